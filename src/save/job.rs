//! Steps 4 and 5: write every shard under a temporary name, verify it, rename
//! everything into place, index last. Runs on any thread; reports through events.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::SystemTime;

use memmap2::Mmap;

use super::copy::{Copier, CopyError};
use super::error::SaveError;
use super::plan::{CachePolicy, SaveOptions, SavePlan, ShardPlan};
use super::preflight::{PARTIAL_SUFFIX, files_to_copy, is_saved_weights_name};
use crate::formats::hf_index::{INDEX_FILE, encode_index};
use crate::model::checkpoint::{Checkpoint, FileId};

/// What a running save reports.
#[derive(Debug, Clone, PartialEq)]
pub enum SaveEvent {
    ShardStarted {
        index: usize,
        count: usize,
        file_name: String,
        bytes: u64,
    },
    /// Cumulative bytes: within the current shard, and of all tensor data.
    Progress {
        index: usize,
        shard_written: u64,
        total_written: u64,
    },
    ShardFinished {
        index: usize,
    },
    Finished(SaveReport),
    Failed(String),
    Cancelled,
}

/// What a finished save wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveReport {
    pub out: PathBuf,
    pub shard_files: Vec<String>,
    pub tensors: usize,
    pub bytes: u64,
    pub copied_files: Vec<String>,
    pub removed_stale: Vec<String>,
    pub kernel_copy: bool,
    /// Whether copied input was dropped from the page cache.
    pub dropped_cache: bool,
}

/// Sends events without ever blocking the copy on a slow reader: progress is dropped
/// when the channel is full (the next one carries the totals), lifecycle events wait.
/// A dropped receiver cancels the save.
pub struct Reporter<'a> {
    tx: Option<&'a SyncSender<SaveEvent>>,
    cancel: &'a AtomicBool,
}

impl<'a> Reporter<'a> {
    pub fn new(tx: Option<&'a SyncSender<SaveEvent>>, cancel: &'a AtomicBool) -> Self {
        Reporter { tx, cancel }
    }

    fn progress(&self, event: SaveEvent) {
        if let Some(tx) = self.tx
            && let Err(TrySendError::Disconnected(_)) = tx.try_send(event)
        {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }

    fn lifecycle(&self, event: SaveEvent) {
        if let Some(tx) = self.tx
            && tx.send(event).is_err()
        {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }
}

/// A save running on its own thread.
pub struct SaveJob {
    pub events: Receiver<SaveEvent>,
    cancel: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<SaveReport, SaveError>>>,
}

impl SaveJob {
    /// Starts writing `plan`. The last event is `Finished`, `Failed` or `Cancelled`.
    pub fn spawn(
        ckpt: Arc<Checkpoint>,
        plan: SavePlan,
        options: SaveOptions,
    ) -> std::io::Result<SaveJob> {
        let (tx, rx) = sync_channel(256);
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let handle = std::thread::Builder::new()
            .name("devmap-save".into())
            .spawn(move || {
                let reporter = Reporter::new(Some(&tx), &flag);
                let result = write(&ckpt, &plan, &options, &flag, &reporter);
                let last = match &result {
                    Ok(report) => SaveEvent::Finished(report.clone()),
                    Err(SaveError::Cancelled) => SaveEvent::Cancelled,
                    Err(e) => SaveEvent::Failed(e.to_string()),
                };
                // The receiver may be gone; the result is returned by join either way.
                let _ = tx.send(last);
                result
            })?;
        Ok(SaveJob {
            events: rx,
            cancel,
            handle: Some(handle),
        })
    }

    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// The flag that cancels this save, for a holder that gives the job away.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Waits for the save to end.
    pub fn join(mut self) -> Result<SaveReport, SaveError> {
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            _ => Err(SaveError::Verify(vec!["the save thread panicked".into()])),
        }
    }
}

/// Temporary files of one save, removed unless the save completes.
struct Staging {
    files: Vec<(PathBuf, PathBuf)>,
    created_out: bool,
    out: PathBuf,
    committed: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for (tmp, _) in &self.files {
            let _ = std::fs::remove_file(tmp);
        }
        if self.created_out {
            // Only removes the folder if it is still empty.
            let _ = std::fs::remove_dir(&self.out);
        }
    }
}

