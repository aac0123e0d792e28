//! `devmap save --quantize fp8-block` without Python: the linear weights are written
//! as F8_E4M3 with a float32 `weight_scale_inv` per 128×128 tile, every other tensor as
//! stored, config.json says how; the values come back within FP8's step; and what
//! cannot be quantized is refused by name with nothing written.
//! (tests/real/fp8_dequant.rs checks the bytes against transformers' `Fp8Quantize`.)

mod common;

use std::path::{Path, PathBuf};

use common::stderr;
use devmap::fixtures::{FixtureTensor, write_json, write_safetensors};
use devmap::types::DType;

/// bfloat16 values spread over a few magnitudes.
fn weight(name: &str, shape: &[u64], seed: u64) -> FixtureTensor {
    let n: u64 = shape.iter().product();
    FixtureTensor {
        name: name.into(),
        dtype: DType::BF16,
        shape: shape.to_vec(),
        data: (0..n)
            .flat_map(|i| {
                let v = (((i * 7919 + seed * 104_729) % 2001) as f32 - 1000.0) / 1000.0
                    * if i % 97 == 0 { 8.0 } else { 0.05 };
                half::bf16::from_f32(v).to_le_bytes()
            })
            .collect(),
    }
}

struct Case {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    out: PathBuf,
    tensors: Vec<FixtureTensor>,
}

fn case(edit: impl FnOnce(&mut Vec<FixtureTensor>, &mut serde_json::Value)) -> Case {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let mut tensors = vec![
        weight("model.embed_tokens.weight", &[64, 128], 1),
        weight("model.layers.0.self_attn.q_proj.weight", &[256, 128], 2),
        weight("model.layers.0.mlp.down_proj.weight", &[128, 256], 3),
        weight("model.layers.0.mlp.gate.weight", &[8, 128], 4),
        weight("model.norm.weight", &[128], 5),
    ];
    let mut config = serde_json::json!({"architectures": ["ToyForCausalLM"], "dtype": "bfloat16"});
    edit(&mut tensors, &mut config);
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    write_safetensors(&src.join("model.safetensors"), &refs).expect("weights");
    write_json(&src.join("config.json"), &config).expect("config");
    let out = tmp.path().join("out");
    Case {
        _tmp: tmp,
        src,
        out,
        tensors,
    }
}

