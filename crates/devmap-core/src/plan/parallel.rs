//! `plan --tp N [--ep N] [--pp N]`: the bytes each GPU of a parallel inference server
//! holds, as vLLM shards a transformers checkpoint (`vllm/model_executor/layers/`:
//! `linear.py`, `vocab_parallel_embedding.py`, `fused_moe/layer.py`;
//! `vllm/distributed/utils.py` for the pipeline stages). SGLang shards the same way,
//! and its `--ep-size` below `--tp` is the `moe_tp = tp / ep` case.
//!
//! - **Column-parallel** (`q_proj`, `k_proj`, `v_proj`, `gate_proj`, `up_proj`, MLA's
//!   `q_b_proj`, `kv_b_proj`, dense and shared-expert MLPs): rows split over the tensor
//!   ranks, biases with them. Keys and values split by head: `kv_heads / tp` heads a
//!   rank, or when `tp > kv_heads` one head, replicated `tp / kv_heads` times (GQA
//!   replication).
//! - **Row-parallel** (`o_proj`, `down_proj`): columns split; biases whole on every
//!   rank.
//! - **Vocabulary-parallel** (`embed_tokens`, `lm_head`): the vocabulary padded to a
//!   multiple of 64 (`DEFAULT_VOCAB_PADDING_SIZE`), then split: `pad64(V) / tp` rows a
//!   rank. A tied `lm_head` is the embedding (one tensor).
//! - **Replicated**: norms, routers (`mlp.gate`), MLA's `q_a_proj` and
//!   `kv_a_proj_with_mqa`, `e_score_correction_bias`, and anything not recognised
//!   (named in the notes).
//! - **Experts** (`experts.E.*`): with `--ep N`, expert parallel ranks hold
//!   `E / N` experts each (vLLM's `determine_expert_map`, linear placement: the first
//!   `E mod N` ranks one more), each expert whole when `N ≥ tp` (vLLM's EP, where
//!   `N = tp × dp` and the attention is data-parallel over `N / tp` groups), or split
//!   over `tp / N` ranks when `N < tp` (SGLang). Without `--ep`, every rank holds every
//!   expert, its intermediate split over the tensor ranks.
//! - **Pipeline stages** (`--pp`): `L / pp` layers a stage, the remainder one each to
//!   the stages before the last, from the last but one backwards (`get_pp_indices`);
//!   the embedding on the first stage, the final norm and `lm_head` on the last (a tied
//!   head is a copy of the embedding there). Layers past `num_hidden_layers` (DeepSeek's
//!   multi-token-prediction layer) are not loaded by the main model.
//!
//! The KV cache splits like the keys and values: `kv_heads / tp` heads a rank (one
//! when replicated); MLA's latent cache is whole on every tensor rank; linear-attention
//! and convolution states split over the tensor ranks. Each stage holds its layers'.

use std::collections::BTreeMap;

use super::kv::KvCache;
use crate::model::checkpoint::{Checkpoint, Tensor};
use crate::types::DType;

/// vLLM's `DEFAULT_VOCAB_PADDING_SIZE`.
pub const VOCAB_PADDING: u64 = 64;

/// How the server is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Tensor-parallel ranks.
    pub tp: u64,
    /// Expert-parallel ranks (1: no expert parallelism).
    pub ep: u64,
    /// Pipeline stages.
    pub pp: u64,
}

impl Layout {
    /// GPUs a stage takes: the tensor ranks, or the expert ranks when more (the
    /// attention then data-parallel over `ep / tp` groups).
    pub fn width(&self) -> u64 {
        self.tp.max(self.ep)
    }

    /// Ranks an expert is split over.
    fn expert_tp(&self) -> u64 {
        if self.ep >= self.tp {
            1
        } else {
            self.tp / self.ep
        }
    }

    /// The expert-parallel rank of GPU `g` of a stage.
    fn ep_rank(&self, g: u64) -> u64 {
        if self.ep >= self.tp {
            g
        } else {
            g / self.expert_tp()
        }
    }
}

/// One GPU's share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rank {
    /// Its global rank: `stage × width + g`.
    pub rank: u64,
    pub stage: u64,
    pub tp_rank: u64,
    pub ep_rank: u64,
    /// Decoder layers `[first, end)` of its stage.
    pub layers: (u64, u64),
    pub weights: u64,
    pub kv: u64,
}

/// Every GPU's share, and what was assumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharded {
    pub layout: Layout,
    pub ranks: Vec<Rank>,
    /// Tensors not recognised, counted whole on every rank.
    pub replicated_unknown: Vec<String>,
    pub notes: Vec<String>,
}

