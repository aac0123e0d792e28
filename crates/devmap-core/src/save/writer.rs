//! The writer threads: each takes shards off a shared queue and streams every tensor's
//! recipe into its temporary file.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::SystemTime;

use super::check_written::verify_shard;
use super::commit::TempFiles;
use super::copy::{Copier, CopyError};
use super::error::SaveError;
use super::event::{Reporter, SaveEvent};
use super::execute::Recipe;
use super::shards::{SavePlan, ShardPlan};
use crate::model::checkpoint::InputKind;
use crate::model::checkpoint::{Checkpoint, FileId};

/// Input files a writer keeps open at once. An offload folder may hold thousands of
/// `.dat` files, more than the open-file limit; tensors come in module order, so a
/// small set of open files serves nearly every read.
const MAX_OPEN_SOURCES: usize = 64;

/// Open input files, checked against what they were when the model was loaded.
#[derive(Default)]
struct Sources {
    open: HashMap<FileId, File>,
}

impl Sources {
    fn get(&mut self, ckpt: &Checkpoint, id: FileId) -> Result<&File, SaveError> {
        if self.open.len() >= MAX_OPEN_SOURCES && !self.open.contains_key(&id) {
            self.open.clear();
        }
        let file = match self.open.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let path = ckpt.file_path(id);
                let file = crate::formats::input::open_regular(path).map_err(|err| {
                    SaveError::SourceChanged {
                        path: path.to_path_buf(),
                        message: err.to_string(),
                    }
                })?;
                e.insert(file)
            }
        };
        check_unchanged(ckpt, id, file)?;
        Ok(file)
    }
}

fn check_unchanged(ckpt: &Checkpoint, id: FileId, file: &File) -> Result<(), SaveError> {
    let info = &ckpt.files[id];
    let meta = file.metadata().map_err(|e| SaveError::io(&info.path, e))?;
    let modified: Option<SystemTime> = meta.modified().ok();
    let what = if meta.len() != info.len {
        format!("its size went from {} to {} bytes", info.len, meta.len())
    } else if info.modified.is_some() && modified != info.modified {
        "its modification time changed (it was rewritten)".to_owned()
    } else {
        return Ok(());
    };
    Err(SaveError::SourceChanged {
        path: info.path.clone(),
        message: format!(
            "changed while devmap was using it: {what}; the save stopped and wrote nothing; save again once nothing else writes to the model"
        ),
    })
}

/// What the writer threads share: the plan, a queue position, totals, flags.
pub(super) struct Shared<'a> {
    pub(super) ckpt: &'a Checkpoint,
    pub(super) plan: &'a SavePlan,
    pub(super) temp_files: &'a TempFiles,
    /// Each shard's temporary file, by shard index.
    pub(super) shard_tmps: &'a [PathBuf],
    pub(super) fsync: bool,
    pub(super) drop_cache: bool,
    pub(super) cancel: &'a AtomicBool,
    pub(super) reporter: &'a Reporter<'a>,
    pub(super) next: AtomicUsize,
    pub(super) total_written: AtomicU64,
    /// Set by a worker that failed, so the others stop early.
    pub(super) failed: AtomicBool,
    pub(super) used_kernel_copy: AtomicBool,
    /// The test hook of [`SaveOptions::pause_file`](super::SaveOptions::pause_file).
    pub(super) pause_file: Option<&'a Path>,
    pub(super) paused: AtomicBool,
    /// What fills staged sources (a live model's GPU tensors).
    pub(super) stage: Option<&'a super::stage::StageRef>,
    /// Threads that may write one shard together: the jobs left over when there are
    /// fewer shards than jobs (one big shard is then not written on one core).
    pub(super) threads_per_shard: usize,
}

