//! What a checkpoint is made of: its tensors, where each one's bytes are (a range of a
//! source file, pieces, a tie partner's), the source files themselves, tie groups, the
//! config.json devmap wrote for a training checkpoint, and where a remote model is.

use std::path::PathBuf;
use std::time::SystemTime;

use super::{ByteRange, TensorId};
use crate::types::placement::Placement;

/// A file devmap reads tensor bytes from, with what it looked like when opened, so a
/// save can tell when it changed underneath.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceFile {
    /// The file; for input that is no file, a name for messages (`/proc/self/mem`,
    /// `devmap:staged/KEY`) that nothing parses: `kind` says what it is.
    pub path: PathBuf,
    pub len: u64,
    pub modified: Option<SystemTime>,
    pub kind: InputKind,
}

/// What a source "file" is: a file, or a live model's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputKind {
    /// A file on disk, opened and read with positioned reads.
    #[default]
    File,
    /// The Python session's memory (a live model's CPU tensors), read through
    /// `/proc/self/mem` in that process (`/proc/PID/mem` from the `devmap` command
    /// `devmap.inspect` starts); offsets are addresses.
    ProcessMemory,
    /// A live model's tensor the Python session copies into a stage when asked (a GPU
    /// tensor), by its key (see `save::stage`).
    Staged(u64),
}

/// Where a tensor's current value comes from, in the design's order of precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// An offload-folder entry: the current value, e.g. after a merge.
    Offload(ByteRange),
    /// The checkpoint's own safetensors entry.
    Checkpoint(ByteRange),
    /// A full replacement from a LoRA adapter (`modules_to_save`, an embedding's
    /// `base_layer`): it outranks both of the above.
    Adapter(ByteRange),
    /// The checkpoint's entry stored in blocks across files (a training run's ranks):
    /// [`Checkpoint::pieces`](super::Checkpoint::pieces) of this index.
    Pieces(u32),
    /// No bytes of its own: it reads a tie partner's.
    Tied(TensorId),
    /// No data anywhere (a `meta` tensor that was never materialised).
    None,
}

/// One tensor. Kept small (88 bytes and no heap but the name): a checkpoint may hold
/// a million of them. The name is a `Box<str>`, allocated once as the header is
/// parsed: an `Arc<str>` would add 16 bytes of counts to each, and a copy made later
/// would leave the first allocation's hole behind.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: Box<str>,
    pub shape: crate::types::shape::Shape,
    pub source: Source,
    pub placement: Placement,
    /// Which device-map entry placed it: its position in the map, or [`NO_KEY`].
    /// [`Checkpoint::map_key`](super::Checkpoint::map_key) gives the key itself.
    pub map_key: u32,
    pub dtype: super::DType,
    /// The dtype an offload index says the model loads this tensor as, when it differs
    /// from the stored bytes.
    pub load_dtype: Option<super::DType>,
}

/// `Tensor::map_key` when no device-map entry placed the tensor.
pub const NO_KEY: u32 = u32::MAX;

impl Tensor {
    pub fn numel(&self) -> u64 {
        self.shape
            .iter()
            .try_fold(1u64, u64::checked_mul)
            .unwrap_or(0)
    }

    /// Bytes of the tensor (validated against its source when it was read).
    pub fn bytes(&self) -> u64 {
        self.numel().saturating_mul(self.dtype.size())
    }

    /// Bytes of the tensor as the model holds it: in its `load_dtype` where an offload
    /// index says the model holds it in another dtype than the one stored. Module
    /// sizes and device totals count these; [`Tensor::bytes`] is what is read.
    pub fn held_bytes(&self) -> u64 {
        let dtype = self.load_dtype.unwrap_or(self.dtype);
        self.numel().saturating_mul(dtype.size())
    }
}

/// Tensors that must hold the same value. `members[0]` is the name written on save
/// (the one transformers keeps: the embedding, not the `_tied_weights_keys` head).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TieGroup {
    pub members: Vec<TensorId>,
    /// What says they are tied: a save drops names on this word alone, so it is never
    /// a name rule (an untied head with no config.json would be lost).
    pub evidence: TieEvidence,
}

/// Why devmap holds names tied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TieEvidence {
    /// config.json: `tie_word_embeddings`, or the architecture's tie keys (transformers
    /// ties them on load whatever the checkpoint holds).
    Config,
    /// One storage for both names: a `torch.save` pickle, a live model's parameter.
    SameStorage,
    /// The user's `--tie`.
    User,
}

impl TieEvidence {
    /// How reports name it ("tied (config)").
    pub fn label(self) -> &'static str {
        match self {
            TieEvidence::Config => "config",
            TieEvidence::SameStorage => "same storage",
            TieEvidence::User => "--tie",
        }
    }
}

/// A tie group by name, as the loaders find them (the kept name first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedTie {
    pub names: Vec<String>,
    pub evidence: TieEvidence,
}

impl TieGroup {
    pub fn kept(&self) -> TensorId {
        self.members[0]
    }
}

/// A temporary folder holding a config.json devmap wrote; removed when dropped.
#[derive(Debug)]
pub struct GeneratedConfig {
    pub dir: PathBuf,
}

impl GeneratedConfig {
    /// Writes `text` as config.json in a new folder under the system's temporary one.
    pub fn write(text: &str) -> std::io::Result<GeneratedConfig> {
        let base = std::env::temp_dir();
        let mut n = 0u32;
        let dir = loop {
            let dir = base.join(format!("devmap-config-{}-{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(e),
            }
        };
        let folder = GeneratedConfig { dir };
        std::fs::write(folder.dir.join("config.json"), text)?;
        Ok(folder)
    }
}

impl Drop for GeneratedConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where a remote model's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteModel {
    /// `hf://org/name[@rev]` or the URL given.
    pub name: String,
    /// What a file name is appended to for reports: `hf://org/name[@rev]/` (the paths
    /// huggingface_hub's HfFileSystem uses) or the URL's folder.
    pub files: String,
}
