//! The activations one forward over a prompt holds at its peak, beside the weights and
//! the KV cache: what transformers 5's decoder code allocates (with `sdpa`, whose
//! fused kernels make no tokens × tokens matrix) while one layer computes, for `B`
//! sequences of `N` tokens (the whole prompt in one forward, as `generate` reads it).
//! Per token, in elements of the dtype the model computes in, with `h` the hidden size,
//! `nh`/`kv` the query/key-value heads of `d` dimensions, `r` the rotary dimensions:
//!
//! - held through the layer: the embeddings, the layer's input, the normed input and
//!   the rotary `cos`/`sin`: `3h + 2r`, and in the MLP half the residual sum, `+ h`;
//! - attention: the rotary embedding of the queries and then the keys, with the
//!   projections alive: `max(4·nh + 2·kv, 2·nh + 5·kv) · d`;
//! - a dense MLP: gate activation, up projection and their product, `3·I`;
//! - routed experts (transformers 5's batched experts): per chosen expert, the token
//!   copied, its gate/up projections, activation and product, `k · (4·I + h)`, and the
//!   router's logits, `E + 1`; a shared expert before them, `3·I_shared` (its output,
//!   `h`, then alive through the routed experts).
//!
//! The peak is the largest of these phases. A sliding-window mask that transformers
//! materializes (`[B, 1, N, N]` booleans: `sliding_mask_window`) comes on top.
//! Measured against the bytes torch allocates in such a forward
//! (tests/python/activations.py): within 1% for Llama, Qwen2, Qwen3, Mistral, Mixtral,
//! Qwen3-MoE and Qwen2-MoE in transformers 5.25. Other attention kinds (MLA, linear
//! attention) are counted with the same formula over their heads, and said so. The last device also holds the logits of the last token
//! (`B · V` in the model's dtype and in float32, as `generate` samples them).

use serde_json::Value;

use crate::types::DType;

/// One forward's activations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activations {
    /// Tokens read in one forward, and sequences.
    pub tokens: u64,
    pub batch: u64,
    pub dtype: DType,
    /// The peak while a layer computes, on the device it computes on.
    pub per_layer: u64,
    /// The last token's logits, on the head's device.
    pub logits: u64,
    /// A sliding-window attention mask transformers builds as a `[B, 1, N, N]` boolean
    /// tensor (0 when it builds none), alive through the forward on the device the
    /// model starts on.
    pub mask: u64,
    /// What the estimate assumed.
    pub notes: Vec<String>,
}

fn number(text: &Value, key: &str) -> Option<u64> {
    text.get(key).and_then(Value::as_u64)
}

/// The activations of one forward over `tokens` tokens of `batch` sequences in `dtype`,
/// for the model config.json describes.
pub fn activations(
    config: &Value,
    tokens: u64,
    batch: u64,
    dtype: DType,
) -> Result<Activations, String> {
    let text = config
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(config);
    let h = number(text, "hidden_size")
        .ok_or("config.json has no hidden_size: activations cannot be estimated")?;
    let nh = number(text, "num_attention_heads")
        .ok_or("config.json has no num_attention_heads: activations cannot be estimated")?;
    let mut notes = Vec::new();
    let mla = text.get("kv_lora_rank").is_some_and(|v| !v.is_null());
    let (kv, d) = if mla {
        notes.push(
            "MLA attention estimated as full attention over its heads (qk_nope + qk_rope dimensions)"
                .to_owned(),
        );
        let d = number(text, "qk_nope_head_dim").unwrap_or(0)
            + number(text, "qk_rope_head_dim").unwrap_or(0);
        (nh, d.max(1))
    } else {
        (
            number(text, "num_key_value_heads").unwrap_or(nh),
            number(text, "head_dim").unwrap_or(h / nh.max(1)),
        )
    };
    let partial = text
        .get("partial_rotary_factor")
        .and_then(Value::as_f64)
        .unwrap_or(1.0);
    let rotary = if mla {
        number(text, "qk_rope_head_dim").unwrap_or(d)
    } else {
        (d as f64 * partial) as u64
    };
    let held = 3 * h + 2 * rotary;
    let attention = held + (4 * nh + 2 * kv).max(2 * nh + 5 * kv) * d;
    let experts = number(text, "num_experts")
        .or_else(|| number(text, "num_local_experts"))
        .or_else(|| number(text, "n_routed_experts"));
    let mut mlp = 0;
    if let Some(experts) = experts.filter(|e| *e > 0) {
        let chosen = number(text, "num_experts_per_tok").unwrap_or(1);
        let moe_i = number(text, "moe_intermediate_size")
            .or_else(|| number(text, "intermediate_size"))
            .unwrap_or(0);
        mlp = mlp.max(held + h + chosen * (4 * moe_i + h) + experts + 1);
        let shared = number(text, "shared_expert_intermediate_size").or_else(|| {
            number(text, "n_shared_experts")
                .filter(|n| *n > 0)
                .map(|n| n * moe_i)
        });
        if let Some(shared) = shared {
            // The shared expert runs first; its output waits through the routed ones.
            mlp = (mlp + h).max(held + h + 3 * shared);
        }
        // DeepSeek's first dense layers.
        if number(text, "first_k_dense_replace").is_some_and(|k| k > 0)
            && let Some(i) = number(text, "intermediate_size")
        {
            mlp = mlp.max(held + h + 3 * i);
        }
    } else if let Some(i) = number(text, "intermediate_size") {
        mlp = held + h + 3 * i;
    } else {
        notes.push("config.json has no intermediate_size: the MLP is not counted".to_owned());
    }
    if text
        .get("layer_types")
        .and_then(Value::as_array)
        .is_some_and(|types| {
            types.iter().any(|t| {
                !matches!(
                    t.as_str(),
                    Some("full_attention" | "sliding_attention" | "chunked_attention")
                )
            })
        })
    {
        notes.push(
            "linear-attention and convolution layers estimated with the attention formula"
                .to_owned(),
        );
    }
    let per_token = attention.max(mlp);
    let vocab = number(text, "vocab_size").unwrap_or(0);
    let mask = match sliding_mask_window(text) {
        Some(window) if tokens > window => {
            notes.push(format!(
                "a sliding-window mask of {tokens} × {tokens} booleans a sequence (transformers builds one past {window} tokens)"
            ));
            batch * tokens * tokens
        }
        _ => 0,
    };
    Ok(Activations {
        tokens,
        batch,
        dtype,
        per_layer: batch * tokens * per_token * dtype.size(),
        logits: batch * vocab * (dtype.size() + 4),
        mask,
        notes,
    })
}

