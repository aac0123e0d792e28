//! compressed-tensors `pack-quantized` integer weights without Python: a checkpoint
//! packed here as compressed-tensors' `pack_to_int32` packs (value `i` at bit `i·bits`
//! of the row, plus `2^(bits−1)`; zero points packed down the rows) is written
//! dequantized — `(q − z) · s` in the scale's dtype — under the weight's own name, its
//! companions and `quantization_config` left out; and every hostile variant is refused by
//! name with nothing written. (tests/real/fp8_dequant.rs checks the values against
//! compressed-tensors and transformers themselves.)

mod common;

use std::path::{Path, PathBuf};

use common::stderr;
use devmap::fixtures::{FixtureTensor, pack_int32 as pack, write_json, write_safetensors};
use devmap::model::DType;

const ROWS: u64 = 40;
const COLS: u64 = 64;
const GROUP: u64 = 32;
const MODULE: &str = "model.layers.0.mlp.down_proj";

fn le32(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A quantized value of row `r`, column `c`, in `bits`.
fn q(r: u64, c: u64, bits: u32) -> i32 {
    let half = 1i64 << (bits - 1);
    ((r * r + r * 7 + c * 13 + c / 5) as i64 % (2 * half) - half) as i32
}

/// A zero point of row `r`, group `g`.
fn z(r: u64, g: u64, bits: u32) -> i32 {
    let half = 1i64 << (bits - 1);
    ((r * r / 3 + r + g * 5) as i64 % (2 * half) - half) as i32
}

/// A bfloat16 scale of row `r`, group `g`.
fn scale(r: u64, g: u64) -> f32 {
    half::bf16::from_f32(0.001 + (r * 2 + g) as f32 * 0.00037).to_f32()
}

struct Case {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    out: PathBuf,
}

/// A 4-bit asymmetric checkpoint in groups of 32, `[ROWS, COLS]`, bfloat16 scales; the
/// config's weights scheme is `scheme`, and `edit` may change the tensors.
fn packed_case(scheme: serde_json::Value, edit: impl FnOnce(&mut Vec<FixtureTensor>)) -> Case {
    packed_case_of((ROWS, COLS), scheme, edit)
}

/// [`packed_case`] of `[rows, cols]`.
fn packed_case_of(
    (rows, cols): (u64, u64),
    scheme: serde_json::Value,
    edit: impl FnOnce(&mut Vec<FixtureTensor>),
) -> Case {
    let bits = 4;
    let groups = cols / GROUP;
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let packed: Vec<u32> = (0..rows)
        .flat_map(|r| pack(&(0..cols).map(|c| q(r, c, bits)).collect::<Vec<_>>(), bits))
        .collect();
    // Zero points: column g of [⌈rows·bits/32⌉, groups] words holds rows 0.. of group g.
    let columns: Vec<Vec<u32>> = (0..groups)
        .map(|g| pack(&(0..rows).map(|r| z(r, g, bits)).collect::<Vec<_>>(), bits))
        .collect();
    let zero_rows = columns[0].len();
    let zeros: Vec<u32> = (0..zero_rows)
        .flat_map(|w| columns.iter().map(move |col| col[w]))
        .collect();
    let scales: Vec<u8> = (0..rows)
        .flat_map(|r| (0..groups).map(move |g| half::bf16::from_f32(scale(r, g))))
        .flat_map(half::bf16::to_le_bytes)
        .collect();
    let mut tensors = vec![
        FixtureTensor {
            name: format!("{MODULE}.weight_packed"),
            dtype: DType::I32,
            shape: vec![rows, (cols * u64::from(bits)).div_ceil(32)],
            data: le32(&packed),
        },
        FixtureTensor {
            name: format!("{MODULE}.weight_scale"),
            dtype: DType::BF16,
            shape: vec![rows, groups],
            data: scales,
        },
        FixtureTensor {
            name: format!("{MODULE}.weight_zero_point"),
            dtype: DType::I32,
            shape: vec![zero_rows as u64, groups],
            data: le32(&zeros),
        },
        FixtureTensor {
            name: format!("{MODULE}.weight_shape"),
            dtype: DType::I64,
            shape: vec![2],
            data: [rows as i64, cols as i64]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        },
        FixtureTensor::patterned("model.norm.weight", DType::BF16, &[cols], 3),
    ];
    edit(&mut tensors);
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    write_safetensors(&src.join("model.safetensors"), &refs).expect("weights");
    write_json(
        &src.join("config.json"),
        &serde_json::json!({
            "architectures": ["ToyForCausalLM"],
            "dtype": "bfloat16",
            "quantization_config": {
                "quant_method": "compressed-tensors", "format": "pack-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": scheme}},
            },
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

fn int4_groups() -> serde_json::Value {
    serde_json::json!({"num_bits": 4, "type": "int", "strategy": "group", "group_size": GROUP, "symmetric": false})
}

fn read(out: &Path) -> safetensors::SafeTensors<'static> {
    let bytes = std::fs::read(out.join("model.safetensors")).expect("written");
    safetensors::SafeTensors::deserialize(Box::leak(bytes.into_boxed_slice())).expect("reads")
}

#[test]
fn packed_integers_are_written_as_the_weight_they_dequantize_to() {
    check_values(ROWS, COLS);
}

/// A weight of several bands (32 rows of 65,536 columns a band: the zero points' words
/// of each band start where the last one's ended), and a last band cut short.
#[test]
fn a_weight_of_several_bands_dequantizes_the_same() {
    check_values(70, 1 << 16);
}

fn check_values(rows: u64, cols: u64) {
    let case = packed_case_of((rows, cols), int4_groups(), |_| {});
    for (dtype, name) in [
        (safetensors::Dtype::BF16, "bfloat16"),
        (safetensors::Dtype::F32, "float32"),
    ] {
        let out = case.out.with_extension(name);
        let o = common::save(&case.src, &out, &["--dtype", name]);
        assert!(o.status.success(), "{}", stderr(&o));
        let st = read(&out);
        let mut names = st.names();
        names.sort_unstable();
        assert_eq!(
            names,
            [&format!("{MODULE}.weight"), "model.norm.weight"],
            "the companions are left out"
        );
        let w = st.tensor(&format!("{MODULE}.weight")).expect("weight");
        assert_eq!(
            (w.dtype(), w.shape()),
            (dtype, &[rows as usize, cols as usize][..])
        );
        for r in 0..rows {
            for c in 0..cols {
                let g = c / GROUP;
                // In bfloat16, the scale's dtype, then widened.
                let want = half::bf16::from_f32((q(r, c, 4) - z(r, g, 4)) as f32 * scale(r, g));
                let i = (r * cols + c) as usize;
                let got = match dtype {
                    safetensors::Dtype::BF16 => {
                        half::bf16::from_le_bytes([w.data()[2 * i], w.data()[2 * i + 1]])
                    }
                    _ => half::bf16::from_f32(f32::from_le_bytes(
                        w.data()[4 * i..4 * i + 4].try_into().expect("4 bytes"),
                    )),
                };
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "element [{r}, {c}] in {name}"
                );
            }
        }
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("config.json")).expect("config"))
                .expect("json");
        assert!(config.get("quantization_config").is_none());
    }
}

