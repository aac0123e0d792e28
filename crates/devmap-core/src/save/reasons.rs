//! Why a save cannot go ahead, or why what it wrote was discarded: typed reasons, so a
//! caller can act on the kind (the inspector offers Ctrl-O for a folder that is not
//! empty, a test asserts the variant) and the words live in one place. The texts are
//! not escaped here: a list of them goes through `super::error::bullets`, which
//! escapes each, and the inspector draws text with its own escaping.

use std::path::PathBuf;

use crate::text::count;

/// Something in the way of the save, found before any byte is written (or again once
/// the save holds the output folder's lock). Each names what is in the way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{name} is a remote model: devmap read only its headers, not its weights; download it first (e.g. `hf download ORG/NAME`) and save from the local copy or the cache"
    )]
    Remote { name: String },
    #[error(
        "the output folder {} is the model directory or inside it; pick a folder outside {}",
        out.display(),
        model.display()
    )]
    OutInModel { out: PathBuf, model: PathBuf },
    #[error("the output folder {} is inside the offload folder {}", out.display(), offload.display())]
    OutInOffload { out: PathBuf, offload: PathBuf },
    /// OUT holds a file the save reads (a live model's checkpoint, an adapter).
    #[error(
        "the output folder {} holds {}{}, which the save reads from (the model's weights live there); pick another folder",
        out.display(),
        input.display(),
        and_more(*more)
    )]
    OutHoldsInput {
        out: PathBuf,
        input: PathBuf,
        more: usize,
    },
    #[error("{} exists and is not a folder", .0.display())]
    OutNotFolder(PathBuf),
    #[error(
        "{} holds {} from an interrupted save, or one still running (*{} or *{}, e.g. {}); they are not valid shards: once no save is running, delete them, then save again",
        out.display(),
        count(*files, "unfinished file", "unfinished files"),
        super::names::PARTIAL_SUFFIX,
        super::names::BACKUP_SUFFIX,
        example
    )]
    Unfinished {
        out: PathBuf,
        files: usize,
        example: String,
    },
    /// A part of a split save (`--part`) found parts of another plan in OUT.
    #[error(
        "{} holds the parts of another save ({}/{found}: another model, shard size, dtype or a changed source); parts of two plans are never published together: commit or remove those, or pass --force to clear them",
        out.display(),
        super::parts::PARTS_DIR
    )]
    ForeignParts { out: PathBuf, found: String },
    /// The commit of a split save (`--commit N`) found a part not ready.
    #[error("part {part} is not ready: {why}; run it (again) with --part {part}, then commit")]
    PartMissing { part: String, why: String },
    /// The commit of a sharded job's save found a rank's blocks missing or wrong.
    #[error("rank {rank} of {world} did not write its part: {why}")]
    RankMissing { rank: u32, world: u32, why: String },
    /// The ranks' blocks of a tensor do not make it up exactly once.
    #[error("`{tensor}`: the ranks' blocks do not make it up: {why}")]
    RanksDoNotTile { tensor: String, why: String },
    /// `--force` (the inspector's Ctrl-O) writes into it.
    #[error(
        "the output folder {} is not empty ({}); pass --force to write into it (earlier weight files there are replaced)",
        out.display(),
        count(*entries, "entry", "entries")
    )]
    NotEmpty { out: PathBuf, entries: usize },
    #[error("cannot create files in {}{}: {error}", folder.display(), where_out_goes(folder, out))]
    NotWritable {
        folder: PathBuf,
        out: PathBuf,
        error: String,
    },
    /// A final name taken by something a file cannot replace (a folder, a FIFO, a
    /// symlink).
    #[error("{} exists and is not a regular file; the save needs that name for a file", .0.display())]
    NameTaken(PathBuf),
    #[error(
        "{} no tensor that has data, so the saved model would lack those modules: {}; the checkpoint holding their weights is missing (or the map is for another model). Pass --allow-partial to save the rest anyway",
        count(.0.len(), "device-map key covers", "device-map keys cover"),
        crate::model::checks::name_list(.0)
    )]
    KeysWithoutData(Vec<String>),
    #[error(
        "not enough free disk at {}: the save writes {} but {} are free",
        at.display(),
        crate::human_bytes(*needed),
        crate::human_bytes(*free)
    )]
    NoSpace { at: PathBuf, needed: u64, free: u64 },
    /// An input file that cannot be read now; the text names the file.
    #[error("{0}")]
    Unreadable(String),
    /// The live model changed while it was being saved (a Python session's check).
    #[error("{0}")]
    ModelChanged(String),
}

fn and_more(more: usize) -> String {
    match more {
        0 => String::new(),
        n => format!(" and {n} more"),
    }
}

fn where_out_goes(folder: &std::path::Path, out: &std::path::Path) -> String {
    if folder == out {
        String::new()
    } else {
        format!(" (where the output folder {} would go)", out.display())
    }
}

/// A tensor (or the model's configuration) that no save can write as asked, found
/// while planning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsaveable {
    /// The text is the model's own warning about the two layouts.
    #[error("{0}")]
    ConvertedLayout(String),
    /// A head the device map places, with no value and no config.json to say it is
    /// tied (the model's own warning, which names `--config` and `--tie`).
    #[error("{0}")]
    HeadTieUnknown(String),
    /// The folder's device_map.json cannot be read (the model's own warning): the
    /// inspector opens without it, a save does not guess where tensors go.
    #[error("{0}")]
    DeviceMapUnreadable(String),
    /// A `quantization_config` this save cannot honour; the text says why and what to
    /// do instead.
    #[error("{0}")]
    Quantization(String),
    #[error(
        "a tensor is named `__metadata__`, the key safetensors reserves for the header's metadata; it cannot be written"
    )]
    ReservedName,
    #[error(
        "tensor `{}` (placed on {placement}) has no data: not in the checkpoint, the offload folder or a tie partner",
        tensor
    )]
    NoData { tensor: String, placement: String },
    #[error(
        "tensor `{}` needs {needs} bytes but its source {} holds {holds}",
        tensor,
        file.display()
    )]
    WrongSize {
        tensor: String,
        needs: u64,
        file: PathBuf,
        holds: u64,
    },
    /// An FP8 weight (or its scale) that cannot be dequantized; `why` continues the
    /// sentence after the tensor's name.
    #[error("tensor `{tensor}` {why}")]
    NotDequantized { tensor: String, why: String },
    /// No recipe writes it as asked (a cast devmap does not make, a block that does
    /// not fit its scales).
    #[error("tensor `{tensor}`: {why}")]
    NoRecipe { tensor: String, why: String },
}

/// A difference between what this save wrote and its plan: the save is discarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("{} is {len} bytes, the plan says {planned}", file.display())]
    ShardLength {
        file: PathBuf,
        len: u64,
        planned: u64,
    },
    #[error("the header of {} differs from the plan ({detail})", file.display())]
    ShardHeader { file: PathBuf, detail: String },
    #[error("`{}` is not written", .0)]
    NotWritten(String),
    #[error("`{tensor}` is written {times} times")]
    WrittenTwice { tensor: String, times: u32 },
    #[error("{written} tensor bytes written but {planned} planned")]
    TotalBytes { written: u64, planned: u64 },
    #[error("`{tensor}`: what rank {rank} wrote differs from its shards, from byte {at} of {}", file.display())]
    RankBlock {
        file: PathBuf,
        tensor: String,
        rank: u32,
        at: u64,
    },
}
