//! Which tensors a save dequantizes, and through which recipe: fine-grained FP8
//! (block scales), compressed-tensors FP8 (per-tensor or per-channel scales), MXFP4
//! experts, compressed-tensors packed integers (`dequantize_packed`) and GPTQ / AWQ
//! integers (`dequantize_gptq`), written as the
//! float dtype `--dtype` names, their scales left out.

use super::DtypeChoice;
use crate::model::checkpoint::{Checkpoint, TensorId};
use crate::save::execute::{Make, Quant, Read, Recipe};
use crate::save::reasons::Unsaveable;
use crate::types::DType;

/// How a save dequantizes (an explicit float `--dtype` on a quantized checkpoint).
#[derive(Debug, Clone, Copy)]
pub(super) enum Dequantize {
    /// Fine-grained FP8 with this weight block, to this dtype.
    Fp8((u64, u64), DType),
    /// MXFP4 experts, to this dtype.
    Mxfp4(DType),
    /// compressed-tensors `float-quantized` FP8, to this dtype.
    CompressedFp8(DType),
    /// compressed-tensors `pack-quantized` integers of this scheme, to this dtype.
    PackedInt(super::dequantize_packed::IntScheme, DType),
    /// compressed-tensors `nvfp4-pack-quantized`, to this dtype.
    Nvfp4(DType),
    /// GPTQ or AWQ integers of this scheme, to this dtype.
    Gptq(super::dequantize_gptq::GptqScheme, DType),
    /// NVIDIA ModelOpt NVFP4, to this dtype.
    ModelOptNvfp4(DType),
}

/// What a dequantizing save does with one tensor.
pub(super) enum Dequantized {
    /// Not FP8: planned as any other tensor.
    NotFp8,
    /// A scale beside an FP8 weight: left out, its values are in the weight.
    Dropped,
    /// An FP8 weight, written through this recipe.
    Written(Recipe),
}

/// Why a save cannot dequantize as asked.
pub(super) enum Refused {
    /// Nothing else is worth checking (the quantization config itself is unusable).
    Alone(Unsaveable),
    /// Said beside the other problems the plan finds.
    WithOthers(Unsaveable),
}

