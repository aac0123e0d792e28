//! One save written by every rank of a sharded job (torchrun with FSDP2 `fully_shard`
//! or other DTensor parameters), with no gather: no process ever holds more than its
//! own blocks of the model plus the copier's fixed buffers.
//!
//! Every rank describes the model with the whole tensors' shapes and, as each
//! tensor's source, the blocks it holds (`formats::live`, `Source::Pieces`). The plan
//! is a function of names, dtypes and shapes only, so every rank computes the same one
//! ([`fingerprint`] is compared across ranks before anything is written). Then, each
//! step between two barriers the Python package sets (`python/devmap/_ranks.py`):
//! 1. rank 0 creates each shard file at its full size, its header written ([`create`]),
//!    in `OUT/.devmap-parts/FINGERPRINT/ranks-of-N/`;
//! 2. every rank writes the blocks it holds at their final offsets — positioned writes
//!    into the shared files: a block split along dimension 0 is one write, one split
//!    along a later dimension a write per row — and records them ([`write_held`]);
//! 3. rank 0 checks that the records make up every tensor exactly once, then publishes
//!    OUT as a single save does: shards linked in, config and index written, all
//!    renamed into place at once ([`commit`]).
//!
//! A failure anywhere ends in [`abandon`]: the shared folder goes, OUT is as it was.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use serde::{Deserialize, Serialize};

use super::copy::Copier;
use super::error::SaveError;
use super::event::{Reporter, SaveReport};
use super::reasons::Refusal;
use super::shards::{SaveOptions, SavePlan};
use crate::formats::live::RankOf;
use crate::model::checkpoint::{Checkpoint, Piece};
use crate::types::range::ByteRange;

/// What identifies a plan across the ranks: every shard's name and header (names,
/// dtypes, shapes, offsets). Sources are left out: each rank's are its own memory.
pub fn fingerprint(ckpt: &Checkpoint, plan: &SavePlan) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    super::parts::hash_shards(&mut h, ckpt, plan);
    format!("{:032x}", h.digest128())
}

/// The folder the ranks of plan `fingerprint` share in `out`.
pub fn shared_dir(out: &Path, fingerprint: &str, world: u32) -> PathBuf {
    out.join(super::parts::PARTS_DIR)
        .join(fingerprint)
        .join(format!("ranks-of-{world}"))
}

/// Rank 0, before any rank writes: the shared folder, emptied of an earlier try of this
/// plan (other plans' parts are refused unless `options.force`), and in it each shard
/// file at its full size with its header. Returns the folder.
pub fn create(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    options: &SaveOptions,
    world: u32,
) -> Result<PathBuf, SaveError> {
    let fingerprint = fingerprint(ckpt, plan);
    let root = options.out.join(super::parts::PARTS_DIR);
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            if name.to_str() == Some(fingerprint.as_str()) {
                continue;
            }
            if options.force {
                let _ = std::fs::remove_dir_all(entry.path());
            } else {
                return Err(SaveError::Refused(vec![Refusal::ForeignParts {
                    out: options.out.clone(),
                    found: name.to_string_lossy().into_owned(),
                }]));
            }
        }
    }
    let dir = shared_dir(&options.out, &fingerprint, world);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| SaveError::io(&dir, e))?;
    for shard in &plan.shards {
        use std::io::Write;
        let path = dir.join(&shard.file_name);
        let file = File::create(&path).map_err(|e| SaveError::io(&path, e))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, &file);
        shard
            .write_header(ckpt, &mut out)
            .and_then(|_| out.flush())
            .map_err(|e| SaveError::io(&path, e))?;
        drop(out);
        crate::sys::files::reserve_blocks(&file, shard.file_bytes())
            .map_err(|e| SaveError::io(&path, e))?;
        file.set_len(shard.file_bytes())
            .map_err(|e| SaveError::io(&path, e))?;
    }
    Ok(dir)
}

/// A rank's record of the blocks it wrote, beside the shards.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    fingerprint: String,
    rank: u32,
    world: u32,
    /// Each tensor this rank wrote some of: its name and blocks.
    blocks: Vec<(String, Vec<Block>)>,
}

/// A block of a tensor: its first index and extent along each dimension.
type Block = (Vec<u64>, Vec<u64>);

