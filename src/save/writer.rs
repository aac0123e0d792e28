//! The writer threads: each takes shards off a shared queue and streams every tensor's
//! recipe into its temporary file.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::SystemTime;

use super::check_written::verify_shard;
use super::commit::Staging;
use super::copy::{Copier, CopyError};
use super::error::SaveError;
use super::event::{Reporter, SaveEvent};
use super::recipe::Recipe;
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
    pub(super) staging: &'a Staging,
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

/// Gives the shard file its blocks before a byte of it is written. On ext4 a file
/// written without them reserves and accounts each 4 KiB block as it is written
/// (delayed allocation), under the lock every write to the file takes: a 1 GB shard
/// took 1.3× as long as `cp` of the same bytes, and the writers of one big shard
/// waited on each other; with the blocks reserved up front it takes as long as `cp`
/// (CHANGELOG.md, Performance history: Saving). A full disk is an error now, before anything is copied; a
/// file system that cannot reserve blocks (some network ones) is written as before.
fn reserve(dst: &File, len: u64) -> std::io::Result<()> {
    match rustix::fs::fallocate(dst, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(e) => {
            let e = std::io::Error::from(e);
            if super::error::output_is_full(&e) {
                Err(e)
            } else {
                Ok(())
            }
        }
    }
}

impl ShardWriter<'_> {
    fn write_shard(
        &mut self,
        shard: &ShardPlan,
        tmp: &Path,
        index: usize,
    ) -> Result<(), SaveError> {
        use std::io::Write;
        let dst = self.shared.staging.create(tmp)?;
        // The header streams into the new file from offset 0 through a small buffer.
        let mut out = std::io::BufWriter::with_capacity(1 << 20, &dst);
        let data_start = shard
            .write_header(self.shared.ckpt, &mut out)
            .and_then(|len| out.flush().map(|()| len))
            .map_err(|e| SaveError::io(tmp, e))?;
        drop(out);
        reserve(&dst, shard.file_bytes()).map_err(|e| SaveError::io(tmp, e))?;
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

    /// Streams `tensors` (some or all of a shard's) into the shard file `dst`.
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
        for t in tensors {
            let recipe = t.recipe(ckpt);
            if let Recipe::Stitch {
                pieces, from, to, ..
            } = recipe
            {
                self.write_stitched(
                    t,
                    pieces,
                    (from, to),
                    (dst, data_start),
                    (index, tmp),
                    shard_written,
                )?;
                shared.pause_once();
                continue;
            }
            let Some(source) = recipe.source() else {
                continue;
            };
            if source.len == 0 {
                // Nothing to copy, and accelerate writes no `.dat` for an empty tensor:
                // its source may not exist.
                continue;
            }
            let kind = ckpt.input_kind(source.file);
            if let InputKind::Staged(key) = kind {
                self.write_staged(t, key, (dst, data_start), (index, tmp), shard_written)?;
                shared.pause_once();
                continue;
            }
            let src = self.sources.get(ckpt, source.file)?;
            let mut report = |n: u64| shared.progress(index, shard_written, n);
            let from = (src, source.offset);
            let to = (dst, data_start + t.begin);
            let moved = match recipe {
                Recipe::Copy(_) if kind == InputKind::ProcessMemory => self
                    .copier
                    .copy_through_buffer(from, to, source.len, &stop, &mut report),
                Recipe::Copy(_) => self.copier.copy(from, to, source.len, &stop, &mut report),
                Recipe::Cast {
                    from: from_dtype,
                    to: to_dtype,
                    ..
                } => self.copier.cast(
                    from,
                    to,
                    source.len,
                    (from_dtype, to_dtype),
                    &stop,
                    &mut report,
                ),
                Recipe::Merge {
                    from: from_dtype,
                    to: to_dtype,
                    ..
                }
                | Recipe::DequantMerge {
                    from: from_dtype,
                    to: to_dtype,
                    ..
                } => {
                    // An FP8 weight's scales, for a merge into its dequantized value.
                    let dequant = match recipe {
                        Recipe::DequantMerge { scale, blocks, .. } => Some(
                            open_source(ckpt, scale.file)
                                .map_err(CopyError::Io)
                                .and_then(|scale_file| {
                                    super::fp8::Fp8Rows::load(
                                        &ckpt.tensors()[t.tensor()].name,
                                        (&scale_file, scale),
                                        blocks,
                                        from_dtype,
                                        source.len,
                                    )
                                }),
                        )
                        .transpose(),
                        _ => Ok(None),
                    };
                    // The merge is arithmetic, not I/O: a big tensor's rows are split
                    // among the cores (each part written in place).
                    let threads = if source.len >= PARALLEL_MERGE_BYTES {
                        std::thread::available_parallelism().map_or(1, usize::from)
                    } else {
                        1
                    };
                    dequant.and_then(|dequant| {
                        super::lora_kernel::write_in_parallel(
                            super::lora_kernel::MergeInput {
                                ckpt,
                                id: t.tensor(),
                                src: from,
                                len: source.len,
                                dtypes: (from_dtype, to_dtype),
                                open: &|file| open_source(ckpt, file),
                                cancel: &stop,
                                dequant: dequant.as_ref(),
                            },
                            to,
                            threads,
                        )
                        .map(&mut report)
                    })
                }
                Recipe::Mxfp4 {
                    blocks,
                    scales,
                    layout,
                    to: to_dtype,
                    merge,
                } => open_source(ckpt, scales.file)
                    .map_err(CopyError::Io)
                    .and_then(|scales_file| {
                        let merger = merge
                            .then(|| {
                                super::lora_kernel::RowMerger::load(
                                    ckpt,
                                    t.tensor(),
                                    layout.matrix(),
                                    &|file| open_source(ckpt, file),
                                )
                            })
                            .transpose()?;
                        // Arithmetic, not I/O: a big weight's experts are split among
                        // the cores, each written in place.
                        let threads = if blocks.len >= PARALLEL_MERGE_BYTES {
                            std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
                        } else {
                            1
                        };
                        super::mxfp4::write_in_parallel(
                            super::mxfp4::Packed {
                                name: &ckpt.tensors()[t.tensor()].name,
                                blocks: (src, blocks),
                                scales: (&scales_file, scales),
                                layout,
                                merge: merger.as_ref(),
                            },
                            to_dtype,
                            (dst, data_start + t.begin),
                            threads,
                            &stop,
                        )
                    })
                    .map(&mut report),
                // Written by `write_stitched` above.
                Recipe::Stitch { .. } => Ok(()),
                Recipe::Dequant {
                    from: from_dtype,
                    to: to_dtype,
                    scale,
                    blocks,
                    source: range,
                } => open_source(ckpt, scale.file)
                    .map_err(CopyError::Io)
                    .and_then(|scale_file| {
                        let mut written = 0u64;
                        super::fp8::stream(
                            &ckpt.tensors()[t.tensor()].name,
                            (src, range),
                            (&scale_file, scale),
                            blocks,
                            (from_dtype, to_dtype),
                            &stop,
                            &mut |out| {
                                dst.write_all_at(out, data_start + t.begin + written)?;
                                written += out.len() as u64;
                                report(out.len() as u64);
                                Ok(())
                            },
                        )
                    }),
            };
            moved.map_err(|e| copy_failed(e, ckpt, t, source, tmp))?;
            check_unchanged(ckpt, source.file, src)?;
            shared.pause_once();
        }
        Ok(())
    }

    /// One tensor stored in pieces, run by run in the whole tensor's order; every
    /// piece's file is checked unchanged before and after.
    fn write_stitched(
        &mut self,
        t: &super::shards::PlannedTensor,
        pieces: u32,
        dtypes: (crate::types::dtype::DType, crate::types::dtype::DType),
        (dst, data_start): (&File, u64),
        (index, tmp): (usize, &Path),
        shard_written: &AtomicU64,
    ) -> Result<(), SaveError> {
        let shared = self.shared;
        let ckpt = shared.ckpt;
        let stop = StopFlag(shared);
        let sources = &mut self.sources;
        let mut refused = None;
        let mut open = |file| match sources.get(ckpt, file).map(File::try_clone) {
            Ok(Ok(f)) => Ok(f),
            Ok(Err(e)) => Err(CopyError::Io(e)),
            Err(e) => {
                refused = Some(e);
                Err(CopyError::Io(std::io::Error::other("changed")))
            }
        };
        let mut report = |n: u64| shared.progress(index, shard_written, n);
        let written = super::stitch::put_together(
            ckpt,
            (t.tensor(), pieces),
            &mut open,
            &mut self.copier,
            super::stitch::Sink::File {
                at: (dst, data_start + t.begin),
                dtypes,
                report: &mut report,
            },
            &stop,
        );
        if let Some(e) = refused {
            return Err(e);
        }
        let recipe = t.recipe(ckpt);
        written.map_err(|f| {
            let range = crate::types::range::ByteRange {
                file: f.file,
                offset: 0,
                len: recipe.source_len(),
            };
            copy_failed(f.error, ckpt, t, range, tmp)
        })?;
        for range in recipe.ranges(ckpt) {
            self.sources.get(ckpt, range.file)?;
        }
        Ok(())
    }

    /// One staged tensor (a live model's GPU tensor), a filled chunk at a time.
    fn write_staged(
        &mut self,
        t: &super::shards::PlannedTensor,
        key: u64,
        (dst, data_start): (&File, u64),
        (index, tmp): (usize, &Path),
        shard_written: &AtomicU64,
    ) -> Result<(), SaveError> {
        let shared = self.shared;
        let recipe = t.recipe(shared.ckpt);
        let Some(source) = recipe.source() else {
            return Ok(());
        };
        let stop = StopFlag(shared);
        let copier = &mut self.copier;
        let mut report = |n: u64| shared.progress(index, shard_written, n);
        let out = data_start + t.begin;
        let moved = match recipe {
            Recipe::Copy(_) => super::stage::through_stage(
                shared.stage,
                key,
                (source.offset, source.len),
                1,
                &mut |from, done, n| {
                    copier.copy_through_buffer(from, (dst, out + done), n, &stop, &mut report)
                },
            ),
            Recipe::Cast { from, to, .. } => super::stage::through_stage(
                shared.stage,
                key,
                (source.offset, source.len),
                from.size(),
                &mut |at, done, n| {
                    let written = done / from.size() * to.size();
                    copier.cast(at, (dst, out + written), n, (from, to), &stop, &mut report)
                },
            ),
            _ => Err(CopyError::Io(std::io::Error::other(
                "a staged tensor is copied or cast, not merged or dequantized",
            ))),
        };
        moved.map_err(|e| copy_failed(e, shared.ckpt, t, source, tmp))
    }
}

