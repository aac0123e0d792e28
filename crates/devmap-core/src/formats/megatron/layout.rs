//! Megatron-Core's names and layouts, and Hugging Face's: the one table of how each
//! tensor a `GPTModel` saves becomes transformers' tensors, and the arithmetic that
//! turns a block of a source tensor into pieces of an output.
//!
//! A `GPTModel` saved with `dist_checkpointing` stacks its layers on a leading axis
//! (`decoder.layers.self_attention.linear_qkv.weight` is `[layers, rows, hidden]`);
//! with `non_homogeneous_layers` each layer is saved apart (`decoder.layers.3.…`).
//! Either way an output is a set of row blocks of one layer of one source tensor, and
//! every such block lies in the chunks ranks saved as row-major runs: one piece per
//! block and chunk, read where it lies, nothing gathered in memory.

pub use super::moe_rules::{MOE_RULES, MoeNames};
use crate::formats::{FormatError, Kind};
use crate::types::DType;
use crate::types::pieces::Piece;
use crate::types::range::ByteRange;
use std::path::Path;

/// How an output is cut from its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The whole tensor (of one layer, for a layer's).
    Whole,
    /// Megatron's fused `linear_qkv`: per query group, the group's query heads, then
    /// its key head, then its value head, `head_dim` rows each; `part` 0, 1, 2 is
    /// `q_proj`, `k_proj`, `v_proj`.
    Qkv(u8),
    /// `linear_fc1` of a gated MLP: the gate's rows, then the up projection's; `part`
    /// 0 is `gate_proj`, 1 is `up_proj`.
    GateUp(u8),
}

/// One row of the map: the Megatron-Core name (layers' without the layer index), the
/// transformers name (`{}` stands for the layer index), and the cut.
pub struct Rule {
    pub megatron: &'static str,
    pub hf: &'static str,
    pub cut: Cut,
}

const fn rule(megatron: &'static str, hf: &'static str, cut: Cut) -> Rule {
    Rule { megatron, hf, cut }
}

/// Llama, Mistral, Qwen2 (`linear_qkv.bias`) and Qwen3 (`q_layernorm`/`k_layernorm`)
/// as Megatron-Core's GPTModel saves them, with both layer specs' norm names: the
/// Transformer Engine spec fuses the norms into the next linear
/// (`linear_qkv.layer_norm_weight`), and the local spec saves them under those names
/// too; older checkpoints have `input_layernorm` and `pre_mlp_layernorm`.
pub const RULES: &[Rule] = &[
    rule(
        "embedding.word_embeddings.weight",
        "model.embed_tokens.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.final_layernorm.weight",
        "model.norm.weight",
        Cut::Whole,
    ),
    rule("output_layer.weight", "lm_head.weight", Cut::Whole),
    rule(
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
        "model.layers.{}.input_layernorm.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.input_layernorm.weight",
        "model.layers.{}.input_layernorm.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.linear_qkv.weight",
        "model.layers.{}.self_attn.q_proj.weight",
        Cut::Qkv(0),
    ),
    rule(
        "decoder.layers.self_attention.linear_qkv.weight",
        "model.layers.{}.self_attn.k_proj.weight",
        Cut::Qkv(1),
    ),
    rule(
        "decoder.layers.self_attention.linear_qkv.weight",
        "model.layers.{}.self_attn.v_proj.weight",
        Cut::Qkv(2),
    ),
    rule(
        "decoder.layers.self_attention.linear_qkv.bias",
        "model.layers.{}.self_attn.q_proj.bias",
        Cut::Qkv(0),
    ),
    rule(
        "decoder.layers.self_attention.linear_qkv.bias",
        "model.layers.{}.self_attn.k_proj.bias",
        Cut::Qkv(1),
    ),
    rule(
        "decoder.layers.self_attention.linear_qkv.bias",
        "model.layers.{}.self_attn.v_proj.bias",
        Cut::Qkv(2),
    ),
    rule(
        "decoder.layers.self_attention.q_layernorm.weight",
        "model.layers.{}.self_attn.q_norm.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.k_layernorm.weight",
        "model.layers.{}.self_attn.k_norm.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.linear_proj.weight",
        "model.layers.{}.self_attn.o_proj.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.mlp.linear_fc1.layer_norm_weight",
        "model.layers.{}.post_attention_layernorm.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.pre_mlp_layernorm.weight",
        "model.layers.{}.post_attention_layernorm.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.mlp.linear_fc1.weight",
        "model.layers.{}.mlp.gate_proj.weight",
        Cut::GateUp(0),
    ),
    rule(
        "decoder.layers.mlp.linear_fc1.weight",
        "model.layers.{}.mlp.up_proj.weight",
        Cut::GateUp(1),
    ),
    rule(
        "decoder.layers.mlp.linear_fc2.weight",
        "model.layers.{}.mlp.down_proj.weight",
        Cut::Whole,
    ),
];

