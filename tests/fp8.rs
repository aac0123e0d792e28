//! Fine-grained FP8 and MXFP4 checkpoints: `devmap save --dtype` dequantizes them
//! (checked here against the formula computed independently in the test; against torch
//! and transformers in tests/real_fp8_dequant.rs), copies them as stored under `auto`
//! and `keep`, and refuses what it cannot dequantize, naming the tensor, writing
//! nothing.

mod common;

use std::path::{Path, PathBuf};

use common::{arg, devmap, stderr};
use devmap::fixtures::{FixtureTensor, write_json, write_safetensors};
use devmap::types::DType;

/// float32 value of an e4m3fn byte, decoded from its fields.
fn e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> 3) & 0xf);
    if e == 15 && b & 7 == 7 {
        return f32::NAN;
    }
    let m = f32::from(b & 7);
    if e == 0 {
        sign * m / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

struct Fp8Case {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    out: PathBuf,
    weight: Vec<u8>,
    scales: Vec<f32>,
}

const ROWS: u64 = 5;
const COLS: u64 = 7;
const BLOCK: (u64, u64) = (2, 4);

/// The FP8 weight's bytes: every finite e4m3 pattern but the NaNs, in turn.
fn e4m3_weight() -> Vec<u8> {
    (0..ROWS * COLS)
        .map(|i| {
            let b = (i * 37 % 256) as u8;
            if b & 0x7f == 0x7f { 0x3c } else { b }
        })
        .collect()
}

/// A 5×7 FP8 weight in 2×4 blocks (a 3×2 scale grid, partial blocks at both ends), a
/// bfloat16 norm, and a config with `quantization_config`.
fn fp8_case(method: &str, scales: Option<Vec<f32>>) -> Fp8Case {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let weight = e4m3_weight();
    let scales = scales.unwrap_or_else(|| vec![0.5, 2.0, 0.125, 3.0, 1.0e-3, 7.5]);
    let w = FixtureTensor {
        name: "model.layers.0.mlp.down_proj.weight".into(),
        dtype: DType::F8E4M3,
        shape: vec![ROWS, COLS],
        data: weight.clone(),
    };
    let s = FixtureTensor {
        name: "model.layers.0.mlp.down_proj.weight_scale_inv".into(),
        dtype: DType::F32,
        shape: vec![3, 2],
        data: scales.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    let norm = FixtureTensor::patterned("model.norm.weight", DType::BF16, &[COLS], 3);
    write_safetensors(&src.join("model.safetensors"), &[&w, &s, &norm]).expect("weights");
    write_json(
        &src.join("config.json"),
        &serde_json::json!({
            "architectures": ["ToyForCausalLM"],
            "dtype": "bfloat16",
            "quantization_config": {"quant_method": method, "weight_block_size": [BLOCK.0, BLOCK.1]},
        }),
    )
    .expect("config");
    let out = tmp.path().join("out");
    Fp8Case {
        _tmp: tmp,
        src,
        out,
        weight,
        scales,
    }
}

fn save(case: &Fp8Case, dtype: &str) -> std::process::Output {
    common::save(&case.src, &case.out, &["--dtype", dtype])
}

fn read(out: &Path) -> safetensors::SafeTensors<'static> {
    let bytes = std::fs::read(out.join("model.safetensors")).expect("written");
    safetensors::SafeTensors::deserialize(Box::leak(bytes.into_boxed_slice())).expect("reads")
}

#[test]
fn fp8_weights_are_dequantized_with_their_block_scales() {
    let case = fp8_case("fp8", None);
    let o = save(&case, "float32");
    assert!(o.status.success(), "{}", stderr(&o));
    let st = read(&case.out);
    let w = st
        .tensor("model.layers.0.mlp.down_proj.weight")
        .expect("weight");
    assert_eq!(w.dtype(), safetensors::Dtype::F32);
    assert_eq!(w.shape(), [5, 7]);
    for i in 0..ROWS as usize {
        for j in 0..COLS as usize {
            let scale = case.scales[i / BLOCK.0 as usize * 2 + j / BLOCK.1 as usize];
            let want = e4m3(case.weight[i * COLS as usize + j]) * scale;
            let at = (i * COLS as usize + j) * 4;
            let got = f32::from_le_bytes(w.data()[at..at + 4].try_into().expect("4 bytes"));
            assert_eq!(got.to_bits(), want.to_bits(), "element ({i}, {j})");
        }
    }
    // The scale is gone; the bfloat16 norm is cast like every float; the config says
    // float32 and no longer says quantized.
    assert!(
        st.tensor("model.layers.0.mlp.down_proj.weight_scale_inv")
            .is_err()
    );
    assert_eq!(
        st.tensor("model.norm.weight").expect("norm").dtype(),
        safetensors::Dtype::F32
    );
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(case.out.join("config.json")).expect("config"),
    )
    .expect("json");
    assert!(config.get("quantization_config").is_none(), "{config}");
    assert_eq!(config["dtype"], "float32");
    // verify --against recomputes it through the same recipe.
    let o = devmap(&[
        "verify",
        arg(&case.out),
        "--against",
        arg(&case.src),
        "--dtype",
        "float32",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", common::stdout(&o));
}

#[test]
fn auto_and_keep_copy_a_quantized_checkpoint_as_stored() {
    for choice in ["auto", "keep"] {
        let case = fp8_case("fp8", None);
        let o = save(&case, choice);
        assert!(o.status.success(), "{}", stderr(&o));
        let st = read(&case.out);
        let w = st
            .tensor("model.layers.0.mlp.down_proj.weight")
            .expect("weight");
        assert_eq!(w.dtype(), safetensors::Dtype::F8_E4M3, "{choice}");
        assert_eq!(w.data(), &case.weight[..]);
        assert!(
            st.tensor("model.layers.0.mlp.down_proj.weight_scale_inv")
                .is_ok()
        );
    }
}

/// `--dtype bfloat16` is refused with a message that contains `needle`, and nothing
/// is written.
fn refused(case: &Fp8Case, needle: &str) {
    let o = save(case, "bfloat16");
    assert!(!o.status.success(), "saved although it should refuse");
    let err = stderr(&o);
    assert!(err.contains(needle), "{err}");
    assert!(!case.out.join("model.safetensors").exists());
}

#[test]
fn what_cannot_be_dequantized_is_refused_by_name() {
    refused(
        &fp8_case("mxfp4", None),
        "quantization_config is `mxfp4`, but no tensor is MXFP4 blocks",
    );
    refused(
        &fp8_case("compressed-tensors", None),
        "quantization_config is compressed-tensors in the `(unnamed)` format",
    );
    refused(
        &fp8_case("bitsandbytes", None),
        "quantization_config is `bitsandbytes`, which devmap does not dequantize",
    );
    refused(
        &fp8_case("awq", None),
        "quantization_config is `awq`, but no tensor is a quantized weight",
    );
    // A scale grid of the wrong shape for the config's blocks.
    let case = fp8_case("fp8", None);
    let config = serde_json::json!({
        "architectures": ["ToyForCausalLM"],
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [4, 4]},
    });
    write_json(&case.src.join("config.json"), &config).expect("config");
    refused(
        &case,
        "tensor `model.layers.0.mlp.down_proj.weight` has a `model.layers.0.mlp.down_proj.weight_scale_inv` of F32 [3, 2], but its 4×4 blocks need float32 or E8M0 [2, 2]",
    );
    // A block of no size.
    let case = fp8_case("fp8", None);
    let config = serde_json::json!({
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 128]},
    });
    write_json(&case.src.join("config.json"), &config).expect("config");
    refused(&case, "weight_block_size of (0, 128)");
    // A NaN scale: found while streaming, the save discarded.
    let case = fp8_case("fp8", Some(vec![0.5, f32::NAN, 1.0, 1.0, 1.0, 1.0]));
    refused(
        &case,
        "the scales of `model.layers.0.mlp.down_proj.weight` hold NaN at element 1",
    );
}

