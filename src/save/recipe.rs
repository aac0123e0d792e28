//! How each output tensor's bytes are made. The shard planner writes one recipe per
//! tensor; the writer runs it and the verifier checks against it, so a value is
//! defined in one place.
//!
//! A [`Recipe::Copy`] moves the current value byte for byte with `copy_file_range`; a
//! [`Recipe::Cast`] converts it through the copier's fixed buffer. Recipes still to
//! come (a slice of a fused tensor) join this enum. A [`Recipe::Merge`] applies LoRA
//! adapters as it streams (see `save::lora_kernel`).

use crate::types::dtype::DType;
use crate::types::range::ByteRange;

/// One output tensor's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// The stored bytes of one source range, unchanged.
    Copy(ByteRange),
    /// The source's elements converted from one floating dtype to another, as torch's
    /// `.to(dtype)` converts them (see `save::cast`).
    Cast {
        source: ByteRange,
        from: DType,
        to: DType,
    },
    /// The source's elements with the checkpoint's LoRA merges for this tensor applied
    /// (`Checkpoint::merges_of`), as peft merges them, then converted to `to`
    /// (see `save::lora_kernel`).
    Merge {
        source: ByteRange,
        from: DType,
        to: DType,
    },
    /// A fine-grained FP8 weight multiplied by its per-block scales (`scale`, the
    /// `…_scale_inv` tensor's bytes), then converted to `to` (see `save::fp8`).
    Dequant {
        source: ByteRange,
        from: DType,
        to: DType,
        scale: ByteRange,
        blocks: crate::save::fp8::Fp8Blocks,
    },
    /// An FP8 weight dequantized as [`Recipe::Dequant`] does — rounded to `to`, the
    /// dtype transformers loads the dequantized model in — with the checkpoint's LoRA
    /// merges applied to that, as peft merges into the loaded model (see
    /// `save::lora_kernel`).
    DequantMerge {
        source: ByteRange,
        from: DType,
        to: DType,
        scale: ByteRange,
        blocks: crate::save::fp8::Fp8Blocks,
    },
    /// An MXFP4 experts weight (`P_blocks`, with its `P_scales`), dequantized and
    /// transposed per expert as transformers loads it, in `to` (see `save::mxfp4`);
    /// with `merge`, the checkpoint's LoRA merges into that dequantized weight applied,
    /// as peft merges into the model transformers loads dequantized. Written under the
    /// name `P` and the shape [`Mxfp4Layout::shape`].
    ///
    /// [`Mxfp4Layout::shape`]: crate::save::mxfp4::Mxfp4Layout::shape
    Mxfp4 {
        blocks: ByteRange,
        scales: ByteRange,
        layout: crate::save::mxfp4::Mxfp4Layout,
        to: DType,
        merge: bool,
    },
    /// A tensor stored in pieces across files (`Checkpoint::pieces(pieces)`, `len`
    /// bytes in all) put together in the whole tensor's order, each run copied or, when
    /// `from` and `to` differ, cast as [`Recipe::Cast`] casts (see `save::stitch`).
    Stitch {
        pieces: u32,
        len: u64,
        from: DType,
        to: DType,
    },
}

impl Recipe {
    /// Bytes the recipe writes.
    pub fn output_len(&self) -> u64 {
        match self {
            Recipe::Copy(range) => range.len,
            Recipe::Cast { source, from, to }
            | Recipe::Merge { source, from, to }
            | Recipe::Dequant {
                source, from, to, ..
            }
            | Recipe::DequantMerge {
                source, from, to, ..
            } => source.len / from.size() * to.size(),
            Recipe::Mxfp4 { layout, to, .. } => layout.elements() * to.size(),
            Recipe::Stitch { len, from, to, .. } => len / from.size() * to.size(),
        }
    }

    /// The one source range the recipe streams from (for a quantized weight, its
    /// blocks); `None` for a tensor stored in pieces.
    pub fn source(&self) -> Option<ByteRange> {
        match self {
            Recipe::Copy(range)
            | Recipe::Cast { source: range, .. }
            | Recipe::Merge { source: range, .. }
            | Recipe::Dequant { source: range, .. }
            | Recipe::DequantMerge { source: range, .. }
            | Recipe::Mxfp4 { blocks: range, .. } => Some(*range),
            Recipe::Stitch { .. } => None,
        }
    }

    /// Bytes the recipe reads from its source (or pieces).
    pub fn source_len(&self) -> u64 {
        match self {
            Recipe::Stitch { len, .. } => *len,
            _ => self.source().map_or(0, |r| r.len),
        }
    }

    /// Every range the recipe streams from: its source, or each of its pieces.
    pub fn ranges(&self, ckpt: &crate::model::checkpoint::Checkpoint) -> Vec<ByteRange> {
        match self {
            Recipe::Stitch { pieces, .. } => ckpt.pieces(*pieces).iter().map(|p| p.range).collect(),
            _ => self.source().into_iter().collect(),
        }
    }
}