/// Multi-latent attention (DeepSeek-V3's, megatron-core's `MLASelfAttention`) as
/// transformers' DeepSeek-V3 names it: renames only, the rows in the same order on
/// both sides (a head's no-position part then its rotary part; the latent, then the
/// rotary key). The queries come through a low-rank pair (`linear_q_down_proj`,
/// `q_layernorm`, `linear_q_up_proj`) or, without `q_lora_rank`, one `linear_q_proj`.
/// The Transformer Engine spec saves each norm fused into the next linear
/// (`linear_q_up_proj.layer_norm_weight`). Checked before [`RULES`] for an MLA model,
/// whose `q_layernorm` is the latent query's norm, not Qwen3's per-head one.
pub const LATENT_RULES: &[Rule] = &[
    rule(
        "decoder.layers.self_attention.linear_q_proj.weight",
        "model.layers.{}.self_attn.q_proj.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.linear_q_down_proj.weight",
        "model.layers.{}.self_attn.q_a_proj.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.q_layernorm.weight",
        "model.layers.{}.self_attn.q_a_layernorm.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.linear_q_up_proj.layer_norm_weight",
        "model.layers.{}.self_attn.q_a_layernorm.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.linear_q_up_proj.weight",
        "model.layers.{}.self_attn.q_b_proj.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.linear_kv_down_proj.weight",
        "model.layers.{}.self_attn.kv_a_proj_with_mqa.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.kv_layernorm.weight",
        "model.layers.{}.self_attn.kv_a_layernorm.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.linear_kv_up_proj.layer_norm_weight",
        "model.layers.{}.self_attn.kv_a_layernorm.weight",
        Cut::Whole,
    ),
    rule(
        "decoder.layers.self_attention.linear_kv_up_proj.weight",
        "model.layers.{}.self_attn.kv_b_proj.weight",
        Cut::Whole,
    ),
];

/// The key of the latent attention's down projection: a checkpoint holding it is an
/// MLA model.
pub const LATENT_KV_DOWN: &str = "decoder.layers.self_attention.linear_kv_down_proj.weight";

/// What one Megatron-Core name becomes: each output's transformers name (`{}` the
/// layer, `{e}` the expert), its cut, and whether the source has an expert axis. An
/// MLA model's (`latent`) attention names come from [`LATENT_RULES`]. `Err` names the
/// family that has no such tensor (a shared expert in Qwen3-MoE, …).
pub fn outputs_of(
    key: &str,
    moe: MoeNames,
    latent: bool,
) -> Result<Vec<(&'static str, Cut, bool)>, String> {
    let latent_rules: &[Rule] = if latent { LATENT_RULES } else { &[] };
    let mut outputs: Vec<_> = match latent_rules.iter().find(|r| r.megatron == key) {
        Some(r) => vec![(r.hf, r.cut, false)],
        None => RULES
            .iter()
            .filter(|r| r.megatron == key)
            .map(|r| (r.hf, r.cut, false))
            .collect(),
    };
    for r in MOE_RULES.iter().filter(|r| r.megatron == key) {
        let hf = r.name(moe).ok_or_else(|| {
            format!(
                "has no place in transformers' {} (give --config with the config.json of the family the model is: qwen2_moe for a gated shared expert, deepseek_v3 or glm4_moe for an ungated one and a router bias)",
                moe.model_type()
            )
        })?;
        outputs.push((hf, r.cut, r.per_expert));
    }
    Ok(outputs)
}

