//! A planned tensor's recipe, kept small. A plan holds one recipe per tensor, and at a
//! million tensors the recipes are most of what a save holds (a [`Recipe`] is 104
//! bytes, for its rare FP8 and MXFP4 forms). Copies, casts, merges and stitches of the
//! tensor's own current value are kept as what is done to it: the bytes are the
//! checkpoint's data source for the tensor, found again when the recipe is read. Any
//! other recipe, or one whose source is not that, is kept whole in a box. Packing
//! checks that unpacking gives the recipe back, so a packed recipe is never another.

use super::Recipe;
use crate::model::checkpoint::{Checkpoint, Source, TensorId};
use crate::types::dtype::DType;

/// See the module: 16 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packed {
    /// `Recipe::Copy` of the tensor's data range.
    Copy,
    /// `Recipe::Cast` of the tensor's data range.
    Cast { from: DType, to: DType },
    /// `Recipe::Merge` of the tensor's data range.
    Merge { from: DType, to: DType },
    /// `Recipe::Stitch` of the tensor's pieces.
    Stitch { from: DType, to: DType },
    /// Any other recipe.
    Whole(Box<Recipe>),
}

impl Packed {
    /// `recipe` of tensor `id`, packed when unpacking gives it back.
    pub fn new(ckpt: &Checkpoint, id: TensorId, recipe: Recipe) -> Packed {
        let packed = match recipe {
            Recipe::Copy(_) => Packed::Copy,
            Recipe::Cast { from, to, .. } => Packed::Cast { from, to },
            Recipe::Merge { from, to, .. } => Packed::Merge { from, to },
            Recipe::Stitch { from, to, .. } => Packed::Stitch { from, to },
            _ => return Packed::Whole(Box::new(recipe)),
        };
        if packed.unpack(ckpt, id) == Some(recipe) {
            packed
        } else {
            Packed::Whole(Box::new(recipe))
        }
    }

    /// The recipe, read with the checkpoint the plan was made from; `None` only when
    /// that checkpoint no longer has the source (never for a plan read with its own).
    pub fn unpack(&self, ckpt: &Checkpoint, id: TensorId) -> Option<Recipe> {
        let range = || ckpt.data_range(id);
        Some(match *self {
            Packed::Copy => Recipe::Copy(range()?),
            Packed::Cast { from, to } => Recipe::Cast {
                source: range()?,
                from,
                to,
            },
            Packed::Merge { from, to } => Recipe::Merge {
                source: range()?,
                from,
                to,
            },
            Packed::Stitch { from, to } => {
                let Some(Source::Pieces(pieces)) = ckpt.data_source(id) else {
                    return None;
                };
                Recipe::Stitch {
                    pieces,
                    len: ckpt.tensors()[id].numel() * from.size(),
                    from,
                    to,
                }
            }
            Packed::Whole(ref recipe) => **recipe,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_recipe_is_small() {
        assert!(std::mem::size_of::<Packed>() <= 16);
        assert!(std::mem::size_of::<super::super::PlannedTensor>() <= 48);
    }
}
