//! A save as a whole: run on a background thread, or blocking on the caller's. Steps
//! 4 and 5 of the design: write every shard under a temporary name, verify it, then
//! commit (rename everything into place, index last).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

use super::check_written::verify_plan_covered;
use super::commit::{TempFiles, write_synced};
use super::error::SaveError;
use super::event::{Reporter, SaveEvent, SaveReport};
use super::parts::{self, Distributed, Part};
use super::preflight::{self, files_to_copy};
use super::reasons::Refusal;
use super::shards::{CachePolicy, SaveOptions, SavePlan};
use super::writer::Shared;
use crate::formats::hf_index::{INDEX_FILE, encode_index};
use crate::model::checkpoint::Checkpoint;

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
        SaveJob::spawn_with_channel(ckpt, plan, options, 256)
    }

    /// Like [`SaveJob::spawn`], with `capacity` events buffered between the writers
    /// and the reader. With 0 the writers wait for the reader at every lifecycle event
    /// (progress is dropped instead), so a test can act "after N events" exactly.
    pub fn spawn_with_channel(
        ckpt: Arc<Checkpoint>,
        plan: SavePlan,
        options: SaveOptions,
        capacity: usize,
    ) -> std::io::Result<SaveJob> {
        let (tx, rx) = sync_channel(capacity);
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
            _ => Err(SaveError::Panicked("the save thread".into())),
        }
    }
}

/// Writes the plan (blocking). `write` assumes `preflight::check` passed. A split save
/// (`options.distributed`) writes one part's shards, or commits the parts.
pub fn write(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    options: &SaveOptions,
    cancel: &AtomicBool,
    reporter: &Reporter<'_>,
) -> Result<SaveReport, SaveError> {
    match options.distributed {
        None => write_as(ckpt, plan, options, (cancel, reporter), Shards::Written),
        Some(Distributed::Part(part)) => write_part(ckpt, plan, options, part, (cancel, reporter)),
        Some(Distributed::Commit(n)) => {
            let fingerprint = parts::fingerprint(ckpt, plan);
            let files = parts::gather(&options.out, &fingerprint, plan, n)?;
            let report = write_as(
                ckpt,
                plan,
                options,
                (cancel, reporter),
                Shards::Linked(&files),
            )?;
            parts::clear(&options.out, &fingerprint);
            Ok(report)
        }
        // Each step of a sharded job's save is run by the ranks in turn (save::ranks).
        Some(Distributed::Ranks(_)) => Err(SaveError::Panicked(
            "a rank's save run as a whole save (save::ranks runs it step by step)".into(),
        )),
    }
}

