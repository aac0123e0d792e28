//! Which tensors of a compressed-tensors `pack-quantized` (integers) or
//! `nvfp4-pack-quantized` checkpoint a save dequantizes, and what it refuses by name:
//! `M.weight_packed` becomes `M.weight` through `save::packed_int` or `save::nvfp4`, its
//! scale, zero points, global scale and shape are left out.

use super::dequantize::Dequantized;
use crate::formats::config::IntWeights;
use crate::model::checkpoint::{Checkpoint, TensorId};
use crate::save::execute::{Make, Quant, Read, Recipe};
use crate::save::nvfp4::{Nvfp4Convention, Nvfp4Layout};
use crate::save::packed_int::PackedIntLayout;
use crate::types::DType;

/// A checkpoint's one integer weight scheme, checked.
#[derive(Debug, Clone, Copy)]
pub(super) struct IntScheme {
    bits: u8,
    /// Columns per scale: the group size, 0 for `channel` (one per row, filled in per
    /// tensor), `None` for `tensor`.
    group: Option<u64>,
    symmetric: bool,
    /// `actorder: group` (or its alias `dynamic`): each column's group is stored in
    /// `M.weight_g_idx`.
    act_order: bool,
}

impl IntScheme {
    /// The scheme of `schemes` (config.json's config groups), or why devmap cannot
    /// dequantize them.
    pub(super) fn of(schemes: &[IntWeights]) -> Result<IntScheme, String> {
        let [w] = schemes else {
            return Err(if schemes.is_empty() {
                "compressed-tensors `pack-quantized`, but no config group has integer weights (`type: int`)".to_owned()
            } else {
                format!(
                    "compressed-tensors `pack-quantized` with {} different integer schemes in its config groups; devmap dequantizes a checkpoint of one scheme",
                    schemes.len()
                )
            });
        };
        let bits = u8::try_from(w.num_bits)
            .ok()
            .filter(|b| (1..=8).contains(b))
            .ok_or_else(|| {
                format!(
                    "compressed-tensors `pack-quantized` with num_bits {}; packed integers have 1 to 8 bits",
                    w.num_bits
                )
            })?;
        let group = match (w.strategy.as_str(), w.group_size) {
            ("group", Some(g)) if g > 0 => Some(g),
            ("group", _) => {
                return Err(
                    "compressed-tensors `pack-quantized` with the `group` strategy but no group_size"
                        .to_owned(),
                );
            }
            ("channel", _) => Some(0),
            ("tensor", _) if w.symmetric => None,
            ("tensor", _) => {
                return Err("compressed-tensors `pack-quantized` with one asymmetric scale per tensor, which devmap does not dequantize (it dequantizes group and channel scales, symmetric or not, and symmetric tensor scales)".to_owned());
            }
            (other, _) => {
                return Err(format!(
                    "compressed-tensors `pack-quantized` with the `{other}` strategy, which devmap does not dequantize (it dequantizes `group`, `channel` and `tensor`)"
                ));
            }
        };
        let act_order = matches!(w.actorder.as_deref(), Some("group" | "dynamic"));
        if act_order && w.strategy != "group" {
            return Err(format!(
                "compressed-tensors `pack-quantized` with activation-order groups (`actorder: {}`) but the `{}` strategy; compressed-tensors orders columns by group only with the `group` strategy",
                w.actorder.as_deref().unwrap_or_default(),
                w.strategy
            ));
        }
        Ok(IntScheme {
            bits,
            group,
            symmetric: w.symmetric,
            act_order,
        })
    }
}

/// What a compressed-tensors module keeps beside `weight_packed`.
const COMPANIONS: [&str; 8] = [
    ".weight_scale",
    ".weight_shape",
    ".weight_zero_point",
    ".weight_g_idx",
    ".weight_global_scale",
    ".input_scale",
    ".input_zero_point",
    ".input_global_scale",
];

/// What a tensor of a compressed-tensors packed checkpoint is.
enum PackedPart<'n> {
    /// `M.weight_packed`, of module `M`.
    Weight(&'n str),
    /// A companion (`.weight_scale`, …) of module `M`'s `weight_packed`.
    Companion(&'n str, &'static str),
    /// Anything else: planned as any other tensor.
    Other,
}