/// Writes the plan (blocking). `write` assumes `preflight::check` passed.
pub fn write(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    options: &SaveOptions,
    cancel: &AtomicBool,
    reporter: &Reporter<'_>,
) -> Result<SaveReport, SaveError> {
    let out = &options.out;
    let created_out = !out.exists();
    std::fs::create_dir_all(out).map_err(|e| SaveError::io(out, e))?;
    let mut staging = Staging {
        files: Vec::new(),
        created_out,
        out: out.clone(),
        committed: false,
    };
    // Every temporary name is known up front, so a failure anywhere removes them all.
    for shard in &plan.shards {
        staging.files.push((
            out.join(format!("{}{PARTIAL_SUFFIX}", shard.file_name)),
            out.join(&shard.file_name),
        ));
    }
    let drop_cache = match options.cache {
        CachePolicy::Drop => true,
        CachePolicy::Keep => false,
        CachePolicy::Auto => {
            crate::monitor::available_ram().is_some_and(|free| plan.file_bytes() > free / 2)
        }
    };
    let shared = Shared {
        ckpt,
        plan,
        out,
        fsync: options.fsync,
        drop_cache,
        cancel,
        reporter,
        next: AtomicUsize::new(0),
        total_written: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        used_kernel_copy: AtomicBool::new(true),
    };
    let workers = options.jobs.clamp(1, plan.shards.len().max(1));
    let results: Vec<Result<(), SaveError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| scope.spawn(|| shared.work()))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(SaveError::Verify(vec!["a writer thread panicked".into()]))
                })
            })
            .collect()
    });
    // The first real error wins over the cancellations it caused in other workers.
    let mut cancelled = false;
    for r in results {
        match r {
            Ok(()) => {}
            Err(SaveError::Cancelled) => cancelled = true,
            Err(e) => return Err(e),
        }
    }
    if cancelled || cancel.load(Ordering::Relaxed) {
        return Err(SaveError::Cancelled);
    }
    verify_plan_covered(ckpt, plan)?;

    let mut copied_files = Vec::new();
    if !options.weights_only {
        for src in files_to_copy(ckpt) {
            let Some(name) = src.file_name() else {
                continue;
            };
            let name_text = name.to_string_lossy().into_owned();
            let tmp = out.join(format!("{name_text}{PARTIAL_SUFFIX}"));
            staging.files.push((tmp.clone(), out.join(name)));
            std::fs::copy(&src, &tmp).map_err(|e| SaveError::io(&src, e))?;
            copied_files.push(name_text);
        }
    }
    // The index is written now, under its temporary name, and renamed last: after
    // this point only renames remain, so nothing that can fail for lack of space or a
    // broken input happens once files carry their real names.
    if plan.shards.len() > 1 {
        let weight_map: BTreeMap<String, String> = plan
            .shards
            .iter()
            .flat_map(|s| {
                s.tensors
                    .iter()
                    .map(move |t| (t.name.clone(), s.file_name.clone()))
            })
            .collect();
        let text = encode_index(plan.total_parameters, plan.total_size, &weight_map);
        let tmp = out.join(format!("{INDEX_FILE}{PARTIAL_SUFFIX}"));
        staging.files.push((tmp.clone(), out.join(INDEX_FILE)));
        write_synced(&tmp, text.as_bytes())?;
    }
    if cancel.load(Ordering::Relaxed) {
        return Err(SaveError::Cancelled);
    }

    // Commit: from here on, files appear under their real names, the index last.
    let shard_files: Vec<String> = plan.shards.iter().map(|s| s.file_name.clone()).collect();
    let removed_stale = remove_stale_weights(out, &shard_files)?;
    for (tmp, dest) in &staging.files {
        std::fs::rename(tmp, dest).map_err(|e| SaveError::io(dest, e))?;
    }
    if let Ok(dir) = File::open(out) {
        let _ = dir.sync_all();
    }
    staging.committed = true;
    Ok(SaveReport {
        out: out.clone(),
        shard_files,
        tensors: plan.tensor_count(),
        bytes: plan.total_size,
        copied_files,
        removed_stale,
        kernel_copy: shared.used_kernel_copy.load(Ordering::Relaxed),
        dropped_cache: shared.drop_cache,
    })
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), SaveError> {
    use std::io::Write;
    let mut f = File::create(path).map_err(|e| SaveError::io(path, e))?;
    f.write_all(bytes).map_err(|e| SaveError::io(path, e))?;
    f.sync_all().map_err(|e| SaveError::io(path, e))
}