impl Dequantize {
    /// How a save with dtype `choice` dequantizes `ckpt`: an explicit float dtype on
    /// quantized weights dequantizes them, or refuses — never quantized bytes under a
    /// float promise. `None`: nothing to dequantize.
    pub(super) fn for_save(
        ckpt: &Checkpoint,
        choice: DtypeChoice,
    ) -> Result<Option<Dequantize>, Refused> {
        match (&ckpt.config.quantization, choice) {
            (Some(q), DtypeChoice::To(to)) if q.method == "fp8" => {
                if q.block.0 == 0 || q.block.1 == 0 {
                    return Err(Refused::Alone(Unsaveable::Quantization(format!(
                        "config.json's quantization_config gives a weight_block_size of {:?}: a block needs rows and columns",
                        q.block
                    ))));
                }
                Ok(Some(Dequantize::Fp8(q.block, to)))
            }
            (Some(q), DtypeChoice::To(to)) if q.method == "mxfp4" => {
                Ok(Some(Dequantize::Mxfp4(to)))
            }
            (Some(q), DtypeChoice::To(to))
                if q.method == "compressed-tensors"
                    && matches!(
                        q.format.as_deref(),
                        Some("float-quantized" | "mxfp8-quantized")
                    ) =>
            {
                Ok(Some(Dequantize::CompressedFp8(to)))
            }
            (Some(q), DtypeChoice::To(to))
                if q.method == "compressed-tensors"
                    && q.format.as_deref() == Some("nvfp4-pack-quantized") =>
            {
                Ok(Some(Dequantize::Nvfp4(to)))
            }
            (Some(q), DtypeChoice::To(to))
                if q.method == "compressed-tensors"
                    && q.format.as_deref() == Some("pack-quantized") =>
            {
                match super::dequantize_packed::IntScheme::of(&q.int_weights) {
                    Ok(scheme) => Ok(Some(Dequantize::PackedInt(scheme, to))),
                    Err(why) => Err(Refused::Alone(Unsaveable::Quantization(format!(
                        "config.json's quantization_config is {why}; --dtype {} would write quantized bytes as if they were {}; save with --dtype keep (or auto) to copy it as it is",
                        to.torch_name(),
                        to.torch_name()
                    )))),
                }
            }
            (Some(q), DtypeChoice::To(to)) if matches!(q.method.as_str(), "gptq" | "awq") => {
                let scheme = q
                    .gptq
                    .as_ref()
                    .ok_or_else(|| format!("`{}` without its scheme", q.method))
                    .and_then(|g| super::dequantize_gptq::GptqScheme::of(&q.method, g));
                match scheme {
                    Ok(scheme) => Ok(Some(Dequantize::Gptq(scheme, to))),
                    Err(why) => Err(Refused::Alone(Unsaveable::Quantization(format!(
                        "config.json's quantization_config is {why}; --dtype {} would write quantized bytes as if they were {}; save with --dtype keep (or auto) to copy it as it is",
                        to.torch_name(),
                        to.torch_name()
                    )))),
                }
            }
            (Some(q), DtypeChoice::To(to)) if q.method == "modelopt" => {
                if q.format.as_deref() == Some("NVFP4") {
                    Ok(Some(Dequantize::ModelOptNvfp4(to)))
                } else {
                    Err(Refused::Alone(Unsaveable::Quantization(format!(
                        "config.json's quantization_config is `modelopt` with quant_algo `{}`, which devmap does not dequantize (it dequantizes ModelOpt's `NVFP4`); --dtype {} would write quantized bytes as if they were {}; save with --dtype keep (or auto) to copy it as it is",
                        q.format.as_deref().unwrap_or("(none)"),
                        to.torch_name(),
                        to.torch_name()
                    ))))
                }
            }
            (Some(q), DtypeChoice::To(to)) if q.method == "compressed-tensors" => {
                Err(Refused::WithOthers(Unsaveable::Quantization(format!(
                    "config.json's quantization_config is compressed-tensors in the `{}` format, which devmap does not dequantize (it dequantizes `float-quantized` and `mxfp8-quantized`: FP8 weights with per-tensor, per-row or per-group scales; `pack-quantized`: integers of 1 to 8 bits; and `nvfp4-pack-quantized`); --dtype {} would write quantized bytes as if they were {}; save with --dtype keep (or auto) to copy it as it is",
                    q.format.as_deref().unwrap_or("(unnamed)"),
                    to.torch_name(),
                    to.torch_name()
                ))))
            }
            (Some(q), DtypeChoice::To(to)) => {
                Err(Refused::WithOthers(Unsaveable::Quantization(format!(
                    "config.json's quantization_config is `{}`, which devmap does not dequantize (it dequantizes fine-grained FP8, `fp8`, MXFP4, `mxfp4`, GPTQ, `gptq`, AWQ, `awq`, and compressed-tensors): --dtype {} would write quantized bytes as if they were {}; save with --dtype keep (or auto) to copy the quantized checkpoint as it is",
                    q.method,
                    to.torch_name(),
                    to.torch_name()
                ))))
            }
            _ => Ok(None),
        }
    }