/// The window of the sliding-window mask transformers 5 builds for this model, if it
/// builds one: for sliding layers in `layer_types`, or, in the classes whose code
/// builds it from `sliding_window` alone (Mistral and Mixtral when it is set; Qwen2-MoE
/// always, whatever `use_sliding_window` says). With sdpa, a forward longer than the
/// window cannot use the fused causal path and materializes the mask.
fn sliding_mask_window(text: &Value) -> Option<u64> {
    let window = text.get("sliding_window").and_then(Value::as_u64);
    let sliding_layers = text
        .get("layer_types")
        .and_then(Value::as_array)
        .is_some_and(|t| t.iter().any(|k| k.as_str() == Some("sliding_attention")));
    let model_type = text.get("model_type").and_then(Value::as_str).unwrap_or("");
    match model_type {
        "qwen2_moe" => Some(window.unwrap_or(0)),
        "mistral" | "mixtral" => window,
        _ if sliding_layers => window,
        _ => None,
    }
}

/// The activations each device holds at its peak under `map`: every device a decoder
/// layer computes on (its own, or for a layer on cpu or disk the execution device)
/// holds one layer's peak; the head's device also the logits.
pub fn activations_by_device(
    ckpt: &crate::model::checkpoint::Checkpoint,
    map: &crate::types::placement::DeviceMap,
    act: &Activations,
    layers: usize,
) -> Vec<(crate::types::placement::Placement, u64)> {
    use super::kv::{cache_device, execution_device, layer_placements};
    use crate::types::placement::Placement;
    let main = execution_device(map.entries().iter().map(|(_, p)| *p));
    let mut on: Vec<(Placement, u64)> = Vec::new();
    for place in layer_placements(ckpt, map, layers) {
        let device = cache_device(place.unwrap_or(Placement::Cpu), main);
        if !on.iter().any(|(p, _)| *p == device) {
            on.push((device, act.per_layer));
        }
    }
    let arch = crate::model::arch::lookup(&ckpt.config.architectures);
    // The mask is made where the model starts, the execution device.
    if act.mask > 0 {
        match on.iter_mut().find(|(p, _)| *p == main) {
            Some((_, b)) => *b += act.mask,
            None => on.push((main, act.mask)),
        }
    }
    // The head's key in the map (a tied head holds no tensor of its own).
    let head = cache_device(
        crate::model::checkpoint::place(Some(map), "lm_head.weight", arch).0,
        main,
    );
    match on.iter_mut().find(|(p, _)| *p == head) {
        Some((_, b)) => *b += act.logits,
        None => on.push((head, act.logits)),
    }
    on
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_larger_phase_sets_the_peak() {
        // A Llama whose MLP outgrows its attention: 4h + 2d + 3I a token.
        let llama = serde_json::json!({
            "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8,
            "num_key_value_heads": 2, "vocab_size": 1000,
        });
        let a = activations(&llama, 100, 2, DType::F32).expect("counted");
        assert_eq!(a.per_layer, 2 * 100 * (4 * 256 + 2 * 32 + 3 * 688) * 4);
        assert_eq!(a.logits, 2 * 1000 * 8);
        // With a tiny MLP the attention's rotary step is the peak.
        let narrow = serde_json::json!({
            "hidden_size": 256, "intermediate_size": 8, "num_attention_heads": 8,
            "num_key_value_heads": 8, "head_dim": 32, "vocab_size": 1000,
        });
        let a = activations(&narrow, 10, 1, DType::BF16).expect("counted");
        assert_eq!(a.per_layer, 10 * (3 * 256 + 64 + (2 * 8 + 5 * 8) * 32) * 2);
    }
}
