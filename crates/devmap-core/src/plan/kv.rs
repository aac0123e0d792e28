//! The KV cache a model holds after reading `context` tokens, per layer, as
//! transformers 5's `DynamicCache(config=…)` holds it (the cache `generate` makes):
//!
//! - a full-attention layer keeps keys and values of every token:
//!   `2 · batch · kv_heads · tokens · head_dim` elements;
//! - a sliding-window (or chunked) layer keeps the last `window − 1` tokens
//!   (`DynamicSlidingWindowLayer`);
//! - an MLA layer (DeepSeek V2/V3, `kv_lora_rank`) keeps its compressed KV and the
//!   rotary key, one head: `batch · tokens · (kv_lora_rank + qk_rope_head_dim)`;
//! - layers that reuse another's cache (`kv_sharing_modes: reuse`) or hold no
//!   attention (`moe`, `mlp`) keep nothing;
//! - linear-attention, convolution and state-space layers keep fixed-size states
//!   (Qwen3-Next's gated delta net, Jamba's Mamba, LFM2's convolution: see
//!   `state_bytes`); a kind devmap does not know is named as not counted.
//!
//! Each layer's kind comes from config.json's `layer_types`; without it, from Jamba's
//! `attn_layer_period`/`attn_layer_offset`, else as transformers infers it
//! (`sliding_window` → sliding, `attention_chunk_size` → chunked, else full), which is
//! said in a note, since some classes derive their own.
//! The elements are of the dtype the model computes in (the load dtype).

use serde_json::Value;

use crate::types::DType;
use crate::types::placement::Placement;

/// What is asked: tokens read (prompt and generated), sequences at once, and the dtype
/// the cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRequest {
    pub context: u64,
    pub batch: u64,
    pub dtype: DType,
}

/// One decoder layer's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerCache {
    /// `full_attention`, `sliding_attention`, `chunked_attention`, `mla`, `none`, or
    /// the config's own name for a kind not counted.
    pub kind: String,
    /// Tokens kept.
    pub tokens: u64,
    pub bytes: u64,
}

/// The whole model's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvCache {
    pub request: KvRequest,
    pub layers: Vec<LayerCache>,
    /// Layers whose states are not counted, as `kind (N layers)`.
    pub not_counted: Vec<String>,
    /// What the estimate assumed that config.json does not say.
    pub notes: Vec<String>,
}

impl KvCache {
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes).sum()
    }
}

/// The fixed-size states of a layer that keeps no per-token KV, as transformers 5's
/// `LinearAttentionLayer` holds them (a convolution state in the model's dtype and,
/// for recurrent layers, a state in float32), whatever the context:
/// - Qwen3-Next's gated delta net (`linear_attention` with `linear_num_value_heads`):
///   `[B, 2·key_heads·key_dim + value_heads·value_dim, conv_kernel]` and
///   `[B, value_heads, key_dim, value_dim]` in float32;
/// - Jamba's Mamba (`linear_attention` with `mamba_d_state`): `[B, expand·hidden,
///   d_conv]` and `[B, expand·hidden, d_state]` in float32;
/// - LFM2's short convolution (`conv`): `[B, hidden, conv_L_cache]`.
///
/// `None` for any other kind (not counted, and said so).
fn state_bytes(text: &Value, kind: &str, request: KvRequest) -> Option<u64> {
    let b = request.batch;
    let size = request.dtype.size();
    match kind {
        "linear_attention" if text.get("linear_num_value_heads").is_some() => {
            let (kh, kd) = (
                number(text, "linear_num_key_heads")?,
                number(text, "linear_key_head_dim")?,
            );
            let (vh, vd) = (
                number(text, "linear_num_value_heads")?,
                number(text, "linear_value_head_dim")?,
            );
            let kernel = number(text, "linear_conv_kernel_dim")?;
            Some(b * (2 * kh * kd + vh * vd) * kernel * size + b * vh * kd * vd * 4)
        }
        "linear_attention" if text.get("mamba_d_state").is_some() => {
            let inner = number(text, "mamba_expand")? * number(text, "hidden_size")?;
            Some(
                b * inner * number(text, "mamba_d_conv")? * size
                    + b * inner * number(text, "mamba_d_state")? * 4,
            )
        }
        "conv" => Some(b * number(text, "hidden_size")? * number(text, "conv_L_cache")? * size),
        _ => None,
    }
}