impl Sharded {
    /// The rank holding the most (weights + KV).
    pub fn largest(&self) -> Option<&Rank> {
        self.ranks.iter().max_by_key(|r| (r.weights + r.kv, r.rank))
    }
}

/// How a tensor is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    /// Rows over the tensor ranks.
    Column,
    /// Key or value heads: `kv_heads / tp` a rank, at least one.
    KvHeads,
    /// Columns over the tensor ranks (biases whole).
    Row,
    /// Vocabulary rows, padded to 64, over the tensor ranks.
    Vocab,
    Replicated,
    /// Expert `e`'s weight, split like `kind` over the expert's tensor ranks.
    Expert(u64, ExpertPart),
    /// A stacked expert tensor `[E, …]` (gpt-oss): experts over the EP ranks, the
    /// rest over the expert's tensor ranks.
    Experts,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExpertPart {
    Column,
    Row,
}

/// The module a tensor belongs to and its own last name: `a.b.q_proj` and `weight`
/// (quantization companions such as `weight_scale_inv` name their weight's module).
fn module_and_leaf(name: &str) -> (&str, &str) {
    name.rsplit_once('.').unwrap_or(("", name))
}

/// The decoder layer a name is in (`….layers.N.…`).
fn layer_of(name: &str) -> Option<u64> {
    let mut parts = name.split('.');
    while let Some(p) = parts.next() {
        if matches!(p, "layers" | "h" | "blocks")
            && let Some(n) = parts.clone().next().and_then(|n| n.parse().ok())
        {
            return Some(n);
        }
    }
    None
}

fn split_of(name: &str) -> Split {
    let (module, _) = module_and_leaf(name);
    let last = module.rsplit('.').next().unwrap_or(module);
    let components: Vec<&str> = module.split('.').collect();
    if let Some(at) = components.iter().position(|c| *c == "experts") {
        if let Some(e) = components.get(at + 1).and_then(|e| e.parse::<u64>().ok()) {
            let part = match last {
                "down_proj" | "w2" => ExpertPart::Row,
                _ => ExpertPart::Column,
            };
            return Split::Expert(e, part);
        }
        if at + 1 == components.len() {
            return Split::Experts;
        }
    }
    match last {
        "embed_tokens" | "lm_head" | "wte" | "word_embeddings" => Split::Vocab,
        "k_proj" | "v_proj" => Split::KvHeads,
        "q_proj" | "gate_proj" | "up_proj" | "q_b_proj" | "kv_b_proj" | "w1" | "w3" => {
            Split::Column
        }
        "o_proj" | "down_proj" | "w2" => Split::Row,
        "gate" | "router" | "q_a_proj" | "kv_a_proj_with_mqa" | "shared_expert_gate" => {
            Split::Replicated
        }
        _ if last.contains("norm") || last.ends_with("layernorm") => Split::Replicated,
        _ if name.ends_with("e_score_correction_bias") => Split::Replicated,
        _ => Split::Unknown,
    }
}

/// Elements of `t` with dimension `dim` cut to `part` of `of` (rounded up).
fn cut(t: &Tensor, dim: usize, part: u64, of: u64) -> u64 {
    let shape = t.shape.to_vec();
    let Some(&n) = shape.get(dim) else {
        return t.numel();
    };
    let kept = (n * part).div_ceil(of.max(1));
    shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if i == dim { kept } else { d })
        .product()
}

/// Pipeline stage `s`'s layers `[first, end)`, as vLLM's `get_pp_indices` splits `layers`.
pub fn stage_layers(layers: u64, s: u64, pp: u64) -> (u64, u64) {
    let mut partitions = vec![layers / pp; pp as usize];
    let remaining = layers % pp;
    for i in 2..remaining + 2 {
        let at = partitions.len() as u64 - i;
        partitions[at as usize] += 1;
    }
    let first: u64 = partitions[..s as usize].iter().sum();
    (first, first + partitions[s as usize])
}

/// Expert-parallel rank `r`'s experts `[first, end)` of `experts` (vLLM's
/// `determine_expert_map`, linear placement).
pub fn rank_experts(experts: u64, r: u64, ep: u64) -> (u64, u64) {
    let base = experts / ep;
    let remainder = experts % ep;
    let first = r * base + r.min(remainder);
    (first, first + base + u64::from(r < remainder))
}

