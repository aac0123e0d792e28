//! Generators of real model directories for tests, benchmarks and the bundled demo.
//!
//! Checkpoint files are written with the `safetensors` crate (not devmap's own writer),
//! offload folders exactly as accelerate and transformers write them, so what devmap
//! reads in its tests is what users have on disk.

pub mod dcp;
pub mod fuzz;
pub mod pickle;
pub mod torch_bin;
pub mod verl;
pub mod zero;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;

use crate::formats::hf_index::{INDEX_FILE, shard_file_name};
use crate::types::{DType, byte_len};

/// A tensor with its bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct FixtureTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

impl FixtureTensor {
    /// A tensor filled with a deterministic pattern derived from `seed`. Floating-point
    /// elements are finite, as a real model's are (their top exponent bit is clear, so
    /// every value lies within ±2): verify reports NaN and infinities.
    pub fn patterned(name: &str, dtype: DType, shape: &[u64], seed: u64) -> FixtureTensor {
        let len = byte_len(dtype, shape).unwrap_or(0) as usize;
        let mut data = pattern_bytes(seed, len);
        if dtype == DType::Bool {
            for b in &mut data {
                *b &= 1;
            }
        }
        // The byte holding the exponent's top bit (bit 6 of the last byte, little-endian).
        let top = match dtype {
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E4M3 | DType::F8E5M2 => {
                Some(dtype.size() as usize)
            }
            _ => None,
        };
        if let Some(size) = top {
            for element in data.chunks_exact_mut(size) {
                element[size - 1] &= !0x40;
            }
        }
        FixtureTensor {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }
}

/// Deterministic pseudo-random bytes (a 64-bit LCG), different for every seed.
pub fn pattern_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        out.extend_from_slice(&state.to_le_bytes()[..(len - out.len()).min(8)]);
    }
    out
}

/// compressed-tensors' `pack_to_int32` of `values` (`bits`-bit integers, one row of a
/// weight or one column of zero points): value `i` at bit `i·bits` of little-endian I32
/// words, stored plus `2^(bits−1)`, straddling words where it must. Written plainly
/// here, for tests that make `pack-quantized` checkpoints without Python.
pub fn pack_int32(values: &[i32], bits: u32) -> Vec<u32> {
    let mut words = vec![0u32; (values.len() * bits as usize).div_ceil(32)];
    for (i, v) in values.iter().enumerate() {
        let stored = (i64::from(*v) + (1 << (bits - 1))) as u64;
        let at = i as u64 * u64::from(bits);
        let (word, shift) = ((at / 32) as usize, at % 32);
        words[word] |= (stored << shift) as u32;
        if shift + u64::from(bits) > 32 {
            words[word + 1] |= (stored >> (32 - shift)) as u32;
        }
    }
    words
}

fn st_dtype(d: DType) -> safetensors::Dtype {
    use safetensors::Dtype as S;
    match d {
        DType::Bool => S::BOOL,
        DType::U8 => S::U8,
        DType::I8 => S::I8,
        DType::F8E4M3 => S::F8_E4M3,
        DType::F8E5M2 => S::F8_E5M2,
        DType::F8E8M0 => S::F8_E8M0,
        DType::I16 => S::I16,
        DType::U16 => S::U16,
        DType::F16 => S::F16,
        DType::BF16 => S::BF16,
        DType::I32 => S::I32,
        DType::U32 => S::U32,
        DType::F32 => S::F32,
        DType::C64 => S::C64,
        DType::I64 => S::I64,
        DType::U64 => S::U64,
        DType::F64 => S::F64,
    }
}

