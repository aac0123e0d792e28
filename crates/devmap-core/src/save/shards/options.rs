//! What the user asks of a save: the folder, shard size, dtype, and the knobs a
//! caller (the CLI, the inspector, the Python package) sets.

use std::path::PathBuf;

use crate::model::checkpoint::Checkpoint;
use crate::types::DType;

/// What the user asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveOptions {
    pub out: PathBuf,
    pub max_shard_size: u64,
    /// Write every name of a tie group instead of once under the kept name.
    pub keep_tied: bool,
    /// Write into a non-empty output folder.
    pub force: bool,
    /// Do not copy config, tokenizer and other files beside the weights.
    pub weights_only: bool,
    /// Shards written at the same time (at least 1).
    pub jobs: usize,
    /// fsync every shard before it is renamed into place (the default). Off trades
    /// durability after a power loss for speed, as `cp` does.
    pub fsync: bool,
    /// What to do with the page cache of copied input.
    pub cache: CachePolicy,
    /// RAM free for the page cache, as the caller's monitor read it; `None` when
    /// unknown. [`CachePolicy::Auto`] compares the model against it.
    pub available_ram: Option<u64>,
    /// The dtype of the floating-point tensors written.
    pub dtype: DtypeChoice,
    /// Save even when device-map entries cover no tensor that has data (the weights
    /// of those modules exist nowhere, so the output lacks them).
    pub allow_partial: bool,
    /// For tests: fail the commit at this rename, to check that it rolls back.
    #[doc(hidden)]
    pub commit_fault: Option<usize>,
    /// For tests: once the first tensor is written, create `<file>.reached` and wait
    /// while `file` exists, so a test can interrupt a save that is surely mid-shard.
    /// The CLI takes it from `DEVMAP_TEST_PAUSE`.
    #[doc(hidden)]
    pub pause_file: Option<PathBuf>,
    /// The caller's last look before the commit: a live model's Python side checks
    /// that no tensor changed while it was read. An `Err` refuses the save with its
    /// message, nothing committed.
    pub commit_check: Option<CommitCheck>,
    /// What fills staged sources (a live model's GPU tensors), see `save::stage`.
    pub stage: Option<crate::save::stage::StageRef>,
    /// What the user's transformers says of the model at the dtype the save casts to
    /// ([`crate::oracle`]): the modules it keeps in float32 come from there instead of
    /// devmap's table.
    pub asked: Option<std::sync::Arc<crate::oracle::Answer>>,
    /// A save split over processes: write one part, or commit the parts
    /// (`save::parts`).
    pub distributed: Option<crate::save::parts::Distributed>,
    /// `--quantize fp8-block`: write the linear weights as fine-grained FP8.
    pub quantize_fp8: bool,
}

/// See [`SaveOptions::commit_check`].
#[derive(Clone)]
pub struct CommitCheck(pub std::sync::Arc<dyn Fn() -> Result<(), String> + Send + Sync>);

impl std::fmt::Debug for CommitCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitCheck")
    }
}

/// Two checks are the same when they are the same closure.
impl PartialEq for CommitCheck {
    fn eq(&self, other: &CommitCheck) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

/// `--dtype`: what floating-point tensors are written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeChoice {
    /// Cast to the model's runtime dtype when the offload folder shows one that
    /// differs from the checkpoint's (the model was loaded with `dtype=`), as
    /// `save_pretrained` writes one dtype; otherwise keep.
    Auto,
    /// Every tensor as stored.
    Keep,
    /// Every tensor in the dtype the model holds it in (`Tensor::load_dtype`, else as
    /// stored): what `save_pretrained` writes from a live model, where transformers
    /// already applied the run dtype and the modules it keeps in float32.
    AsLoaded,
    /// Every floating-point tensor cast to this dtype (integers and bools untouched).
    To(DType),
}

