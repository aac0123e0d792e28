//! What a quantized checkpoint's tensors are, read from config.json's
//! `quantization_config` and each tensor's neighbours: a quantized weight (its format,
//! its scale tensor, its shape and size once dequantized) or the scale of one. The
//! inspector, `inspect` and `--json` show it; the saver's recipes (`save::fp8`,
//! `save::mxfp4`) are what dequantizes.

use super::checkpoint::{Checkpoint, TensorId};
use crate::types::DType;

/// One tensor's part in a quantized checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantizedPart {
    /// A quantized weight.
    Weight {
        /// The format, in words: `fp8 e4m3, 128×128 blocks`, `mxfp4, 32-value groups`.
        format: String,
        /// The tensor holding its scales.
        scales: String,
        /// The name and shape a dequantizing save writes it under.
        dequantized_name: String,
        dequantized_shape: Vec<u64>,
    },
    /// The scales of the quantized weight `of` (part of it, not a weight of its own).
    Scales { of: String },
}

impl QuantizedPart {
    /// Bytes the weight takes once dequantized to `dtype` (0 for scales).
    pub fn dequantized_bytes(&self, dtype: DType) -> u64 {
        match self {
            QuantizedPart::Weight {
                dequantized_shape, ..
            } => dequantized_shape.iter().product::<u64>() * dtype.size(),
            QuantizedPart::Scales { .. } => 0,
        }
    }
}

/// The dtype a dequantized model is loaded in: config.json's, else bfloat16 (what the
/// FP8 and MXFP4 releases say).
pub fn dequantized_dtype(ckpt: &Checkpoint) -> DType {
    ckpt.config
        .torch_dtype
        .as_deref()
        .and_then(DType::from_torch_name)
        .filter(|d| matches!(d, DType::BF16 | DType::F16 | DType::F32))
        .unwrap_or(DType::BF16)
}

/// Tensor `id`'s part in the checkpoint's quantization, if it has one.
/// The values tensor `id` holds as a parameter of the model: its elements, but for a
/// quantized weight packed several to a stored element (MXFP4's `_blocks`: two 4-bit
/// values a byte) the values it dequantizes to.
pub fn values_of(ckpt: &Checkpoint, id: TensorId) -> u64 {
    let tensor = &ckpt.tensors()[id];
    if ckpt.config.quantization.is_none() {
        return tensor.numel();
    }
    match quantized_part(ckpt, id) {
        Some(QuantizedPart::Weight {
            dequantized_shape, ..
        }) => dequantized_shape.iter().product(),
        _ => tensor.numel(),
    }
}