/// Weight files of an earlier save in the output folder that this save does not
/// overwrite (a different shard count, or a stale index), so the loader never mixes
/// them in.
fn remove_stale_weights(out: &Path, keep: &[String]) -> Result<Vec<String>, SaveError> {
    let mut removed = Vec::new();
    let entries = std::fs::read_dir(out).map_err(|e| SaveError::io(out, e))?;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(PARTIAL_SUFFIX) || keep.contains(&name) || !entry.path().is_file() {
            continue;
        }
        if is_saved_weights_name(&name) {
            std::fs::remove_file(entry.path()).map_err(|e| SaveError::io(entry.path(), e))?;
            removed.push(name);
        }
    }
    removed.sort();
    Ok(removed)
}

/// Open input files, checked against what they were when the model was loaded.
#[derive(Default)]
struct Sources {
    open: HashMap<FileId, File>,
}

impl Sources {
    fn get(&mut self, ckpt: &Checkpoint, id: FileId) -> Result<&File, SaveError> {
        let file = match self.open.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let path = ckpt.file_path(id);
                e.insert(File::open(path).map_err(|err| SaveError::io(path, err))?)
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
    if meta.len() != info.len || (info.modified.is_some() && modified != info.modified) {
        return Err(SaveError::SourceChanged {
            path: info.path.clone(),
            message: format!(
                "changed while devmap was using it (was {} bytes, now {}); the save stopped and wrote nothing; save again once nothing else writes to the model",
                info.len,
                meta.len()
            ),
        });
    }
    Ok(())
}

/// What the writer threads share: the plan, a queue position, totals, flags.
struct Shared<'a> {
    ckpt: &'a Checkpoint,
    plan: &'a SavePlan,
    out: &'a Path,
    fsync: bool,
    drop_cache: bool,
    cancel: &'a AtomicBool,
    reporter: &'a Reporter<'a>,
    next: AtomicUsize,
    total_written: AtomicU64,
    /// Set by a worker that failed, so the others stop early.
    failed: AtomicBool,
    used_kernel_copy: AtomicBool,
}

impl Shared<'_> {
    /// One writer thread: takes shards off the queue until none is left.
    fn work(&self) -> Result<(), SaveError> {
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
                let tmp = self
                    .out
                    .join(format!("{}{PARTIAL_SUFFIX}", shard.file_name));
                writer.write_shard(shard, &tmp, index)?;
                verify_shard(shard, &tmp)?;
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

    /// Stop copying: the user cancelled or another worker failed.
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
        use std::os::unix::fs::FileExt;
        let dst = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp)
            .map_err(|e| SaveError::io(tmp, e))?;
        dst.write_all_at(&shard.header, 0)
            .map_err(|e| SaveError::io(tmp, e))?;
        let data_start = shard.header.len() as u64;
        let mut shard_written = 0u64;
        let shared = self.shared;
        let ckpt = shared.ckpt;
        let stop = StopFlag(shared);
        for t in &shard.tensors {
            let src = self.sources.get(ckpt, t.source.file)?;
            let src_path = ckpt.file_path(t.source.file);
            let mut report = |n: u64| {
                shard_written += n;
                let total = shared.total_written.fetch_add(n, Ordering::Relaxed) + n;
                shared.reporter.progress(SaveEvent::Progress {
                    index,
                    shard_written,
                    total_written: total,
                });
            };
            self.copier
                .copy(
                    (src, t.source.offset),
                    (&dst, data_start + t.begin),
                    t.source.len,
                    &stop,
                    &mut report,
                )
                .map_err(|e| match e {
                    CopyError::Cancelled => SaveError::Cancelled,
                    CopyError::ShortSource { copied } => SaveError::SourceChanged {
                        path: src_path.to_path_buf(),
                        message: format!(
                            "ended after {copied} of the {} bytes of tensor `{}`; it was truncated while devmap read it",
                            t.source.len, t.name
                        ),
                    },
                    // Out of space or over a file-size limit is about the output.
                    CopyError::Io(io)
                        if matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EFBIG | libc::EDQUOT)) =>
                    {
                        SaveError::io(tmp, io)
                    }
                    CopyError::Io(io) => SaveError::io(src_path, io),
                })?;
            check_unchanged(ckpt, t.source.file, src)?;
        }
        // A trailing empty tensor leaves the file short of its planned length.
        dst.set_len(shard.file_bytes())
            .map_err(|e| SaveError::io(tmp, e))?;
        if shared.fsync {
            dst.sync_all().map_err(|e| SaveError::io(tmp, e))?;
        }
        Ok(())
    }
}