    /// What this save does with tensor `id`; an FP8 weight it cannot dequantize is an
    /// error saying why.
    pub(super) fn tensor(self, ckpt: &Checkpoint, id: TensorId) -> Result<Dequantized, String> {
        match self {
            Dequantize::Fp8(block, to) => dequantized(ckpt, id, block, to),
            Dequantize::Mxfp4(to) => dequantized_mxfp4(ckpt, id, to),
            Dequantize::CompressedFp8(to) => dequantized_compressed(ckpt, id, to),
            Dequantize::PackedInt(scheme, to) => {
                super::dequantize_packed::dequantized(ckpt, id, scheme, to)
            }
            Dequantize::Nvfp4(to) => super::dequantize_packed::dequantized_nvfp4(ckpt, id, to),
            Dequantize::Gptq(scheme, to) => {
                super::dequantize_gptq::dequantized(ckpt, id, scheme, to)
            }
            Dequantize::ModelOptNvfp4(to) => {
                super::dequantize_packed::dequantized_modelopt_nvfp4(ckpt, id, to)
            }
        }
    }
}

/// How a fine-grained FP8 save (an explicit float `--dtype` on such a checkpoint)
/// treats tensor `id`; a weight it cannot dequantize is an error saying why. FP8
/// weights take the config's blocks, with float32 or E8M0 (`scale_fmt: ue8m0`) scales;
/// DeepSeek-V4's FP4-packed experts (`expert_dtype: fp4`: I8 matrices of two E2M1
/// codes a byte, with E8M0 scales, one per 32 values of a row) take the block their
/// scale grid gives, as transformers' `Fp8Dequantize` does.
fn dequantized(
    ckpt: &Checkpoint,
    id: TensorId,
    block: (u64, u64),
    to: DType,
) -> Result<Dequantized, String> {
    let tensor = &ckpt.tensors()[id];
    if crate::save::fp8::is_companion(&tensor.name) {
        return Ok(Dequantized::Dropped);
    }
    let fp4 = tensor.dtype == DType::I8;
    if !(fp4 || matches!(tensor.dtype, DType::F8E4M3 | DType::F8E5M2)) {
        return Ok(Dequantized::NotFp8);
    }
    let scale_name = format!("{}_scale_inv", tensor.name);
    let Some(scale_id) = ckpt.index_of(&scale_name) else {
        if fp4 {
            // An I8 tensor without scales is not packed FP4: copied as stored.
            return Ok(Dequantized::NotFp8);
        }
        return Err(format!(
            "is {}, but there is no `{scale_name}` beside it to dequantize it with",
            tensor.dtype
        ));
    };
    let scale = &ckpt.tensors()[scale_id];
    let dims: Vec<u64> = tensor.shape.iter().collect();
    if dims.len() < 2 || (fp4 && dims.len() != 2) {
        return Err(format!(
            "is {} with {} dimensions; fine-grained FP8 weights are matrices (packed FP4 ones 2-D)",
            tensor.dtype,
            dims.len()
        ));
    }
    let (rows, stored_cols) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let cols = if fp4 { stored_cols * 2 } else { stored_cols };
    let have: Vec<u64> = scale.shape.iter().collect();
    let e8m0 = scale.dtype.holds_e8m0_scales();
    let block = match (fp4, have.as_slice()) {
        (false, _) => block,
        (true, &[sr, sc]) if sr > 0 && sc > 0 && rows % sr == 0 && cols % sc == 0 => {
            (rows / sr, cols / sc)
        }
        (true, other) => {
            return Err(format!(
                "is packed FP4 [{rows}, {cols}], but its `{scale_name}` of shape {other:?} does not divide it into blocks"
            ));
        }
    };
    let blocks = crate::save::fp8::Fp8Blocks {
        rows,
        cols,
        block_rows: block.0,
        block_cols: block.1,
        scale_dtype: if e8m0 { DType::F8E8M0 } else { DType::F32 },
        // transformers multiplies in float32, whatever the scales are stored as.
        product: DType::F32,
    };
    let (sr, sc) = blocks.grid();
    let mut want: Vec<u64> = dims[..dims.len() - 2].to_vec();
    want.extend([sr, sc]);
    if !(e8m0 || scale.dtype == DType::F32) || have != want {
        return Err(format!(
            "has a `{scale_name}` of {} {have:?}, but its {}×{} blocks need float32 or E8M0 {want:?}",
            scale.dtype, block.0, block.1
        ));
    }
    fp8_recipe(ckpt, (id, scale_id), to, blocks)
}