/// Every layer's kind for a config without `layer_types`, as transformers infers it.
fn inferred_kind(text: &Value, notes: &mut Vec<String>) -> &'static str {
    let sliding = text
        .get("sliding_window")
        .filter(|_| text.get("use_sliding_window").and_then(Value::as_bool) != Some(false))
        .and_then(Value::as_u64);
    if sliding.is_some() {
        notes.push(
            "config.json lists no layer_types: every layer taken as sliding-window, as transformers infers from sliding_window (a model class may derive other types in its own code: not checked)"
                .to_owned(),
        );
        "sliding_attention"
    } else if number(text, "attention_chunk_size").is_some() {
        "chunked_attention"
    } else {
        "full_attention"
    }
}

fn number(config: &Value, key: &str) -> Option<u64> {
    config.get(key).and_then(Value::as_u64)
}

/// The cache of the model `config` describes (config.json's whole text), or why it
/// cannot be known (a key it needs is missing).
pub fn kv_cache(config: &Value, request: KvRequest) -> Result<KvCache, String> {
    // A multimodal model's text decoder holds the cache.
    let text = config
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(config);
    let layers = number(text, "num_hidden_layers")
        .ok_or("config.json has no num_hidden_layers: the KV cache cannot be counted")?
        as usize;
    let heads = number(text, "num_attention_heads")
        .ok_or("config.json has no num_attention_heads: the KV cache cannot be counted")?;
    let kv_heads = number(text, "num_key_value_heads").unwrap_or(heads);
    let head_dim = if let Some(d) = number(text, "head_dim") {
        d
    } else {
        let hidden = number(text, "hidden_size")
            .ok_or("config.json has neither head_dim nor hidden_size")?;
        hidden / heads.max(1)
    };
    let mut notes = Vec::new();
    let kinds: Vec<String> = if let Some(list) = text.get("layer_types").and_then(Value::as_array) {
        list.iter()
            .map(|k| k.as_str().unwrap_or("full_attention").to_owned())
            .collect()
    } else if let (Some(period), Some(offset)) = (
        number(text, "attn_layer_period").filter(|p| *p > 0),
        number(text, "attn_layer_offset"),
    ) {
        // Jamba's config derives its layer types: attention every `period` layers from
        // `offset`, Mamba in between.
        (0..layers as u64)
            .map(|i| {
                if i % period == offset {
                    "full_attention"
                } else {
                    "linear_attention"
                }
                .to_owned()
            })
            .collect()
    } else {
        vec![inferred_kind(text, &mut notes).to_owned(); layers]
    };
    let sharing = text.get("kv_sharing_modes").and_then(Value::as_array);
    let window = |key: &str| number(text, key);
    let mla = number(text, "kv_lora_rank").zip(number(text, "qk_rope_head_dim"));
    let size = request.dtype.size();
    let mut out = Vec::with_capacity(layers);
    let mut uncounted: Vec<(String, usize)> = Vec::new();
    for (i, kind) in kinds.iter().take(layers).enumerate() {
        let reuses = sharing
            .and_then(|s| s.get(i))
            .and_then(Value::as_str)
            .is_some_and(|m| m == "reuse");
        let (kind, tokens) = match kind.as_str() {
            _ if reuses => ("none".to_owned(), 0),
            "moe" | "mlp" => ("none".to_owned(), 0),
            "full_attention" => (kind.clone(), request.context),
            "sliding_attention" | "chunked_attention" => {
                let key = if kind == "chunked_attention" {
                    "attention_chunk_size"
                } else {
                    "sliding_window"
                };
                let w = window(key)
                    .ok_or_else(|| format!("config.json has {kind} layers but no {key}"))?;
                // The last window − 1 tokens (DynamicSlidingWindowLayer).
                (kind.clone(), request.context.min(w.saturating_sub(1)))
            }
            other => {
                if let Some(bytes) = state_bytes(text, other, request) {
                    out.push(LayerCache {
                        kind: other.to_owned(),
                        tokens: 0,
                        bytes,
                    });
                    continue;
                }
                match uncounted.iter_mut().find(|(k, _)| k == other) {
                    Some((_, n)) => *n += 1,
                    None => uncounted.push((other.to_owned(), 1)),
                }
                (other.to_owned(), 0)
            }
        };
        let per_token = match (mla, kind.as_str()) {
            (_, "none") => 0,
            (Some((rank, rope)), _) => rank + rope,
            _ => 2 * kv_heads * head_dim,
        };
        let counted = matches!(
            kind.as_str(),
            "full_attention" | "sliding_attention" | "chunked_attention"
        );
        out.push(LayerCache {
            kind: if mla.is_some() && counted {
                "mla".to_owned()
            } else {
                kind
            },
            tokens,
            bytes: if counted {
                request.batch * tokens * per_token * size
            } else {
                0
            },
        });
    }
    if kinds.len() < layers {
        return Err(format!(
            "config.json's layer_types lists {} layers of {layers}",
            kinds.len()
        ));
    }
    Ok(KvCache {
        request,
        layers: out,
        not_counted: uncounted
            .into_iter()
            .map(|(k, n)| format!("{k} ({})", crate::text::count(n, "layer", "layers")))
            .collect(),
        notes,
    })
}

