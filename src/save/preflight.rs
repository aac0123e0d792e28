//! Step 3: what can be refused before the first byte is written.

use std::path::{Path, PathBuf};

use super::plan::{SaveOptions, SavePlan};
use crate::model::checkpoint::Checkpoint;

/// Suffix of files a save is still writing. A file with it is never a finished shard.
pub const PARTIAL_SUFFIX: &str = ".devmap-partial";

/// Other files of the model directory that a save copies: top-level regular files
/// that are not weights, indexes, the device map or offload data.
pub fn files_to_copy(ckpt: &Checkpoint) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(&ckpt.dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = read
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| !ckpt.weight_files.contains(p))
        .filter(|p| ckpt.device_map_path.as_deref() != Some(p.as_path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !is_weight_file_name(name)
                && !name.ends_with(PARTIAL_SUFFIX)
                && name != "device_map.json"
        })
        .collect();
    files.sort();
    files
}

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
pub fn check(ckpt: &Checkpoint, plan: &SavePlan, options: &SaveOptions) -> Vec<String> {
    let mut problems = Vec::new();
    let out = canonical_or_self(&options.out);
    let input = canonical_or_self(&ckpt.dir);
    if out == input || out.starts_with(&input) {
        problems.push(format!(
            "the output folder {} is the model directory or inside it; pick a folder outside {}",
            options.out.display(),
            ckpt.dir.display()
        ));
    }
    if let Some(offload) = &ckpt.offload_dir {
        let offload = canonical_or_self(offload);
        if out == offload || out.starts_with(&offload) {
            problems.push(format!(
                "the output folder {} is inside the offload folder {}",
                options.out.display(),
                offload.display()
            ));
        }
    }
    if options.out.exists() && !options.out.is_dir() {
        problems.push(format!(
            "{} exists and is not a folder",
            options.out.display()
        ));
    }
    if options.out.is_dir() {
        let entries: Vec<String> = std::fs::read_dir(&options.out)
            .map(|r| {
                r.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let partial: Vec<&String> = entries
            .iter()
            .filter(|n| n.ends_with(PARTIAL_SUFFIX))
            .collect();
        if !partial.is_empty() {
            problems.push(format!(
                "{} holds {} unfinished file(s) from an interrupted save (*{PARTIAL_SUFFIX}, e.g. {}); they are not valid shards: delete them, then save again",
                options.out.display(),
                partial.len(),
                partial[0]
            ));
        } else if !entries.is_empty() && !options.force {
            problems.push(format!(
                "the output folder {} is not empty ({} entries); pass --force to write into it (earlier weight files there are replaced)",
                options.out.display(),
                entries.len()
            ));
        }
        if let Ok(meta) = std::fs::metadata(&options.out)
            && meta.permissions().readonly()
        {
            problems.push(format!(
                "the output folder {} is read-only",
                options.out.display()
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
        Ok(free) if free < needed => problems.push(format!(
            "not enough free disk at {}: the save writes {} but {} are free",
            probe.display(),
            crate::human_bytes(needed),
            crate::human_bytes(free)
        )),
        _ => {}
    }
    problems
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