/// `--dtype bfloat16` is refused with a message that contains `needle`, and nothing
/// is written.
fn refused(case: &Case, needle: &str) {
    let o = common::save(&case.src, &case.out, &["--dtype", "bfloat16"]);
    assert!(!o.status.success(), "saved although it should refuse");
    let err = stderr(&o);
    assert!(err.contains(needle), "wanted {needle:?} in: {err}");
    assert!(!case.out.exists(), "something was written");
}

fn replace(tensors: &mut [FixtureTensor], suffix: &str, with: FixtureTensor) {
    let t = tensors
        .iter_mut()
        .find(|t| t.name.ends_with(suffix))
        .expect("tensor");
    *t = with;
}

#[test]
fn hostile_packed_integers_are_refused_by_name_with_nothing_written() {
    // Scales of the wrong shape.
    refused(
        &packed_case(int4_groups(), |t| {
            replace(
                t,
                ".weight_scale",
                FixtureTensor::patterned(
                    &format!("{MODULE}.weight_scale"),
                    DType::BF16,
                    &[ROWS, 3],
                    1,
                ),
            );
        }),
        &format!(
            "`{MODULE}.weight_packed` has a `{MODULE}.weight_scale` of shape [40, 3], but its scheme needs [40, 2]"
        ),
    );
    // A group size that does not divide the columns.
    let mut scheme = int4_groups();
    scheme["group_size"] = 48.into();
    refused(
        &packed_case(scheme, |_| {}),
        "has 64 columns, which the group size 48 does not divide",
    );
    // Packed widths that disagree with the config's num_bits.
    let mut scheme = int4_groups();
    scheme["num_bits"] = 8.into();
    refused(
        &packed_case(scheme, |_| {}),
        "packs 64 columns into 8 I32 words a row, but 64 values of 8 bits (the config's num_bits) take 16",
    );
    // A shape that disagrees with the packed rows.
    refused(
        &packed_case(int4_groups(), |t| {
            replace(
                t,
                ".weight_shape",
                FixtureTensor {
                    name: format!("{MODULE}.weight_shape"),
                    dtype: DType::I64,
                    shape: vec![2],
                    data: [41i64, 64].iter().flat_map(|v| v.to_le_bytes()).collect(),
                },
            );
        }),
        "has a `model.layers.0.mlp.down_proj.weight_shape` of [41, 64], but it holds 40 packed rows",
    );
    // A NaN scale: found while streaming, the save discarded.
    refused(
        &packed_case(int4_groups(), |t| {
            let s = t
                .iter_mut()
                .find(|t| t.name.ends_with(".weight_scale"))
                .expect("scale");
            s.data[6..8].copy_from_slice(&half::bf16::NAN.to_le_bytes());
        }),
        &format!("the scales of `{MODULE}.weight_packed` hold NaN at element 3"),
    );
    // Zero points under a symmetric scheme, and none under an asymmetric one.
    let mut scheme = int4_groups();
    scheme["symmetric"] = true.into();
    refused(
        &packed_case(scheme, |_| {}),
        "the config's scheme is symmetric (no zero points)",
    );
    refused(
        &packed_case(int4_groups(), |t| {
            t.retain(|t| !t.name.ends_with(".weight_zero_point"));
        }),
        &format!(
            "is quantized asymmetrically, but there is no `{MODULE}.weight_zero_point` beside it"
        ),
    );
    // Activation-order groups (g_idx), an unknown strategy, mixed schemes, an unknown
    // format inside compressed-tensors.
    refused(
        &packed_case(int4_groups(), |t| {
            t.push(FixtureTensor::patterned(
                &format!("{MODULE}.weight_g_idx"),
                DType::I32,
                &[COLS],
                2,
            ));
        }),
        "is an activation-order group index",
    );
    let mut scheme = int4_groups();
    scheme["strategy"] = "block".into();
    refused(
        &packed_case(scheme, |_| {}),
        "with the `block` strategy, which devmap does not dequantize",
    );
    let case = packed_case(int4_groups(), |_| {});
    let mut two = int4_groups();
    two["num_bits"] = 8.into();
    write_json(
        &case.src.join("config.json"),
        &serde_json::json!({"quantization_config": {
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"a": {"weights": int4_groups()}, "b": {"weights": two}},
        }}),
    )
    .expect("config");
    refused(
        &case,
        "with 2 different integer schemes in its config groups",
    );
    let case = packed_case(int4_groups(), |_| {});
    write_json(
        &case.src.join("config.json"),
        &serde_json::json!({"quantization_config": {"quant_method": "compressed-tensors", "format": "marlin-24"}}),
    )
    .expect("config");
    refused(
        &case,
        "compressed-tensors in the `marlin-24` format, which devmap does not dequantize",
    );
}

