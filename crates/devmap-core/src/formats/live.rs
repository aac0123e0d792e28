//! The live-model manifest: what the Python package (`python/devmap`) tells the saver
//! about a model in a Python session — every tensor `save_pretrained` would write,
//! under the name it would write, with where its current bytes are.
//!
//! A value is either in this process's memory (a CPU tensor: its address, read through
//! `/proc/self/mem` with plain positioned reads, so no pointer is ever dereferenced) or
//! in a file (an accelerate `.dat`, a safetensors entry of the checkpoint or of
//! transformers' offload folder) or staged (a GPU tensor the Python side copies into a
//! pinned buffer chunk by chunk). A source may start inside its tensor: transformers
//! saves some parameters as slices of a fused one (`first`, in elements).
//!
//! ```json
//! {"format": "devmap-live/1", "config_dir": "/tmp/…",
//!  "tensors": [{"name": "model.embed_tokens.weight", "dtype": "bfloat16",
//!               "shape": [32000, 4096], "device": "cpu",
//!               "source": {"kind": "memory", "address": 140231312}}]}
//! ```

use super::Kind;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::FormatError;

/// The `format` value this version reads.
pub const FORMAT: &str = "devmap-live/1";

/// How a staged tensor's source is named in messages: `devmap:staged/KEY` (see
/// `save::stage`). Only a name: the source's `InputKind::Staged` says what it is.
pub const STAGED_PREFIX: &str = "devmap:staged/";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    /// A folder holding the config.json (and generation_config.json) the save copies,
    /// written by transformers' own `config.save_pretrained`.
    pub config_dir: PathBuf,
    /// `model.num_parameters()`, for the index's `total_parameters` as transformers
    /// writes it; the saver counts the written tensors when absent.
    #[serde(default)]
    pub total_parameters: Option<u64>,
    /// How reports name the model (`LlamaForCausalLM in this Python session`).
    #[serde(default)]
    pub title: Option<String>,
    /// The model's `hf_device_map`, as device_map.json holds it: shown, and naming
    /// the key that placed each tensor (the placements themselves are the tensors'
    /// devices as they are now).
    #[serde(default)]
    pub device_map: Option<serde_json::Value>,
    /// Present when this process is one rank of a sharded job (FSDP2, DTensor): the
    /// tensors have their whole shapes, and each source is the pieces this rank holds
    /// (see `save::ranks`).
    #[serde(default)]
    pub rank: Option<RankOf>,
    /// The process whose memory the `memory` sources' addresses are in, when the
    /// manifest is read by another (`devmap.inspect` hands it to the `devmap` command);
    /// absent: the process reading it.
    #[serde(default)]
    pub pid: Option<u32>,
    pub tensors: Vec<LiveTensor>,
}

/// Which rank of how many wrote a manifest (ranks count from 0).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RankOf {
    pub rank: u32,
    pub world: u32,
}

/// A block of a tensor this rank holds: its first index and extent along every
/// dimension of the whole tensor, and where its elements are, row-major: in this
/// process's memory at `address`, or staged from tensor `key` (from its element
/// `first`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LivePiece {
    pub offsets: Vec<u64>,
    pub sizes: Vec<u64>,
    #[serde(default)]
    pub address: Option<u64>,
    #[serde(default)]
    pub key: Option<u64>,
    #[serde(default)]
    pub first: u64,
}

/// One tensor as `save_pretrained` would write it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveTensor {
    pub name: String,
    /// The dtype the model holds it in (torch's name: `bfloat16`), which `--dtype auto`
    /// writes.
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Where the model keeps it: `cpu`, `cuda:N`, `disk`, `meta`.
    pub device: String,
    pub source: LiveSource,
}

/// Where a tensor's current bytes are.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LiveSource {
    /// Contiguous bytes in this process at `address`, in the tensor's own dtype.
    Memory { address: u64 },
    /// Raw little-endian elements in a file from byte `offset` (an accelerate `.dat`
    /// is at offset 0), stored as `dtype` (the model may hold another).
    File {
        path: PathBuf,
        #[serde(default)]
        offset: u64,
        dtype: String,
        #[serde(default)]
        first: u64,
    },
    /// Entry `tensor` of a safetensors file, from its element `first`.
    Safetensors {
        path: PathBuf,
        tensor: String,
        #[serde(default)]
        first: u64,
    },
    /// Bytes the Python side copies into memory when asked, a chunk at a time (a GPU
    /// tensor, through a pinned buffer: `save::stage`), from element `first` of the
    /// tensor it registered as `key`, in the tensor's own dtype.
    Staged {
        key: u64,
        #[serde(default)]
        first: u64,
    },
    /// The blocks of the tensor this rank of a sharded job holds (none when other
    /// ranks hold all of it); the other ranks write the rest.
    Pieces { pieces: Vec<LivePiece> },
    /// The same parameter as tensor `to` (transformers' tie removal drops this name):
    /// not written unless ties are kept; shown as a tie.
    Tied { to: String },
    /// No value anywhere (a `meta` tensor nothing materialises).
    None,
}

/// Parses a manifest; `origin` names it in errors.
pub fn parse_manifest(text: &str, origin: &Path) -> Result<Manifest, FormatError> {
    let manifest: Manifest = serde_json::from_str(text).map_err(|e| {
        FormatError::invalid_as(
            Kind::NotTheFormat,
            origin,
            format!("is not a devmap live-model manifest: {e}"),
        )
    })?;
    if manifest.format != FORMAT {
        return Err(FormatError::invalid_as(
            Kind::Unsupported,
            origin,
            format!(
                "is manifest format `{}`; this devmap reads `{FORMAT}` (the Python package and the library come from different versions)",
                manifest.format
            ),
        ));
    }
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_source_kind_and_refuses_another_version() {
        let text = r#"{"format": "devmap-live/1", "config_dir": "/c", "tensors": [
            {"name": "a", "dtype": "float32", "shape": [2], "device": "cpu",
             "source": {"kind": "memory", "address": 4096}},
            {"name": "b", "dtype": "bfloat16", "shape": [2, 2], "device": "disk",
             "source": {"kind": "file", "path": "/o/b.dat", "dtype": "bfloat16"}},
            {"name": "c", "dtype": "float32", "shape": [1], "device": "disk",
             "source": {"kind": "safetensors", "path": "/m/x.safetensors", "tensor": "c", "first": 3}},
            {"name": "d", "dtype": "float32", "shape": [1], "device": "meta",
             "source": {"kind": "none"}}]}"#;
        let m = parse_manifest(text, Path::new("m.json")).expect("parses");
        assert_eq!(m.tensors.len(), 4);
        assert!(matches!(
            m.tensors[0].source,
            LiveSource::Memory { address: 4096 }
        ));
        assert!(matches!(
            m.tensors[1].source,
            LiveSource::File {
                offset: 0,
                first: 0,
                ..
            }
        ));
        assert!(matches!(
            m.tensors[2].source,
            LiveSource::Safetensors { first: 3, .. }
        ));
        assert!(matches!(m.tensors[3].source, LiveSource::None));

        let old = text.replace("devmap-live/1", "devmap-live/0");
        let err = parse_manifest(&old, Path::new("m.json")).expect_err("other version");
        assert!(err.to_string().contains("devmap-live/0"), "{err}");
        let typo = text.replace("\"address\"", "\"adress\"");
        assert!(parse_manifest(&typo, Path::new("m.json")).is_err());
    }
}