fn packed_part<'n>(ckpt: &Checkpoint, name: &'n str) -> PackedPart<'n> {
    if let Some(companion) = COMPANIONS.iter().find(|c| name.ends_with(*c)) {
        let module = &name[..name.len() - companion.len()];
        return if ckpt.index_of(&format!("{module}.weight_packed")).is_some() {
            PackedPart::Companion(module, companion)
        } else {
            PackedPart::Other
        };
    }
    name.strip_suffix(".weight_packed")
        .map_or(PackedPart::Other, PackedPart::Weight)
}

/// How a `pack-quantized` save treats tensor `id`.
pub(super) fn dequantized(
    ckpt: &Checkpoint,
    id: TensorId,
    scheme: IntScheme,
    to: DType,
) -> Result<Dequantized, String> {
    let tensor = &ckpt.tensors()[id];
    let module = match packed_part(ckpt, &tensor.name) {
        PackedPart::Weight(module) => module,
        PackedPart::Companion(module, ".weight_g_idx") if !scheme.act_order => {
            return Err(format!(
                "is an activation-order group index of `{module}.weight_packed`, but the config's scheme has no `actorder: group`: compressed-tensors would not read it, and devmap does not guess which grouping is meant"
            ));
        }
        PackedPart::Companion(..) => return Ok(Dequantized::Dropped),
        PackedPart::Other => return Ok(Dequantized::NotFp8),
    };
    let dims: Vec<u64> = tensor.shape.to_vec();
    let (DType::I32, &[rows, packed_cols]) = (tensor.dtype, dims.as_slice()) else {
        return Err(format!(
            "is {} {dims:?}; packed integer weights are I32 matrices [rows, words]",
            tensor.dtype
        ));
    };
    let scale_name = format!("{module}.weight_scale");
    let Some(scale_id) = ckpt.index_of(&scale_name) else {
        return Err(format!(
            "is packed integers, but there is no `{scale_name}` beside it to dequantize it with"
        ));
    };
    let scale = &ckpt.tensors()[scale_id];
    if !matches!(scale.dtype, DType::F32 | DType::BF16 | DType::F16) {
        return Err(format!(
            "has a `{scale_name}` of {}, not a float",
            scale.dtype
        ));
    }
    let scale_dims: Vec<u64> = scale.shape.to_vec();
    let cols = match ckpt.index_of(&format!("{module}.weight_shape")) {
        Some(shape_id) => {
            let shape = read_ints(ckpt, shape_id)?;
            match shape.as_slice() {
                &[r, c] if r == rows as i64 && c > 0 => c as u64,
                other => {
                    return Err(format!(
                        "has a `{module}.weight_shape` of {other:?}, but it holds {rows} packed rows"
                    ));
                }
            }
        }
        // compressed-tensors' own rule without the shape: the scales pin the columns
        // for groups.
        None => match (scheme.group, scale_dims.as_slice()) {
            (Some(g), &[_, groups]) if g > 0 => groups * g,
            _ => {
                return Err(format!(
                    "has no `{module}.weight_shape` to say how many columns it packs"
                ));
            }
        },
    };
    let bits = u64::from(scheme.bits);
    if packed_cols != (cols * bits).div_ceil(32) {
        return Err(format!(
            "packs {cols} columns into {packed_cols} I32 words a row, but {cols} values of {bits} bits (the config's num_bits) take {}",
            (cols * bits).div_ceil(32)
        ));
    }
    let group = match scheme.group {
        Some(0) => cols,
        Some(g) if cols % g != 0 => {
            return Err(format!(
                "has {cols} columns, which the group size {g} does not divide"
            ));
        }
        Some(g) => g,
        None => 0,
    };
    let layout = PackedIntLayout {
        rows,
        cols,
        bits: scheme.bits,
        group,
        scale_dtype: scale.dtype,
        zero_points: !scheme.symmetric,
    };
    let want_scales: Vec<u64> = if group == 0 {
        vec![1]
    } else {
        vec![rows, layout.groups()]
    };
    if scale_dims.iter().product::<u64>() != want_scales.iter().product::<u64>()
        || (group != 0 && scale_dims != want_scales)
    {
        return Err(format!(
            "has a `{scale_name}` of shape {scale_dims:?}, but its scheme needs {want_scales:?}"
        ));
    }
    let zero_name = format!("{module}.weight_zero_point");
    let zeros = match (ckpt.index_of(&zero_name), scheme.symmetric) {
        (None, true) => None,
        (Some(_), true) => {
            return Err(format!(
                "has a `{zero_name}`, but the config's scheme is symmetric (no zero points)"
            ));
        }
        (None, false) => {
            return Err(format!(
                "is quantized asymmetrically, but there is no `{zero_name}` beside it"
            ));
        }
        (Some(zero_id), false) => {
            let z = &ckpt.tensors()[zero_id];
            let want = [layout.zero_rows(), layout.groups()];
            if z.dtype != DType::I32 || !z.shape.iter().eq(want) {
                return Err(format!(
                    "has a `{zero_name}` of {} {:?}, but its zero points pack into I32 {want:?}",
                    z.dtype,
                    z.shape.to_vec()
                ));
            }
            Some(
                ckpt.data_range(zero_id)
                    .ok_or("or its zero points have no data to read")?,
            )
        }
    };
    let g_idx = match (
        ckpt.index_of(&format!("{module}.weight_g_idx")),
        scheme.act_order,
    ) {
        // Without `actorder: group` a stored g_idx is refused as its own tensor.
        (_, false) => None,
        (None, true) => {
            return Err(format!(
                "is quantized in activation order (`actorder: group`), but there is no `{module}.weight_g_idx` beside it to say each column's group"
            ));
        }
        (Some(g_id), true) => {
            let g = &ckpt.tensors()[g_id];
            if g.dtype != DType::I32 || !g.shape.iter().eq([cols]) {
                return Err(format!(
                    "has a `{module}.weight_g_idx` of {} {:?}, but its {cols} columns need I32 [{cols}]",
                    g.dtype,
                    g.shape.to_vec()
                ));
            }
            Some(
                ckpt.data_range(g_id)
                    .ok_or("or its g_idx has no data to read")?,
            )
        }
    };
    let (Some(packed), Some(scales)) = (ckpt.data_range(id), ckpt.data_range(scale_id)) else {
        return Err("or its scales have no data to read".to_owned());
    };
    Ok(Dequantized::Written(Recipe {
        read: Read::Range(packed),
        make: Make::Dequantize {
            quant: Quant::PackedInt {
                scales,
                zeros,
                g_idx,
                layout,
            },
            to,
        },
        // A LoRA adapter merges into the dequantized weight, as peft merges into the
        // model transformers loads dequantized.
        merge: !ckpt.merges_of(id).is_empty(),
    }))
}