fn e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> 3) & 0xf);
    let m = f32::from(b & 7);
    if e == 0 {
        sign * m / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

fn read(out: &Path) -> (Vec<u8>, serde_json::Value) {
    let bytes = std::fs::read(out.join("model.safetensors")).expect("written");
    let config = serde_json::from_slice(&std::fs::read(out.join("config.json")).expect("config"))
        .expect("json");
    (bytes, config)
}

#[test]
fn linear_weights_are_written_as_fp8_tiles_and_the_rest_as_stored() {
    let model = case(|_, _| {});
    let output = common::save(&model.src, &model.out, &["--quantize", "fp8-block"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let (bytes, config) = read(&model.out);
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("reads");
    for (name, rows, cols) in [
        ("model.layers.0.self_attn.q_proj.weight", 256usize, 128usize),
        ("model.layers.0.mlp.down_proj.weight", 128, 256),
    ] {
        let values = st.tensor(name).expect("values");
        assert_eq!(
            (values.dtype(), values.shape()),
            (safetensors::Dtype::F8_E4M3, &[rows, cols][..])
        );
        let scale = st.tensor(&format!("{name}_scale_inv")).expect("scales");
        assert_eq!(
            (scale.dtype(), scale.shape()),
            (safetensors::Dtype::F32, &[rows / 128, cols / 128][..])
        );
        let scales: Vec<f32> = scale
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let source = &model
            .tensors
            .iter()
            .find(|t| t.name == name)
            .expect("source")
            .data;
        // Each value back within half an FP8 step of its tile's largest: |w − q·s| ≤
        // max/16 (E4M3 keeps 3 mantissa bits).
        for (i, (&b, src)) in values.data().iter().zip(source.chunks_exact(2)).enumerate() {
            let (r, col) = (i / cols, i % cols);
            let s = scales[(r / 128) * (cols / 128) + col / 128];
            let w = half::bf16::from_le_bytes([src[0], src[1]]).to_f32();
            let back = e4m3(b) * s;
            assert!(
                (back - w).abs() <= 448.0 * s / 16.0,
                "{name}[{r}, {col}]: {w} came back {back}"
            );
        }
    }
    // The embedding, the router (8 rows: not whole tiles) and the norm, as stored.
    for name in [
        "model.embed_tokens.weight",
        "model.layers.0.mlp.gate.weight",
        "model.norm.weight",
    ] {
        let kept = st.tensor(name).expect("kept");
        let source = &model
            .tensors
            .iter()
            .find(|t| t.name == name)
            .expect("source")
            .data;
        assert_eq!(
            (kept.dtype(), kept.data()),
            (safetensors::Dtype::BF16, &source[..]),
            "{name}"
        );
    }
    let quantization = &config["quantization_config"];
    assert_eq!(quantization["quant_method"], "fp8");
    assert_eq!(
        quantization["weight_block_size"],
        serde_json::json!([128, 128])
    );
    assert_eq!(
        quantization["modules_to_not_convert"],
        serde_json::json!(["model.embed_tokens", "model.layers.0.mlp.gate"])
    );
}

#[test]
fn verify_against_reports_the_round_trip_as_a_bound() {
    let model = case(|_, _| {});
    let output = common::save(&model.src, &model.out, &["--quantize", "fp8-block"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let verify = |model: &Case| {
        common::devmap(&[
            "verify",
            common::arg(&model.out),
            "--against",
            common::arg(&model.src),
            "--quantize",
            "fp8-block",
        ])
    };
    let clean = verify(&model);
    let text = common::stdout(&clean);
    assert!(clean.status.success(), "{text}{}", stderr(&clean));
    assert!(
        text.contains("2 weights quantized: every value within half an E4M3 step of its source"),
        "{text}"
    );
    // One value moved by a step: past the bound, named with its element (and the
    // bytes differ from the recipe's too).
    let (mut bytes, _) = read(&model.out);
    let header = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let offset = find_offset(&bytes, header, "model.layers.0.mlp.down_proj.weight") + 5;
    bytes[offset] ^= 0x01;
    std::fs::write(model.out.join("model.safetensors"), &bytes).expect("written back");
    let broken = verify(&model);
    let text = common::stdout(&broken);
    assert!(!broken.status.success(), "{text}");
    assert!(
        text.contains("element 5: the source holds") && text.contains("of half an E4M3 step"),
        "{text}"
    );
}

/// Where tensor `name`'s bytes start in a safetensors file (`header` bytes of JSON).
fn find_offset(bytes: &[u8], header: usize, name: &str) -> usize {
    let json: serde_json::Value =
        serde_json::from_slice(&bytes[8..8 + header]).expect("header json");
    let begin = json[name]["data_offsets"][0].as_u64().expect("offsets") as usize;
    8 + header + begin
}

/// `--quantize fp8-block` is refused with a message that contains `needle`, and
/// nothing is written.
fn refused(c: &Case, extra: &[&str], needle: &str) {
    let mut args = vec!["--quantize", "fp8-block"];
    args.extend_from_slice(extra);
    let o = common::save(&c.src, &c.out, &args);
    common::assert_refused(&o, &c.out, "--quantize fp8-block", &[needle]);
}

#[test]
fn what_cannot_be_quantized_is_refused_by_name() {
    // A NaN has no FP8 value: found while streaming, the save discarded.
    let c = case(|t, _| {
        t[2].data[10..12].copy_from_slice(&half::bf16::NAN.to_le_bytes());
    });
    refused(
        &c,
        &[],
        "`model.layers.0.mlp.down_proj.weight` holds NaN at element 5",
    );
    // A model quantized already.
    let c = case(|_, config| {
        config["quantization_config"] = serde_json::json!({"quant_method": "fp8"});
    });
    refused(&c, &[], "says this one is quantized already");
    // No linear weight of whole tiles.
    let c = case(|t, _| t.retain(|t| !t.name.contains("proj")));
    refused(&c, &[], "found no weight to quantize");
}