fn to_io(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Writes one safetensors file with the reference library, with `{"format": "pt"}`.
pub fn write_safetensors(path: &Path, tensors: &[&FixtureTensor]) -> io::Result<()> {
    let views = tensors
        .iter()
        .map(|t| {
            let shape = t.shape.iter().map(|&d| d as usize).collect();
            safetensors::tensor::TensorView::new(st_dtype(t.dtype), shape, &t.data)
                .map(|v| (t.name.clone(), v))
                .map_err(to_io)
        })
        .collect::<io::Result<Vec<_>>>()?;
    let meta = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::tensor::serialize_to_file(views, Some(meta), path).map_err(to_io)
}

/// Writes `tensors` as `shards` files plus `model.safetensors.index.json`, dealing
/// tensors out round-robin so that files hold names out of order.
pub fn write_sharded(dir: &Path, tensors: &[FixtureTensor], shards: usize) -> io::Result<()> {
    let shards = shards.max(1);
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for k in 0..shards {
        let file = shard_file_name(k + 1, shards);
        let members: Vec<&FixtureTensor> = tensors.iter().skip(k).step_by(shards).collect();
        for t in &members {
            weight_map.insert(t.name.clone(), file.clone());
            total += t.data.len() as u64;
        }
        write_safetensors(&dir.join(&file), &members)?;
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    write_json(&dir.join(INDEX_FILE), &index)
}

pub fn write_json(path: &Path, value: &serde_json::Value) -> io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(to_io)?;
    std::fs::write(path, text + "\n")
}

/// accelerate's `offload_state_dict` format: `index.json` of dtype/shape, raw bytes in
/// `<name>.dat` (bfloat16 as its int16 view: same bytes; 0-dim as one element).
pub fn write_offload_dat(folder: &Path, tensors: &[FixtureTensor]) -> io::Result<()> {
    std::fs::create_dir_all(folder)?;
    let mut index = serde_json::Map::new();
    for t in tensors {
        index.insert(
            t.name.clone(),
            serde_json::json!({"dtype": t.dtype.torch_name(), "shape": t.shape}),
        );
        std::fs::write(folder.join(format!("{}.dat", t.name)), &t.data)?;
    }
    write_json(
        &folder.join("index.json"),
        &serde_json::Value::Object(index),
    )
}

/// transformers 5's form: one `<name>.safetensors` per tensor, no index on disk.
pub fn write_offload_per_tensor(folder: &Path, tensors: &[FixtureTensor]) -> io::Result<()> {
    std::fs::create_dir_all(folder)?;
    for t in tensors {
        write_safetensors(&folder.join(format!("{}.safetensors", t.name)), &[t])?;
    }
    Ok(())
}

/// `index.json` entries pointing into safetensors files (absolute paths, as
/// transformers writes them); the files themselves are written per tensor.
pub fn write_offload_indexed(folder: &Path, tensors: &[FixtureTensor]) -> io::Result<()> {
    write_offload_per_tensor(folder, tensors)?;
    let mut index = serde_json::Map::new();
    let abs = std::fs::canonicalize(folder)?;
    for t in tensors {
        index.insert(
            t.name.clone(),
            serde_json::json!({
                "safetensors_file": abs.join(format!("{}.safetensors", t.name)).display().to_string(),
                "weight_name": t.name,
                "dtype": t.dtype.torch_name(),
            }),
        );
    }
    write_json(
        &folder.join("index.json"),
        &serde_json::Value::Object(index),
    )
}

/// Shape of a small Llama-like model.
#[derive(Debug, Clone, Copy)]
pub struct LlamaShape {
    pub layers: usize,
    pub hidden: u64,
    pub intermediate: u64,
    pub vocab: u64,
    pub dtype: DType,
}

/// A Llama-like state dict without `lm_head.weight` (tied, as transformers saves it).
pub fn llama_like(shape: LlamaShape) -> Vec<FixtureTensor> {
    let LlamaShape {
        layers,
        hidden: h,
        intermediate: i,
        vocab: v,
        dtype,
    } = shape;
    let mut out = vec![FixtureTensor::patterned(
        "model.embed_tokens.weight",
        dtype,
        &[v, h],
        1,
    )];
    let mut seed = 2;
    for l in 0..layers {
        let mut add = |suffix: &str, dt: DType, shape: &[u64]| {
            out.push(FixtureTensor::patterned(
                &format!("model.layers.{l}.{suffix}"),
                dt,
                shape,
                seed,
            ));
            seed += 1;
        };
        for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            add(&format!("self_attn.{proj}.weight"), dtype, &[h, h]);
        }
        add("mlp.gate_proj.weight", dtype, &[i, h]);
        add("mlp.up_proj.weight", dtype, &[i, h]);
        add("mlp.down_proj.weight", dtype, &[h, i]);
        add("input_layernorm.weight", DType::F32, &[h]);
        add("post_attention_layernorm.weight", DType::F32, &[h]);
    }
    out.push(FixtureTensor::patterned(
        "model.norm.weight",
        DType::F32,
        &[h],
        seed,
    ));
    out
}

/// A Llama-like `config.json` with tied embeddings.
pub fn llama_config(shape: LlamaShape) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": shape.vocab,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": true,
        "torch_dtype": shape.dtype.torch_name(),
    })
}

/// Shape of a header-realistic giant mixture-of-experts checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct MoeShape {
    pub layers: usize,
    pub experts: usize,
    pub hidden: u64,
    pub expert_intermediate: u64,
    pub shards: usize,
}

impl MoeShape {
    /// The DeepSeek-V3-sized model the scale test and the benchmarks use: 60 layers of
    /// 256 experts over 160 shards, 92,583 tensors describing 657 GiB.
    pub const GIANT: MoeShape = MoeShape {
        layers: 60,
        experts: 256,
        hidden: 7168,
        expert_intermediate: 2048,
        shards: 160,
    };
}