/// An FP8 weight's recipe (fine-grained or compressed-tensors): dequantized, and with a
/// LoRA adapter merged into the dequantized weight where one adapts it, as peft merges
/// into the model transformers loads dequantized.
fn fp8_recipe(
    ckpt: &Checkpoint,
    (id, scale_id): (TensorId, TensorId),
    to: DType,
    blocks: crate::save::fp8::Fp8Blocks,
) -> Result<Dequantized, String> {
    let (Some(source), Some(scale)) = (ckpt.data_range(id), ckpt.data_range(scale_id)) else {
        return Err("or its scale has no data to read".to_owned());
    };
    let from = ckpt.tensors()[id].dtype;
    Ok(Dequantized::Written(Recipe {
        read: Read::Range(source),
        make: Make::Dequantize {
            quant: Quant::Fp8 {
                from,
                scale,
                blocks,
            },
            to,
        },
        merge: !ckpt.merges_of(id).is_empty(),
    }))
}

/// What a compressed-tensors checkpoint keeps beside a quantized module's weight: its
/// scales and zero points (the activations' too); a dequantized model has none.
const COMPRESSED_COMPANIONS: [&str; 5] = [
    ".weight_scale",
    ".weight_zero_point",
    ".input_scale",
    ".input_zero_point",
    ".output_scale",
];

/// How a compressed-tensors `float-quantized` save treats tensor `id`: an FP8 weight
/// `M.weight` with `M.weight_scale` of one value (the `tensor` strategy), one per row
/// (`channel`) or one per group of a row (`group`; MXFP8's E8M0 exponents per 32) is
/// written dequantized — each element times its scale, multiplied in the scale's dtype,
/// as compressed-tensors' `dequantize` does, then converted to `to` — and its
/// companions are dropped. Asymmetric weights (a zero point) and 2-D blocks are
/// refused by name.
fn dequantized_compressed(
    ckpt: &Checkpoint,
    id: TensorId,
    to: DType,
) -> Result<Dequantized, String> {
    let tensor = &ckpt.tensors()[id];
    if let Some(companion) = COMPRESSED_COMPANIONS
        .iter()
        .find(|c| tensor.name.ends_with(*c))
    {
        let module = &tensor.name[..tensor.name.len() - companion.len()];
        let weight = ckpt.index_of(&format!("{module}.weight"));
        if weight.is_some_and(|w| matches!(ckpt.tensors()[w].dtype, DType::F8E4M3 | DType::F8E5M2))
        {
            if *companion == ".weight_zero_point" {
                return Err(format!(
                    "is a zero point: `{module}.weight` is quantized asymmetrically, which devmap does not dequantize"
                ));
            }
            return Ok(Dequantized::Dropped);
        }
        return Ok(Dequantized::NotFp8);
    }
    if !matches!(tensor.dtype, DType::F8E4M3 | DType::F8E5M2) {
        return Ok(Dequantized::NotFp8);
    }
    let Some(module) = tensor.name.strip_suffix(".weight") else {
        return Err(format!("is {} but not a module's `weight`", tensor.dtype));
    };
    let scale_name = format!("{module}.weight_scale");
    let Some(scale_id) = ckpt.index_of(&scale_name) else {
        return Err(format!(
            "is {}, but there is no `{scale_name}` beside it to dequantize it with",
            tensor.dtype
        ));
    };
    let scale = &ckpt.tensors()[scale_id];
    let &[rows, cols] = tensor.shape.to_vec().as_slice() else {
        return Err(format!(
            "is {} with {} dimensions; compressed-tensors FP8 weights are matrices",
            tensor.dtype,
            tensor.shape.len()
        ));
    };
    let scales: Vec<u64> = scale.shape.to_vec();
    let block = match scales.as_slice() {
        [] | [1] | [1, 1] => (rows, cols),
        [r, 1] if *r == rows => (1, cols),
        // Groups along the row (MXFP8's 32, or the `group` strategy's size), which
        // compressed-tensors requires to divide the row.
        [r, g] if *r == rows && *g > 0 && cols % g == 0 => (1, cols / g),
        other => {
            return Err(format!(
                "has a `{scale_name}` of shape {other:?}: devmap dequantizes one scale per tensor, per row or per group of a row ([1], [{rows}, 1] or [{rows}, groups dividing {cols}]), not blocks"
            ));
        }
    };
    // MXFP8 (`mxfp8-quantized`) stores power-of-two exponents as U8 (E8M0).
    let mx = scale.dtype.holds_e8m0_scales();
    if !(mx || matches!(scale.dtype, DType::F32 | DType::BF16 | DType::F16)) {
        return Err(format!(
            "has a `{scale_name}` of {}, not a float",
            scale.dtype
        ));
    }
    let blocks = crate::save::fp8::Fp8Blocks {
        rows,
        cols,
        block_rows: block.0,
        block_cols: block.1,
        scale_dtype: if mx { DType::F8E8M0 } else { scale.dtype },
        // compressed-tensors multiplies in the scales' dtype; MX exponents in bfloat16.
        product: if mx { DType::BF16 } else { scale.dtype },
    };
    fp8_recipe(ckpt, (id, scale_id), to, blocks)
}

