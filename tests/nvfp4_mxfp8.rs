//! compressed-tensors NVFP4 (`nvfp4-pack-quantized`) and MXFP8 (`mxfp8-quantized`)
//! without Python: checkpoints laid out here as compressed-tensors writes them are
//! written dequantized under the weight's own name, and hostile variants are refused by
//! name with nothing written. (tests/real/fp8_dequant.rs checks the values against
//! compressed-tensors and transformers themselves.)

mod common;

use std::path::PathBuf;

use common::stderr;
use devmap::fixtures::{FixtureTensor, write_json, write_safetensors};
use devmap::types::DType;

const ROWS: u64 = 6;
const COLS: u64 = 64;
const MODULE: &str = "model.layers.0.self_attn.o_proj";

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

/// FP4 E2M1's value of a 4-bit code.
fn e2m1(code: u8) -> f32 {
    let magnitude = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][usize::from(code & 7)];
    if code & 8 != 0 { -magnitude } else { magnitude }
}

struct Case {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    out: PathBuf,
}

fn case(
    format: &str,
    tensors: &mut dyn FnMut() -> Vec<FixtureTensor>,
    edit: impl FnOnce(&mut Vec<FixtureTensor>),
) -> Case {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let mut tensors = tensors();
    edit(&mut tensors);
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    write_safetensors(&src.join("model.safetensors"), &refs).expect("weights");
    write_json(
        &src.join("config.json"),
        &serde_json::json!({
            "architectures": ["ToyForCausalLM"],
            "dtype": "bfloat16",
            "quantization_config": {"quant_method": "compressed-tensors", "format": format},
        }),
    )
    .expect("config");
    let out = tmp.path().join("out");
    Case {
        _tmp: tmp,
        src,
        out,
    }
}

/// Packed codes, one scale byte per 16 values (every finite e4m3 pattern in turn), and
/// the global scale.
fn nvfp4_tensors() -> Vec<FixtureTensor> {
    let codes = |r: u64, c: u64| ((r * 5 + c * 3 + c / 7) % 16) as u8;
    let packed: Vec<u8> = (0..ROWS)
        .flat_map(|r| (0..COLS / 2).map(move |k| codes(r, 2 * k) | (codes(r, 2 * k + 1) << 4)))
        .collect();
    vec![
        FixtureTensor {
            name: format!("{MODULE}.weight_packed"),
            dtype: DType::U8,
            shape: vec![ROWS, COLS / 2],
            data: packed,
        },
        FixtureTensor {
            name: format!("{MODULE}.weight_scale"),
            dtype: DType::F8E4M3,
            shape: vec![ROWS, COLS / 16],
            data: (0..ROWS * COLS / 16).map(nvfp4_scale).collect(),
        },
        FixtureTensor {
            name: format!("{MODULE}.weight_global_scale"),
            dtype: DType::F32,
            shape: vec![1],
            data: GLOBAL.to_le_bytes().to_vec(),
        },
        FixtureTensor::patterned("model.norm.weight", DType::BF16, &[COLS], 3),
    ]
}

const GLOBAL: f32 = 3000.7;

fn nvfp4_scale(k: u64) -> u8 {
    let b = (k * 37 % 256) as u8;
    if b & 0x7f == 0x7f { 0x3c } else { b }
}

fn read_bf16(out: &std::path::Path, name: &str) -> Vec<half::bf16> {
    let bytes = std::fs::read(out.join("model.safetensors")).expect("written");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("reads");
    let t = st.tensor(name).expect("tensor");
    assert_eq!(t.dtype(), safetensors::Dtype::BF16);
    t.data()
        .chunks_exact(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]))
        .collect()
}