impl Shared<'_> {
    /// One writer thread: takes shards off the queue until none is left.
    pub(super) fn work(&self) -> Result<(), SaveError> {
        let mut writer = ShardWriter {
            shared: self,
            sources: Sources::default(),
            copier: Copier::new(self.drop_cache),
        };
        let result = (|| {
            let count = self.plan.shards.len();
            loop {
                if self.cancel.load(Ordering::Relaxed) || self.failed.load(Ordering::Relaxed) {
                    return Err(SaveError::Cancelled);
                }
                let index = self.next.fetch_add(1, Ordering::Relaxed);
                let Some(shard) = self.plan.shards.get(index) else {
                    return Ok(());
                };
                self.reporter.lifecycle(SaveEvent::ShardStarted {
                    index,
                    count,
                    file_name: shard.file_name.clone(),
                    bytes: shard.file_bytes(),
                });
                let tmp = &self.shard_tmps[index];
                writer.write_shard(shard, tmp, index)?;
                verify_shard(self.ckpt, shard, tmp)?;
                self.reporter.lifecycle(SaveEvent::ShardFinished { index });
            }
        })();
        if !writer.copier.used_kernel_copy() {
            self.used_kernel_copy.store(false, Ordering::Relaxed);
        }
        if matches!(result, Err(ref e) if !matches!(e, SaveError::Cancelled)) {
            self.failed.store(true, Ordering::Relaxed);
        }
        result
    }

    /// The test hook: the first time a tensor is in place, say so and wait while the
    /// pause file exists (or until the save is stopped), so a test can interrupt a save
    /// that is certainly mid-shard.
    fn pause_once(&self) {
        let Some(pause) = self.pause_file else { return };
        if self.paused.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut reached = pause.as_os_str().to_os_string();
        reached.push(".reached");
        let _ = std::fs::write(&reached, b"");
        while pause.exists() && !self.stop_flag() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Stop copying: the user cancelled or another worker failed.
    /// Counts `n` more bytes written into shard `index` (`shard_written` so far) and
    /// reports the totals.
    fn progress(&self, index: usize, shard_written: &AtomicU64, n: u64) {
        let written = shard_written.fetch_add(n, Ordering::Relaxed) + n;
        let total = self.total_written.fetch_add(n, Ordering::Relaxed) + n;
        self.reporter.progress(SaveEvent::Progress {
            index,
            shard_written: written,
            total_written: total,
        });
    }

    fn stop_flag(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.failed.load(Ordering::Relaxed)
    }
}

/// Streams tensors into shard files, reusing open inputs and the copy buffer.
struct ShardWriter<'a> {
    shared: &'a Shared<'a>,
    sources: Sources,
    copier: Copier,
}