/// How an MXFP4 save treats tensor `id`: `P_blocks` (U8 `[E, rows, G, 16]`) is
/// written dequantized as `P` with its `P_scales` (U8 `[E, rows, G]`), which is
/// dropped; every other tensor is planned as usual.
fn dequantized_mxfp4(ckpt: &Checkpoint, id: TensorId, to: DType) -> Result<Dequantized, String> {
    let tensor = &ckpt.tensors()[id];
    if let Some(base) = tensor.name.strip_suffix("_scales")
        && ckpt.index_of(&format!("{base}_blocks")).is_some()
    {
        return Ok(Dequantized::Dropped);
    }
    let Some(base) = tensor.name.strip_suffix("_blocks") else {
        return Ok(Dequantized::NotFp8);
    };
    let scales_name = format!("{base}_scales");
    let Some(scales_id) = ckpt.index_of(&scales_name) else {
        return Err(format!(
            "is MXFP4 blocks, but there is no `{scales_name}` beside it to dequantize it with"
        ));
    };
    let scales = &ckpt.tensors()[scales_id];
    let dims: Vec<u64> = tensor.shape.iter().collect();
    let &[experts, rows, groups, 16] = dims.as_slice() else {
        return Err(format!(
            "is MXFP4 blocks of shape {dims:?}; devmap dequantizes experts weights of [experts, rows, groups, 16] bytes"
        ));
    };
    let want = [experts, rows, groups];
    if tensor.dtype != DType::U8 || scales.dtype != DType::U8 || !scales.shape.iter().eq(want) {
        return Err(format!(
            "is {} {dims:?} with a `{scales_name}` of {} {:?}; MXFP4 needs U8 blocks and U8 scales of {want:?}",
            tensor.dtype,
            scales.dtype,
            scales.shape.to_vec()
        ));
    }
    let (Some(blocks), Some(scales)) = (ckpt.data_range(id), ckpt.data_range(scales_id)) else {
        return Err("or its scales have no data to read".to_owned());
    };
    Ok(Dequantized::Written(Recipe {
        read: Read::Range(blocks),
        make: Make::Dequantize {
            quant: Quant::Mxfp4 {
                scales,
                layout: crate::save::mxfp4::Mxfp4Layout {
                    experts,
                    rows,
                    groups,
                },
            },
            to,
        },
        // A LoRA adapter merges into the dequantized weight, as peft merges into the
        // model transformers loads dequantized.
        merge: !ckpt.merges_of(id).is_empty(),
    }))
}
