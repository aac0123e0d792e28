//! LoRA merges a checkpoint carries: for a tensor, the adapter steps that change its
//! value when it is saved, in the order they apply. Read from peft adapter folders by
//! [`super::lora`]; computed by `save::lora_kernel`, which the saver and `devmap verify`
//! share.

use crate::types::DType;
use crate::types::range::ByteRange;

/// One stored matrix of an adapter: where its bytes are, their dtype and its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matrix {
    pub range: ByteRange,
    pub dtype: DType,
    pub rows: u64,
    pub cols: u64,
}

/// How one adapter changes one tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum MergeKind {
    /// A linear weight `[out, in]`: W′ = dtype(f32(W) + scale·(B·A)), rounded once.
    /// `fan_in_fan_out` (GPT-2's Conv1D, weight `[in, out]`) transposes the delta.
    /// With a DoRA magnitude, each row of W + delta is rescaled to it.
    Linear {
        fan_in_fan_out: bool,
        magnitude: Option<Matrix>,
    },
    /// An embedding `[num, dim]` (`lora_embedding_A` `[r, num]`, `_B` `[dim, r]`): the
    /// delta, transposed, is rounded to the weight's dtype before it is added.
    Embedding,
    /// A bias with `lora_bias`: b′ = dtype(f32(b) + scale·B.bias); `b` holds B's bias.
    Bias,
    /// A LoRA on a fused experts parameter (peft's `target_parameters`: A `[r·E, in]`,
    /// B `[out, r·E]`; expert e's delta is `B[:, k·E+e] · A[e·r+k, :]` over k): into the
    /// per-expert checkpoint tensor of `expert`, whose rows are that expert's delta rows
    /// from `delta_row` on, or (`expert: None`) into a checkpoint tensor that holds
    /// every expert as transformers loads it (`[E, out, in]`, GraniteMoE's; or, with
    /// `transposed`, `[E, in, out]`: gpt-oss's, whose experts module says
    /// `is_transposed`, and an MXFP4 weight dequantized). peft computes the delta in f32
    /// (scale·Σ), rounds it to the weight's dtype, then adds in that dtype (rounded
    /// again), as for an embedding.
    Expert {
        expert: Option<u64>,
        experts: u64,
        delta_row: u64,
        transposed: bool,
    },
}

/// One adapter's change to one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeStep {
    /// The adapter folder, as given.
    pub adapter: std::sync::Arc<str>,
    pub kind: MergeKind,
    /// `lora_A` (`[r, in]`) or `lora_embedding_A`; unused for `Bias`.
    pub a: Option<Matrix>,
    /// `lora_B` (`[out, r]`), `lora_embedding_B`, or B's bias (`[out]`, as 1 row).
    pub b: Matrix,
    pub rank: u64,
    pub alpha: f64,
    /// α/r, or α/√r with rsLoRA, rounded to f32 as torch multiplies by it.
    pub scale: f32,
    /// `--allow-nonfinite`: a result that overflows to ±Inf is written as peft would
    /// write it instead of stopping the save.
    pub allow_nonfinite: bool,
}

impl MergeStep {
    /// `linear`, `dora`, `conv1d` (fan_in_fan_out), `embedding` or `bias`.
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            MergeKind::Linear {
                magnitude: Some(_), ..
            } => "dora",
            MergeKind::Linear {
                fan_in_fan_out: true,
                ..
            } => "conv1d",
            MergeKind::Linear { .. } => "linear",
            MergeKind::Embedding => "embedding",
            MergeKind::Bias => "bias",
            MergeKind::Expert { .. } => "experts",
        }
    }
}