/// A copy of tensor `t` from `source` into the shard `tmp` that failed, as the save
/// reports it: the output when it is full, else the input, with the tensor named.
fn copy_failed(
    e: CopyError,
    ckpt: &Checkpoint,
    t: &super::shards::PlannedTensor,
    source: crate::types::range::ByteRange,
    tmp: &Path,
) -> SaveError {
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
        CopyError::Io(io) if super::error::output_is_full(&io) => SaveError::io(tmp, io),
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
/// that computes on every core already (merges, MXFP4). FP8 dequantization computes on
/// one core a tensor, so its shards are split like copies.
fn parts_for_threads<'p>(
    shard: &'p ShardPlan,
    shared: &Shared<'_>,
) -> Vec<&'p [super::shards::PlannedTensor]> {
    let tensors = &shard.tensors[..];
    let threads = shared.threads_per_shard.min(tensors.len()).max(1);
    let simple = tensors.iter().all(|t| {
        let recipe = t.recipe(shared.ckpt);
        matches!(
            recipe,
            Recipe::Copy(_) | Recipe::Cast { .. } | Recipe::Stitch { .. } | Recipe::Dequant { .. }
        ) && recipe
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
/// Merged tensors at least this large are computed on every core.
const PARALLEL_MERGE_BYTES: u64 = 1 << 20;

/// Opens a source file by id (an adapter's weights, for a merge).
fn open_source(ckpt: &Checkpoint, file: crate::types::range::FileId) -> std::io::Result<File> {
    crate::formats::input::open_regular(ckpt.file_path(file)).map_err(std::io::Error::other)
}

struct StopFlag<'a>(&'a Shared<'a>);

impl super::copy::Stop for StopFlag<'_> {
    fn stop(&self) -> bool {
        self.0.stop_flag()
    }
}