/// The values of a small integer tensor (`weight_shape`), read now.
fn read_ints(ckpt: &Checkpoint, id: TensorId) -> Result<Vec<i64>, String> {
    let tensor = &ckpt.tensors()[id];
    let (DType::I64 | DType::I32) = tensor.dtype else {
        return Err(format!(
            "has a `{}` of {}, not integers",
            tensor.name, tensor.dtype
        ));
    };
    let range = ckpt
        .data_range(id)
        .filter(|r| r.len <= 64)
        .ok_or_else(|| format!("has a `{}` that cannot be read", tensor.name))?;
    let path = ckpt.file_path(range.file);
    let file = crate::formats::input::open_regular(path).map_err(|e| e.to_string())?;
    let mut bytes = vec![0u8; range.len as usize];
    crate::save::copy::read_exact_at(&file, &mut bytes, range.offset)
        .map_err(|_| format!("has a `{}` that cannot be read", tensor.name))?;
    Ok(match tensor.dtype {
        DType::I64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_le_bytes(b.try_into().unwrap_or([0; 4]))))
            .collect(),
    })
}

/// How an `nvfp4-pack-quantized` save treats tensor `id`: `M.weight_packed` (U8
/// `[rows, cols/2]`) with its F8_E4M3 `M.weight_scale` (`[rows, cols/16]`) and F32
/// `M.weight_global_scale` is written dequantized as `M.weight`.
pub(super) fn dequantized_nvfp4(
    ckpt: &Checkpoint,
    id: TensorId,
    to: DType,
) -> Result<Dequantized, String> {
    let tensor = &ckpt.tensors()[id];
    let module = match packed_part(ckpt, &tensor.name) {
        PackedPart::Weight(module) => module,
        PackedPart::Companion(module, ".weight_zero_point") => {
            return Err(format!(
                "is a zero point: `{module}.weight_packed` is NVFP4 quantized asymmetrically, which devmap does not dequantize"
            ));
        }
        PackedPart::Companion(..) => return Ok(Dequantized::Dropped),
        PackedPart::Other => return Ok(Dequantized::NotFp8),
    };
    nvfp4_recipe(
        ckpt,
        id,
        module,
        "weight_global_scale",
        Nvfp4Convention::CompressedTensors,
        to,
    )
}

