//! Step 3: what can be refused before the first byte is written.

use std::path::{Path, PathBuf};

use super::names::{blocked_target, is_weight_file_name};
use super::reasons::Refusal;
use super::shards::{SaveOptions, SavePlan};
use crate::model::checkpoint::Checkpoint;

/// Other files of the model directory that a save copies: top-level regular files
/// that are not weights, indexes, the device map or offload data (and those of
/// `--config DIR` and the checkpoint's side folders).
pub fn files_to_copy(ckpt: &Checkpoint) -> Vec<PathBuf> {
    let mut files = small_files(ckpt, &ckpt.dir);
    // `--config DIR` (or the config devmap wrote), then the checkpoint's side folders
    // (a NeMo 2 tokenizer): their files too, where no folder before has the name.
    let others = ckpt.config_dir.iter().chain(&ckpt.side_dirs);
    for other in others {
        let names: std::collections::HashSet<_> = files
            .iter()
            .filter_map(|f| f.file_name().map(ToOwned::to_owned))
            .collect();
        files.extend(
            small_files(ckpt, other)
                .into_iter()
                .filter(|f| f.file_name().is_some_and(|n| !names.contains(n))),
        );
        files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    }
    files
}

/// The top-level regular files of `dir` a save copies: not weights, indexes, the
/// device map or a save's unfinished files.
fn small_files(ckpt: &Checkpoint, dir: &Path) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    // By name first, a stat last: a sharded model's folder is mostly its shards, and
    // comparing whole paths against every weight file was 5 ms of each save preview
    // for 160 shards.
    let weights: std::collections::HashSet<&Path> =
        ckpt.weight_files.iter().map(PathBuf::as_path).collect();
    let mut files: Vec<PathBuf> = read
        .filter_map(Result::ok)
        .filter(|e| {
            let raw = e.file_name();
            let name = raw.to_str().unwrap_or("");
            !is_weight_file_name(name)
                && !super::names::is_unfinished_name(&raw)
                && name != "device_map.json"
        })
        .map(|e| e.path())
        .filter(|p| !weights.contains(p.as_path()))
        .filter(|p| ckpt.device_map_path.as_deref() != Some(p.as_path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Resolves `path` as far as it exists, so `out/../x` and symlinks compare truly.
fn canonical_or_self(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (
            existing.file_name().map(std::borrow::ToOwned::to_owned),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => break,
        }
        if existing.as_os_str().is_empty() {
            existing = PathBuf::from(".");
        }
    }
    let mut resolved = existing.canonicalize().unwrap_or(existing);
    for name in rest.into_iter().rev() {
        resolved.push(name);
    }
    resolved
}

/// Every reason to refuse, found without writing anything.
pub fn check(ckpt: &Checkpoint, plan: &SavePlan, options: &SaveOptions) -> Vec<Refusal> {
    let mut problems = check_all_but_inputs(ckpt, plan, options);
    problems.extend(unreadable_sources(ckpt, plan));
    problems
}

/// [`check`] without opening every input file to prove it readable (tens of
/// thousands of files in an offload folder): for a preview that already knows the
/// answer for this model ([`unreadable_inputs`]), since which files a save reads does
/// not change with the device map or the save's options.
pub fn check_all_but_inputs(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    options: &SaveOptions,
) -> Vec<Refusal> {
    let mut problems = Vec::new();
    let out = canonical_or_self(&options.out);
    let input = canonical_or_self(&ckpt.dir);
    if out == input || out.starts_with(&input) {
        problems.push(Refusal::OutInModel {
            out: options.out.clone(),
            model: ckpt.dir.clone(),
        });
    }
    if let Some(offload) = &ckpt.offload_dir {
        let canonical = canonical_or_self(offload);
        if out == canonical || out.starts_with(&canonical) {
            problems.push(Refusal::OutInOffload {
                out: options.out.clone(),
                offload: canonical,
            });
        }
    }
    problems.extend(sources_inside(&out, ckpt, plan));
    problems.extend(check_out_folder(options));
    problems.extend(check_targets(ckpt, plan, options));
    if !options.allow_partial {
        let empty = crate::model::checks::keys_without_data(ckpt);
        if !empty.is_empty() {
            problems.push(Refusal::KeysWithoutData(
                empty.into_iter().map(str::to_owned).collect(),
            ));
        }
    }
    let copies: u64 = if options.weights_only {
        0
    } else {
        files_to_copy(ckpt)
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    };
    let needed = plan.file_bytes() + copies;
    let probe = nearest_existing(&out);
    match crate::sys::free_space(&probe) {
        Ok(free) if free < needed => problems.push(Refusal::NoSpace {
            at: probe,
            needed,
            free,
        }),
        _ => {}
    }
    problems
}

/// Input files inside OUT: the commit would replace or remove what the save (and, for
/// a live model, the model itself) reads. The model folder and the offload folder are
/// checked above by name; this catches the rest (a live model's checkpoint, an
/// adapter).
fn sources_inside(out: &Path, ckpt: &Checkpoint, plan: &SavePlan) -> Option<Refusal> {
    // Nothing is inside a folder that is not there yet (the usual case).
    if !out.exists() {
        return None;
    }
    let files = files_read(ckpt, plan, |_| true);
    // One canonical path per folder, not per file: an offload folder holds tens of
    // thousands of files in one folder (a realpath each cost 100 ms a preview).
    let mut folders: std::collections::HashMap<&Path, PathBuf> = std::collections::HashMap::new();
    let inside: Vec<&Path> = files
        .into_iter()
        .filter(|&f| ckpt.input_kind(f) == crate::model::checkpoint::InputKind::File)
        .map(|f| ckpt.file_path(f))
        .filter(|p| {
            let parent = p.parent().unwrap_or(Path::new("."));
            let folder = folders
                .entry(parent)
                .or_insert_with(|| canonical_or_self(parent));
            folder
                .join(p.file_name().unwrap_or_default())
                .starts_with(out)
        })
        .collect();
    inside.first().map(|first| Refusal::OutHoldsInput {
        out: out.to_path_buf(),
        input: first.to_path_buf(),
        more: inside.len() - 1,
    })
}

/// Input files the save will read that cannot be opened now (permissions, a file
/// replaced by a folder since the model was opened): found before writing, not
/// halfway through a shard.
fn unreadable_sources(ckpt: &Checkpoint, plan: &SavePlan) -> Vec<Refusal> {
    unreadable_files(ckpt, files_read(ckpt, plan, |range| range.len > 0))
}

/// The source files of the ranges `plan` reads that `keep` accepts, each once, in
/// id order: marked in a list as long as the model's files, not collected per tensor
/// (a million tensors would hold 8 MB of ids at the save's peak).
fn files_read(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    keep: impl Fn(&crate::types::range::ByteRange) -> bool,
) -> Vec<usize> {
    let mut read = vec![false; ckpt.files.len()];
    for range in plan.planned().flat_map(|t| t.recipe(ckpt).ranges(ckpt)) {
        if keep(&range)
            && let Some(slot) = read.get_mut(range.file)
        {
            *slot = true;
        }
    }
    (0..read.len()).filter(|&f| read[f]).collect()
}

/// Every source file of the model that cannot be opened now: what [`check`] finds
/// about a save's inputs, for any save of this model (a save reads every tensor's
/// source; which tensors a tie drops does not change the files).
pub fn unreadable_inputs(ckpt: &Checkpoint) -> Vec<Refusal> {
    let files = (0..ckpt.tensors().len())
        .flat_map(|id| ckpt.data_ranges(id))
        .filter(|range| range.len > 0)
        .map(|range| range.file)
        .collect();
    unreadable_files(ckpt, files)
}

fn unreadable_files(ckpt: &Checkpoint, mut files: Vec<usize>) -> Vec<Refusal> {
    // A staged source is no file: the Python session fills it when asked.
    files.retain(|&file| {
        !matches!(
            ckpt.input_kind(file),
            crate::model::checkpoint::InputKind::Staged(_)
        )
    });
    files.sort_unstable();
    files.dedup();
    // Opened on a few threads: an offload folder is tens of thousands of files, and
    // the inspector's save preview runs this after every edit.
    let opened = crate::sys::look_in_parallel(&files, |&id| {
        let path = ckpt.file_path(id);
        let memory = ckpt.input_kind(id) == crate::model::checkpoint::InputKind::ProcessMemory;
        crate::formats::input::open_regular(path)
            .err()
            .map(|e| match e {
                // Another process's memory (the inspector `devmap.inspect` started):
                // the kernel's tracing rules decide.
                _ if memory => Refusal::Unreadable(format!(
                    "the Python session's memory cannot be read from here ({}): {e}; the kernel's ptrace rules (Yama's ptrace_scope) decide who may; devmap.save_pretrained in the session saves without that",
                    path.display()
                )),
                e => Refusal::Unreadable(e.to_string()),
            })
    });
    match opened {
        Some(problems) => problems.into_iter().flatten().collect(),
        None => vec![Refusal::Unreadable(
            "a thread checking the inputs failed".to_owned(),
        )],
    }
}

/// What the output folder must be for a save: a folder (or absent), writable, empty
/// unless `--force`, and free of another save's unfinished files. Checked before
/// planning and again once the save holds the lock on it.
pub fn check_out_folder(options: &SaveOptions) -> Vec<Refusal> {
    let mut problems = Vec::new();
    if options.out.exists() && !options.out.is_dir() {
        problems.push(Refusal::OutNotFolder(options.out.clone()));
    }
    if options.out.is_dir() {
        // The parts of a split save in progress, and the write probe of another save
        // checking OUT at this moment (parts start together), are no content of OUT's.
        let entries: Vec<std::ffi::OsString> = std::fs::read_dir(&options.out)
            .map(|r| {
                r.filter_map(Result::ok)
                    .map(|e| e.file_name())
                    .filter(|n| {
                        n != super::parts::PARTS_DIR
                            && !n.as_encoded_bytes().starts_with(PROBE_PREFIX.as_bytes())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let partial: Vec<&std::ffi::OsString> = entries
            .iter()
            .filter(|n| super::names::is_unfinished_name(n))
            .collect();
        if !partial.is_empty() {
            problems.push(Refusal::Unfinished {
                out: options.out.clone(),
                files: partial.len(),
                example: partial[0].to_string_lossy().into_owned(),
            });
        } else if !entries.is_empty() && !options.force {
            problems.push(Refusal::NotEmpty {
                out: options.out.clone(),
                entries: entries.len(),
            });
        }
    }
    // Whether the save can create files there, asked of the file system itself (mode
    // bits say nothing of owners, root, ACLs or read-only mounts).
    let folder = if options.out.is_dir() {
        options.out.clone()
    } else {
        nearest_existing(&options.out)
    };
    if folder.is_dir()
        && let Err(e) = probe_writable(&folder)
    {
        problems.push(Refusal::NotWritable {
            folder,
            out: options.out.clone(),
            error: e.to_string(),
        });
    }
    problems
}

/// Creates and removes an empty probe file in `folder`.
/// The name [`probe_writable`]'s file starts with (the process id follows).
const PROBE_PREFIX: &str = ".devmap-write-probe-";

fn probe_writable(folder: &Path) -> std::io::Result<()> {
    let probe = folder.join(format!("{PROBE_PREFIX}{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

/// Final names in OUT that are taken by something a file cannot replace (a folder, a
/// FIFO, a symlink).
fn check_targets(ckpt: &Checkpoint, plan: &SavePlan, options: &SaveOptions) -> Vec<Refusal> {
    let shard_names = plan
        .shards
        .iter()
        .map(|s| std::ffi::OsString::from(&s.file_name));
    let index = (plan.shards.len() > 1)
        .then(|| std::ffi::OsString::from(crate::formats::hf_index::INDEX_FILE));
    let copies = if options.weights_only {
        Vec::new()
    } else {
        files_to_copy(ckpt)
            .iter()
            .filter_map(|p| p.file_name().map(std::ffi::OsStr::to_os_string))
            .collect()
    };
    shard_names
        .chain(copies)
        .chain(index)
        .filter_map(|name| blocked_target(&options.out.join(name)))
        .collect()
}

fn nearest_existing(path: &Path) -> PathBuf {
    let mut at = path.to_path_buf();
    while !at.exists() {
        if !at.pop() {
            return PathBuf::from(".");
        }
    }
    at
}
