//! devmap: inspect Hugging Face device maps and offloaded checkpoints, and re-save
//! them as sharded safetensors with flat memory.
//!
//! The library is two crates along its layers, re-exported here under one name:
//! `devmap-core` (types, formats, model, oracle, save, plan, inspect, monitor, remote,
//! verify: no terminal, no HTTP unless the `remote` feature) and `devmap-tui` (the
//! inspector, `devmap::tui`). The command line is this package's binary
//! (`src/main.rs` and `src/cli/`). Every file, with what it holds, is in
//! CONTRIBUTING.md's layout map (checked by a test).

#[cfg(feature = "fixtures")]
pub use devmap_core::fixtures;
#[cfg(feature = "remote")]
pub use devmap_core::remote;
pub use devmap_core::{
    formats, human_bytes, inspect, model, monitor, oracle, plan, save, sys, text, types, verify,
};
pub use devmap_tui as tui;
