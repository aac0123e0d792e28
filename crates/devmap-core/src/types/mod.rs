//! The shared vocabulary at the bottom of the layers: element types, devices and byte
//! ranges. `formats` and `model` both speak it; it imports nothing of the crate.

mod dtype;
pub mod pieces;
pub mod placement;
pub mod range;
pub mod shape;

// One path for each name: `types::DType`, not `types::dtype::DType` too.
pub use dtype::{DType, byte_len, numel};
pub use placement::{DeviceMap, Placement};
pub use range::{ByteRange, FileId};