#[test]
fn a_weight_without_its_scale_is_refused() {
    let case = fp8_case("fp8", None);
    let w = FixtureTensor {
        name: "model.layers.0.mlp.down_proj.weight".into(),
        dtype: DType::F8E4M3,
        shape: vec![ROWS, COLS],
        data: case.weight.clone(),
    };
    write_safetensors(&case.src.join("model.safetensors"), &[&w]).expect("weights");
    refused(
        &case,
        "tensor `model.layers.0.mlp.down_proj.weight` is F8_E4M3, but there is no `model.layers.0.mlp.down_proj.weight_scale_inv` beside it",
    );
}

#[test]
fn inspect_says_the_checkpoint_is_quantized() {
    let case = fp8_case("fp8", None);
    let o = devmap(&["inspect", arg(&case.src)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = common::stdout(&o);
    // 35 FP8 bytes and 6 float32 scales stored; 35 bfloat16 values dequantized.
    assert!(
        text.contains(
            "quantized: fp8, 2×4 blocks: 1 quantized weight with its scales, 59 B stored, 70 B as bfloat16 (save --dtype bfloat16 dequantizes)"
        ),
        "{text}"
    );
    let o = devmap(&["inspect", arg(&case.src), "--json"]);
    let json: serde_json::Value = serde_json::from_str(&common::stdout(&o)).expect("json");
    assert_eq!(
        json["quantization"],
        serde_json::json!({"method": "fp8", "block": [2, 4]})
    );
    // Each tensor says its part: the weight its format and scales, the scales whose.
    let tensor = |name: &str| {
        json["tensors"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["name"] == name))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        tensor("model.layers.0.mlp.down_proj.weight")["quantized"],
        serde_json::json!({
            "format": "fp8 e4m3, 2×4 blocks",
            "scales": "model.layers.0.mlp.down_proj.weight_scale_inv",
            "dequantized_name": "model.layers.0.mlp.down_proj.weight",
            "dequantized_shape": [5, 7],
            "dequantized_bytes": 70,
        })
    );
    assert_eq!(
        tensor("model.layers.0.mlp.down_proj.weight_scale_inv")["quantized"],
        serde_json::json!({"scales_of": "model.layers.0.mlp.down_proj.weight"})
    );
    assert!(tensor("model.norm.weight").get("quantized").is_none());
    let plain = fp8_case("mxfp4", None);
    let o = devmap(&["inspect", arg(&plain.src), "--json"]);
    let json: serde_json::Value = serde_json::from_str(&common::stdout(&o)).expect("json");
    assert_eq!(json["quantization"], serde_json::json!({"method": "mxfp4"}));
}

#[test]
fn inspect_shows_mxfp4_experts_as_the_weights_they_dequantize_to() {
    let (_tmp, src, _, _) = mxfp4_case(&[2, 3, 2]);
    let o = devmap(&["inspect", arg(&src)]);
    let text = common::stdout(&o);
    // 192 packed bytes and 12 scale bytes; 2·64·3 bfloat16 values.
    assert!(
        text.contains(
            "quantized: mxfp4: 1 quantized weight with its scales, 204 B stored, 768 B as bfloat16 (save --dtype bfloat16 dequantizes)"
        ),
        "{text}"
    );
    let o = devmap(&["inspect", arg(&src), "--json"]);
    let json: serde_json::Value = serde_json::from_str(&common::stdout(&o)).expect("json");
    let blocks = json["tensors"]
        .as_array()
        .and_then(|ts| {
            ts.iter()
                .find(|t| t["name"] == "model.layers.0.mlp.experts.gate_up_proj_blocks")
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        blocks["quantized"],
        serde_json::json!({
            "format": "mxfp4, 32-value groups",
            "scales": "model.layers.0.mlp.experts.gate_up_proj_scales",
            "dequantized_name": "model.layers.0.mlp.experts.gate_up_proj",
            "dequantized_shape": [2, 64, 3],
            "dequantized_bytes": 768,
        })
    );
}

/// A gpt-oss-like MXFP4 experts weight: `[2 experts, 3 rows, 2 groups, 16]` bytes and
/// its scales, a bfloat16 bias, and a config naming `mxfp4`.
fn mxfp4_case(scales_shape: &[u64]) -> (tempfile::TempDir, PathBuf, Vec<u8>, Vec<u8>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let blocks: Vec<u8> = (0..2 * 3 * 2 * 16).map(|i| (i * 73 % 256) as u8).collect();
    let scales: Vec<u8> = (0..scales_shape.iter().product::<u64>())
        .map(|i| 120 + (i % 9) as u8)
        .collect();
    let b = FixtureTensor {
        name: "model.layers.0.mlp.experts.gate_up_proj_blocks".into(),
        dtype: DType::U8,
        shape: vec![2, 3, 2, 16],
        data: blocks.clone(),
    };
    let s = FixtureTensor {
        name: "model.layers.0.mlp.experts.gate_up_proj_scales".into(),
        dtype: DType::U8,
        shape: scales_shape.to_vec(),
        data: scales.clone(),
    };
    let bias = FixtureTensor::patterned(
        "model.layers.0.mlp.experts.gate_up_proj_bias",
        DType::BF16,
        &[2, 3],
        5,
    );
    write_safetensors(&src.join("model.safetensors"), &[&b, &s, &bias]).expect("weights");
    write_json(
        &src.join("config.json"),
        &serde_json::json!({
            "architectures": ["ToyForCausalLM"],
            "dtype": "bfloat16",
            "quantization_config": {"quant_method": "mxfp4"},
        }),
    )
    .expect("config");
    (tmp, src, blocks, scales)
}

#[test]
fn mxfp4_experts_are_dequantized_and_transposed_per_expert() {
    let (tmp, src, blocks, scales) = mxfp4_case(&[2, 3, 2]);
    let out = tmp.path().join("out");
    let o = devmap(&["save", arg(&src), "--out", arg(&out), "--dtype", "float32"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("dequantizing 1 MXFP4 weight to float32"),
        "{}",
        stderr(&o)
    );
    let st = read(&out);
    let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "model.layers.0.mlp.experts.gate_up_proj",
            "model.layers.0.mlp.experts.gate_up_proj_bias"
        ]
    );
    let w = st
        .tensor("model.layers.0.mlp.experts.gate_up_proj")
        .expect("weight");
    assert_eq!(w.shape(), [2, 64, 3]);
    // The definition: element (e, c, r) is nibble c of row r's 32 values (the low
    // nibble of byte c/2 first) of expert e, times 2^(scale - 127).
    const FP4: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let got: Vec<f32> = w
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    for e in 0..2 {
        for c in 0..64 {
            for r in 0..3 {
                let (group, within) = (c / 32, c % 32);
                let byte = blocks[((e * 3 + r) * 2 + group) * 16 + within / 2];
                let nibble = if within % 2 == 1 {
                    byte >> 4
                } else {
                    byte & 15
                };
                let magnitude = FP4[usize::from(nibble & 7)];
                let sign = if nibble & 8 != 0 { -1.0 } else { 1.0 };
                let scale = scales[(e * 3 + r) * 2 + group];
                let want = sign * magnitude * 2f32.powi(i32::from(scale) - 127);
                let have = got[(e * 64 + c) * 3 + r];
                assert_eq!(have.to_bits(), want.to_bits(), "[{e}][{c}][{r}]");
            }
        }
    }
    let config = std::fs::read_to_string(out.join("config.json")).expect("config");
    assert!(!config.contains("quantization_config"), "{config}");
    // verify --against recomputes every value the same way.
    let o = devmap(&[
        "verify",
        arg(&out),
        "--against",
        arg(&src),
        "--dtype",
        "float32",
    ]);
    assert!(
        common::stdout(&o).contains("0 differences"),
        "{}{}",
        common::stdout(&o),
        stderr(&o)
    );
}

#[test]
fn mxfp4_that_cannot_be_dequantized_is_refused_by_name() {
    let (tmp, src, _, _) = mxfp4_case(&[2, 3, 1]);
    let out = tmp.path().join("out");
    let o = common::save(&src, &out, &["--dtype", "bfloat16"]);
    assert!(!o.status.success(), "saved although the scales do not fit");
    let err = stderr(&o);
    assert!(
        err.contains("tensor `model.layers.0.mlp.experts.gate_up_proj_blocks` is U8 [2, 3, 2, 16] with a `model.layers.0.mlp.experts.gate_up_proj_scales` of U8 [2, 3, 1]"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
    // keep copies the packed checkpoint as it is.
    let o = common::save(&src, &out, &["--dtype", "keep"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        read(&out)
            .tensor("model.layers.0.mlp.experts.gate_up_proj_blocks")
            .is_ok()
    );
}

/// compressed-tensors `float-quantized`: a per-row bfloat16 `weight_scale`, multiplied
/// in bfloat16 (compressed-tensors' `dequantize` computes in the scale's dtype), then
/// widened to float32; the scale dropped.
#[test]
fn compressed_tensors_fp8_multiplies_in_the_scale_dtype() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let weight = e4m3_weight();
    // bfloat16 scales with all 8 bits of mantissa in use, so the product needs rounding.
    let scales: Vec<u16> = (0..ROWS).map(|r| 0x3f81 + r as u16 * 37).collect();
    let w = FixtureTensor {
        name: "model.layers.0.mlp.down_proj.weight".into(),
        dtype: DType::F8E4M3,
        shape: vec![ROWS, COLS],
        data: weight.clone(),
    };
    let s = FixtureTensor {
        name: "model.layers.0.mlp.down_proj.weight_scale".into(),
        dtype: DType::BF16,
        shape: vec![ROWS, 1],
        data: scales.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    write_safetensors(&src.join("model.safetensors"), &[&w, &s]).expect("weights");
    write_json(
        &src.join("config.json"),
        &serde_json::json!({
            "architectures": ["ToyForCausalLM"],
            "dtype": "bfloat16",
            "quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized"},
        }),
    )
    .expect("config");
    let out = tmp.path().join("out");
    let o = common::save(&src, &out, &["--dtype", "float32"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let st = read(&out);
    assert!(
        st.tensor("model.layers.0.mlp.down_proj.weight_scale")
            .is_err()
    );
    let got = st
        .tensor("model.layers.0.mlp.down_proj.weight")
        .expect("weight");
    for (i, b) in got.data().chunks_exact(4).enumerate() {
        let have = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let scale = f32::from_bits(u32::from(scales[i / COLS as usize]) << 16);
        let product = e4m3(weight[i]) * scale;
        // Rounded to bfloat16 (to nearest, ties to even), as torch multiplies bfloat16.
        let bits = product.to_bits();
        let want = f32::from_bits(bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000);
        assert_eq!(have.to_bits(), want.to_bits(), "element {i}: {product}");
    }
}

/// An FP8 checkpoint whose bfloat16 output is one shard past 64 MiB is dequantized by
/// every job, each a run of its tensors: byte for byte what one job writes (which the
/// tests above and tests/real_fp8_dequant.rs check value by value).
#[test]
fn a_big_dequantized_shard_written_by_several_jobs_is_byte_identical() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let (rows, cols) = (2048u64, 2048u64);
    let mut tensors = Vec::new();
    for layer in 0..9u64 {
        let name = format!("model.layers.{layer}.mlp.down_proj.weight");
        let data = (0..rows * cols)
            .map(|i| {
                let b = ((i + layer) * 37 % 256) as u8;
                if b & 0x7f == 0x7f { 0x3c } else { b }
            })
            .collect();
        let scales: Vec<u8> = (0..(rows / 128) * (cols / 128))
            .flat_map(|i| (0.25 + (i + layer) as f32 / 64.0).to_le_bytes())
            .collect();
        tensors.push(FixtureTensor {
            name: name.clone(),
            dtype: DType::F8E4M3,
            shape: vec![rows, cols],
            data,
        });
        tensors.push(FixtureTensor {
            name: format!("{name}_scale_inv"),
            dtype: DType::F32,
            shape: vec![rows / 128, cols / 128],
            data: scales,
        });
    }
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    write_safetensors(&src.join("model.safetensors"), &refs).expect("weights");
    write_json(
        &src.join("config.json"),
        &serde_json::json!({
            "architectures": ["ToyForCausalLM"],
            "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        }),
    )
    .expect("config");
    let written = |jobs: &str| {
        let out = tmp.path().join(format!("out{jobs}"));
        let o = common::save(&src, &out, &["--dtype", "bfloat16", "--jobs", jobs]);
        assert!(o.status.success(), "--jobs {jobs}: {}", stderr(&o));
        std::fs::read(out.join("model.safetensors")).expect("one shard")
    };
    let one = written("1");
    assert!(
        one.len() as u64 > 64 << 20,
        "{} bytes: not past 64 MiB",
        one.len()
    );
    assert!(
        written("2") == one,
        "--jobs 2 wrote other bytes than --jobs 1"
    );
}

/// MXFP4 blocks hold two 4-bit values a byte: the inspector and `inspect` count the
/// values the weight dequantizes to, not its packed bytes (issue 40: the header said
/// 24.6K for 49,152 values).
#[test]
fn mxfp4_blocks_count_their_values_as_parameters() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("gpt-oss-like");
    std::fs::create_dir(&dir).expect("mkdir");
    let blocks = devmap::fixtures::FixtureTensor::patterned(
        "model.layers.0.mlp.experts.gate_up_proj_blocks",
        DType::U8,
        &[2, 8, 3, 16],
        1,
    );
    let scales = devmap::fixtures::FixtureTensor::patterned(
        "model.layers.0.mlp.experts.gate_up_proj_scales",
        DType::U8,
        &[2, 8, 3],
        2,
    );
    devmap::fixtures::write_safetensors(&dir.join("model.safetensors"), &[&blocks, &scales])
        .expect("write");
    devmap::fixtures::write_json(
        &dir.join("config.json"),
        &serde_json::json!({
            "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
            "quantization_config": {"quant_method": "mxfp4"}
        }),
    )
    .expect("config");
    let o = common::devmap(&["inspect", dir.to_str().expect("p")]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    // 2 experts × 3 groups × 32 values × 8 rows, plus the 48 scales.
    let values = 2 * 3 * 32 * 8 + 48;
    assert!(
        common::stdout(&o).contains(&format!("{values} parameters"))
            || common::stdout(&o)
                .contains(&format!("{:.2}K parameters", f64::from(values) / 1000.0)),
        "{}",
        common::stdout(&o)
    );
}

/// DeepSeek-V4's FP4-packed weights in a fine-grained FP8 checkpoint: I8 `[rows,
/// cols/2]` of two E2M1 codes a byte (the low nibble first), with E8M0 scales per 32
/// values of a row, written `[rows, cols]` as `e2m1 · 2^(e − 127)` (computed here from
/// the formats' definitions); `expert_dtype` leaves the config with the quantization.
#[test]
fn fp4_packed_weights_with_e8m0_scales_are_dequantized() {
    const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let (rows, cols) = (3u64, 64u64);
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let packed: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 37 % 256) as u8).collect();
    let exponents: Vec<u8> = (0..rows * cols / 32).map(|i| 120 + (i % 9) as u8).collect();
    let weight = FixtureTensor {
        name: "model.layers.0.mlp.experts.0.w1.weight".into(),
        dtype: DType::I8,
        shape: vec![rows, cols / 2],
        data: packed.clone(),
    };
    let scale = FixtureTensor {
        name: "model.layers.0.mlp.experts.0.w1.weight_scale_inv".into(),
        dtype: DType::F8E8M0,
        shape: vec![rows, cols / 32],
        data: exponents.clone(),
    };
    write_safetensors(&src.join("model.safetensors"), &[&weight, &scale]).expect("weights");
    write_json(
        &src.join("config.json"),
        &serde_json::json!({
            "architectures": ["ToyForCausalLM"],
            "dtype": "bfloat16",
            "expert_dtype": "fp4",
            "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"},
        }),
    )
    .expect("config");
    // inspect shows the packed weight as what it dequantizes to.
    let listed = devmap(&["inspect", arg(&src), "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("inspect --json");
    let packed_entry = json["tensors"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["dtype"] == "I8"))
        .expect("the I8 weight");
    assert_eq!(
        packed_entry["quantized"]["dequantized_shape"],
        serde_json::json!([3, 64])
    );
    assert!(
        packed_entry["quantized"]["format"]
            .as_str()
            .is_some_and(|f| f.starts_with("fp4 e2m1")),
        "{packed_entry}"
    );
    let out = tmp.path().join("out");
    let saved = common::save(&src, &out, &["--dtype", "float32"]);
    assert!(saved.status.success(), "{}", stderr(&saved));
    let st = read(&out);
    let got = st
        .tensor("model.layers.0.mlp.experts.0.w1.weight")
        .expect("weight");
    assert_eq!(
        (got.dtype(), got.shape()),
        (safetensors::Dtype::F32, &[3usize, 64][..])
    );
    for (k, b) in got.data().chunks_exact(4).enumerate() {
        let (r, c) = (k / 64, k % 64);
        let byte = packed[r * 32 + c / 2];
        let code = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
        let magnitude = E2M1[usize::from(code & 7)];
        let value = if code & 8 != 0 { -magnitude } else { magnitude };
        let factor = 2f32.powi(i32::from(exponents[r * 2 + c / 32]) - 127);
        let want = value * factor;
        let have = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(have.to_bits(), want.to_bits(), "element ({r}, {c})");
    }
    assert!(
        st.tensor("model.layers.0.mlp.experts.0.w1.weight_scale_inv")
            .is_err()
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).expect("config"))
            .expect("json");
    assert!(config.get("quantization_config").is_none() && config.get("expert_dtype").is_none());
}