pub fn quantized_part(ckpt: &Checkpoint, id: TensorId) -> Option<QuantizedPart> {
    let q = ckpt.config.quantization.as_ref()?;
    let tensor = &ckpt.tensors()[id];
    let name: &str = &tensor.name;
    match q.method.as_str() {
        "fp8" => {
            if let Some(weight) = name.strip_suffix("_scale_inv") {
                return ckpt.index_of(weight).map(|_| QuantizedPart::Scales {
                    of: weight.to_owned(),
                });
            }
            let scales = format!("{name}_scale_inv");
            let scale_id = ckpt.index_of(&scales)?;
            let (format, dequantized_shape) = match tensor.dtype {
                DType::F8E4M3 | DType::F8E5M2 => {
                    let kind = if tensor.dtype == DType::F8E4M3 {
                        "e4m3"
                    } else {
                        "e5m2"
                    };
                    let e8m0 = if ckpt.tensors()[scale_id].dtype.holds_e8m0_scales() {
                        ", e8m0 scales"
                    } else {
                        ""
                    };
                    (
                        format!("fp8 {kind}, {}×{} blocks{e8m0}", q.block.0, q.block.1),
                        tensor.shape.to_vec(),
                    )
                }
                // DeepSeek-V4's FP4-packed experts: two values a byte.
                DType::I8 => {
                    let mut shape = tensor.shape.to_vec();
                    *shape.last_mut()? *= 2;
                    ("fp4 e2m1 (packed), e8m0 scales".to_owned(), shape)
                }
                _ => return None,
            };
            Some(QuantizedPart::Weight {
                format,
                scales,
                dequantized_name: name.to_owned(),
                dequantized_shape,
            })
        }
        "compressed-tensors" if q.format.as_deref() == Some("nvfp4-pack-quantized") => {
            nvfp4_part(ckpt, name, tensor)
        }
        "compressed-tensors"
            if matches!(
                q.format.as_deref(),
                Some("float-quantized" | "mxfp8-quantized")
            ) =>
        {
            for companion in [".weight_scale", ".input_scale"] {
                if let Some(module) = name.strip_suffix(companion) {
                    let weight = format!("{module}.weight");
                    return ckpt
                        .index_of(&weight)
                        .map(|_| QuantizedPart::Scales { of: weight });
                }
            }
            let format = match tensor.dtype {
                DType::F8E4M3 => "fp8 e4m3",
                DType::F8E5M2 => "fp8 e5m2",
                _ => return None,
            };
            let module = name.strip_suffix(".weight")?;
            let scales = format!("{module}.weight_scale");
            let scale = ckpt.tensor(&scales)?;
            let per = match scale.shape.to_vec().as_slice() {
                [] | [1] | [1, 1] => "tensor".to_owned(),
                [_, 1] => "row".to_owned(),
                [_, groups] => format!(
                    "{} values of a row",
                    tensor.shape.iter().last().unwrap_or(0) / groups.max(&1)
                ),
                _ => "block".to_owned(),
            };
            Some(QuantizedPart::Weight {
                format: format!(
                    "{format}, compressed-tensors, a {} scale per {per}",
                    scale.dtype
                ),
                scales,
                dequantized_name: name.to_owned(),
                dequantized_shape: tensor.shape.to_vec(),
            })
        }
        "compressed-tensors" if q.format.as_deref() == Some("pack-quantized") => {
            packed_int_part(ckpt, q, name, tensor)
        }
        "gptq" | "awq" => gptq_part(ckpt, q, name, tensor),
        "modelopt" if q.format.as_deref() == Some("NVFP4") => modelopt_part(ckpt, name, tensor),
        "mxfp4" => {
            if let Some(base) = name.strip_suffix("_scales") {
                let blocks = format!("{base}_blocks");
                return ckpt
                    .index_of(&blocks)
                    .map(|_| QuantizedPart::Scales { of: blocks });
            }
            let base = name.strip_suffix("_blocks")?;
            let scales = format!("{base}_scales");
            ckpt.index_of(&scales)?;
            let dims: Vec<u64> = tensor.shape.to_vec();
            let &[experts, rows, groups, 16] = dims.as_slice() else {
                return None;
            };
            // Each expert's matrix transposed, as transformers loads it (and as
            // `save::mxfp4` writes it): 32 values per group.
            Some(QuantizedPart::Weight {
                format: "mxfp4, 32-value groups".to_owned(),
                scales,
                dequantized_name: base.to_owned(),
                dequantized_shape: vec![experts, groups * 32, rows],
            })
        }
        _ => None,
    }
}

/// A compressed-tensors `pack-quantized` tensor's part: `M.weight_packed` (I32
/// `[rows, words]`) is a weight of `[rows, cols]`, its scale, zero points and shape are
/// part of it. The columns come from the scales for groups (exact, as compressed-tensors
/// itself finds them); per row or per tensor, from the packed width (at most
/// `32 / bits − 1` more than stored: the exact count is in `weight_shape`'s data, which
/// a save reads).
fn packed_int_part(
    ckpt: &Checkpoint,
    q: &crate::formats::config::Quantization,
    name: &str,
    tensor: &crate::model::checkpoint::Tensor,
) -> Option<QuantizedPart> {
    if let Some(part) = packed_companion(
        ckpt,
        name,
        &[
            ".weight_scale",
            ".weight_zero_point",
            ".weight_shape",
            ".weight_g_idx",
        ],
    ) {
        return part;
    }
    let module = name.strip_suffix(".weight_packed")?;
    let [scheme] = q.int_weights.as_slice() else {
        return None;
    };
    let &[rows, words] = tensor.shape.to_vec().as_slice() else {
        return None;
    };
    let scales = format!("{module}.weight_scale");
    let scale = ckpt.tensor(&scales)?;
    let bits = scheme.num_bits.max(1);
    let cols = match (
        scheme.strategy.as_str(),
        scheme.group_size,
        scale.shape.to_vec().as_slice(),
    ) {
        ("group", Some(g), &[_, groups]) => groups * g,
        _ => words * 32 / bits,
    };
    let act_order = ckpt.tensor(&format!("{module}.weight_g_idx")).is_some();
    let grouping = match (scheme.strategy.as_str(), scheme.group_size) {
        ("group", Some(g)) if act_order => format!("groups of {g} in activation order (g_idx)"),
        ("group", Some(g)) => format!("groups of {g}"),
        ("channel", _) => "a scale per row".to_owned(),
        (other, _) => format!("a scale per {other}"),
    };
    Some(QuantizedPart::Weight {
        format: format!(
            "int{bits} packed (compressed-tensors), {grouping}, {}",
            if scheme.symmetric {
                "symmetric"
            } else {
                "with zero points"
            }
        ),
        scales,
        dequantized_name: format!("{module}.weight"),
        dequantized_shape: vec![rows, cols],
    })
}

