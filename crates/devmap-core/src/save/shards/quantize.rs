//! Which tensors `--quantize fp8-block` writes as fine-grained FP8, and what
//! config.json then says. transformers' FP8 integration turns every `nn.Linear` (and
//! fused experts) into an FP8 module unless `modules_to_not_convert` names it; devmap
//! quantizes the linear weights it can and names every other module with a weight of two
//! or more dimensions there, so `from_pretrained` loads exactly what was written.

use crate::model::checkpoint::{Checkpoint, TensorId};
use crate::save::execute::{Make, Read, Recipe};
use crate::save::quantize_fp8::{Fp8Out, Fp8Part};
use crate::types::DType;

/// The tile transformers' FP8 quantizer uses (`weight_block_size`).
pub const BLOCK: (u64, u64) = (128, 128);

/// Modules whose weight is never quantized: embeddings, the output head and routers
/// (transformers' FP8 quantizer leaves them in the model's dtype), and norms.
const KEPT: [&str; 11] = [
    "embed_tokens",
    "embed",
    "wte",
    "wpe",
    "word_embeddings",
    "position_embeddings",
    "embeddings",
    "shared",
    "lm_head",
    "gate",
    "router",
];

/// What `--quantize fp8-block` does with tensor `id`.
pub(super) enum Fp8Choice {
    /// Quantized: its values and its `_scale_inv`.
    Quantized(Box<[Recipe; 2]>),
    /// Written as any other tensor; transformers must be told not to convert `module`.
    Kept { module: Option<String> },
}

/// The choice for tensor `id`; an error when it should be quantized but cannot be.
pub(super) fn choose(ckpt: &Checkpoint, id: TensorId) -> Result<Fp8Choice, String> {
    let tensor = &ckpt.tensors()[id];
    let name: &str = &tensor.name;
    let dims: Vec<u64> = tensor.shape.to_vec();
    let module = name.rsplit_once('.').map(|(m, _)| m.to_owned());
    let floating = matches!(tensor.dtype, DType::F32 | DType::F16 | DType::BF16);
    if dims.len() < 2 || !floating {
        return Ok(Fp8Choice::Kept { module: None });
    }
    let leaf = module
        .as_deref()
        .map_or("", |m| m.rsplit('.').next().unwrap_or(m));
    let linear = name.ends_with(".weight")
        && dims.len() == 2
        && !KEPT.contains(&leaf)
        && !leaf.contains("norm")
        && ckpt.tie_group(id).is_none();
    let fits = dims[0].is_multiple_of(BLOCK.0) && dims[1].is_multiple_of(BLOCK.1);
    if !(linear && fits) {
        return Ok(Fp8Choice::Kept { module });
    }
    if !ckpt.merges_of(id).is_empty() {
        return Err(
            "is merged into by a LoRA adapter: save the merged model first, then quantize it"
                .to_owned(),
        );
    }
    let Some(range) = ckpt.data_range(id) else {
        return Err("has no single range to read (stored in pieces or not at all): save it once first, then quantize".to_owned());
    };
    let layout = |part| Fp8Out {
        rows: dims[0],
        cols: dims[1],
        block: BLOCK,
        from: tensor.dtype,
        part,
    };
    let recipe = |part| Recipe {
        read: Read::Range(range),
        make: Make::Quantize(layout(part)),
        merge: false,
    };
    Ok(Fp8Choice::Quantized(Box::new([
        recipe(Fp8Part::Values),
        recipe(Fp8Part::Scales),
    ])))
}

/// The `quantization_config` written with the quantized weights.
pub(super) fn config(not_converted: &[String]) -> serde_json::Value {
    serde_json::json!({
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [BLOCK.0, BLOCK.1],
        "modules_to_not_convert": not_converted,
    })
}