/// The recipe of NVFP4 weight `id` of module `module`: U8 `[rows, cols/2]` beside its
/// F8_E4M3 `M.weight_scale` and the F32 global scale `M.{global}`, each checked.
fn nvfp4_recipe(
    ckpt: &Checkpoint,
    id: TensorId,
    module: &str,
    global: &str,
    convention: Nvfp4Convention,
    to: DType,
) -> Result<Dequantized, String> {
    let tensor = &ckpt.tensors()[id];
    let dims: Vec<u64> = tensor.shape.to_vec();
    let (DType::U8, &[rows, half]) = (tensor.dtype, dims.as_slice()) else {
        return Err(format!(
            "is {} {dims:?}; NVFP4 weights are U8 matrices [rows, cols/2]",
            tensor.dtype
        ));
    };
    let cols = half * 2;
    let group = crate::save::nvfp4::GROUP;
    if cols % group != 0 {
        return Err(format!(
            "packs {cols} FP4 values a row, which groups of {group} do not divide"
        ));
    }
    let scale_name = format!("{module}.weight_scale");
    let global_name = format!("{module}.{global}");
    let (Some(scale_id), Some(global_id)) =
        (ckpt.index_of(&scale_name), ckpt.index_of(&global_name))
    else {
        return Err(format!(
            "is NVFP4, but `{scale_name}` or `{global_name}` is missing beside it"
        ));
    };
    let (scale, global) = (&ckpt.tensors()[scale_id], &ckpt.tensors()[global_id]);
    let want = [rows, cols / group];
    if scale.dtype != DType::F8E4M3 || !scale.shape.iter().eq(want) {
        return Err(format!(
            "has a `{scale_name}` of {} {:?}, but its FP4 values need F8_E4M3 {want:?}",
            scale.dtype,
            scale.shape.to_vec()
        ));
    }
    if global.dtype != DType::F32 || global.numel() != 1 {
        return Err(format!(
            "has a `{global_name}` of {} {:?}, not one float32",
            global.dtype,
            global.shape.to_vec()
        ));
    }
    let (Some(packed), Some(scales), Some(global)) = (
        ckpt.data_range(id),
        ckpt.data_range(scale_id),
        ckpt.data_range(global_id),
    ) else {
        return Err("or its scales have no data to read".to_owned());
    };
    Ok(Dequantized::Written(Recipe {
        read: Read::Range(packed),
        make: Make::Dequantize {
            quant: Quant::Nvfp4 {
                scales,
                global,
                layout: Nvfp4Layout {
                    rows,
                    cols,
                    convention,
                },
            },
            to,
        },
        merge: !ckpt.merges_of(id).is_empty(),
    }))
}

/// How a ModelOpt NVFP4 save treats tensor `id`: `M.weight` (U8 `[rows, cols/2]`) beside
/// its F8_E4M3 `M.weight_scale` (`[rows, cols/16]`) and F32 `M.weight_scale_2` is
/// written dequantized under its own name; those and `M.input_scale` are left out.
/// Anything else (the modules ModelOpt excludes, norms) is planned as any other tensor.
pub(super) fn dequantized_modelopt_nvfp4(
    ckpt: &Checkpoint,
    id: TensorId,
    to: DType,
) -> Result<Dequantized, String> {
    let tensor = &ckpt.tensors()[id];
    let name: &str = &tensor.name;
    let is_fp4 = |module: &str| {
        ckpt.tensor(&format!("{module}.weight"))
            .is_some_and(|w| w.dtype == DType::U8)
    };
    for companion in [".weight_scale", ".weight_scale_2", ".input_scale"] {
        if let Some(module) = name.strip_suffix(companion) {
            return Ok(if is_fp4(module) {
                Dequantized::Dropped
            } else {
                Dequantized::NotFp8
            });
        }
    }
    let Some(module) = name
        .strip_suffix(".weight")
        .filter(|_| tensor.dtype == DType::U8)
    else {
        return Ok(Dequantized::NotFp8);
    };
    nvfp4_recipe(
        ckpt,
        id,
        module,
        "weight_scale_2",
        Nvfp4Convention::ModelOpt,
        to,
    )
}
