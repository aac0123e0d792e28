//! Checks a written checkpoint against its plan: each shard's header as the reference
//! safetensors parser reads it, and the plan's coverage of every tensor of the model.
//! The future home of `devmap verify`.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::error::SaveError;
use super::plan::{SavePlan, ShardPlan};
use crate::model::checkpoint::Checkpoint;

/// Re-reads the written header with the reference safetensors parser and compares it
/// with the plan: names, dtypes, shapes, offsets and file length.
pub fn verify_shard(shard: &ShardPlan, path: &Path) -> Result<(), SaveError> {
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
                    || offsets != (t.begin, t.end())
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
pub fn verify_plan_covered(ckpt: &Checkpoint, plan: &SavePlan) -> Result<(), SaveError> {
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