fn record_path(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank-{rank}.json"))
}

/// Every rank, once rank 0 has created the files: the blocks this rank holds, written
/// at their places in the shared shard files, flushed to the disk (`options.fsync`),
/// read back and compared with the model when `verify` ([`verify_held`]), then
/// `options.commit_check` (nothing changed meanwhile), then its record. Returns the
/// bytes written. `progress(n)` after each `n` bytes.
pub fn write_held(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    options: &SaveOptions,
    (part, verify): (RankOf, bool),
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> Result<u64, SaveError> {
    let fingerprint = fingerprint(ckpt, plan);
    let dir = shared_dir(&options.out, &fingerprint, part.world);
    let mut copier = Copier::new(false);
    // Every rank writes into every file: the kernel's copy paths assume a file no one
    // else writes.
    copier.share_destination(true);
    let mut written = 0u64;
    let mut blocks = Vec::new();
    for shard in &plan.shards {
        let path = dir.join(&shard.file_name);
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| SaveError::io(&path, e))?;
        for t in &shard.tensors {
            let recipe = t.recipe(ckpt);
            let Some(index) = recipe.pieces() else {
                continue;
            };
            let pieces = ckpt.pieces(index);
            if pieces.iter().all(|p| p.numel() == 0) {
                continue;
            }
            let mut report = |n: u64| {
                written += n;
                progress(n);
            };
            super::execute::run_held(
                &recipe,
                super::execute::Inputs {
                    ckpt,
                    tensor: t.tensor(),
                    source: None,
                    stage: options.stage.as_ref(),
                    stop: cancel,
                },
                &mut copier,
                (&file, shard.header_len + t.begin),
                &mut report,
            )
            .map_err(|failed| match failed.error {
                super::copy::CopyError::Cancelled => SaveError::Cancelled,
                super::copy::CopyError::Io(e) if crate::sys::files::is_disk_full(&e) => {
                    SaveError::io(&path, e)
                }
                error => SaveError::SourceChanged {
                    path: path.clone(),
                    message: format!(
                        "`{}`: writing this rank's blocks failed: {}",
                        t.name(ckpt),
                        match error {
                            super::copy::CopyError::Io(e) => e.to_string(),
                            _ => "its memory ended early".to_owned(),
                        }
                    ),
                },
            })?;
            blocks.push((
                t.name(ckpt).into_owned(),
                pieces
                    .iter()
                    .filter(|p| p.numel() > 0)
                    .map(|p| (p.offsets.to_vec(), p.sizes.to_vec()))
                    .collect(),
            ));
        }
        if options.fsync {
            file.sync_data().map_err(|e| SaveError::io(&path, e))?;
        }
    }
    if verify {
        verify_held(ckpt, plan, options, part, cancel)?;
    }
    if let Some(check) = &options.commit_check {
        (check.0)().map_err(|why| SaveError::Refused(vec![Refusal::ModelChanged(why)]))?;
    }
    let record = Record {
        fingerprint,
        rank: part.rank,
        world: part.world,
        blocks,
    };
    let text = serde_json::to_vec(&record).unwrap_or_default();
    let path = record_path(&dir, part.rank);
    super::parts::write_whole(&path, &text).map_err(|e| SaveError::io(&path, e))?;
    Ok(written)
}

/// Every rank, after writing: each block it holds made again from the model (cast as
/// the save casts) and compared with what the shared files hold at its place. The
/// first tensor that differs fails the save, named, before anything is committed.
pub fn verify_held(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    options: &SaveOptions,
    part: RankOf,
    cancel: &AtomicBool,
) -> Result<(), SaveError> {
    let dir = shared_dir(&options.out, &fingerprint(ckpt, plan), part.world);
    let mut copier = Copier::new(false);
    for shard in &plan.shards {
        let path = dir.join(&shard.file_name);
        let file = File::open(&path).map_err(|e| SaveError::io(&path, e))?;
        for t in &shard.tensors {
            let recipe = t.recipe(ckpt);
            if recipe.pieces().is_none() {
                continue;
            }
            let differs = super::execute::check_held(
                &recipe,
                super::execute::Inputs {
                    ckpt,
                    tensor: t.tensor(),
                    source: None,
                    stage: options.stage.as_ref(),
                    stop: cancel,
                },
                &mut copier,
                (&file, shard.header_len + t.begin),
            )
            .map_err(|failed| match failed.error {
                super::copy::CopyError::Cancelled => SaveError::Cancelled,
                super::copy::CopyError::Io(e) => SaveError::io(&path, e),
                super::copy::CopyError::ShortSource { .. } => {
                    SaveError::io(&path, std::io::Error::other("the shard file ended early"))
                }
            })?;
            if let Some(at) = differs {
                return Err(SaveError::Verify(vec![
                    super::reasons::Mismatch::RankBlock {
                        file: path.clone(),
                        tensor: t.name(ckpt).into_owned(),
                        rank: part.rank,
                        at,
                    },
                ]));
            }
        }
    }
    Ok(())
}

