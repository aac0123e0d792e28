//! Checks a written checkpoint against its plan: each shard's header as the reference
//! safetensors parser reads it, and the plan's coverage of every tensor of the model.
//! The future home of `devmap verify`.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

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
    let not_safetensors = |why: String| {
        SaveError::Verify(vec![format!(
            "{} does not parse as safetensors: {why}",
            path.display()
        )])
    };
    // The header alone, by ordinary reads: the reference parser's own header type
    // reads it, and the comparison below with the plan (every tensor's offsets, the
    // count, the file length) covers what its whole-file check would.
    let header = read_header_bytes(&file, len)
        .map_err(|e| SaveError::io(path, e))?
        .ok_or_else(|| not_safetensors("the header length runs past the end".into()))?;
    let metadata: safetensors::tensor::Metadata =
        serde_json::from_slice(&header).map_err(|e| not_safetensors(e.to_string()))?;
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

/// The JSON header of the safetensors file `file` of `len` bytes, or `None` when its
/// declared length does not fit the file.
fn read_header_bytes(file: &File, len: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    let mut len_bytes = [0u8; 8];
    if len < 8 {
        return Ok(None);
    }
    file.read_exact_at(&mut len_bytes, 0)?;
    let header_len = u64::from_le_bytes(len_bytes);
    let Some(header_len) = usize::try_from(header_len).ok().filter(|&n| {
        n as u64 <= crate::formats::safetensors::MAX_HEADER_LEN && 8 + n as u64 <= len
    }) else {
        return Ok(None);
    };
    let mut header = vec![0u8; header_len];
    file.read_exact_at(&mut header, 8)?;
    Ok(Some(header))
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
    for t in ckpt.tensors() {
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