/// A GPTQ or AWQ tensor's part: `M.qweight` (I32, the weight transposed and packed) is
/// a weight of `[out, in]`; `M.qzeros`, `M.scales` and `M.g_idx` are part of it.
fn gptq_part(
    ckpt: &Checkpoint,
    q: &crate::formats::config::Quantization,
    name: &str,
    tensor: &crate::model::checkpoint::Tensor,
) -> Option<QuantizedPart> {
    for companion in [".qzeros", ".scales", ".g_idx"] {
        if let Some(module) = name.strip_suffix(companion) {
            let weight = format!("{module}.qweight");
            return ckpt
                .index_of(&weight)
                .map(|_| QuantizedPart::Scales { of: weight });
        }
    }
    let module = name.strip_suffix(".qweight")?;
    let scheme = q.gptq.as_ref()?;
    let &[a, b] = tensor.shape.to_vec().as_slice() else {
        return None;
    };
    let per_word = 32 / scheme.bits.clamp(1, 32);
    let (inputs, outputs, method) = if q.method == "awq" {
        (a, b * per_word, "AWQ")
    } else {
        (a * per_word, b, "GPTQ")
    };
    let groups = match scheme.group_size {
        Some(g) => format!("groups of {g}"),
        None => "a scale per column".to_owned(),
    };
    Some(QuantizedPart::Weight {
        format: format!(
            "int{} {method} ({}), {groups}{}",
            scheme.bits,
            scheme.format,
            if scheme.desc_act {
                ", activation order"
            } else {
                ""
            }
        ),
        scales: format!("{module}.scales"),
        dequantized_name: format!("{module}.weight"),
        dequantized_shape: vec![outputs, inputs],
    })
}

/// A ModelOpt NVFP4 tensor's part: `M.weight` (U8 `[rows, cols/2]`) is a weight of
/// `[rows, cols]`; its `weight_scale`, `weight_scale_2` and `input_scale` are part of it.
fn modelopt_part(
    ckpt: &Checkpoint,
    name: &str,
    tensor: &crate::model::checkpoint::Tensor,
) -> Option<QuantizedPart> {
    let fp4 = |module: &str| {
        ckpt.tensor(&format!("{module}.weight"))
            .is_some_and(|w| w.dtype == DType::U8)
    };
    for companion in [".weight_scale", ".weight_scale_2", ".input_scale"] {
        if let Some(module) = name.strip_suffix(companion) {
            return fp4(module).then(|| QuantizedPart::Scales {
                of: format!("{module}.weight"),
            });
        }
    }
    let module = name.strip_suffix(".weight")?;
    let &[rows, half] = tensor.shape.to_vec().as_slice() else {
        return None;
    };
    (tensor.dtype == DType::U8 && ckpt.index_of(&format!("{module}.weight_scale")).is_some()).then(
        || QuantizedPart::Weight {
            format:
                "nvfp4 (ModelOpt: fp4 e2m1, an fp8 e4m3 scale per 16 values and weight_scale_2)"
                    .to_owned(),
            scales: format!("{module}.weight_scale"),
            dequantized_name: name.to_owned(),
            dequantized_shape: vec![rows, half * 2],
        },
    )
}

/// An `nvfp4-pack-quantized` tensor's part: `M.weight_packed` (U8 `[rows, cols/2]`) is a
/// weight of `[rows, cols]`; its scale and global scale are part of it.
fn nvfp4_part(
    ckpt: &Checkpoint,
    name: &str,
    tensor: &crate::model::checkpoint::Tensor,
) -> Option<QuantizedPart> {
    if let Some(part) = packed_companion(
        ckpt,
        name,
        &[
            ".weight_scale",
            ".weight_global_scale",
            ".input_global_scale",
        ],
    ) {
        return part;
    }
    let module = name.strip_suffix(".weight_packed")?;
    let &[rows, half] = tensor.shape.to_vec().as_slice() else {
        return None;
    };
    let scales = format!("{module}.weight_scale");
    ckpt.index_of(&scales)?;
    Some(QuantizedPart::Weight {
        format: "nvfp4 (fp4 e2m1, an fp8 e4m3 scale per 16 values and a global scale)".to_owned(),
        scales,
        dequantized_name: format!("{module}.weight"),
        dequantized_shape: vec![rows, half * 2],
    })
}

/// For a tensor named `M` + one of `companions`: `Some` of its part — the scales of
/// `M.weight_packed`, or nothing when there is no such weight; `None` for any other name.
#[allow(clippy::option_option)]
fn packed_companion(
    ckpt: &Checkpoint,
    name: &str,
    companions: &[&str],
) -> Option<Option<QuantizedPart>> {
    let module = companions.iter().find_map(|c| name.strip_suffix(c))?;
    let weight = format!("{module}.weight_packed");
    Some(
        ckpt.index_of(&weight)
            .map(|_| QuantizedPart::Scales { of: weight }),
    )
}
