//! Real file formats, read and written. Nothing here knows about terminals or about
//! how tensors are placed; see `model` for the meaning of what is read.

pub mod adapter;
pub mod config;
pub mod dcp;
pub mod deepspeed;
pub mod device_map;
pub mod dtensor;
mod error;
pub mod hf_index;
pub mod hub_cache;
pub mod input;
pub mod json;
pub mod live;
pub mod megatron;
pub mod nemo;
pub mod offload;
pub mod pickle;
pub mod rank_files;
pub mod safetensors;
pub mod size;
pub mod split;
pub mod torch_bin;
pub mod verl;
pub mod zip;

pub use error::{FormatError, Kind};