/// The first tensor of each of the `layers` decoder layers: of `P.i.` for the
/// container `P` (`model.layers`, `transformer.h`, …) that numbers the most layers;
/// `None` for a layer with no tensor there. A layer's cache lives where its weights are.
pub fn layer_tensors(
    ckpt: &crate::model::checkpoint::Checkpoint,
    layers: usize,
) -> Vec<Option<crate::model::checkpoint::TensorId>> {
    use std::collections::BTreeMap;
    // Container prefix → layer index → its first tensor.
    let mut containers: BTreeMap<&str, BTreeMap<usize, usize>> = BTreeMap::new();
    for (id, t) in ckpt.tensors().iter().enumerate() {
        let name: &str = &t.name;
        let mut at = 0;
        for part in name.split('.') {
            if let Ok(i) = part.parse::<usize>()
                && i < layers
                && at > 0
            {
                containers
                    .entry(&name[..at - 1])
                    .or_default()
                    .entry(i)
                    .or_insert(id);
                break;
            }
            at += part.len() + 1;
        }
    }
    let Some((_, first)) = containers.into_iter().max_by_key(|(_, m)| m.len()) else {
        return vec![None; layers];
    };
    (0..layers).map(|i| first.get(&i).copied()).collect()
}

/// Where each decoder layer sits under `map` (see [`layer_tensors`]).
pub fn layer_placements(
    ckpt: &crate::model::checkpoint::Checkpoint,
    map: &crate::model::DeviceMap,
    layers: usize,
) -> Vec<Option<crate::types::placement::Placement>> {
    let arch = crate::model::arch::lookup(&ckpt.config.architectures);
    layer_tensors(ckpt, layers)
        .into_iter()
        .map(|id| {
            id.map(|id| {
                crate::model::checkpoint::place(Some(map), &ckpt.tensors()[id].name, arch).0
            })
        })
        .collect()
}

/// A model's cache, one forward's activations, and the tensor that says where each
/// layer (and so its cache and activations) is, for a view whose placements change
/// (the inspector's edits).
#[derive(Debug, Clone)]
pub struct KvOnDevices {
    pub cache: KvCache,
    /// A forward over the whole context (`None` when the config says too little).
    pub act: Option<super::activation::Activations>,
    layer_tensors: Vec<Option<crate::model::checkpoint::TensorId>>,
}

impl KvOnDevices {
    /// The cache of `ckpt`'s model for `request`, and the activations of reading the
    /// context in one forward.
    pub fn new(
        ckpt: &crate::model::checkpoint::Checkpoint,
        request: KvRequest,
    ) -> Result<KvOnDevices, String> {
        let cache = kv_cache(&ckpt.config.raw, request)?;
        let layer_tensors = layer_tensors(ckpt, cache.layers.len());
        let act = super::activation::activations(
            &ckpt.config.raw,
            request.context,
            request.batch,
            request.dtype,
        )
        .ok();
        Ok(KvOnDevices {
            cache,
            act,
            layer_tensors,
        })
    }

    /// The device offloaded layers compute on: the first GPU of the model's device map,
    /// else of its tensors in order.
    fn main(ckpt: &crate::model::checkpoint::Checkpoint) -> Placement {
        match &ckpt.device_map {
            Some(map) => execution_device(map.entries().iter().map(|(_, p)| *p)),
            None => execution_device(ckpt.tensors().iter().map(|t| t.placement)),
        }
    }

