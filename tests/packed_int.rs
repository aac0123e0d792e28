//! compressed-tensors `pack-quantized` integer weights without Python: a checkpoint
//! packed here as compressed-tensors' `pack_to_int32` packs (value `i` at bit `i·bits`
//! of the row, plus `2^(bits−1)`; zero points packed down the rows) is written
//! dequantized — `(q − z) · s` in the scale's dtype — under the weight's own name, its
//! companions and `quantization_config` left out; and every hostile variant is refused by
//! name with nothing written. (tests/real/fp8_dequant.rs checks the values against
//! compressed-tensors and transformers themselves.) The same for a GPTQ checkpoint,
//! packed here as GPTQModel packs it.

mod common;

use std::path::{Path, PathBuf};

use common::stderr;
use devmap::fixtures::{FixtureTensor, pack_int32 as pack, write_json, write_safetensors};
use devmap::types::DType;

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
    check_values(ROWS, COLS, None);
}

/// A weight of several bands (32 rows of 65,536 columns a band: the zero points' words
/// of each band start where the last one's ended), and a last band cut short.
#[test]
fn a_weight_of_several_bands_dequantizes_the_same() {
    check_values(70, 1 << 16, None);
}

/// Activation order (`actorder: group`): column `c` takes the scale and zero point of
/// group `g_idx[c]`, as compressed-tensors 0.18 computes it (it sorts the columns by
/// group and cuts them into runs of the group size: the same where each group has that
/// many columns). Here the columns are dealt to the groups by a stride through them, so
/// every group's columns are scattered across the row.
#[test]
fn activation_order_columns_take_their_g_idx_group() {
    let cols = 4 * GROUP;
    let mut g_idx = vec![0u64; cols as usize];
    for i in 0..cols {
        g_idx[((i * 37) % cols) as usize] = i / GROUP;
    }
    assert!(
        g_idx
            .iter()
            .enumerate()
            .any(|(c, &g)| g != c as u64 / GROUP),
        "the grouping differs from column order"
    );
    check_values(ROWS, cols, Some(g_idx.clone()));
    let case = packed_case_of((ROWS, cols), act_order_groups(), |t| {
        t.push(g_idx_tensor(
            &g_idx.iter().map(|&g| g as i64).collect::<Vec<_>>(),
        ));
    });
    let o = common::devmap(&["inspect", common::arg(&case.src), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&common::stdout(&o)).expect("json");
    let packed = report["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .find(|t| t["name"] == format!("{MODULE}.weight_packed").as_str())
        .cloned()
        .expect("listed");
    assert_eq!(
        packed["quantized"]["format"],
        "int4 packed (compressed-tensors), groups of 32 in activation order (g_idx), with zero points"
    );
    // Over several bands too (each band's tables made per row).
    let cols = 1 << 15;
    let g_idx: Vec<u64> = (0..cols).map(|c| c % (cols / GROUP)).collect();
    check_values(70, cols, Some(g_idx));
}

/// A tensor `M.weight_g_idx` of `groups` (I32 `[cols]`).
fn g_idx_tensor(groups: &[i64]) -> FixtureTensor {
    FixtureTensor {
        name: format!("{MODULE}.weight_g_idx"),
        dtype: DType::I32,
        shape: vec![groups.len() as u64],
        data: groups
            .iter()
            .flat_map(|&g| (g as i32).to_le_bytes())
            .collect(),
    }
}

fn act_order_groups() -> serde_json::Value {
    let mut scheme = int4_groups();
    scheme["actorder"] = "group".into();
    scheme
}

/// Columns `c` in group `of(c)` where `g_idx` gives them (activation order).
fn check_values(rows: u64, cols: u64, g_idx: Option<Vec<u64>>) {
    let scheme = if g_idx.is_some() {
        act_order_groups()
    } else {
        int4_groups()
    };
    let group_of = |c: u64| g_idx.as_ref().map_or(c / GROUP, |of| of[c as usize]);
    let case = packed_case_of((rows, cols), scheme, |t| {
        if let Some(of) = &g_idx {
            t.push(g_idx_tensor(
                &of.iter().map(|&g| g as i64).collect::<Vec<_>>(),
            ));
        }
    });
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
                let g = group_of(c);
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
    common::assert_refused(&o, &case.out, "--dtype bfloat16", &[needle]);
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
    // An unknown strategy, mixed schemes, an unknown format inside compressed-tensors.
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

/// Activation-order group indices that compressed-tensors would read otherwise, or not
/// at all, are refused by name with nothing written.
#[test]
fn hostile_activation_order_groups_are_refused_by_name() {
    let groups = COLS / GROUP;
    let interleaved: Vec<i64> = (0..COLS as i64).map(|c| c % groups as i64).collect();
    // A g_idx the config does not ask for (compressed-tensors would leave it unread).
    refused(
        &packed_case(int4_groups(), |t| t.push(g_idx_tensor(&interleaved))),
        &format!(
            "`{MODULE}.weight_g_idx` is an activation-order group index of `{MODULE}.weight_packed`, but the config's scheme has no `actorder: group`"
        ),
    );
    // Activation order without the g_idx.
    refused(
        &packed_case(act_order_groups(), |_| {}),
        &format!("there is no `{MODULE}.weight_g_idx` beside it"),
    );
    // A g_idx of the wrong length or dtype.
    refused(
        &packed_case(act_order_groups(), |t| {
            t.push(g_idx_tensor(&interleaved[..COLS as usize - 1]));
        }),
        "but its 64 columns need I32 [64]",
    );
    // A group out of range (found while streaming, the save discarded).
    let mut out_of_range = interleaved.clone();
    out_of_range[5] = groups as i64;
    refused(
        &packed_case(act_order_groups(), |t| t.push(g_idx_tensor(&out_of_range))),
        &format!(
            "the g_idx of `{MODULE}.weight_packed` gives column 5 group 2, outside the 2 stored"
        ),
    );
    // Groups of unequal size: compressed-tensors' readings would differ.
    let mut uneven = interleaved.clone();
    uneven[1] = 0;
    refused(
        &packed_case(act_order_groups(), |t| t.push(g_idx_tensor(&uneven))),
        "puts 33 columns in group 0, not the group size 32",
    );
    // "Not set" (−1) mixed with groups.
    let mut mixed = interleaved.clone();
    mixed[3] = -1;
    refused(
        &packed_case(act_order_groups(), |t| t.push(g_idx_tensor(&mixed))),
        "gives column 3 group -1",
    );
    // Activation order with a strategy compressed-tensors does not order by group.
    let mut scheme = act_order_groups();
    scheme["strategy"] = "channel".into();
    refused(
        &packed_case(scheme, |t| t.push(g_idx_tensor(&interleaved))),
        "(`actorder: group`) but the `channel` strategy",
    );
}

/// compressed-tensors' "not set" g_idx (all −1) is column order, as its `dequantize`
/// reads it: the same weight as without one.
#[test]
fn an_unset_g_idx_is_column_order() {
    let plain = packed_case(int4_groups(), |_| {});
    let unset = packed_case(act_order_groups(), |t| {
        t.push(g_idx_tensor(&vec![-1; COLS as usize]));
    });
    for case in [&plain, &unset] {
        let o = common::save(&case.src, &case.out, &["--dtype", "bfloat16"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let weight = |case: &Case| {
        read(&case.out)
            .tensor(&format!("{MODULE}.weight"))
            .expect("weight")
            .data()
            .to_vec()
    };
    assert_eq!(weight(&unset), weight(&plain));
    assert!(
        read(&unset.out)
            .names()
            .iter()
            .all(|n| !n.ends_with("g_idx"))
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

/// A GPTQ v2 checkpoint packed here (4 bits, `[in/8, out]` words packed down the input
/// rows, zero points along the columns, float16 scales, a `g_idx` that interleaves the
/// rows' groups): written as `M.weight` `[out, in]`, `(q − z) · s` rounded to float16 then
/// widened, its companions, `quantization_config` and `quantize_config.json` left out; a
/// `g_idx` out of range is refused by name, nothing written. (tests/real/fp8_dequant.rs
/// checks GPTQ and AWQ against their references.)
#[test]
fn gptq_weights_are_written_transposed_and_dequantized() {
    let (inputs, outputs, groups) = (32u64, 16u64, 2u64);
    let code = |i: u64, o: u64| ((i * 7 + o * 3 + i / 5) % 16) as u32;
    let zero = |g: u64, o: u64| ((g * 5 + o * 7) % 16) as u32;
    let scale = |g: u64, o: u64| half::f16::from_f32(0.02 + (g * 16 + o) as f32 * 0.0041);
    // Row i's group alternates: activation order.
    let group_of = |i: u64| (i % 2) as u32;
    let build = |g_idx: Vec<u32>| {
        let tmp = tempfile::tempdir().expect("tmp");
        let src = tmp.path().join("src");
        std::fs::create_dir_all(&src).expect("mkdir");
        let qweight: Vec<u32> = (0..inputs / 8)
            .flat_map(|r| {
                (0..outputs).map(move |o| (0..8).fold(0, |w, k| w | code(r * 8 + k, o) << (4 * k)))
            })
            .collect();
        let qzeros: Vec<u32> = (0..groups)
            .flat_map(|g| {
                (0..outputs / 8)
                    .map(move |w| (0..8).fold(0, |acc, k| acc | zero(g, w * 8 + k) << (4 * k)))
            })
            .collect();
        let scales: Vec<u8> = (0..groups)
            .flat_map(|g| (0..outputs).map(move |o| scale(g, o)))
            .flat_map(half::f16::to_le_bytes)
            .collect();
        let m = "model.layers.0.mlp.down_proj";
        let tensors = [
            FixtureTensor {
                name: format!("{m}.qweight"),
                dtype: DType::I32,
                shape: vec![inputs / 8, outputs],
                data: le32(&qweight),
            },
            FixtureTensor {
                name: format!("{m}.qzeros"),
                dtype: DType::I32,
                shape: vec![groups, outputs / 8],
                data: le32(&qzeros),
            },
            FixtureTensor {
                name: format!("{m}.scales"),
                dtype: DType::F16,
                shape: vec![groups, outputs],
                data: scales,
            },
            FixtureTensor {
                name: format!("{m}.g_idx"),
                dtype: DType::I32,
                shape: vec![inputs],
                data: le32(&g_idx),
            },
        ];
        write_safetensors(
            &src.join("model.safetensors"),
            &tensors.iter().collect::<Vec<_>>(),
        )
        .expect("weights");
        write_json(
            &src.join("config.json"),
            &serde_json::json!({
                "architectures": ["ToyForCausalLM"],
                "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 16,
                    "desc_act": true, "sym": false, "checkpoint_format": "gptq_v2"},
            }),
        )
        .expect("config");
        write_json(
            &src.join("quantize_config.json"),
            &serde_json::json!({"bits": 4}),
        )
        .expect("side file");
        let out = tmp.path().join("out");
        Case {
            _tmp: tmp,
            src,
            out,
        }
    };
    let case = build((0..inputs).map(group_of).collect());
    let o = common::devmap(&[
        "save",
        common::arg(&case.src),
        "--out",
        common::arg(&case.out),
        "--dtype",
        "float32",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let st = read(&case.out);
    let w = st
        .tensor("model.layers.0.mlp.down_proj.weight")
        .expect("written");
    assert_eq!(w.shape(), [outputs as usize, inputs as usize]);
    let got: Vec<f32> = w
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    for o in 0..outputs {
        for i in 0..inputs {
            let g = u64::from(group_of(i));
            let want = half::f16::from_f32(
                (code(i, o) as i32 - zero(g, o) as i32) as f32 * scale(g, o).to_f32(),
            )
            .to_f32();
            assert_eq!(
                got[(o * inputs + i) as usize].to_bits(),
                want.to_bits(),
                "[{o}, {i}]"
            );
        }
    }
    assert_eq!(st.names().len(), 1, "{:?}", st.names());
    assert!(!case.out.join("quantize_config.json").exists());
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(case.out.join("config.json")).expect("config"),
    )
    .expect("json");
    assert!(config.get("quantization_config").is_none(), "{config}");
    // A g_idx naming a group that has no scales.
    let mut bad: Vec<u32> = (0..inputs).map(group_of).collect();
    bad[5] = 7;
    let case = build(bad);
    refused(&case, "gives input row 5 group 7, outside the 2 stored");
}
