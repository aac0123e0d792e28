//! Checks a written checkpoint against its plan: each shard's header as the reference
//! safetensors parser reads it, and the plan's coverage of every tensor of the model.
//! The future home of `devmap verify`.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use super::error::SaveError;
use super::plan::{SavePlan, ShardPlan};
use crate::model::checkpoint::Checkpoint;

/// Re-reads the written shard's header and compares it byte for byte with the one
/// planned, and the file's length with the plan's: names, dtypes, shapes and offsets
/// are then exactly what the plan says. (That the planned header is what the reference
/// parsers read is what the tests check, with the `safetensors` crate and Python's
/// library, on every kind of output.) Reads in fixed chunks: memory stays flat.
pub fn verify_shard(shard: &ShardPlan, expected: &[u8], path: &Path) -> Result<(), SaveError> {
    use std::os::unix::fs::FileExt;
    let file = File::open(path).map_err(|e| SaveError::io(path, e))?;
    let len = file.metadata().map_err(|e| SaveError::io(path, e))?.len();
    if len != shard.file_bytes() || expected.len() as u64 != shard.header_len {
        return Err(SaveError::Verify(vec![format!(
            "{} is {len} bytes, the plan says {}",
            path.display(),
            shard.file_bytes()
        )]));
    }
    let mut chunk = vec![0u8; expected.len().min(1 << 20)];
    let mut at = 0usize;
    while at < expected.len() {
        let n = chunk.len().min(expected.len() - at);
        file.read_exact_at(&mut chunk[..n], at as u64)
            .map_err(|e| SaveError::io(path, e))?;
        if chunk[..n] != expected[at..at + n] {
            return Err(SaveError::Verify(vec![format!(
                "the header of {} differs from the plan at byte {}",
                path.display(),
                at + chunk[..n]
                    .iter()
                    .zip(&expected[at..at + n])
                    .position(|(a, b)| a != b)
                    .unwrap_or(0)
            )]));
        }
        at += n;
    }
    Ok(())
}

/// Every tensor of the model is written once, or dropped as a tied copy.
pub fn verify_plan_covered(ckpt: &Checkpoint, plan: &SavePlan) -> Result<(), SaveError> {
    let mut seen = vec![0u32; ckpt.tensors().len()];
    for s in &plan.shards {
        for t in &s.tensors {
            seen[t.tensor] += 1;
        }
    }
    let dropped: HashMap<&str, &str> = plan
        .dropped_ties
        .iter()
        .map(|(d, k)| (d.as_str(), k.as_str()))
        .collect();
    let written = |name: &str| ckpt.index_of(name).map_or(0, |id| seen[id]);
    let mut problems = Vec::new();
    for (id, t) in ckpt.tensors().iter().enumerate() {
        match (seen[id], dropped.get(t.name.as_str())) {
            (1, None) => {}
            (0, Some(kept)) if written(kept) == 1 => {}
            (0, _) => problems.push(format!("`{}` is not written", t.name)),
            (n, _) => problems.push(format!("`{}` is written {n} times", t.name)),
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
