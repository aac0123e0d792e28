//! How each output tensor's bytes are made. The shard planner writes one recipe per
//! tensor; the writer runs it and the verifier checks against it, so a value is
//! defined in one place.
//!
//! Today every recipe is a [`Recipe::Copy`]: the current value, byte for byte, moved
//! with `copy_file_range`. Recipes that transform bytes (a slice of a fused tensor, a
//! dtype cast, a LoRA merge) join this enum and run through the copier's fixed buffer.

use crate::types::range::ByteRange;

/// One output tensor's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// The stored bytes of one source range, unchanged.
    Copy(ByteRange),
}

impl Recipe {
    /// Bytes the recipe writes.
    pub fn output_len(&self) -> u64 {
        match self {
            Recipe::Copy(range) => range.len,
        }
    }

    /// The source range the recipe reads.
    pub fn source(&self) -> ByteRange {
        match self {
            Recipe::Copy(range) => *range,
        }
    }
}
