//! The quantized weights a LoRA adapter merges into: which are mergeable, and the
//! packed weight an adapter's module names when the checkpoint holds no plain
//! `M.weight` (compressed-tensors' `weight_packed`, GPTQ's and AWQ's `qweight`).

use super::model_tensor;
use crate::model::checkpoint::Checkpoint;
use crate::types::DType;

/// Refuses merging into a weight devmap cannot merge into: float32, float16 and
/// bfloat16 ones, the FP8 (and packed FP4) weights of a fine-grained FP8 or the FP8
/// ones of a compressed-tensors FP8 checkpoint, the MXFP4 experts blocks of an MXFP4 one, packed integers, and
/// ModelOpt's NVFP4 `M.weight` bytes (merged into their dequantized value, so only by
/// a save that dequantizes).
pub(super) fn mergeable(quantized: Option<&str>, name: &str, dtype: DType) -> Result<(), String> {
    let fp8 = matches!(quantized, Some("fp8" | "compressed-tensors"))
        && matches!(dtype, DType::F8E4M3 | DType::F8E5M2);
    // DeepSeek-V4's FP4-packed weights, beside the FP8 ones (`expert_dtype: fp4`).
    let fp4 = quantized == Some("fp8") && dtype == DType::I8;
    let mxfp4 = quantized == Some("mxfp4") && dtype == DType::U8 && name.ends_with("_blocks");
    // ModelOpt's NVFP4 keeps its FP4 bytes under the weight's own name.
    let modelopt = quantized == Some("modelopt") && dtype == DType::U8 && name.ends_with(".weight");
    let packed = (quantized == Some("compressed-tensors")
        && matches!(dtype, DType::I32 | DType::U8)
        && name.ends_with(".weight_packed"))
        || (matches!(quantized, Some("gptq" | "awq"))
            && dtype == DType::I32
            && name.ends_with(".qweight"));
    if matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        || fp8
        || fp4
        || mxfp4
        || packed
        || modelopt
    {
        Ok(())
    } else {
        Err(format!(
            "adapts `{name}`, which is {dtype}; devmap merges into float32, float16 and bfloat16 weights, and into fine-grained FP8 (and its packed FP4), MXFP4 experts, packed integer, GPTQ, AWQ and NVFP4 (compressed-tensors, ModelOpt) weights dequantized"
        ))
    }
}

/// A compressed-tensors packed weight `{module}.weight_packed` whose rows hold `cols`
/// values (I32 words of the config's integer bits, or bytes of two FP4 values), or a
/// GPTQ/AWQ `{module}.qweight` of `cols` input features: its id and the shape it
/// dequantizes to.
pub(super) fn packed_int_weight(
    ckpt: &Checkpoint,
    module: &str,
    cols: u64,
) -> Option<(crate::model::TensorId, Vec<u64>)> {
    let q = ckpt.config.quantization.as_ref()?;
    if let (Some(scheme), Some(id)) = (&q.gptq, model_tensor(ckpt, &format!("{module}.qweight"))) {
        let &[a, b] = ckpt.tensors()[id].shape.to_vec().as_slice() else {
            return None;
        };
        let per_word = 32 / scheme.bits.clamp(1, 32);
        let (inputs, outputs) = if q.method == "awq" {
            (a, b * per_word)
        } else {
            (a * per_word, b)
        };
        return (inputs == cols).then(|| (id, vec![outputs, inputs]));
    }
    let id = model_tensor(ckpt, &format!("{module}.weight_packed"))?;
    let dims: Vec<u64> = ckpt.tensors()[id].shape.to_vec();
    let &[rows, stored] = dims.as_slice() else {
        return None;
    };
    let fits = match (q.format.as_deref(), q.int_weights.as_slice()) {
        // Two FP4 values a byte.
        (Some("nvfp4-pack-quantized"), _) => stored * 2 == cols,
        (_, [scheme]) => stored == (cols * scheme.num_bits).div_ceil(32),
        _ => false,
    };
    fits.then(|| (id, vec![rows, cols]))
}

/// The shape a weight of two FP4 values a byte dequantizes to — ModelOpt's NVFP4 (U8
/// `[rows, cols/2]`) or DeepSeek-V4's FP4-packed weights in a fine-grained FP8
/// checkpoint (I8 `[rows, cols/2]`) — when an adapter's A has `cols` columns; `None`
/// for any other tensor.
pub(super) fn packed_fp4_shape(
    ckpt: &Checkpoint,
    id: crate::model::TensorId,
    cols: u64,
) -> Option<Vec<u64>> {
    let tensor = &ckpt.tensors()[id];
    let &[rows, stored] = tensor.shape.to_vec().as_slice() else {
        return None;
    };
    let fp4 = matches!(
        (quant_method(ckpt), tensor.dtype),
        (Some("modelopt"), DType::U8) | (Some("fp8"), DType::I8)
    );
    (fp4 && stored * 2 == cols).then(|| vec![rows, cols])
}

/// The checkpoint's `quant_method`, when it is quantized.
pub(super) fn quant_method(ckpt: &Checkpoint) -> Option<&str> {
    ckpt.config.quantization.as_ref().map(|q| q.method.as_str())
}
