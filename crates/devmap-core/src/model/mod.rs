//! The domain: tensors, their placement and data source, ties, and the module tree.
//! Built from `formats`; knows nothing of terminals.

pub mod arch;
pub mod checkpoint;
pub mod checks;
pub mod expect;
pub mod load;
pub mod lora;
pub mod merge;
pub mod names;
pub mod options;
pub mod quantized;
mod table;
pub use crate::types::shape;
pub mod tree;
pub mod warning;

pub use crate::types::{DeviceMap, Placement};
pub use checkpoint::{
    ByteRange, Checkpoint, NamedTie, Source, Tensor, TensorId, TieEvidence, TieGroup,
};
pub use load::{LoadError, LoadOptions, load};
pub use tree::ModuleTree;
pub use warning::Warning;