fn number(config: &serde_json::Value, key: &str) -> Option<u64> {
    let text = config
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(config);
    text.get(key).and_then(serde_json::Value::as_u64)
}

/// Each GPU's bytes under `layout`, the weights in `dtype` when given (floating
/// tensors; quantized ones as stored), with `kv` split as the heads are.
pub fn shard(
    ckpt: &Checkpoint,
    layout: Layout,
    dtype: Option<DType>,
    kv: Option<&KvCache>,
) -> Result<Sharded, String> {
    let Layout { tp, ep, pp } = layout;
    if tp == 0 || ep == 0 || pp == 0 {
        return Err("--tp, --ep and --pp count ranks: 1 or more".to_owned());
    }
    if ep > 1 && !(ep.is_multiple_of(tp) || tp.is_multiple_of(ep)) {
        return Err(format!(
            "--ep {ep} with --tp {tp}: vLLM's expert ranks are tp × dp, SGLang's divide tp; one must divide the other"
        ));
    }
    let config = &ckpt.config.raw;
    let layers = number(config, "num_hidden_layers")
        .ok_or("config.json has no num_hidden_layers: the layers cannot be staged")?;
    if pp > layers {
        return Err(format!("--pp {pp} is more stages than the {layers} layers"));
    }
    let heads = number(config, "num_attention_heads").unwrap_or(0);
    let kv_heads = number(config, "num_key_value_heads").unwrap_or(heads);
    if heads > 0 && !heads.is_multiple_of(tp) {
        return Err(format!(
            "{heads} attention heads do not split over {tp} tensor ranks (vLLM requires it)"
        ));
    }
    if kv_heads > 0 && !kv_heads.is_multiple_of(tp) && !tp.is_multiple_of(kv_heads) {
        return Err(format!(
            "{kv_heads} key/value heads and {tp} tensor ranks: one must divide the other (vLLM requires it)"
        ));
    }
    let kv_per_rank = if kv_heads == 0 {
        1
    } else {
        (kv_heads / tp).max(1)
    };
    let tied = ckpt.config.tie_word_embeddings;
    let width = layout.width();
    let expert_tp = layout.expert_tp();
    let mut unknown = Vec::new();
    let mut notes = Vec::new();
    let mut beyond = 0usize;
    // Per (stage, g): weights.
    let mut weights: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    let stages: Vec<(u64, u64)> = (0..pp).map(|s| stage_layers(layers, s, pp)).collect();
    for t in ckpt.tensors() {
        let name: &str = &t.name;
        let split = split_of(name);
        let is_head = module_and_leaf(name).0.ends_with("lm_head");
        if is_head && tied {
            continue;
        }
        // The stages holding it.
        let held_by: Vec<u64> = match layer_of(name) {
            Some(l) if l >= layers => {
                beyond += 1;
                continue;
            }
            Some(l) => stages
                .iter()
                .position(|&(a, b)| (a..b).contains(&l))
                .map(|s| vec![s as u64])
                .unwrap_or_default(),
            None if split == Split::Vocab && is_head => vec![pp - 1],
            None if split == Split::Vocab && tied && pp > 1 => vec![0, pp - 1],
            None if split == Split::Vocab => vec![0],
            // The final norm, on the last stage.
            None => vec![pp - 1],
        };
        // Quantized weights (FP8, packed integers) stay as stored: vLLM computes with them.
        let element = match dtype {
            Some(d) if matches!(t.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64) => {
                d.size()
            }
            _ => t.dtype.size(),
        };
        let rank_dims = t.shape.to_vec().len();
        for &s in &held_by {
            for g in 0..width {
                let elements = match split {
                    Split::KvHeads if kv_heads > 0 => cut(t, 0, kv_per_rank, kv_heads),
                    Split::Column | Split::KvHeads => cut(t, 0, 1, tp),
                    Split::Row if rank_dims >= 2 => cut(t, rank_dims - 1, 1, tp),
                    Split::Row | Split::Replicated => t.numel(),
                    Split::Vocab => {
                        let rows = t.shape.to_vec().first().copied().unwrap_or(0);
                        let padded = rows.div_ceil(VOCAB_PADDING) * VOCAB_PADDING;
                        cut(t, 0, padded.div_ceil(tp), rows.max(1))
                    }
                    Split::Expert(e, part) => {
                        let experts = number(config, "num_experts")
                            .or_else(|| number(config, "num_local_experts"))
                            .or_else(|| number(config, "n_routed_experts"))
                            .unwrap_or(e + 1);
                        let (a, b) = rank_experts(experts, layout.ep_rank(g), ep);
                        if !(a..b).contains(&e) {
                            0
                        } else if part == ExpertPart::Row && rank_dims >= 2 {
                            cut(t, rank_dims - 1, 1, expert_tp)
                        } else if part == ExpertPart::Row {
                            t.numel()
                        } else {
                            cut(t, 0, 1, expert_tp)
                        }
                    }
                    Split::Experts => {
                        let experts = t.shape.to_vec().first().copied().unwrap_or(1);
                        let (a, b) = rank_experts(experts, layout.ep_rank(g), ep);
                        let mine = cut(t, 0, b - a, experts);
                        mine.div_ceil(expert_tp)
                    }
                    Split::Unknown => {
                        if s == held_by[0] && g == 0 {
                            unknown.push(name.to_owned());
                        }
                        t.numel()
                    }
                };
                *weights.entry((s, g)).or_default() += elements * element;
            }
        }
    }
    if beyond > 0 {
        notes.push(format!(
            "{} past num_hidden_layers ({layers}) left out: the main model does not load them (DeepSeek's multi-token prediction)",
            crate::text::count(beyond, "tensor", "tensors")
        ));
    }
    if tp > kv_heads && kv_heads > 0 {
        notes.push(format!(
            "{kv_heads} key/value heads over {tp} tensor ranks: each rank holds one, replicated {} times",
            tp / kv_heads
        ));
    }
    let mut ranks = Vec::new();
    for (s, &(first, end)) in stages.iter().enumerate() {
        let s = s as u64;
        let kv_bytes: u64 = kv.map_or(0, |cache| {
            cache
                .layers
                .iter()
                .enumerate()
                .filter(|(i, _)| (first..end).contains(&(*i as u64)))
                .map(|(_, l)| match l.kind.as_str() {
                    "mla" | "none" => l.bytes,
                    "full_attention" | "sliding_attention" | "chunked_attention"
                        if kv_heads > 0 =>
                    {
                        l.bytes / kv_heads * kv_per_rank
                    }
                    _ => l.bytes.div_ceil(tp),
                })
                .sum()
        });
        for g in 0..width {
            ranks.push(Rank {
                rank: s * width + g,
                stage: s,
                tp_rank: g % tp,
                ep_rank: layout.ep_rank(g),
                layers: (first, end),
                weights: weights.get(&(s, g)).copied().unwrap_or(0),
                kv: kv_bytes,
            });
        }
    }
    Ok(Sharded {
        layout,
        ranks,
        replicated_unknown: unknown,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_give_the_remainder_to_the_stages_before_the_last() {
        // vLLM's own example: 30 layers over 4 stages → 7, 8, 8, 7.
        let stages: Vec<_> = (0..4).map(|s| stage_layers(30, s, 4)).collect();
        assert_eq!(stages, [(0, 7), (7, 15), (15, 23), (23, 30)]);
        assert_eq!(stage_layers(61, 0, 1), (0, 61));
    }

    #[test]
    fn experts_go_to_the_first_ranks_first() {
        let ranks: Vec<_> = (0..3).map(|r| rank_experts(8, r, 3)).collect();
        assert_eq!(ranks, [(0, 3), (3, 6), (6, 8)]);
    }

    #[test]
    fn names_split_as_vllm_shards_them() {
        assert_eq!(
            split_of("model.layers.0.self_attn.q_proj.weight"),
            Split::Column
        );
        assert_eq!(
            split_of("model.layers.0.self_attn.k_proj.bias"),
            Split::KvHeads
        );
        assert_eq!(
            split_of("model.layers.0.self_attn.o_proj.weight"),
            Split::Row
        );
        assert_eq!(
            split_of("model.layers.3.mlp.experts.7.down_proj.weight"),
            Split::Expert(7, ExpertPart::Row)
        );
        assert_eq!(
            split_of("model.layers.3.mlp.experts.7.up_proj.weight_scale_inv"),
            Split::Expert(7, ExpertPart::Column)
        );
        assert_eq!(
            split_of("model.layers.3.mlp.gate.weight"),
            Split::Replicated
        );
        assert_eq!(
            split_of("model.layers.3.self_attn.kv_a_proj_with_mqa.weight"),
            Split::Replicated
        );
        assert_eq!(split_of("model.norm.weight"), Split::Replicated);
        assert_eq!(split_of("lm_head.weight"), Split::Vocab);
        assert_eq!(split_of("model.layers.0.mystery.weight"), Split::Unknown);
    }
}