/// Whether devmap's map has a name for the Megatron-Core name `key`.
pub fn is_mapped(key: &str) -> bool {
    RULES.iter().any(|r| r.megatron == key)
        || LATENT_RULES.iter().any(|r| r.megatron == key)
        || MOE_RULES.iter().any(|r| r.megatron == key)
}

/// The layers' prefix of Megatron-Core's names.
pub const LAYERS: &str = "decoder.layers.";

/// The attention's head counts, for the cut of `linear_qkv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub query: u64,
    pub key_value: u64,
    pub dim: u64,
}

/// One block of rows an output takes: source rows `from..from + len` become output
/// rows `to..to + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub from: u64,
    pub len: u64,
    pub to: u64,
}

/// The row blocks of `cut` over a source dimension of `rows` rows.
pub fn row_blocks(cut: Cut, rows: u64, heads: Option<Heads>) -> Result<Vec<Rows>, String> {
    match cut {
        Cut::Whole => Ok(vec![Rows {
            from: 0,
            len: rows,
            to: 0,
        }]),
        Cut::GateUp(part) => {
            if !rows.is_multiple_of(2) {
                return Err(format!(
                    "has {rows} rows, which is not a gate and an up projection of one size"
                ));
            }
            let half = rows / 2;
            Ok(vec![Rows {
                from: u64::from(part) * half,
                len: half,
                to: 0,
            }])
        }
        Cut::Qkv(part) => {
            let h = heads.ok_or("needs the attention's head counts")?;
            if h.key_value == 0 || !h.query.is_multiple_of(h.key_value) {
                return Err(format!(
                    "cannot be cut: {} query heads do not fall into {} groups",
                    h.query, h.key_value
                ));
            }
            let per_group = h.query / h.key_value;
            let group_rows = (per_group + 2) * h.dim;
            if group_rows * h.key_value != rows {
                return Err(format!(
                    "has {rows} rows, but {} query heads in {} groups of head dimension {} make {}",
                    h.query,
                    h.key_value,
                    h.dim,
                    group_rows * h.key_value
                ));
            }
            let (skip, len) = match part {
                0 => (0, per_group * h.dim),
                1 => (per_group * h.dim, h.dim),
                _ => ((per_group + 1) * h.dim, h.dim),
            };
            Ok((0..h.key_value)
                .map(|g| Rows {
                    from: g * group_rows + skip,
                    len,
                    to: g * len,
                })
                .collect())
        }
    }
}

/// A source tensor as the ranks saved it: its chunks, each a row-major run of a file
/// (a tensor saved whole is one chunk at offset zero).
pub struct Source<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [u64],
    pub chunks: &'a [Piece],
}

