//! A planned tensor's recipe, kept small. A plan holds one recipe per tensor, and at a
//! million tensors the recipes are most of what a save holds (a [`Recipe`] is ~100
//! bytes, for its rare quantized forms). A recipe that reads the tensor's own current
//! value (its data range, or its pieces) and copies or casts it, merged or not, is kept
//! as what is done to it: the source is the checkpoint's for the tensor, found again
//! when the recipe is read. Any other recipe is kept whole in a box. Packing checks
//! that unpacking gives the recipe back, so a packed recipe is never another.

use super::recipe::{Make, Read, Recipe};
use crate::model::checkpoint::{Checkpoint, Source, TensorId};
use crate::types::DType;

/// See the module: 16 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packed {
    /// The tensor's own value (range or pieces), copied when `from == to`, else cast;
    /// merged when `merge`.
    Own { from: DType, to: DType, merge: bool },
    /// Any other recipe.
    Whole(Box<Recipe>),
}

impl Packed {
    /// `recipe` of tensor `id`, packed when unpacking gives it back.
    pub fn new(ckpt: &Checkpoint, id: TensorId, recipe: Recipe) -> Packed {
        let stored = ckpt.tensors()[id].dtype;
        let (from, to) = match recipe.make {
            Make::Copy => (stored, stored),
            Make::Cast { from, to } if from != to => (from, to),
            _ => return Packed::Whole(Box::new(recipe)),
        };
        let packed = Packed::Own {
            from,
            to,
            merge: recipe.merge,
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
        match *self {
            Packed::Own { from, to, merge } => {
                let read = match ckpt.data_source(id)? {
                    Source::Pieces(index) => Read::Pieces {
                        index,
                        len: ckpt.tensors()[id].numel() * from.size(),
                    },
                    _ => Read::Range(ckpt.data_range(id)?),
                };
                let make = if from == to {
                    Make::Copy
                } else {
                    Make::Cast { from, to }
                };
                Some(Recipe { read, make, merge })
            }
            Packed::Whole(ref recipe) => Some(**recipe),
        }
    }

    /// Whether the recipe applies LoRA merges, read without the checkpoint.
    pub fn merges(&self) -> bool {
        match self {
            Packed::Own { merge, .. } => *merge,
            Packed::Whole(recipe) => recipe.merge,
        }
    }

    /// The recipe, when it is kept whole (the only form a quantized recipe has).
    pub fn whole(&self) -> Option<&Recipe> {
        match self {
            Packed::Whole(recipe) => Some(recipe),
            Packed::Own { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_recipe_is_small() {
        assert!(std::mem::size_of::<Packed>() <= 16);
        assert!(std::mem::size_of::<crate::save::shards::PlannedTensor>() <= 48);
    }
}
