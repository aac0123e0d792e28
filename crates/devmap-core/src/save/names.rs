//! The names a save gives and recognises: its temporary and moved-aside files, the
//! weight files it writes or must never copy, and targets it cannot take. Shared by
//! the preflight checks and the commit.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Suffix of files a save is still writing. A file with it is never a finished shard.
pub const PARTIAL_SUFFIX: &str = ".devmap-partial";
/// Suffix of earlier files a commit moved aside; they are deleted once it completes.
pub const BACKUP_SUFFIX: &str = ".devmap-old";

/// Names of weight files a loader would pick up: never copied from the input, and
/// removed from the output when a forced save replaces them.
pub fn is_weight_file_name(name: &str) -> bool {
    // Weights of any framework and their indexes: OUT gets the model's current values
    // from devmap and nothing a loader could mistake for them.
    const WEIGHTS: [&str; 11] = [
        ".safetensors",
        ".bin",
        ".h5",
        ".msgpack",
        ".gguf",
        ".pt",
        ".pth",
        ".ckpt",
        ".onnx",
        ".dat",
        ".index.json",
    ];
    WEIGHTS.iter().any(|ext| name.ends_with(ext))
}

/// Files a save of its own writes: `model.safetensors`, `model-0000K-of-0000N.safetensors`
/// and the index. With `--force`, earlier ones that the new save does not overwrite
/// are removed so a loader never mixes old and new shards; nothing else is touched.
pub fn is_saved_weights_name(name: &str) -> bool {
    name == crate::formats::hf_index::SINGLE_FILE
        || name == crate::formats::hf_index::INDEX_FILE
        || (name.starts_with("model-") && name.contains("-of-") && name.ends_with(".safetensors"))
}

/// Why `dest` cannot take a saved file: it exists as something other than a regular
/// file (a rename onto a folder fails; onto a FIFO or symlink it replaces the wrong
/// thing).
pub(super) fn blocked_target(dest: &Path) -> Option<super::reasons::Refusal> {
    let meta = std::fs::symlink_metadata(dest).ok()?;
    (!meta.file_type().is_file()).then(|| super::reasons::Refusal::NameTaken(dest.to_path_buf()))
}

/// Whether `name` is a file a save left while it ran: a temporary or moved-aside file.
pub fn is_unfinished_name(name: &OsStr) -> bool {
    let bytes = name.as_bytes();
    bytes.ends_with(PARTIAL_SUFFIX.as_bytes()) || bytes.ends_with(BACKUP_SUFFIX.as_bytes())
}