impl ShardWriter<'_> {
    fn write_shard(
        &mut self,
        shard: &ShardPlan,
        tmp: &Path,
        index: usize,
    ) -> Result<(), SaveError> {
        use std::io::Write;
        let dst = self.shared.temp_files.create(tmp)?;
        // The header streams into the new file from offset 0 through a small buffer.
        let mut out = std::io::BufWriter::with_capacity(1 << 20, &dst);
        let data_start = shard
            .write_header(self.shared.ckpt, &mut out)
            .and_then(|len| out.flush().map(|()| len))
            .map_err(|e| SaveError::io(tmp, e))?;
        drop(out);
        crate::sys::files::reserve_blocks(&dst, shard.file_bytes())
            .map_err(|e| SaveError::io(tmp, e))?;
        let shard_written = AtomicU64::new(0);
        let shared = self.shared;
        let parts = parts_for_threads(shard, shared);
        let together = parts.len() > 1;
        let mut parts = parts.into_iter();
        let first = parts.next().unwrap_or(&[]);
        std::thread::scope(|scope| {
            // The other parts of a big shard, each on a thread of its own with its own
            // open inputs and buffers; positioned writes keep them apart.
            let helpers: Vec<_> = parts
                .map(|part| {
                    let (dst, written) = (&dst, &shard_written);
                    scope.spawn(move || {
                        let mut helper = ShardWriter {
                            shared,
                            sources: Sources::default(),
                            copier: Copier::new(shared.drop_cache),
                        };
                        helper.copier.share_destination(true);
                        let result =
                            helper.write_tensors(part, (dst, data_start), (index, tmp), written);
                        if !helper.copier.used_kernel_copy() {
                            shared.used_kernel_copy.store(false, Ordering::Relaxed);
                        }
                        if result.is_err() {
                            shared.failed.store(true, Ordering::Relaxed);
                        }
                        result
                    })
                })
                .collect();
            self.copier.share_destination(together);
            let mine = self.write_tensors(first, (&dst, data_start), (index, tmp), &shard_written);
            self.copier.share_destination(false);
            if mine.is_err() {
                shared.failed.store(true, Ordering::Relaxed);
            }
            let theirs = helpers.into_iter().map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            });
            // The first real error, before a cancel the failure caused in the others.
            let mut results: Vec<Result<(), SaveError>> =
                std::iter::once(mine).chain(theirs).collect();
            results.sort_by_key(|r| matches!(r, Err(SaveError::Cancelled)));
            results.into_iter().find(Result::is_err).unwrap_or(Ok(()))
        })?;
        // A trailing empty tensor leaves the file short of its planned length.
        dst.set_len(shard.file_bytes())
            .map_err(|e| SaveError::io(tmp, e))?;
        if shared.fsync {
            dst.sync_all().map_err(|e| SaveError::io(tmp, e))?;
        }
        Ok(())
    }

    /// Streams `tensors` (some or all of a shard's) into the shard file `dst`, each
    /// through its recipe (`save::execute`). Every file a tensor is read from is checked
    /// unchanged before and after.
    fn write_tensors(
        &mut self,
        tensors: &[super::shards::PlannedTensor],
        (dst, data_start): (&File, u64),
        (index, tmp): (usize, &Path),
        shard_written: &AtomicU64,
    ) -> Result<(), SaveError> {
        let shared = self.shared;
        let ckpt = shared.ckpt;
        let stop = StopFlag(shared);
        for t in write_order(tensors, ckpt) {
            let recipe = t.recipe(ckpt);
            if recipe.pieces().is_some() {
                for range in recipe.ranges(ckpt) {
                    self.sources.get(ckpt, range.file)?;
                }
            }
            // The one source file, kept open from tensor to tensor; none for an empty
            // tensor (accelerate writes no `.dat` for one), pieces or a staged tensor.
            let source = recipe
                .source()
                .filter(|r| r.len > 0 && !matches!(ckpt.input_kind(r.file), InputKind::Staged(_)));
            let src = match source {
                Some(r) => Some(self.sources.get(ckpt, r.file)?),
                None => None,
            };
            let mut report = |n: u64| shared.progress(index, shard_written, n);
            super::execute::run(
                &recipe,
                super::execute::Inputs {
                    ckpt,
                    tensor: t.tensor(),
                    source: src,
                    stage: shared.stage,
                    stop: &stop,
                },
                &mut self.copier,
                super::execute::Sink::File {
                    at: (dst, data_start + t.begin),
                    report: &mut report,
                },
            )
            .map_err(|failed| copy_failed(failed, ckpt, t, &recipe, tmp))?;
            if let (Some(r), Some(src)) = (source, src) {
                check_unchanged(ckpt, r.file, src)?;
            }
            if recipe.pieces().is_some() {
                for range in recipe.ranges(ckpt) {
                    self.sources.get(ckpt, range.file)?;
                }
            }
            shared.pause_once();
        }
        Ok(())
    }
}

/// The order `tensors` are written in: as they lie, except that each weight quantized
/// on the way out has its scales written right after its values. The shard lays the F32
/// scales before the F8 values; written that way, the scales' recipe would read the
/// whole weight for its tiles' maxima and the values' recipe read it again. Values
/// first, the weight is read once: the values' recipe keeps the tile scales it made,
/// and the scales' recipe writes them without reading (`save::quantize_fp8`).
/// Positioned writes make any order safe.
fn write_order<'p>(
    tensors: &'p [super::shards::PlannedTensor],
    ckpt: &Checkpoint,
) -> Vec<&'p super::shards::PlannedTensor> {
    use super::execute::Make;
    use super::quantize_fp8::Fp8Part;
    let quantized = |t: &super::shards::PlannedTensor, want: Fp8Part| {
        let recipe = t.recipe(ckpt);
        match (recipe.make, recipe.source()) {
            (Make::Quantize(out), Some(r)) if out.part == want => Some((r.file, r.offset)),
            _ => None,
        }
    };
    // Scales whose values lie in this shard too, by the weight they are made from.
    let values: std::collections::HashSet<_> = tensors
        .iter()
        .filter_map(|t| quantized(t, Fp8Part::Values))
        .collect();
    let mut scales: HashMap<(FileId, u64), &super::shards::PlannedTensor> = HashMap::new();
    for t in tensors {
        if let Some(weight) = quantized(t, Fp8Part::Scales).filter(|w| values.contains(w)) {
            scales.insert(weight, t);
        }
    }
    let mut order = Vec::with_capacity(tensors.len());
    for t in tensors {
        if quantized(t, Fp8Part::Scales).is_some_and(|w| values.contains(&w)) {
            continue;
        }
        order.push(t);
        if let Some(after) = quantized(t, Fp8Part::Values).and_then(|w| scales.remove(&w)) {
            order.push(after);
        }
    }
    order
}

