//! The domain: tensors, their placement and data source, ties, and the module tree.
//! Built from `formats`; knows nothing of terminals.

pub mod checkpoint;
pub mod checks;
pub mod dtype;
pub mod load;
pub mod names;
pub mod placement;
pub mod shape;
pub mod tree;

pub use checkpoint::{ByteRange, Checkpoint, Source, Tensor, TensorId, TieGroup};
pub use dtype::DType;
pub use load::{LoadError, LoadOptions, load};
pub use placement::{DeviceMap, Placement};
pub use tree::ModuleTree;