/// Lets the copy loop see both the user's cancel and another worker's failure.
struct StopFlag<'a>(&'a Shared<'a>);

impl super::copy::Stop for StopFlag<'_> {
    fn stop(&self) -> bool {
        self.0.stop_flag()
    }
}

/// Re-reads the written header with the reference safetensors parser and compares it
/// with the plan: names, dtypes, shapes, offsets and file length.
fn verify_shard(shard: &ShardPlan, path: &Path) -> Result<(), SaveError> {
    let file = File::open(path).map_err(|e| SaveError::io(path, e))?;
    let len = file.metadata().map_err(|e| SaveError::io(path, e))?.len();
    if len != shard.file_bytes() {
        return Err(SaveError::Verify(vec![format!(
            "{} is {len} bytes, the plan says {}",
            path.display(),
            shard.file_bytes()
        )]));
    }
    // SAFETY: the file is ours, complete, synced and not written again; only its
    // header pages are read.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| SaveError::io(path, e))?;
    let (_, metadata) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| {
        SaveError::Verify(vec![format!(
            "{} does not parse as safetensors: {e}",
            path.display()
        )])
    })?;
    let written = metadata.tensors();
    let mut problems = Vec::new();
    for t in &shard.tensors {
        match written.get(&t.name) {
            None => problems.push(format!("`{}` is missing from {}", t.name, shard.file_name)),
            Some(info) => {
                let shape: Vec<u64> = info.shape.iter().map(|&d| d as u64).collect();
                let offsets = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
                if shape != t.shape
                    || info.dtype.to_string() != t.dtype.safetensors_name()
                    || offsets != (t.begin, t.begin + t.source.len)
                {
                    problems.push(format!(
                        "`{}` in {} differs from the plan",
                        t.name, shard.file_name
                    ));
                }
            }
        }
    }
    if written.len() != shard.tensors.len() {
        problems.push(format!(
            "{} holds {} tensors, the plan {}",
            shard.file_name,
            written.len(),
            shard.tensors.len()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(SaveError::Verify(problems))
    }
}

/// Every tensor of the model is written once, or dropped as a tied copy.
fn verify_plan_covered(ckpt: &Checkpoint, plan: &SavePlan) -> Result<(), SaveError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for s in &plan.shards {
        for t in &s.tensors {
            *seen.entry(t.name.as_str()).or_default() += 1;
        }
    }
    let dropped: HashMap<&str, &str> = plan
        .dropped_ties
        .iter()
        .map(|(d, k)| (d.as_str(), k.as_str()))
        .collect();
    let mut problems = Vec::new();
    for t in &ckpt.tensors {
        match (seen.get(t.name.as_str()), dropped.get(t.name.as_str())) {
            (Some(1), None) => {}
            (None, Some(kept)) if seen.get(kept) == Some(&1) => {}
            (Some(n), _) => problems.push(format!("`{}` is written {n} times", t.name)),
            (None, _) => problems.push(format!("`{}` is not written", t.name)),
        }
    }
    let written_bytes: u64 = plan.shards.iter().map(|s| s.data_bytes).sum();
    if written_bytes != plan.total_size {
        problems.push(format!(
            "{written_bytes} tensor bytes written but {} planned",
            plan.total_size
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(SaveError::Verify(problems))
    }
}
