//! devmap-core: devmap below the terminal. It reads Hugging Face device maps and
//! offloaded checkpoints and re-saves them as sharded safetensors with flat memory.
//! The inspector is `devmap-tui`, the command line the `devmap` package, which
//! re-exports both as one library (`devmap::model`, `devmap::tui`).
//!
//! Layers, bottom to top; each uses only the ones below it, nothing points up:
//!
//! ```text
//! types      DType, Placement, DeviceMap, ByteRange: the shared vocabulary
//! formats    safetensors headers, HF index, config.json, device_map.json, offload folders
//! model      Checkpoint (tensors, sources, placement, ties), ModuleTree, checks
//! oracle     the user's transformers, asked what a config's model is (names, shapes,
//!            dtypes save_pretrained writes, buffers, float32 modules); cached
//! save  plan  inspect  monitor
//!            save: shard plan of per-tensor recipes, writers, commit, verify;
//!            plan: accelerate's auto placement; inspect: text and JSON reports;
//!            monitor: RAM and GPU memory readings (save gets free RAM passed in)
//! remote     hf:// and https:// models: config, index and shard headers by HTTP
//!            range reads into a header mirror that `model::load` reads
//! verify     devmap verify: a saved folder as transformers reads it, and compared
//!            with what a save writes (through save's plan and recipes)
//! (devmap-tui: App, layout, views, the runtime, above all of these)
//!
//! The command line is the binary's (`src/main.rs` and `src/cli/`).
//! ```
//!
//! `sys` holds the few system calls std lacks (through rustix: no `unsafe` anywhere).
//! Nothing here needs a terminal. The layers at this height only; every file,
//! with what it holds, is in CONTRIBUTING.md's layout map (checked by a test).

#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod formats;
pub mod inspect;
pub mod model;
pub mod monitor;
pub mod oracle;
pub mod plan;
#[cfg(feature = "remote")]
pub mod remote;
pub mod save;
pub mod sys;
pub mod text;
pub mod types;
pub mod verify;

/// Formats a byte count the way every devmap screen and message does (`1.50 GiB`).
pub fn human_bytes(bytes: u64) -> String {
    humansize::format_size(bytes, humansize::BINARY)
}
