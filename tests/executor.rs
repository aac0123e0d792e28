//! The one recipe executor (`save::execute`) runs every recipe into both of its sinks:
//! a shard file (the writer) and a digest stream (`verify --against`). Over random
//! models whose recipes cover copies, casts, LoRA merges, FP8 dequantization with and
//! without a merge, MXFP4 experts and compressed-tensors packed integers, every tensor the save wrote hashes to what the
//! streamed recipe hashes to — the two sinks never disagree.

use std::path::Path;

use devmap::fixtures::{FixtureTensor, pack_int32, write_json, write_safetensors};
use devmap::model::{LoadOptions, load};
use devmap::save::{Reporter, SaveOptions, prepare, write};
use devmap::types::DType;
use devmap::verify::{Kind, Progress, SaveReference, Severity, verify};
use proptest::prelude::*;

/// The dtype a save is asked for (`None`: keep).
fn save_dtype() -> impl Strategy<Value = Option<DType>> {
    prop::sample::select(vec![
        None,
        Some(DType::F32),
        Some(DType::F16),
        Some(DType::BF16),
    ])
}

/// What the model holds besides its float tensors.
#[derive(Debug, Clone)]
enum Quantized {
    None,
    /// An FP8 weight `[rows, cols]` in blocks, with the block scales.
    Fp8 {
        rows: u64,
        cols: u64,
        block: (u64, u64),
    },
    /// compressed-tensors INT4 `[rows, groups·32]` with a scale per group of 32,
    /// symmetric or with zero points.
    PackedInt {
        rows: u64,
        groups: u64,
        symmetric: bool,
    },
    /// compressed-tensors NVFP4 `[rows, groups·16]`.
    Nvfp4 {
        rows: u64,
        groups: u64,
    },
    /// MXFP4 experts `[experts, rows, groups, 16]`.
    Mxfp4 {
        experts: u64,
        rows: u64,
        groups: u64,
    },
}

fn quantized() -> impl Strategy<Value = Quantized> {
    prop_oneof![
        Just(Quantized::None),
        (1u64..20, 1u64..20, 1u64..6, 1u64..6).prop_map(|(rows, cols, br, bc)| Quantized::Fp8 {
            rows,
            cols,
            block: (br, bc)
        }),
        (1u64..40, 1u64..4, any::<bool>()).prop_map(|(rows, groups, symmetric)| {
            Quantized::PackedInt {
                rows,
                groups,
                symmetric,
            }
        }),
        (1u64..40, 1u64..4).prop_map(|(rows, groups)| Quantized::Nvfp4 { rows, groups }),
        (1u64..3, 1u64..5, 1u64..3).prop_map(|(experts, rows, groups)| Quantized::Mxfp4 {
            experts,
            rows,
            groups
        }),
    ]
}

/// A LoRA adapter on `model.proj.weight` (`[out, in]`), rank `r`.
fn write_adapter(dir: &Path, (out, inp, r): (u64, u64, u64)) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let a = FixtureTensor::patterned(
        "base_model.model.model.proj.lora_A.weight",
        DType::F32,
        &[r, inp],
        41,
    );
    let b = FixtureTensor::patterned(
        "base_model.model.model.proj.lora_B.weight",
        DType::F32,
        &[out, r],
        42,
    );
    // Small finite values: patterned bytes may be any float, NaN included.
    let small = |t: &FixtureTensor| FixtureTensor {
        data: t
            .data
            .chunks_exact(4)
            .enumerate()
            .flat_map(|(k, _)| (((k * 31) % 17) as f32 / 17.0 - 0.5).to_le_bytes())
            .collect(),
        ..t.clone()
    };
    write_safetensors(
        &dir.join("adapter_model.safetensors"),
        &[&small(&a), &small(&b)],
    )
    .expect("adapter");
    write_json(
        &dir.join("adapter_config.json"),
        &serde_json::json!({"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": ["proj"]}),
    )
    .expect("adapter config");
}

