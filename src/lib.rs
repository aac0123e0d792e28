//! devmap: inspect Hugging Face device maps and offloaded checkpoints, and re-save
//! them as sharded safetensors with flat memory.
//!
//! Layers, top to bottom: `save` (and later `tui`) use `model`, which reads through
//! `formats`. Nothing here needs a terminal.

#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod formats;
pub mod inspect;
pub mod model;
pub mod monitor;
pub mod plan;
pub mod save;
pub mod sys;
pub mod tui;
pub mod types;

/// Formats a byte count the way every devmap screen and message does (`1.50 GiB`).
pub fn human_bytes(bytes: u64) -> String {
    humansize::format_size(bytes, humansize::BINARY)
}