/// Writes a giant MoE checkpoint whose data regions are holes (sparse files): every
/// header is real, every tensor reads as zeros, and a "1 TB" model costs a few MB of
/// disk. FP8 expert weights with F32 block scales, BF16 attention, F32 norms.
/// Returns the number of tensors and the bytes they describe.
pub fn write_sparse_moe(dir: &Path, shape: MoeShape) -> io::Result<(usize, u64)> {
    std::fs::create_dir_all(dir)?;
    let h = shape.hidden;
    let i = shape.expert_intermediate;
    let mut names: Vec<(String, DType, Vec<u64>)> = vec![(
        "model.embed_tokens.weight".into(),
        DType::BF16,
        vec![129_280, h],
    )];
    for l in 0..shape.layers {
        let p = format!("model.layers.{l}");
        for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            names.push((
                format!("{p}.self_attn.{proj}.weight"),
                DType::BF16,
                vec![h, h],
            ));
        }
        names.push((format!("{p}.input_layernorm.weight"), DType::F32, vec![h]));
        names.push((
            format!("{p}.post_attention_layernorm.weight"),
            DType::F32,
            vec![h],
        ));
        names.push((
            format!("{p}.mlp.gate.weight"),
            DType::BF16,
            vec![shape.experts as u64, h],
        ));
        for e in 0..shape.experts {
            for (proj, dims) in [
                ("gate_proj", [i, h]),
                ("up_proj", [i, h]),
                ("down_proj", [h, i]),
            ] {
                names.push((
                    format!("{p}.mlp.experts.{e}.{proj}.weight"),
                    DType::F8E4M3,
                    dims.to_vec(),
                ));
                names.push((
                    format!("{p}.mlp.experts.{e}.{proj}.weight_scale_inv"),
                    DType::F32,
                    vec![dims[0].div_ceil(128), dims[1].div_ceil(128)],
                ));
            }
        }
    }
    names.push(("model.norm.weight".into(), DType::F32, vec![h]));
    names.push(("lm_head.weight".into(), DType::BF16, vec![129_280, h]));
    write_sparse(
        dir,
        &names,
        shape.shards,
        &serde_json::json!({"architectures": ["DeepseekV3ForCausalLM"], "tie_word_embeddings": false}),
    )
}

/// A deep dense Llama of `layers` decoder layers (nine tensors each) over `shards`
/// sparse shards, as [`write_sparse_moe`] writes them: the deep shape of the
/// inspector's benchmark (10,200 layers is 91,803 tensors). Returns the number of
/// tensors and the bytes they describe.
pub fn write_sparse_deep(
    dir: &Path,
    layers: usize,
    hidden: u64,
    shards: usize,
) -> io::Result<(usize, u64)> {
    let h = hidden;
    let mut names: Vec<(String, DType, Vec<u64>)> = vec![(
        "model.embed_tokens.weight".into(),
        DType::BF16,
        vec![32_000, h],
    )];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            names.push((
                format!("{p}.self_attn.{proj}.weight"),
                DType::BF16,
                vec![h, h],
            ));
        }
        for (proj, dims) in [
            ("gate_proj", [4 * h, h]),
            ("up_proj", [4 * h, h]),
            ("down_proj", [h, 4 * h]),
        ] {
            names.push((format!("{p}.mlp.{proj}.weight"), DType::BF16, dims.to_vec()));
        }
        names.push((format!("{p}.input_layernorm.weight"), DType::BF16, vec![h]));
        names.push((
            format!("{p}.post_attention_layernorm.weight"),
            DType::BF16,
            vec![h],
        ));
    }
    names.push(("model.norm.weight".into(), DType::BF16, vec![h]));
    names.push(("lm_head.weight".into(), DType::BF16, vec![32_000, h]));
    write_sparse(
        dir,
        &names,
        shards,
        &serde_json::json!({"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": false}),
    )
}

/// Writes `names` over `shards` sparse safetensors files with an index and `config`.
fn write_sparse(
    dir: &Path,
    names: &[(String, DType, Vec<u64>)],
    shards: usize,
    config: &serde_json::Value,
) -> io::Result<(usize, u64)> {
    use crate::formats::safetensors::{HeaderEntry, encode_header};
    std::fs::create_dir_all(dir)?;
    let count = names.len();
    let per_shard = count.div_ceil(shards.max(1));
    let shards = count.div_ceil(per_shard);
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    let metadata = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
    for (k, chunk) in names.chunks(per_shard).enumerate() {
        let file = shard_file_name(k + 1, shards);
        let mut begin = 0u64;
        let entries: Vec<HeaderEntry<'_>> = chunk
            .iter()
            .map(|(name, dtype, dims)| {
                let len = byte_len(*dtype, dims).unwrap_or(0);
                let e = HeaderEntry {
                    name: name.as_str().into(),
                    dtype: *dtype,
                    shape: dims.as_slice().into(),
                    begin,
                    end: begin + len,
                };
                begin += len;
                weight_map.insert(name.clone(), file.clone());
                e
            })
            .collect();
        total += begin;
        let header = encode_header(entries.into_iter(), &metadata);
        let f = std::fs::File::create(dir.join(&file))?;
        use std::io::Write;
        (&f).write_all(&header)?;
        f.set_len(header.len() as u64 + begin)?;
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    write_json(&dir.join(INDEX_FILE), &index)?;
    write_json(&dir.join("config.json"), config)?;
    Ok((count, total))
}
