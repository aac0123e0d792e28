//! What this save wrote, checked against its plan: each shard's header as the reference
//! safetensors parser reads it, and the plan's coverage of every tensor of the model.
//! (`devmap verify`, in `crate::verify`, checks any saved folder.)

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use super::error::SaveError;
use super::reasons::Mismatch;
use super::shards::{SavePlan, ShardPlan};
use crate::model::checkpoint::Checkpoint;

/// Re-reads the written shard's header and compares it byte for byte with the one
/// the plan encodes, and the file's length with the plan's: names, dtypes, shapes and
/// offsets are then exactly what the plan says. (That the planned header is what the
/// reference parsers read is what the tests check, with the `safetensors` crate and
/// Python's library, on every kind of output.) The expected header is encoded again
/// as a stream and compared in 1 MiB pieces: memory stays flat.
pub fn verify_shard(ckpt: &Checkpoint, shard: &ShardPlan, path: &Path) -> Result<(), SaveError> {
    let file = File::open(path).map_err(|e| SaveError::io(path, e))?;
    let len = file.metadata().map_err(|e| SaveError::io(path, e))?.len();
    if len != shard.file_bytes() {
        return Err(SaveError::Verify(vec![Mismatch::ShardLength {
            file: path.to_path_buf(),
            len,
            planned: shard.file_bytes(),
        }]));
    }
    let mut compare = std::io::BufWriter::with_capacity(
        1 << 20,
        CompareWith {
            file: &file,
            at: 0,
            buffer: Vec::new(),
        },
    );
    let result = shard
        .write_header(ckpt, &mut compare)
        .and_then(|_| std::io::Write::flush(&mut compare));
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            Err(SaveError::Verify(vec![Mismatch::ShardHeader {
                file: path.to_path_buf(),
                detail: e.to_string(),
            }]))
        }
        Err(e) => Err(SaveError::io(path, e)),
    }
}

/// A writer that, instead of writing, checks that `file` holds the same bytes at the
/// same place.
struct CompareWith<'f> {
    file: &'f File,
    at: u64,
    buffer: Vec<u8>,
}

impl std::io::Write for CompareWith<'_> {
    fn write(&mut self, expected: &[u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        self.buffer.resize(expected.len(), 0);
        self.file.read_exact_at(&mut self.buffer, self.at)?;
        if let Some(i) = self.buffer.iter().zip(expected).position(|(a, b)| a != b) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("first difference at byte {}", self.at + i as u64),
            ));
        }
        self.at += expected.len() as u64;
        Ok(expected.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every tensor of the model is written once, or dropped as a tied copy or as the
/// scale of a weight written dequantized.
pub fn verify_plan_covered(ckpt: &Checkpoint, plan: &SavePlan) -> Result<(), SaveError> {
    // A byte per tensor (times past 255 read as 255): this runs at the save's end,
    // beside the checkpoint and the plan.
    let mut seen = vec![0u8; ckpt.tensors().len()];
    for s in &plan.shards {
        for t in s.tensors.iter().filter(|t| !t.is_companion()) {
            seen[t.tensor()] = seen[t.tensor()].saturating_add(1);
        }
    }
    let dropped: HashMap<&str, &str> = plan
        .dropped_ties
        .iter()
        .map(|(d, k)| (d.as_str(), k.as_str()))
        .collect();
    let written = |name: &str| ckpt.index_of(name).map_or(0, |id| seen[id]);
    let scales: std::collections::HashSet<&str> =
        plan.dropped_scales.iter().map(String::as_str).collect();
    let mut problems = Vec::new();
    for (id, t) in ckpt.tensors().iter().enumerate() {
        match (seen[id], dropped.get(t.name.as_ref())) {
            (1, None) => {}
            (0, Some(kept)) if written(kept) == 1 => {}
            (0, None) if scales.contains(t.name.as_ref()) => {}
            (0, _) => problems.push(Mismatch::NotWritten(t.name.to_string())),
            (times, _) => problems.push(Mismatch::WrittenTwice {
                tensor: t.name.to_string(),
                times: times.into(),
            }),
        }
    }
    let written_bytes: u64 = plan.shards.iter().map(|s| s.data_bytes).sum();
    if written_bytes != plan.total_size {
        problems.push(Mismatch::TotalBytes {
            written: written_bytes,
            planned: plan.total_size,
        });
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(SaveError::Verify(problems))
    }
}