#[test]
fn nvfp4_is_written_as_the_weight_it_dequantizes_to() {
    let c = case("nvfp4-pack-quantized", &mut nvfp4_tensors, |_| {});
    let o = common::save(&c.src, &c.out, &["--dtype", "bfloat16"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = read_bf16(&c.out, &format!("{MODULE}.weight"));
    assert_eq!(got.len() as u64, ROWS * COLS);
    let packed = &nvfp4_tensors()[0].data;
    for r in 0..ROWS {
        for col in 0..COLS {
            let byte = packed[(r * COLS / 2 + col / 2) as usize];
            let code = if col % 2 == 0 { byte & 0xF } else { byte >> 4 };
            // The block scale over the global scale in f32, the product in f32, then
            // bfloat16: compressed-tensors' order.
            let scale = e4m3(nvfp4_scale(r * COLS / 16 + col / 16)) / GLOBAL;
            let want = half::bf16::from_f32(e2m1(code) * scale);
            let i = (r * COLS + col) as usize;
            assert_eq!(got[i].to_bits(), want.to_bits(), "element [{r}, {col}]");
        }
    }
    let names: Vec<String> = {
        let bytes = std::fs::read(c.out.join("model.safetensors")).expect("written");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("reads");
        let mut n: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
        n.sort_unstable();
        n
    };
    assert_eq!(
        names,
        [format!("{MODULE}.weight"), "model.norm.weight".to_owned()]
    );
}

/// MXFP8: F8_E4M3 values, one E8M0 exponent (U8) per 32 values of a row.
fn mxfp8_tensors() -> Vec<FixtureTensor> {
    vec![
        FixtureTensor {
            name: format!("{MODULE}.weight"),
            dtype: DType::F8E4M3,
            shape: vec![ROWS, COLS],
            data: (0..ROWS * COLS).map(nvfp4_scale).collect(),
        },
        FixtureTensor {
            name: format!("{MODULE}.weight_scale"),
            dtype: DType::U8,
            shape: vec![ROWS, COLS / 32],
            data: (0..ROWS * COLS / 32)
                .map(|k| 100 + (k * 7 % 40) as u8)
                .collect(),
        },
        FixtureTensor::patterned("model.norm.weight", DType::BF16, &[COLS], 3),
    ]
}

#[test]
fn mxfp8_is_multiplied_out_by_its_power_of_two_exponents() {
    let c = case("mxfp8-quantized", &mut mxfp8_tensors, |_| {});
    let o = common::save(&c.src, &c.out, &["--dtype", "bfloat16"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = read_bf16(&c.out, &format!("{MODULE}.weight"));
    let tensors = mxfp8_tensors();
    for r in 0..ROWS {
        for col in 0..COLS {
            let i = (r * COLS + col) as usize;
            let exponent = tensors[1].data[(r * COLS / 32 + col / 32) as usize];
            let want = half::bf16::from_f32(
                e4m3(tensors[0].data[i]) * 2f32.powi(i32::from(exponent) - 127),
            );
            assert_eq!(got[i].to_bits(), want.to_bits(), "element [{r}, {col}]");
        }
    }
}

/// FP8 with a float scale per group of 32 values of a row (compressed-tensors'
/// `float-quantized`, `group` strategy): each value the code's value times its group's
/// bfloat16 scale, rounded to bfloat16 (the dtype compressed-tensors multiplies in); a
/// group holding a NaN code keeps its NaN, and its other values are those values too.
/// (tests/python/compressed_fp8.py checks the same against compressed-tensors.)
#[test]
fn fp8_groups_of_a_row_are_multiplied_out_by_their_scales() {
    let scale = |k: u64| half::bf16::from_f32(0.0013 + (k * 37 % 101) as f32 * 0.0007);
    let mut tensors = || {
        let mut codes: Vec<u8> = (0..ROWS * COLS).map(nvfp4_scale).collect();
        codes[70] = 0x7F; // NaN, in row 1's second group
        vec![
            FixtureTensor {
                name: format!("{MODULE}.weight"),
                dtype: DType::F8E4M3,
                shape: vec![ROWS, COLS],
                data: codes,
            },
            FixtureTensor {
                name: format!("{MODULE}.weight_scale"),
                dtype: DType::BF16,
                shape: vec![ROWS, COLS / 32],
                data: (0..ROWS * COLS / 32)
                    .flat_map(|k| scale(k).to_le_bytes())
                    .collect(),
            },
        ]
    };
    let codes = tensors()[0].data.clone();
    let c = case("float-quantized", &mut tensors, |_| {});
    let o = common::save(&c.src, &c.out, &["--dtype", "bfloat16"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = read_bf16(&c.out, &format!("{MODULE}.weight"));
    for r in 0..ROWS {
        for col in 0..COLS {
            let i = (r * COLS + col) as usize;
            let s = scale(r * COLS / 32 + col / 32).to_f32();
            let want = half::bf16::from_f32(e4m3(codes[i]) * s);
            if want.is_nan() {
                assert!(got[i].is_nan(), "element [{r}, {col}] is NaN");
                continue;
            }
            assert_eq!(got[i].to_bits(), want.to_bits(), "element [{r}, {col}]");
        }
    }
}

/// `--dtype bfloat16` is refused with a message that contains `needle`, and nothing
/// is written.
fn refused(c: &Case, needle: &str) {
    let o = common::save(&c.src, &c.out, &["--dtype", "bfloat16"]);
    common::assert_refused(&o, &c.out, "--dtype bfloat16", &[needle]);
}

fn set(tensors: &mut [FixtureTensor], suffix: &str, edit: impl FnOnce(&mut FixtureTensor)) {
    edit(
        tensors
            .iter_mut()
            .find(|t| t.name.ends_with(suffix))
            .expect("tensor"),
    );
}

#[test]
fn hostile_nvfp4_and_mxfp8_are_refused_by_name_with_nothing_written() {
    let nvfp4 = |edit: &dyn Fn(&mut Vec<FixtureTensor>)| {
        case("nvfp4-pack-quantized", &mut nvfp4_tensors, |t| edit(t))
    };
    refused(
        &nvfp4(&|t| set(t, ".weight_scale", |s| s.shape = vec![ROWS * 2, COLS / 32])),
        &format!(
            "has a `{MODULE}.weight_scale` of F8_E4M3 [12, 2], but its FP4 values need F8_E4M3 [6, 4]"
        ),
    );
    refused(
        &nvfp4(&|t| set(t, ".weight_scale", |s| s.data[5] = 0x7f)),
        &format!("the scales of `{MODULE}.weight_packed` hold NaN at element 5"),
    );
    refused(
        &nvfp4(&|t| {
            set(t, ".weight_global_scale", |s| {
                s.data = 0f32.to_le_bytes().to_vec();
            });
        }),
        &format!("the global scale of `{MODULE}.weight_packed` is 0"),
    );
    refused(
        &nvfp4(&|t| {
            t.push(FixtureTensor::patterned(
                &format!("{MODULE}.weight_zero_point"),
                DType::F8E4M3,
                &[ROWS, COLS / 16],
                1,
            ));
        }),
        "is NVFP4 quantized asymmetrically, which devmap does not dequantize",
    );
    refused(
        &nvfp4(&|t| t.retain(|t| !t.name.ends_with(".weight_global_scale"))),
        &format!("`{MODULE}.weight_global_scale` is missing beside it"),
    );
    let mxfp8 = |edit: &dyn Fn(&mut Vec<FixtureTensor>)| {
        case("mxfp8-quantized", &mut mxfp8_tensors, |t| edit(t))
    };
    // 0xFF is E8M0's NaN.
    refused(
        &mxfp8(&|t| set(t, ".weight_scale", |s| s.data[3] = 0xff)),
        &format!("the scales of `{MODULE}.weight` hold NaN at element 3"),
    );
    refused(
        &mxfp8(&|t| {
            set(t, ".weight_scale", |s| {
                s.shape = vec![ROWS, 3];
                s.data = vec![127; (ROWS * 3) as usize];
            });
        }),
        "[6, groups dividing 64]), not blocks",
    );
}
