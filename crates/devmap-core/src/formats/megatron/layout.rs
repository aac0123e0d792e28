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

/// transformers' names for a mixture-of-experts layer, by family: Qwen3-MoE (per-head
/// q/k norms), Qwen2-MoE (a gated shared expert beside the routed ones) or Mixtral.
/// `{}` is the layer index, `{e}` the expert's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeNames {
    Qwen3Moe,
    Qwen2Moe,
    Mixtral,
}

impl MoeNames {
    /// transformers' `model_type` of the family.
    pub fn model_type(self) -> &'static str {
        match self {
            MoeNames::Qwen3Moe => "qwen3_moe",
            MoeNames::Qwen2Moe => "qwen2_moe",
            MoeNames::Mixtral => "mixtral",
        }
    }
}

/// One row of the experts' map: the Megatron-Core name, the names of the Qwen MoE
/// families (Qwen2-MoE and Qwen3-MoE name routed experts alike) and Mixtral's (`None`:
/// the family has no such tensor), the cut, and whether the source has an expert axis
/// after its layer axis (`[layers, experts, rows, columns]` stacked).
pub struct MoeRule {
    pub megatron: &'static str,
    pub qwen: &'static str,
    pub mixtral: Option<&'static str>,
    /// Only Qwen2-MoE has it (the shared expert and its gate).
    pub qwen2_only: bool,
    pub cut: Cut,
    pub per_expert: bool,
}

const fn routed(
    megatron: &'static str,
    qwen: &'static str,
    mixtral: &'static str,
    cut: Cut,
    per_expert: bool,
) -> MoeRule {
    MoeRule {
        megatron,
        qwen,
        mixtral: Some(mixtral),
        qwen2_only: false,
        cut,
        per_expert,
    }
}

const fn shared(megatron: &'static str, qwen2: &'static str, cut: Cut) -> MoeRule {
    MoeRule {
        megatron,
        qwen: qwen2,
        mixtral: None,
        qwen2_only: true,
        cut,
        per_expert: false,
    }
}

/// A GPTModel's MoE layer as megatron-core saves it with its local spec's experts
/// (`SequentialMLP`: every expert's `linear_fc1`/`linear_fc2` stacked on an expert axis,
/// expert-parallel ranks holding blocks of it), its router, and its shared expert
/// (`SharedExpertMLP`: a gated MLP every token goes through, scaled by
/// `sigmoid(gate_weight · x)` when `moe_shared_expert_gate`), which is Qwen2-MoE's
/// `shared_expert` and `shared_expert_gate`.
pub const MOE_RULES: &[MoeRule] = &[
    routed(
        "decoder.layers.mlp.router.weight",
        "model.layers.{}.mlp.gate.weight",
        "model.layers.{}.block_sparse_moe.gate.weight",
        Cut::Whole,
        false,
    ),
    routed(
        "decoder.layers.mlp.experts.experts.linear_fc1.weight",
        "model.layers.{}.mlp.experts.{e}.gate_proj.weight",
        "model.layers.{}.block_sparse_moe.experts.{e}.w1.weight",
        Cut::GateUp(0),
        true,
    ),
    routed(
        "decoder.layers.mlp.experts.experts.linear_fc1.weight",
        "model.layers.{}.mlp.experts.{e}.up_proj.weight",
        "model.layers.{}.block_sparse_moe.experts.{e}.w3.weight",
        Cut::GateUp(1),
        true,
    ),
    routed(
        "decoder.layers.mlp.experts.experts.linear_fc2.weight",
        "model.layers.{}.mlp.experts.{e}.down_proj.weight",
        "model.layers.{}.block_sparse_moe.experts.{e}.w2.weight",
        Cut::Whole,
        true,
    ),
    shared(
        "decoder.layers.mlp.shared_experts.linear_fc1.weight",
        "model.layers.{}.mlp.shared_expert.gate_proj.weight",
        Cut::GateUp(0),
    ),
    shared(
        "decoder.layers.mlp.shared_experts.linear_fc1.weight",
        "model.layers.{}.mlp.shared_expert.up_proj.weight",
        Cut::GateUp(1),
    ),
    shared(
        "decoder.layers.mlp.shared_experts.linear_fc2.weight",
        "model.layers.{}.mlp.shared_expert.down_proj.weight",
        Cut::Whole,
    ),
    shared(
        "decoder.layers.mlp.shared_experts.gate_weight",
        "model.layers.{}.mlp.shared_expert_gate.weight",
        Cut::Whole,
    ),
];

/// What one Megatron-Core name becomes: each output's transformers name (`{}` the
/// layer, `{e}` the expert), its cut, and whether the source has an expert axis. `Err`
/// names the family that has no such tensor (a shared expert outside Qwen2-MoE).
pub fn outputs_of(key: &str, moe: MoeNames) -> Result<Vec<(&'static str, Cut, bool)>, String> {
    let mut outputs: Vec<_> = RULES
        .iter()
        .filter(|r| r.megatron == key)
        .map(|r| (r.hf, r.cut, false))
        .collect();
    for r in MOE_RULES.iter().filter(|r| r.megatron == key) {
        let hf = match moe {
            MoeNames::Qwen2Moe => Some(r.qwen),
            MoeNames::Qwen3Moe if !r.qwen2_only => Some(r.qwen),
            MoeNames::Qwen3Moe => None,
            MoeNames::Mixtral => r.mixtral,
        };
        let hf = hf.ok_or_else(|| {
            format!(
                "is a shared expert, which transformers' {} has no place for (Qwen2-MoE has: give --config with a qwen2_moe config.json)",
                moe.model_type()
            )
        })?;
        outputs.push((hf, r.cut, r.per_expert));
    }
    Ok(outputs)
}

/// Whether devmap's map has a name for the Megatron-Core name `key`.
pub fn is_mapped(key: &str) -> bool {
    RULES.iter().any(|r| r.megatron == key) || MOE_RULES.iter().any(|r| r.megatron == key)
}

/// The layers' prefix of Megatron-Core's names.
pub const LAYERS: &str = "decoder.layers.";

/// A saved tensor's name split into its map key and, for a layer saved apart
/// (`decoder.layers.3.mlp…`), its layer: `("decoder.layers.mlp…", Some(3))`.
pub fn key_of(name: &str) -> (String, Option<u64>) {
    if let Some(rest) = name.strip_prefix(LAYERS)
        && let Some((index, tail)) = rest.split_once('.')
        && let Ok(layer) = index.parse::<u64>()
    {
        return (format!("{LAYERS}{tail}"), Some(layer));
    }
    (name.to_owned(), None)
}

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
    fn a_layer_saved_apart_is_named_by_its_index() {
        assert_eq!(
            key_of("decoder.layers.12.mlp.linear_fc2.weight"),
            ("decoder.layers.mlp.linear_fc2.weight".to_owned(), Some(12))
        );
        assert_eq!(
            key_of("decoder.layers.mlp.linear_fc2.weight"),
            ("decoder.layers.mlp.linear_fc2.weight".to_owned(), None)
        );
    }
}