/// The dtype a save casts floating-point tensors to, if any.
/// A quantized checkpoint (config.json's `quantization_config`) under `auto` is
/// written as stored, as `save_pretrained` writes a quantized model.
pub fn resolve_dtype(ckpt: &Checkpoint, choice: DtypeChoice) -> Option<DType> {
    match choice {
        DtypeChoice::Keep | DtypeChoice::AsLoaded => None,
        DtypeChoice::To(d) => Some(d),
        DtypeChoice::Auto if ckpt.config.quantization.is_some() => None,
        DtypeChoice::Auto => runtime_dtype(ckpt),
    }
}

/// The dtype the model ran in, where the offload folder shows it differs from the
/// checkpoint's: offloaded tensors held in another floating dtype than the same
/// tensors in the checkpoint, or (transformers' index) loaded as another dtype than
/// stored. `None` when nothing differs, or when the differences disagree.
pub fn runtime_dtype(ckpt: &Checkpoint) -> Option<DType> {
    use crate::model::checkpoint::Source;
    use crate::save::cast::is_castable;
    let mut seen: std::collections::BTreeSet<DType> = std::collections::BTreeSet::new();
    let arch = crate::model::arch::lookup(&ckpt.config.architectures);
    for (id, t) in ckpt.tensors().iter().enumerate() {
        if !matches!(t.source, Source::Offload(_)) || !is_castable(t.dtype) {
            continue;
        }
        // Modules transformers keeps in float32 (at float16, where every entry, strict
        // or not, applies) do not show the dtype the rest of the model ran in.
        let loaded = ckpt.loaded_name(id).unwrap_or(&t.name);
        if arch.is_some_and(|a| a.kept_in_fp32(loaded, DType::F16).is_some()) {
            continue;
        }
        match t.load_dtype {
            Some(load) if load != t.dtype => {
                seen.insert(load);
            }
            _ if ckpt.checkpoint_dtype(id) != t.dtype && is_castable(ckpt.checkpoint_dtype(id)) => {
                seen.insert(t.dtype);
            }
            _ => {}
        }
    }
    let mut differing = seen.into_iter();
    match (differing.next(), differing.next()) {
        (Some(d), None) if is_castable(d) => Some(d),
        _ => None,
    }
}

/// Whether copied input stays in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachePolicy {
    /// Drop it when the model is larger than half the available RAM, where keeping it
    /// would push out everything else; keep it otherwise (dropping costs time).
    Auto,
    /// Always advise the kernel to drop copied ranges.
    Drop,
    /// Leave the page cache to the kernel, as `cp` does.
    Keep,
}

impl SaveOptions {
    /// The defaults of `devmap save`: 50GB shards (transformers 5's), ties collapsed, config files copied,
    /// two shards at a time, fsync on.
    pub fn new(out: impl Into<PathBuf>) -> SaveOptions {
        SaveOptions {
            out: out.into(),
            max_shard_size: DEFAULT_MAX_SHARD_SIZE,
            keep_tied: false,
            force: false,
            weights_only: false,
            jobs: DEFAULT_JOBS,
            fsync: true,
            cache: CachePolicy::Auto,
            available_ram: None,
            dtype: DtypeChoice::Auto,
            allow_partial: false,
            commit_fault: None,
            pause_file: None,
            commit_check: None,
            stage: None,
            asked: None,
            distributed: None,
            quantize_fp8: false,
        }
    }
}

/// Shards smaller than this are written by one thread; bigger ones by the jobs no other
/// shard needs, each taking a run of its tensors.
pub(in crate::save) const PARALLEL_SHARD_BYTES: u64 = 64 << 20;

/// Shards written in parallel by default: two writers overlap one shard's copy or
/// fsync with the other's (docs/performance.md, Saving).
pub const DEFAULT_JOBS: usize = 2;

/// What transformers 5's `save_pretrained` writes by default (`max_shard_size="50GB"`;
/// transformers 4 wrote 5GB, one preset away in the inspector).
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 50_000_000_000;
/// [`DEFAULT_MAX_SHARD_SIZE`] as typed.
pub const DEFAULT_MAX_SHARD_SIZE_TEXT: &str = "50GB";