/// A recipe of tensor `t` into the shard `tmp` that failed, as the save reports it:
/// the output when it is full, else the input it was reading, with the tensor named.
fn copy_failed(
    failed: super::execute::Failed,
    ckpt: &Checkpoint,
    t: &super::shards::PlannedTensor,
    recipe: &Recipe,
    tmp: &Path,
) -> SaveError {
    let e = failed.error;
    let file = failed
        .file
        .or_else(|| recipe.ranges(ckpt).first().map(|r| r.file));
    let (Some(file), false) = (file, matches!(e, CopyError::Cancelled)) else {
        return match e {
            CopyError::Cancelled => SaveError::Cancelled,
            CopyError::Io(io) => SaveError::io(tmp, io),
            CopyError::ShortSource { copied } => SaveError::io(
                tmp,
                std::io::Error::other(format!("a source ended after {copied} bytes")),
            ),
        };
    };
    let source = crate::types::range::ByteRange {
        file,
        offset: recipe.source().map_or(0, |r| r.offset),
        len: recipe.source_len(),
    };
    let path = ckpt.file_path(source.file);
    let name = t.name(ckpt);
    let kind = ckpt.input_kind(source.file);
    let staged = matches!(kind, InputKind::Staged(_));
    let changed = |message: String| SaveError::SourceChanged {
        path: path.to_path_buf(),
        message,
    };
    match e {
        CopyError::Cancelled => SaveError::Cancelled,
        CopyError::ShortSource { copied } if staged => changed(format!(
            "tensor `{name}`: the stage gave {copied} of {} bytes",
            source.len
        )),
        CopyError::ShortSource { copied } => changed(format!(
            "ended after {copied} of the {} bytes of tensor `{name}`; it was truncated while devmap read it",
            source.len
        )),
        // Out of space or over a file-size limit is about the output.
        CopyError::Io(io) if crate::sys::files::is_disk_full(&io) => SaveError::io(tmp, io),
        CopyError::Io(io) if kind == InputKind::ProcessMemory => changed(format!(
            "tensor `{name}`: its memory at {:#x} cannot be read ({io}): the tensor was freed or moved while devmap saved it",
            source.offset
        )),
        CopyError::Io(io) if staged => changed(format!("tensor `{name}`: {io}")),
        CopyError::Io(io) => SaveError::io(path, io),
    }
}

/// A shard's tensors in the parts its threads write: consecutive runs of about equal
/// bytes, as many as [`Shared::threads_per_shard`] allows — one part for a small shard,
/// or one whose tensors a single stream must write (a live model's staged tensors) or
/// that splits each weight among threads already (merges, MXFP4, packed integers). FP8
/// dequantization's shards are split like copies: every part's threads share the
/// cores' permits (`save::compute`).
fn parts_for_threads<'p>(
    shard: &'p ShardPlan,
    shared: &Shared<'_>,
) -> Vec<&'p [super::shards::PlannedTensor]> {
    let tensors = &shard.tensors[..];
    let threads = shared.threads_per_shard.min(tensors.len()).max(1);
    let simple = tensors.iter().all(|t| {
        let recipe = t.recipe(shared.ckpt);
        recipe.shares_a_shard()
            && recipe
                .ranges(shared.ckpt)
                .iter()
                .all(|r| shared.ckpt.input_kind(r.file) == InputKind::File)
    });
    let bytes = shard.file_bytes();
    if threads < 2 || !simple || bytes < super::shards::PARALLEL_SHARD_BYTES {
        return vec![tensors];
    }
    let share = bytes / threads as u64;
    let mut parts = Vec::with_capacity(threads);
    let mut start = 0;
    for (i, t) in tensors.iter().enumerate() {
        if parts.len() + 1 < threads && t.begin >= share * (parts.len() as u64 + 1) && i > start {
            parts.push(&tensors[start..i]);
            start = i;
        }
    }
    parts.push(&tensors[start..]);
    parts
}

/// Lets the copy loop see both the user's cancel and another worker's failure.
struct StopFlag<'a>(&'a Shared<'a>);

impl super::copy::Stop for StopFlag<'_> {
    fn stop(&self) -> bool {
        self.0.stop_flag()
    }
}
