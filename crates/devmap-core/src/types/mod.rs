//! The shared vocabulary at the bottom of the layers: element types, devices and byte
//! ranges. `formats` and `model` both speak it; it imports nothing of the crate.

pub mod dtype;
pub mod pieces;
pub mod placement;
pub mod range;
pub mod shape;

pub use dtype::DType;
pub use placement::{DeviceMap, Placement};
pub use range::{ByteRange, FileId};
