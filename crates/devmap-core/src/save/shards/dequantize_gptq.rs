//! Which tensors of a GPTQ (`quant_method: gptq`) or AWQ (`quant_method: awq`)
//! checkpoint a save dequantizes, and what it refuses by name: `M.qweight` becomes
//! `M.weight` through `save::gptq`, its `qzeros`, `scales` and `g_idx` are left out
//! (a bias stays, converted as any other tensor).

use super::dequantize::Dequantized;
use crate::formats::config::GptqWeights;
use crate::model::checkpoint::{Checkpoint, TensorId};
use crate::save::execute::{Make, Quant, Read, Recipe};
use crate::save::gptq::{Packing, TransposedIntLayout};
use crate::types::DType;

/// A checkpoint's GPTQ or AWQ scheme, checked.
#[derive(Debug, Clone, Copy)]
pub(super) struct GptqScheme {
    bits: u8,
    /// Input rows a group holds; `None`: one group for every row (`group_size: -1`).
    group_size: Option<u64>,
    packing: Packing,
}

impl GptqScheme {
    /// The scheme `quantization_config` gives (`method` is `gptq` or `awq`), or why
    /// devmap cannot dequantize it.
    pub(super) fn of(method: &str, q: &GptqWeights) -> Result<GptqScheme, String> {
        let bits = u8::try_from(q.bits)
            .ok()
            .filter(|b| matches!(b, 2 | 4 | 8))
            .ok_or_else(|| {
                format!(
                    "`{method}` with bits {}; devmap dequantizes 2, 4 and 8-bit weights",
                    q.bits
                )
            })?;
        let packing = match (method, q.format.as_str()) {
            ("gptq", "gptq") => Packing::Gptq { v1: true },
            ("gptq", "gptq_v2") => Packing::Gptq { v1: false },
            ("awq", "gemm") if bits == 4 => Packing::Awq,
            ("awq", "gemm") => {
                return Err(format!(
                    "`awq` GEMM with {bits} bits; AutoAWQ's GEMM packing is 4-bit"
                ));
            }
            ("awq", _) if !q.zero_point => {
                return Err("`awq` without zero points (`zero_point: false`), which devmap does not dequantize".to_owned());
            }
            (_, other) => {
                return Err(format!(
                    "`{method}` in the `{other}` format, which devmap does not dequantize (it dequantizes GPTQ's `gptq` and `gptq_v2` and AWQ's `gemm`)"
                ));
            }
        };
        Ok(GptqScheme {
            bits,
            group_size: q.group_size,
            packing,
        })
    }
}

/// What a GPTQ/AWQ module keeps beside `qweight`.
const COMPANIONS: [&str; 3] = [".qzeros", ".scales", ".g_idx"];

/// How a GPTQ or AWQ save treats tensor `id`.
pub(super) fn dequantized(
    ckpt: &Checkpoint,
    id: TensorId,
    scheme: GptqScheme,
    to: DType,
) -> Result<Dequantized, String> {
    let tensor = &ckpt.tensors()[id];
    let name: &str = &tensor.name;
    if let Some(companion) = COMPANIONS.iter().find(|c| name.ends_with(*c)) {
        let module = &name[..name.len() - companion.len()];
        return Ok(if ckpt.index_of(&format!("{module}.qweight")).is_some() {
            Dequantized::Dropped
        } else {
            Dequantized::NotFp8
        });
    }
    let Some(module) = name.strip_suffix(".qweight") else {
        return Ok(Dequantized::NotFp8);
    };
    let dims: Vec<u64> = tensor.shape.to_vec();
    let (DType::I32, &[a, b]) = (tensor.dtype, dims.as_slice()) else {
        return Err(format!(
            "is {} {dims:?}; GPTQ and AWQ weights are I32 matrices",
            tensor.dtype
        ));
    };
    let p = 32 / u64::from(scheme.bits);
    let (inputs, outputs) = match scheme.packing {
        Packing::Gptq { .. } => (a * p, b),
        Packing::Awq => (a, b * p),
    };
    let scales_name = format!("{module}.scales");
    let zeros_name = format!("{module}.qzeros");
    let (Some(scales_id), Some(zeros_id)) =
        (ckpt.index_of(&scales_name), ckpt.index_of(&zeros_name))
    else {
        return Err(format!(
            "is quantized, but `{scales_name}` or `{zeros_name}` is missing beside it"
        ));
    };
    let (scales, zeros) = (&ckpt.tensors()[scales_id], &ckpt.tensors()[zeros_id]);
    if !matches!(scales.dtype, DType::F16 | DType::BF16 | DType::F32) {
        return Err(format!(
            "has `{scales_name}` of {}, not a float",
            scales.dtype
        ));
    }
    let scale_dims: Vec<u64> = scales.shape.to_vec();
    let &[groups, scale_cols] = scale_dims.as_slice() else {
        return Err(format!(
            "has `{scales_name}` of shape {scale_dims:?}, not [groups, out]"
        ));
    };
    if scale_cols != outputs {
        return Err(format!(
            "packs {outputs} output columns at {} bits (the config's bits), but `{scales_name}` has {scale_cols}: the packed width disagrees with the config",
            scheme.bits
        ));
    }
    let want_zeros = [groups, outputs / p];
    if zeros.dtype != DType::I32 || !zeros.shape.iter().eq(want_zeros) {
        return Err(format!(
            "has `{zeros_name}` of {} {:?}, but {groups} groups of {outputs} zero points of {} bits (the config's bits) pack into I32 {want_zeros:?}: the packed width disagrees with the config",
            zeros.dtype,
            zeros.shape.to_vec(),
            scheme.bits
        ));
    }
    let g_idx = match (scheme.packing, ckpt.index_of(&format!("{module}.g_idx"))) {
        (Packing::Gptq { .. }, Some(g_id)) => {
            let g = &ckpt.tensors()[g_id];
            if g.dtype != DType::I32 || !g.shape.iter().eq([inputs]) {
                return Err(format!(
                    "has `{module}.g_idx` of {} {:?}, but its {inputs} input rows need I32 [{inputs}]",
                    g.dtype,
                    g.shape.to_vec()
                ));
            }
            Some(
                ckpt.data_range(g_id)
                    .ok_or("or its g_idx has no data to read")?,
            )
        }
        _ => None,
    };
    let group_size = scheme.group_size.unwrap_or(inputs);
    if g_idx.is_none() && (group_size == 0 || inputs.div_ceil(group_size) != groups) {
        return Err(format!(
            "has {inputs} input rows in {groups} groups of scales, but the config's group_size is {group_size}"
        ));
    }
    let layout = TransposedIntLayout {
        inputs,
        outputs,
        bits: scheme.bits,
        groups,
        group_size,
        packing: scheme.packing,
        scale_dtype: scales.dtype,
    };
    layout.check()?;
    let (Some(qweight), Some(scales), Some(qzeros)) = (
        ckpt.data_range(id),
        ckpt.data_range(scales_id),
        ckpt.data_range(zeros_id),
    ) else {
        return Err("or its scales or zero points have no data to read".to_owned());
    };
    Ok(Dequantized::Written(Recipe {
        read: Read::Range(qweight),
        make: Make::Dequantize {
            quant: Quant::TransposedInt {
                qzeros,
                scales,
                g_idx,
                layout,
            },
            to,
        },
        merge: !ckpt.merges_of(id).is_empty(),
    }))
}