#[test]
fn inspect_shows_packed_integers_as_the_weights_they_dequantize_to() {
    let case = packed_case(int4_groups(), |_| {});
    let o = common::devmap(&["inspect", common::arg(&case.src), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&common::stdout(&o)).expect("json");
    let tensor = |name: String| {
        report["tensors"]
            .as_array()
            .expect("tensors")
            .iter()
            .find(|t| t["name"] == name.as_str())
            .cloned()
            .expect("listed")
    };
    let packed = tensor(format!("{MODULE}.weight_packed"));
    assert_eq!(
        packed["quantized"]["format"],
        "int4 packed (compressed-tensors), groups of 32, with zero points"
    );
    assert_eq!(
        packed["quantized"]["dequantized_name"],
        format!("{MODULE}.weight")
    );
    assert_eq!(
        packed["quantized"]["dequantized_shape"],
        serde_json::json!([ROWS, COLS])
    );
    assert_eq!(packed["quantized"]["dequantized_bytes"], ROWS * COLS * 2);
    for companion in ["weight_scale", "weight_zero_point", "weight_shape"] {
        assert_eq!(
            tensor(format!("{MODULE}.{companion}"))["quantized"]["scales_of"],
            format!("{MODULE}.weight_packed")
        );
    }
    let text = common::devmap(&["inspect", common::arg(&case.src)]);
    assert!(
        common::stdout(&text).contains(
            "quantized: compressed-tensors pack-quantized: 1 quantized weight with its scales"
        ),
        "{}",
        common::stdout(&text)
    );
}