/// Finite float bytes of `dtype` for `n` elements (patterned bytes can be NaN).
fn finite(dtype: DType, n: u64, seed: u64) -> Vec<u8> {
    let values = (0..n).map(|k| ((k * 7 + seed * 13) % 23) as f32 / 23.0 - 0.4);
    match dtype {
        DType::F32 => values.flat_map(f32::to_le_bytes).collect(),
        DType::F16 => values
            .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => values
            .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn every_recipe_writes_what_it_streams(
        float_dtype in prop::sample::select(vec![DType::F32, DType::F16, DType::BF16]),
        (out, inp) in (1u64..24, 1u64..24),
        rank in 1u64..4,
        merge in any::<bool>(),
        quant in quantized(),
        to in save_dtype(),
        jobs in 1usize..3,
    ) {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("m");
        std::fs::create_dir(&dir).expect("mkdir");
        let mut tensors = vec![
            FixtureTensor { name: "model.proj.weight".into(), dtype: float_dtype, shape: vec![out, inp], data: finite(float_dtype, out * inp, 1) },
            FixtureTensor { name: "model.norm.weight".into(), dtype: float_dtype, shape: vec![inp], data: finite(float_dtype, inp, 2) },
            FixtureTensor::patterned("model.positions", DType::I64, &[3], 3),
        ];
        let mut config = serde_json::json!({"architectures": ["ToyForCausalLM"], "dtype": "bfloat16"});
        match quant {
            Quantized::None => {}
            Quantized::Fp8 { rows, cols, block } => {
                let grid = rows.div_ceil(block.0) * cols.div_ceil(block.1);
                tensors.push(FixtureTensor {
                    name: "model.q.weight".into(),
                    dtype: DType::F8E4M3,
                    shape: vec![rows, cols],
                    // Every e4m3 pattern but the NaNs (0x7f, 0xff).
                    data: (0..rows * cols).map(|i| { let b = (i * 37 % 256) as u8; if b & 0x7f == 0x7f { 0x3c } else { b } }).collect(),
                });
                tensors.push(FixtureTensor {
                    name: "model.q.weight_scale_inv".into(),
                    dtype: DType::F32,
                    shape: vec![rows.div_ceil(block.0), cols.div_ceil(block.1)],
                    data: (0..grid).flat_map(|k| (0.25 + k as f32 * 0.5).to_le_bytes()).collect(),
                });
                config["quantization_config"] = serde_json::json!({"quant_method": "fp8", "weight_block_size": [block.0, block.1]});
            }
            Quantized::PackedInt { rows, groups, symmetric } => {
                let cols = groups * 32;
                let words = |v: Vec<u32>| v.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
                let packed: Vec<u32> = (0..rows)
                    .flat_map(|r| pack_int32(&(0..cols).map(|c| ((r * 5 + c * 3) % 16) as i32 - 8).collect::<Vec<_>>(), 4))
                    .collect();
                tensors.push(FixtureTensor { name: "model.q.weight_packed".into(), dtype: DType::I32, shape: vec![rows, cols / 8], data: words(packed) });
                tensors.push(FixtureTensor {
                    name: "model.q.weight_scale".into(),
                    dtype: DType::BF16,
                    shape: vec![rows, groups],
                    data: (0..rows * groups).flat_map(|k| half::bf16::from_f32(0.01 + k as f32 * 0.003).to_le_bytes()).collect(),
                });
                tensors.push(FixtureTensor {
                    name: "model.q.weight_shape".into(),
                    dtype: DType::I64,
                    shape: vec![2],
                    data: [rows as i64, cols as i64].iter().flat_map(|v| v.to_le_bytes()).collect(),
                });
                if !symmetric {
                    let columns: Vec<Vec<u32>> = (0..groups)
                        .map(|g| pack_int32(&(0..rows).map(|r| ((r + g * 7) % 16) as i32 - 8).collect::<Vec<_>>(), 4))
                        .collect();
                    let zero_rows = columns[0].len();
                    let zeros: Vec<u32> = (0..zero_rows).flat_map(|w| columns.iter().map(move |c| c[w])).collect();
                    tensors.push(FixtureTensor { name: "model.q.weight_zero_point".into(), dtype: DType::I32, shape: vec![zero_rows as u64, groups], data: words(zeros) });
                }
                config["quantization_config"] = serde_json::json!({
                    "quant_method": "compressed-tensors", "format": "pack-quantized",
                    "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": symmetric}}},
                });
            }
            Quantized::Nvfp4 { rows, groups } => {
                let cols = groups * 16;
                tensors.push(FixtureTensor {
                    name: "model.q.weight_packed".into(),
                    dtype: DType::U8,
                    shape: vec![rows, cols / 2],
                    data: (0..rows * cols / 2).map(|i| (i * 73 % 256) as u8).collect(),
                });
                tensors.push(FixtureTensor {
                    name: "model.q.weight_scale".into(),
                    dtype: DType::F8E4M3,
                    shape: vec![rows, groups],
                    // Finite e4m3 patterns (0x7f and 0xff are NaN).
                    data: (0..rows * groups).map(|i| (i * 37 % 120) as u8).collect(),
                });
                tensors.push(FixtureTensor {
                    name: "model.q.weight_global_scale".into(),
                    dtype: DType::F32,
                    shape: vec![1],
                    data: 448.5f32.to_le_bytes().to_vec(),
                });
                config["quantization_config"] = serde_json::json!({
                    "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                });
            }
            Quantized::Mxfp4 { experts, rows, groups } => {
                tensors.push(FixtureTensor {
                    name: "model.experts.gate_up_proj_blocks".into(),
                    dtype: DType::U8,
                    shape: vec![experts, rows, groups, 16],
                    data: (0..experts * rows * groups * 16).map(|i| (i * 73 % 256) as u8).collect(),
                });
                tensors.push(FixtureTensor {
                    name: "model.experts.gate_up_proj_scales".into(),
                    dtype: DType::U8,
                    shape: vec![experts, rows, groups],
                    data: (0..experts * rows * groups).map(|i| 120 + (i % 9) as u8).collect(),
                });
                config["quantization_config"] = serde_json::json!({"quant_method": "mxfp4"});
            }
        }
        let refs: Vec<&FixtureTensor> = tensors.iter().collect();
        write_safetensors(&dir.join("model.safetensors"), &refs).expect("weights");
        write_json(&dir.join("config.json"), &config).expect("config");
        // A quantized checkpoint is dequantized only to a float dtype.
        let to = match quant {
            Quantized::None => to,
            _ => Some(to.unwrap_or(DType::BF16)),
        };

        let mut ckpt = load(&dir, &LoadOptions::default()).expect("load");
        if merge {
            let adapter = tmp.path().join("adapter");
            write_adapter(&adapter, (out, inp, rank));
            devmap::model::lora::apply_adapter_with(&mut ckpt, &adapter, false).expect("adapter");
        }
        let options = SaveOptions {
            max_shard_size: 700,
            jobs,
            dtype: match to {
                Some(d) => devmap::save::shards::DtypeChoice::To(d),
                None => devmap::save::shards::DtypeChoice::Keep,
            },
            ..SaveOptions::new(tmp.path().join("out"))
        };
        let plan = prepare(&ckpt, &options).expect("plan");
        let planned = plan.tensor_count();
        let cancel = std::sync::atomic::AtomicBool::new(false);
        write(&ckpt, &plan, &options, &cancel, &Reporter::new(None, &cancel)).expect("save");

        let expected = SaveReference::new(&ckpt, &options).expect("expected");
        let report = verify(&tmp.path().join("out"), Some(&expected), false, &Progress::default())
            .expect("verify");
        let differences: Vec<String> = report
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Difference && matches!(f.kind, Kind::Content | Kind::Unreadable))
            .map(|f| format!("{}: {}", f.subject, f.message))
            .collect();
        prop_assert!(differences.is_empty(), "the sinks disagree: {differences:?}");
        // Every tensor was hashed on both sides: none was skipped as unreadable.
        prop_assert_eq!(report.compared, planned);
    }
}