/// Rank 0, once every rank has written: every rank's record read (all `world` of them,
/// of this plan), each tensor checked to be made up by the ranks' blocks exactly once,
/// each shard file checked for its header and length; then OUT published as a single
/// save publishes it. The shared folder goes after the commit.
pub fn commit(
    ckpt: &Checkpoint,
    plan: &SavePlan,
    options: &SaveOptions,
    world: u32,
    cancel: &AtomicBool,
) -> Result<SaveReport, SaveError> {
    let fingerprint = fingerprint(ckpt, plan);
    let dir = shared_dir(&options.out, &fingerprint, world);
    let mut held: HashMap<String, Vec<Piece>> = HashMap::new();
    let mut problems = Vec::new();
    for rank in 0..world {
        let missing = |why: String| Refusal::RankMissing { rank, world, why };
        let record: Record = match std::fs::read(record_path(&dir, rank))
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(r) => r,
            Err(e) => {
                problems.push(missing(format!("no record ({e}): it did not finish")));
                continue;
            }
        };
        if record.fingerprint != fingerprint || record.rank != rank || record.world != world {
            problems.push(missing("its record is of another plan".into()));
            continue;
        }
        for (name, blocks) in record.blocks {
            let pieces = held.entry(name).or_default();
            pieces.extend(blocks.into_iter().map(|(offsets, sizes)| Piece {
                range: ByteRange {
                    file: rank as usize,
                    offset: 0,
                    len: 0,
                },
                offsets: offsets.into(),
                sizes: sizes.into(),
                stride: None,
            }));
        }
    }
    if !problems.is_empty() {
        return Err(SaveError::Refused(problems));
    }
    let mut files = Vec::with_capacity(plan.shards.len());
    for shard in &plan.shards {
        for t in &shard.tensors {
            let name = t.name(ckpt);
            let shape = ckpt.tensors()[t.tensor()].shape.to_vec();
            let pieces = held.get(name.as_ref()).map_or(&[][..], Vec::as_slice);
            if let Err(problem) = crate::types::pieces::tiling(&shape, pieces) {
                let ranks = |i: usize| pieces.get(i).map_or(0, |p| p.range.file);
                let why = match problem {
                    crate::types::pieces::Tiling::Overlap { pieces: (a, b) } => format!(
                        "ranks {} and {} both wrote some of the same elements",
                        ranks(a),
                        ranks(b)
                    ),
                    other => other.to_string().replace("chunk", "block"),
                };
                problems.push(Refusal::RanksDoNotTile {
                    tensor: name.into_owned(),
                    why,
                });
            }
        }
        let path = dir.join(&shard.file_name);
        super::check_written::verify_shard(ckpt, shard, &path)?;
        files.push(path);
    }
    if !problems.is_empty() {
        return Err(SaveError::Refused(problems));
    }
    let flag = AtomicBool::new(false);
    let reporter = Reporter::new(None, &flag);
    let report = super::job::publish(ckpt, plan, options, (cancel, &reporter), &files)?;
    super::parts::clear(&options.out, &fingerprint);
    Ok(report)
}

/// After a failure on any rank: the shared folder of this plan goes (and the parts
/// folder once empty). OUT itself was never touched.
pub fn abandon(ckpt: &Checkpoint, plan: &SavePlan, out: &Path) {
    super::parts::clear(out, &fingerprint(ckpt, plan));
}