/// The pieces of an output made of `rows` of the dimension after `prefix` (the layer
/// index, for a stacked tensor; empty otherwise), the following dimensions whole.
/// Each piece is one block within one chunk, read where it lies.
pub fn select(
    metadata: &Path,
    source: &Source,
    prefix: &[u64],
    rows: &[Rows],
) -> Result<Vec<Piece>, FormatError> {
    let k = prefix.len();
    if source.shape.len() <= k {
        return Err(FormatError::tensor_as(
            Kind::Malformed,
            metadata,
            source.name,
            format!(
                "has shape {:?}, which has no dimension after its layer axis",
                source.shape
            ),
        ));
    }
    let element = source.dtype.size();
    let mut pieces = Vec::new();
    for chunk in source.chunks {
        let (o, s) = (&chunk.offsets, &chunk.sizes);
        if chunk.stride.is_some() || o.len() != source.shape.len() || s.len() != o.len() {
            return Err(FormatError::tensor_as(
                Kind::Malformed,
                metadata,
                source.name,
                "has a chunk whose dimensions are not the tensor's",
            ));
        }
        if (0..k).any(|j| prefix[j] < o[j] || prefix[j] >= o[j] + s[j]) {
            continue;
        }
        // The chunk's row of the prefix, then rows of dimension k, each `inner` bytes.
        let inner: u64 = s[k + 1..].iter().product::<u64>() * element;
        let before = (0..k).fold(0, |at, j| at * s[j] + (prefix[j] - o[j]));
        for block in rows {
            let start = block.from.max(o[k]);
            let end = (block.from + block.len).min(o[k] + s[k]);
            if start >= end {
                continue;
            }
            let mut offsets = vec![block.to + (start - block.from)];
            offsets.extend_from_slice(&o[k + 1..]);
            let mut sizes = vec![end - start];
            sizes.extend_from_slice(&s[k + 1..]);
            pieces.push(Piece {
                range: ByteRange {
                    file: chunk.range.file,
                    offset: chunk.range.offset + (before * s[k] + (start - o[k])) * inner,
                    len: (end - start) * inner,
                },
                offsets: offsets.into(),
                sizes: sizes.into(),
                stride: None,
            });
        }
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(file: usize, offset: u64, offsets: &[u64], sizes: &[u64]) -> Piece {
        let len = sizes.iter().product::<u64>() * 4;
        Piece {
            range: ByteRange { file, offset, len },
            offsets: offsets.into(),
            sizes: sizes.into(),
            stride: None,
        }
    }

    #[test]
    fn qkv_rows_follow_megatrons_groups() {
        // 4 query heads in 2 groups, head dim 2: per group q q q q k k v v (rows).
        let heads = Some(Heads {
            query: 4,
            key_value: 2,
            dim: 2,
        });
        let q = row_blocks(Cut::Qkv(0), 16, heads).expect("cut");
        assert_eq!(
            q,
            [
                Rows {
                    from: 0,
                    len: 4,
                    to: 0
                },
                Rows {
                    from: 8,
                    len: 4,
                    to: 4
                }
            ]
        );
        let v = row_blocks(Cut::Qkv(2), 16, heads).expect("cut");
        assert_eq!(
            v[1],
            Rows {
                from: 14,
                len: 2,
                to: 2
            }
        );
        assert!(row_blocks(Cut::Qkv(0), 18, heads).is_err());
    }

    #[test]
    fn a_block_is_found_in_each_chunk_it_crosses() {
        // [layers 2, rows 4, cols 3] f32, saved by two ranks split on rows.
        let chunks = [
            chunk(0, 100, &[0, 0, 0], &[2, 2, 3]),
            chunk(1, 200, &[0, 2, 0], &[2, 2, 3]),
        ];
        let source = Source {
            name: "w",
            dtype: DType::F32,
            shape: &[2, 4, 3],
            chunks: &chunks,
        };
        let rows = [Rows {
            from: 1,
            len: 2,
            to: 0,
        }];
        let pieces = select(Path::new("m"), &source, &[1], &rows).expect("select");
        assert_eq!(pieces.len(), 2);
        // Layer 1, row 1 of rank 0's chunk: (1 * 2 + 1) rows of 12 bytes in.
        assert_eq!(pieces[0].range.offset, 100 + 3 * 12);
        assert_eq!(pieces[0].range.len, 12);
        assert_eq!(&*pieces[0].offsets, &[0, 0]);
        // Layer 1, row 0 of rank 1's chunk (global row 2).
        assert_eq!(pieces[1].range.offset, 200 + 2 * 12);
        assert_eq!(&*pieces[1].offsets, &[1, 0]);
        assert_eq!(&*pieces[1].sizes, &[1, 3]);
    }

    #[test]
    fn q_layernorm_is_the_latent_querys_norm_in_an_mla_model() {
        let key = "decoder.layers.self_attention.q_layernorm.weight";
        let grouped = outputs_of(key, MoeNames::Qwen3Moe, false).expect("mapped");
        assert_eq!(grouped[0].0, "model.layers.{}.self_attn.q_norm.weight");
        let latent = outputs_of(key, MoeNames::DeepseekV3, true).expect("mapped");
        assert_eq!(latent.len(), 1);
        assert_eq!(
            latent[0].0,
            "model.layers.{}.self_attn.q_a_layernorm.weight"
        );
        // The router's bias has a name only in the sigmoid families.
        let bias = "decoder.layers.mlp.router.expert_bias";
        assert!(outputs_of(bias, MoeNames::Mixtral, false).is_err());
        let glm = outputs_of(bias, MoeNames::Glm4Moe, false).expect("mapped");
        assert_eq!(glm[0].0, "model.layers.{}.mlp.gate.e_score_correction_bias");
    }
}