    /// Where each layer computes, with `ckpt`'s placements as they are now (a layer
    /// with no tensor found counts as on the CPU).
    fn computing(&self, ckpt: &crate::model::checkpoint::Checkpoint) -> Vec<Placement> {
        let main = Self::main(ckpt);
        self.layer_tensors
            .iter()
            .map(|id| {
                let layer = id.map_or(Placement::Cpu, |id| ckpt.tensors()[id].placement);
                cache_device(layer, main)
            })
            .collect()
    }

    /// Bytes of the cache on `device`: a layer's cache where the layer computes
    /// ([`cache_device`]).
    pub fn on(&self, ckpt: &crate::model::checkpoint::Checkpoint, device: Placement) -> u64 {
        self.cache
            .layers
            .iter()
            .zip(self.computing(ckpt))
            .filter(|(_, at)| *at == device)
            .map(|(layer, _)| layer.bytes)
            .sum()
    }

    /// Bytes of the activations on `device`: one layer's peak where any layer
    /// computes, the logits where the head is, a materialized mask on the execution
    /// device.
    pub fn activations_on(
        &self,
        ckpt: &crate::model::checkpoint::Checkpoint,
        device: Placement,
    ) -> u64 {
        let Some(act) = &self.act else {
            return 0;
        };
        let main = Self::main(ckpt);
        let mut bytes = 0;
        if self.computing(ckpt).contains(&device) {
            bytes += act.per_layer;
        }
        let head = ckpt
            .tensor("lm_head.weight")
            .map_or(main, |t| cache_device(t.placement, main));
        if head == device {
            bytes += act.logits;
        }
        if main == device {
            bytes += act.mask;
        }
        bytes
    }
}

/// The device the offloaded modules of a dispatched model compute on, as accelerate's
/// `dispatch_model` picks it: the first device of the map (in its order) that is
/// neither `cpu` nor `disk`; the CPU when the map holds no other.
pub fn execution_device(values: impl IntoIterator<Item = Placement>) -> Placement {
    values
        .into_iter()
        .find(|p| !matches!(p, Placement::Cpu | Placement::Disk | Placement::Meta))
        .unwrap_or(Placement::Cpu)
}

/// Where a layer placed on `layer` keeps its KV cache: where it computes. A layer on
/// `cpu` or `disk` is brought to the execution device `main` for its forward
/// (accelerate's offload hooks), and its keys and values are made there.
pub fn cache_device(layer: Placement, main: Placement) -> Placement {
    match layer {
        Placement::Cpu | Placement::Disk => main,
        other => other,
    }
}

/// The dtype the model computes in: `load` (from_pretrained's dtype), else
/// config.json's, else torch's default, float32.
pub fn compute_dtype(ckpt: &crate::model::checkpoint::Checkpoint, load: Option<DType>) -> DType {
    load.or_else(|| {
        ckpt.config
            .torch_dtype
            .as_deref()
            .and_then(DType::from_torch_name)
    })
    .unwrap_or(DType::F32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(context: u64) -> KvRequest {
        KvRequest {
            context,
            batch: 2,
            dtype: DType::BF16,
        }
    }

    #[test]
    fn full_sliding_and_mla_layers_keep_what_transformers_keeps() {
        let config = serde_json::json!({
            "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
            "hidden_size": 256, "sliding_window": 10,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        });
        let cache = kv_cache(&config, request(100)).expect("counted");
        // head_dim 256 / 8 = 32: 2 · 2 kv heads · 32 = 128 elements a token.
        let per_token = 128 * 2 * 2;
        assert_eq!(
            cache.layers.iter().map(|l| l.tokens).collect::<Vec<_>>(),
            [9, 100, 9]
        );
        assert_eq!(cache.bytes(), (9 + 100 + 9) * per_token);
        let mla = serde_json::json!({
            "num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 256,
            "kv_lora_rank": 512, "qk_rope_head_dim": 64,
        });
        assert_eq!(
            kv_cache(&mla, request(7)).expect("counted").bytes(),
            2 * 2 * 7 * (512 + 64) * 2
        );
    }

    #[test]
    fn layers_not_counted_are_named_and_sharing_layers_keep_nothing() {
        let config = serde_json::json!({
            "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 16,
            "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
            "kv_sharing_modes": ["own", "own", "own", "reuse"],
        });
        let cache = kv_cache(&config, request(5)).expect("counted");
        assert_eq!(cache.not_counted, ["linear_attention (2 layers)"]);
        assert_eq!(cache.layers[3].bytes, 0);
        assert_eq!(cache.bytes(), 2 * 5 * 2 * 4 * 16 * 2);
    }
}
