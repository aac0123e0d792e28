//! What each subcommand does with the library.

mod args;
mod demo;
mod live;
mod output;
mod parallel;
mod plan;
mod progress;
mod verify;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use args::Args;
use args::{Command, ModelArgs, SaveArgs};
use color_eyre::eyre::{Result, WrapErr, eyre};
use devmap::model::{Checkpoint, LoadOptions, load};
use devmap::save::{SaveEvent, SaveJob, SaveOptions, SavePlan, prepare};
use devmap::{human_bytes, inspect};
pub use output::{OutputGone, print_error, print_gone};
use output::{err_line, out, out_with};
use std::process::ExitCode;

pub fn run(args: Args) -> Result<ExitCode> {
    if let (None, Some(manifest)) = (&args.command, &args.live_manifest) {
        return live::show(manifest);
    }
    match args.command {
        Some(Command::Verify(a)) => Ok(verify::run(&a, &args.model)),
        Some(Command::Inspect(a)) => {
            let mut ckpt = open_to_look(&a.dir, &args.model.reading(a.remote))?;
            if let Some(budgets) = &a.max_memory {
                ckpt.warnings
                    .extend(devmap::plan::budget_warnings(&ckpt, &budgets.0));
            }
            if a.json {
                out_with(|w| inspect::write_json(&ckpt, w))?;
            } else {
                out(inspect::to_text(
                    &ckpt,
                    inspect::TextOptions { depth: a.depth },
                ))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Plan(a)) => {
            plan::plan(&a, &args.model.reading(a.remote)).map(|()| ExitCode::SUCCESS)
        }
        Some(Command::Save(a)) => save(&a, &args.model),
        None => {
            let model = args.model.reading(args.remote);
            // An unpacked demo is removed when this returns.
            let (dir, _demo) = if let Some(d) = args.dir {
                (d, None)
            } else {
                let demo = demo::demo_dir()?;
                (demo.dir.clone(), Some(demo))
            };
            // A dumb terminal gets the plain report, said once.
            let dumb = output::dumb_terminal();
            if dumb && std::io::stdout().is_terminal() {
                err_line(
                    "note: TERM=dumb: printing the report instead of the interactive inspector",
                )?;
            }
            if std::io::stdout().is_terminal() && !dumb {
                // The terminal shows "opening …" at once while the model loads (a
                // remote model's fetch progress under it).
                let what = dir.display().to_string();
                let options = devmap::tui::InspectorOptions {
                    max_memory: args.max_memory.map(|b| b.0).unwrap_or_default(),
                    kv: args.context.map(|c| (c, args.batch)),
                    parallel: (args.tp.is_some() || args.ep.is_some() || args.pp.is_some()).then(
                        || devmap::plan::parallel::Layout {
                            tp: args.tp.unwrap_or(1),
                            ep: args.ep.unwrap_or(1),
                            pp: args.pp.unwrap_or(1),
                        },
                    ),
                };
                let loaded = devmap::tui::run_loading(&what, options, move |status| {
                    open_with(&dir, &model, Some(&|line| status.set(line)), true)
                })
                .wrap_err("the terminal interface failed")?;
                if let devmap::tui::Loaded::Failed(e) = loaded {
                    return Err(e);
                }
            } else {
                let ckpt = open_to_look(&dir, &model)?;
                // Not a terminal (piped, redirected): the same picture as text.
                out(inspect::to_text(&ckpt, inspect::TextOptions::default()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Opens a MODEL argument: a folder, a repo id in the local Hugging Face cache
/// (`org/name[@revision]`, when no such path exists), or a remote model (`hf://…`,
/// `https://…`) read by its headers alone.
pub(super) fn open(arg: &Path, model: &ModelArgs) -> Result<Checkpoint> {
    open_with(arg, model, None, false)
}

/// [`open`] for looking (the inspector, `inspect`): a broken shard is a warning, its
/// tensors kept without data, instead of the model not opening.
pub(super) fn open_to_look(arg: &Path, model: &ModelArgs) -> Result<Checkpoint> {
    open_with(arg, model, None, true)
}

/// [`open`]; with `report`, a remote fetch's progress goes there (the inspector's
/// opening screen) instead of stderr; `looking`: see [`open_to_look`].
fn open_with(
    arg: &Path,
    model: &ModelArgs,
    report: Option<&(dyn Fn(String) + Sync)>,
    looking: bool,
) -> Result<Checkpoint> {
    let options = LoadOptions {
        device_map: model.device_map.clone(),
        offload_folder: model.offload_folder.clone(),
        ties: model.ties.clone(),
        config_dir: model.config_dir.clone(),
        state_dict_key: model.state_dict_key.clone(),
        open_broken: looking,
    };
    if let Some(source) = remote_source(arg)? {
        let mirror = fetch_headers(&source, report, model.max_remote_shards)?;
        let mut ckpt = load(&mirror.dir, &options)
            .wrap_err_with(|| format!("cannot read the model at {}", mirror.origin))?;
        ckpt.remote = Some(source.describe());
        // Everything devmap needs is in memory now; the mirror folder goes.
        drop(mirror);
        return with_adapters(ckpt, model);
    }
    let dir = local_model_dir(arg)?;
    let ckpt = load(&dir, &options)
        .wrap_err_with(|| format!("cannot open the model in {}", dir.display()))?;
    with_adapters(ckpt, model)
}

/// Applies every `--merge-lora` adapter, in order.
fn with_adapters(mut ckpt: Checkpoint, model: &ModelArgs) -> Result<Checkpoint> {
    for adapter in &model.merge_lora {
        devmap::model::lora::apply_adapter_with(&mut ckpt, adapter, model.allow_nonfinite)
            .wrap_err_with(|| {
                format!(
                    "cannot merge the adapter {} into the model",
                    devmap::text::path(adapter)
                )
            })?;
    }
    Ok(ckpt)
}

/// The remote model an argument names, if it names one.
fn remote_source(arg: &Path) -> Result<Option<devmap::remote::Source>> {
    match arg.to_str().and_then(devmap::remote::Source::parse) {
        Some(source) => Ok(Some(source?)),
        None => Ok(None),
    }
}

/// A folder as given, or the cache snapshot of a repo id that is not a path here.
pub(super) fn local_model_dir(arg: &Path) -> Result<PathBuf> {
    use devmap::formats::hub_cache;
    if let Ok(meta) = std::fs::metadata(arg) {
        // A weights file, an index or a config names its model's folder.
        if meta.is_file()
            && let Some(folder) = holding_folder(arg)
        {
            err_line(format!(
                "{} is a file: reading the folder that holds it, {}",
                arg.display(),
                folder.display()
            ))?;
            return Ok(folder);
        }
        return Ok(arg.to_path_buf());
    }
    if std::fs::symlink_metadata(arg).is_ok() {
        return Ok(arg.to_path_buf());
    }
    // A path here, not a repo id: it starts like one, or its first folder exists.
    let first_exists = arg
        .components()
        .next()
        .is_some_and(|c| Path::new(c.as_os_str()).is_dir());
    let id = arg.to_str().and_then(hub_cache::parse_repo_id);
    let Some(id) = id.filter(|_| !first_exists) else {
        return Err(eyre!("{}", no_such_folder(arg)));
    };
    let root = hub_cache::cache_root().ok_or(hub_cache::HubCacheError::NoRoot)?;
    let dir = hub_cache::resolve(&id, &root)?;
    Ok(dir)
}

/// The folder of a file that belongs to a model folder: weights, an index, a config.
fn holding_folder(file: &Path) -> Option<PathBuf> {
    let name = file.file_name()?.to_str()?;
    let belongs = [".safetensors", ".bin", ".index.json", ".distcp"]
        .iter()
        .any(|end| name.ends_with(end))
        || name == "config.json";
    let parent = file.parent()?;
    belongs.then(|| {
        if parent.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            parent.to_path_buf()
        }
    })
}

/// "no such folder", with the names beside it that come closest.
fn no_such_folder(path: &Path) -> String {
    let mut text = format!("no such folder: {}", path.display());
    let parent = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => return text,
    };
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return text;
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return text;
    };
    let mut near: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| n.starts_with(name) || devmap::text::edit_distance(n, name) <= 2)
        .collect();
    near.sort();
    near.truncate(3);
    if !near.is_empty() {
        let shown: Vec<String> = near
            .iter()
            .map(|n| parent.join(n).display().to_string())
            .collect();
        text.push_str(&format!(" (did you mean {}?)", shown.join(", ")));
    }
    text
}

/// Fetches a remote model's config, index and shard headers, with a progress line on
/// a terminal's stderr and a summary after.
fn fetch_headers(
    source: &devmap::remote::Source,
    report: Option<&(dyn Fn(String) + Sync)>,
    max_shards: usize,
) -> Result<devmap::remote::Mirror> {
    use std::io::Write;
    let tty = report.is_none() && std::io::stderr().is_terminal();
    let origin = source.display();
    let started = std::time::Instant::now();
    let progress = |done: usize, total: usize| {
        let line = format!(
            "fetching the headers of {}: {done}/{total} shards",
            devmap::text::escaped(&origin)
        );
        if let Some(report) = report {
            report(line);
        } else if tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{line}");
            let _ = err.flush();
        }
    };
    let mirror = devmap::remote::fetch_with(source, None, &progress, max_shards);
    if tty {
        let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
    }
    let mirror = mirror.wrap_err_with(|| format!("cannot read the remote model {origin}"))?;
    if report.is_some() {
        // The inspector takes the terminal next: no summary printed over it.
        return Ok(mirror);
    }
    err_line(format!(
        "{}: {} in {:.1} s, {} in {} ({:.4}% of the model's {})",
        devmap::text::escaped(&mirror.origin),
        devmap::text::count(mirror.shards, "shard header", "shard headers"),
        started.elapsed().as_secs_f64(),
        human_bytes(mirror.bytes),
        devmap::text::count(mirror.requests, "request", "requests"),
        mirror.bytes as f64 * 100.0 / mirror.model_bytes.max(1) as f64,
        human_bytes(mirror.model_bytes)
    ))?;
    Ok(mirror)
}

/// Refuses a remote model before any request: saving needs the weights.
pub(super) fn refuse_remote(arg: &Path, what: &str) -> Result<()> {
    if let Some(source) = remote_source(arg)? {
        return Err(eyre!(
            "{} is a remote model, and {what} needs its weights; download it first (e.g. `hf download {}`) and use the local copy or its repo id",
            source.display(),
            match &source {
                devmap::remote::Source::Hub { repo, .. } => repo.clone(),
                devmap::remote::Source::Url { .. } => "…".to_owned(),
            }
        ));
    }
    Ok(())
}

/// What the user's transformers says of the model whose config.json is in
/// `config_dir`, loaded in `dtype` (`None`: the config's own): `None` when there is
/// none to ask (`--transformers none`, or no Python with transformers found), or it
/// could not answer (said in a warning: devmap's table is used instead). An explicit
/// `--transformers` that does not import transformers is an error. When transformers
/// refuses config.json itself, the answer says so (verify reports it) if
/// `keep_refusal`; else that is said in a warning and the table answers.
pub(super) fn ask_transformers(
    config_dir: &Path,
    dtype: Option<devmap::types::DType>,
    model: &ModelArgs,
    (quiet, keep_refusal): (bool, bool),
) -> Result<Option<devmap::oracle::Answer>> {
    use devmap::oracle::Oracle;
    let oracle = Oracle::find(model.transformers.as_deref(), model.trust_remote_code)
        .map_err(|e| eyre!(e))
        .wrap_err("--transformers names a Python that cannot answer")?;
    let Some(oracle) = oracle else {
        return Ok(None);
    };
    if std::fs::metadata(config_dir.join("config.json")).is_err() {
        return Ok(None);
    }
    match oracle.ask(config_dir, dtype) {
        Ok(ref answer) if !keep_refusal && let Some(reason) = &answer.refused => {
            err_line(format!(
                "warning: transformers {} refuses {}: {reason}; from_pretrained will fail on it. Expectations from devmap's table ({}) instead",
                answer.transformers,
                devmap::text::path(&config_dir.join("config.json")),
                devmap::model::expect::source()
            ))?;
            Ok(None)
        }
        Ok(answer) => {
            if !quiet {
                err_line(oracle.said())?;
            }
            Ok(Some(answer))
        }
        Err(e) => {
            err_line(format!(
                "warning: {e}; expectations from devmap's table ({}) instead",
                devmap::model::expect::source()
            ))?;
            Ok(None)
        }
    }
}

/// Findings shown before a save at most; `devmap verify OUT` lists them all.
const EXPECTATIONS_SHOWN: usize = 10;

/// Says before writing what transformers' loader would report of the tensors the save
/// writes (a training checkpoint that lost parameters is saved, but not silently).
fn expectation_warnings(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    answer: Option<&devmap::oracle::Answer>,
) -> Result<()> {
    let findings = devmap::verify::expectations_of_plan(ckpt, plan, answer);
    for f in findings.iter().take(EXPECTATIONS_SHOWN) {
        err_line(format!("warning: {f}"))?;
    }
    if findings.len() > EXPECTATIONS_SHOWN {
        err_line(format!(
            "warning: and {} more of the kind (devmap verify OUT lists them all)",
            findings.len() - EXPECTATIONS_SHOWN
        ))?;
    }
    Ok(())
}

fn save(a: &SaveArgs, model: &ModelArgs) -> Result<ExitCode> {
    refuse_remote(&a.dir, "saving")?;
    let ckpt = open(&a.dir, model)?;
    // Asked at the dtype the save writes: which modules transformers keeps in float32
    // there, and what its save_pretrained writes for this config.
    let cast_to = devmap::save::shards::resolve_dtype(&ckpt, a.dtype);
    let config_dir = ckpt.config_dir.clone().unwrap_or_else(|| ckpt.dir.clone());
    let answer = ask_transformers(&config_dir, cast_to, model, (a.quiet, false))?.map(Arc::new);
    let mut ckpt = ckpt;
    if let Some(answer) = &answer {
        ckpt.tensorless_modules = answer.empty_modules.clone().into();
    }
    let options = SaveOptions {
        max_shard_size: a.max_shard_size.bytes,
        keep_tied: a.keep_tied,
        force: a.force,
        weights_only: a.weights_only,
        jobs: a.jobs.max(1),
        fsync: !a.no_fsync,
        cache: a.cache.into(),
        available_ram: devmap::monitor::available_ram(),
        allow_partial: a.allow_partial,
        dtype: a.dtype,
        quantize_fp8: a.quantize == Some(args::QuantizeFormat::Fp8Block),
        pause_file: std::env::var_os("DEVMAP_TEST_PAUSE").map(PathBuf::from),
        asked: answer.clone(),
        distributed: match (a.part, a.commit) {
            (Some(part), _) => Some(devmap::save::parts::Distributed::Part(part)),
            (None, Some(n)) => Some(devmap::save::parts::Distributed::Commit(n)),
            (None, None) => None,
        },
        ..SaveOptions::new(&a.out)
    };
    let plan = prepare(&ckpt, &options)?;
    if let Some(hint) = devmap::formats::size::unit_hint(&a.max_shard_size.text) {
        err_line(format!("warning: {hint}"))?;
    }
    if !a.quiet {
        for w in &devmap::model::checks::all_warnings(&ckpt) {
            err_line(format!("warning: {w}"))?;
        }
        expectation_warnings(&ckpt, &plan, answer.as_deref())?;
        if let (Some(to), None) = (plan.cast_to, &answer)
            && devmap::model::arch::lookup(&ckpt.config.architectures).is_none()
        {
            // Nothing knows which modules this architecture keeps in float32.
            err_line(format!(
                "warning: {} is not in devmap's table ({}) and no transformers was asked: the modules such a model keeps in float32 cannot be known, so every floating-point tensor is cast to {}; --transformers PYTHON asks yours",
                ckpt.config.architectures.first().map_or(
                    "the model (config.json names no architecture)",
                    String::as_str
                ),
                devmap::model::expect::source(),
                to.torch_name()
            ))?;
        }
        err_line(format!(
            "saving {} ({}) into {} in {}",
            devmap::text::count(plan.tensor_count(), "tensor", "tensors"),
            human_bytes(plan.total_size),
            devmap::text::count(plan.shards.len(), "shard", "shards"),
            a.out.display()
        ))?;
        if let Some(part) = a.part {
            let mine: Vec<&devmap::save::ShardPlan> =
                devmap::save::parts::shards_of(&plan, part).collect();
            err_line(format!(
                "  part {part}: writing {} ({}) of them; nothing is published until `--commit {}`",
                devmap::text::count(mine.len(), "shard", "shards"),
                human_bytes(mine.iter().map(|s| s.file_bytes()).sum()),
                part.n
            ))?;
        }
        if let Some(dtype) = plan.cast_to {
            err_line(format!(
                "  floating-point tensors are written as {} (config.json records it; --dtype keep writes them as stored)",
                dtype.torch_name()
            ))?;
        }
        if plan.dequantized > 0 {
            err_line(format!(
                "  dequantizing {} to {} ({} left out, and config.json's quantization_config)",
                devmap::text::count(
                    plan.dequantized,
                    &format!("{} weight", plan.dequantized_format()),
                    &format!("{} weights", plan.dequantized_format())
                ),
                plan.cast_to.map_or("?", |d| d.torch_name()),
                devmap::text::count(plan.dropped_scales.len(), "scale tensor", "scale tensors"),
            ))?;
        }
        if plan.quantized > 0 {
            err_line(format!(
                "  quantizing {} to FP8 in 128×128 tiles (each with its `_scale_inv`); config.json gets quantization_config",
                devmap::text::count(plan.quantized, "linear weight", "linear weights"),
            ))?;
        }
        for line in plan.fp32_lines() {
            err_line(format!("  {line}"))?;
        }
        for (dropped, kept) in &plan.dropped_ties {
            let why = ckpt
                .tie_evidence(dropped)
                .map_or(String::new(), |e| format!(" ({})", e.label()));
            err_line(format!(
                "  `{dropped}` is tied to `{kept}`{why}: written once as `{kept}` (--keep-tied writes both)"
            ))?;
        }
        let merged = plan.merged_count();
        if !model.merge_lora.is_empty() {
            let replaced = (0..ckpt.tensors().len())
                .filter(|&id| ckpt.replaced_by_adapter(id))
                .count();
            err_line(format!(
                "  LoRA: {} merged into {}, {} replaced by adapter values (devmap inspect … --merge-lora lists them)",
                devmap::text::count(model.merge_lora.len(), "adapter", "adapters"),
                devmap::text::count(merged, "tensor", "tensors"),
                devmap::text::count(replaced, "tensor", "tensors")
            ))?;
        }
    }
    let total = plan.total_size;
    // Kept for --verify: the content check compares against exactly what was planned.
    let planned = a.verify.then(|| plan.clone());
    let ckpt = Arc::new(ckpt);
    let job = SaveJob::spawn(Arc::clone(&ckpt), plan, options)
        .wrap_err("cannot start the save thread")?;
    let mut bar = progress::Progress::new(total);
    // Ctrl-C, SIGTERM and SIGHUP cancel the save cleanly instead of killing it
    // mid-write: the job removes its partial files before it returns.
    let terminated = devmap::sys::catch_termination();
    // Set when stderr cannot be written: the save is cancelled, and devmap exits
    // non-zero once it has cleaned up.
    let mut stderr_gone = false;
    loop {
        match job
            .events
            .recv_timeout(std::time::Duration::from_millis(100))
        {
            Ok(event) => {
                if !a.quiet && !stderr_gone && bar.handle(&event).is_err() {
                    stderr_gone = true;
                    job.cancel();
                }
                if matches!(
                    event,
                    SaveEvent::Finished(_) | SaveEvent::Failed(_) | SaveEvent::Cancelled
                ) {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if terminated.load(std::sync::atomic::Ordering::SeqCst) {
            job.cancel();
        }
    }
    let result = job.join();
    if stderr_gone {
        return Err(output::OutputGone("stderr").into());
    }
    let report = result.map_err(|e| eyre!(e))?;
    if let (Some(part), false) = (a.part, a.quiet) {
        err_line(format!(
            "part {part} done: {} ({}), under {}; once all {} parts are done: devmap save {} --out {} --commit {}",
            report.shard_files.join(", "),
            human_bytes(report.bytes),
            report.out.join(devmap::save::parts::PARTS_DIR).display(),
            part.n,
            a.dir.display(),
            a.out.display(),
            part.n
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    if !a.quiet {
        err_line(format!(
            "done: {}, {} in {} ({}){}",
            devmap::text::count(report.tensors, "tensor", "tensors"),
            human_bytes(report.bytes),
            report.out.display(),
            report.shard_files.join(", "),
            if report.copied_files.is_empty() {
                String::new()
            } else {
                format!("; copied {}", report.copied_files.join(", "))
            }
        ))?;
        if !report.removed_stale.is_empty() {
            err_line(format!(
                "removed earlier weight files: {}",
                report.removed_stale.join(", ")
            ))?;
        }
    }
    match planned {
        Some(plan) => {
            let mut expected = devmap::verify::SaveReference::from_plan(&ckpt, plan);
            if a.weights_only {
                expected = expected.weights_only();
            }
            let answer = ask_transformers(&report.out, None, model, (true, true))?;
            verify::after_save(
                &report.out,
                &expected,
                (model.allow_nonfinite, answer.as_ref()),
                a.quiet,
            )
        }
        None => Ok(ExitCode::SUCCESS),
    }
}