/// Publishes OUT from shard files already written elsewhere under OUT (`files`, by
/// shard index): linked into place, config and index written, all renamed at once.
pub(super) fn publish(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    options: &SaveOptions,
    stop: (&AtomicBool, &Reporter<'_>),
    files: &[PathBuf],
) -> Result<SaveReport, SaveError> {
    write_as(ckpt, plan, options, stop, Shards::Linked(files))
}

/// Where the shards of a save come from.
#[derive(Clone, Copy)]
enum Shards<'a> {
    /// Written here, from the sources: a whole save.
    Written,
    /// Written here, one part's: no index, no coverage check, nothing copied beside.
    Part,
    /// Written by the parts (`--commit`): linked into place by shard index.
    Linked(&'a [PathBuf]),
}

/// Part `part` of a split save: its shards, in its own folder under OUT, and its
/// manifest; OUT itself is not touched.
fn write_part(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    options: &SaveOptions,
    part: Part,
    (cancel, reporter): (&AtomicBool, &Reporter<'_>),
) -> Result<SaveReport, SaveError> {
    let fingerprint = parts::fingerprint(ckpt, plan);
    let dir = parts::prepare_part(&options.out, &fingerprint, part, options.force)?;
    let mine = SavePlan {
        shards: parts::shards_of(plan, part).cloned().collect(),
        ..plan.clone()
    };
    let inner = SaveOptions {
        out: dir.clone(),
        force: true,
        weights_only: true,
        distributed: None,
        ..options.clone()
    };
    let report = write_as(ckpt, &mine, &inner, (cancel, reporter), Shards::Part)?;
    parts::write_manifest(&dir, &fingerprint, part, &report.shard_files)?;
    Ok(SaveReport {
        out: options.out.clone(),
        bytes: mine
            .shards
            .iter()
            .map(super::shards::ShardPlan::file_bytes)
            .sum(),
        ..report
    })
}

fn write_as(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    options: &SaveOptions,
    (cancel, reporter): (&AtomicBool, &Reporter<'_>),
    shards: Shards<'_>,
) -> Result<SaveReport, SaveError> {
    let out = &options.out;
    let mut temp_files = TempFiles::begin(out)?;
    // Under the lock, what the pre-flight saw may have changed (another save may have
    // finished into OUT meanwhile): look again.
    let changed = preflight::check_out_folder(options);
    if !changed.is_empty() {
        return Err(SaveError::Refused(changed));
    }
    // Every temporary name is known up front, so a failure anywhere removes them all,
    // and every final name is checked before the first byte is written.
    let shard_tmps: Vec<PathBuf> = plan
        .shards
        .iter()
        .map(|shard| temp_files.add(shard.file_name.as_ref()))
        .collect();
    let copies: Vec<(PathBuf, PathBuf)> = if options.weights_only || matches!(shards, Shards::Part)
    {
        Vec::new()
    } else {
        files_to_copy(ckpt)
            .into_iter()
            // A quantizer's own config beside the weights (GPTQModel's
            // quantize_config.json, AutoAWQ's quant_config.json) says they are
            // quantized: GPTQModel.load takes any folder holding one for GPTQ.
            // Dequantized weights leave it out.
            .filter(|src| {
                plan.dequantized == 0
                    || !src
                        .file_name()
                        .is_some_and(|n| n == "quantize_config.json" || n == "quant_config.json")
            })
            .filter_map(|src| {
                let tmp = temp_files.add(src.file_name()?);
                Some((src, tmp))
            })
            .collect()
    };
    let index_tmp = (plan.shards.len() > 1 && !matches!(shards, Shards::Part))
        .then(|| temp_files.add(INDEX_FILE.as_ref()));
    let blocked = temp_files.blocked_targets();
    if !blocked.is_empty() {
        return Err(SaveError::Refused(blocked));
    }
    let drop_cache = match options.cache {
        CachePolicy::Drop => true,
        CachePolicy::Keep => false,
        CachePolicy::Auto => options
            .available_ram
            .is_some_and(|free| plan.file_bytes() > free / 2),
    };
    let shared = Shared {
        ckpt,
        plan,
        temp_files: &temp_files,
        shard_tmps: &shard_tmps,
        fsync: options.fsync,
        drop_cache,
        cancel,
        reporter,
        next: AtomicUsize::new(0),
        total_written: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        used_kernel_copy: AtomicBool::new(true),
        pause_file: options.pause_file.as_deref(),
        stage: options.stage.as_ref(),
        paused: AtomicBool::new(false),
        threads_per_shard: (options.jobs / options.jobs.clamp(1, plan.shards.len().max(1))).max(1),
    };
    let workers = match shards {
        Shards::Linked(files) => {
            for (from, tmp) in files.iter().zip(&shard_tmps) {
                temp_files.link(from, tmp)?;
            }
            0
        }
        _ => options.jobs.clamp(1, plan.shards.len().max(1)),
    };
    let results: Vec<Result<(), SaveError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| scope.spawn(|| shared.work()))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(SaveError::Panicked("a writer thread".into())))
            })
            .collect()
    });
    super::compute::release_scratch();
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
    if !matches!(shards, Shards::Part) {
        verify_plan_covered(ckpt, plan)?;
    }
    let kernel_copy = shared.used_kernel_copy.load(Ordering::Relaxed);

    let mut copied_files = Vec::new();
    for (src, tmp) in &copies {
        let is_config = src.file_name().is_some_and(|n| n == "config.json");
        if is_config && (plan.cast_to.is_some() || plan.quantization_config.is_some()) {
            let mut text = crate::formats::input::read_json_text(src)
                .map_err(|e| SaveError::Refused(vec![Refusal::Unreadable(e.to_string())]))?;
            // The config records the dtype: it gets the one the weights now have.
            if let Some(dtype) = plan.cast_to {
                text = crate::formats::config::with_dtype(&text, dtype.torch_name());
            }
            if plan.dequantized > 0 {
                // The weights are plain floats now: a quantization_config would make
                // transformers look for the scales.
                text = crate::formats::config::without_key(&text, "quantization_config");
                // DeepSeek-V4 keeps its experts' FP4 format beside it; transformers
                // moves it into a quantization_config when one is there, and the
                // experts are floats now.
                text = crate::formats::config::without_key(&text, "expert_dtype");
            }
            if let Some(quantization) = &plan.quantization_config {
                // Quantized on the way out: transformers' FP8 integration loads it.
                text = crate::formats::config::with_key(&text, "quantization_config", quantization);
            }
            write_synced(&temp_files, tmp, text.as_bytes())?;
        } else {
            copy_beside(&temp_files, src, tmp)?;
        }
        copied_files.push(
            src.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
        );
    }
    // The index is written now, under its temporary name, and renamed last: after
    // this point only renames remain, so nothing that can fail for lack of space or a
    // broken input happens once files carry their real names.
    if let Some(tmp) = &index_tmp {
        let weight_map: BTreeMap<String, String> = plan
            .shards
            .iter()
            .flat_map(|s| {
                s.tensors
                    .iter()
                    .map(move |t| (t.name(ckpt).into_owned(), s.file_name.clone()))
            })
            .collect();
        let text = encode_index(plan.total_parameters, plan.total_size, &weight_map);
        write_synced(&temp_files, tmp, text.as_bytes())?;
    }
    if cancel.load(Ordering::Relaxed) {
        return Err(SaveError::Cancelled);
    }
    if let Some(check) = &options.commit_check {
        (check.0)().map_err(|why| SaveError::Refused(vec![Refusal::ModelChanged(why)]))?;
        // The check may have waited (for Python's lock) while the save was cancelled.
        if cancel.load(Ordering::Relaxed) {
            return Err(SaveError::Cancelled);
        }
    }

    // Commit: from here on, files appear under their real names, the index last.
    let shard_files: Vec<String> = plan.shards.iter().map(|s| s.file_name.clone()).collect();
    let removed_stale = temp_files.commit(&shard_files, options.commit_fault)?;
    Ok(SaveReport {
        out: out.clone(),
        shard_files,
        tensors: plan.tensor_count(),
        bytes: plan.total_size,
        copied_files,
        removed_stale,
        kernel_copy,
        dropped_cache: drop_cache,
    })
}

/// Copies a small file of the model directory (config, tokenizer) to its temporary
/// name in OUT. A full disk or a file-size limit is OUT's problem and says so; any
/// other failure names the input.
fn copy_beside(temp_files: &TempFiles, src: &Path, tmp: &Path) -> Result<(), SaveError> {
    let mut input = std::fs::File::open(src).map_err(|e| SaveError::io(src, e))?;
    let mut output = temp_files.create(tmp)?;
    std::io::copy(&mut input, &mut output).map_err(|e| {
        if crate::sys::files::is_disk_full(&e) {
            SaveError::io(tmp, e)
        } else {
            SaveError::io(src, e)
        }
    })?;
    Ok(())
}
