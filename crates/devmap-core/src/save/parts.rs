//! One save split over processes that share only a filesystem (`--part K/N`, then
//! `--commit N`). Every part computes the whole plan, exactly as a plain save does;
//! the shards are dealt to the parts by bytes, the same way for a given plan; part K
//! writes its shards under `OUT/.devmap-parts/FINGERPRINT/K-of-N/` and a manifest
//! naming each with its size and XXH3-128 digest. Nothing is published until the
//! commit, which checks that all N manifests are there and describe this very plan
//! (the fingerprint), then publishes OUT as a single save does: shards linked in,
//! config and index written, all renamed into place at once.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::SaveError;
use super::reasons::Refusal;
use super::shards::{SavePlan, ShardPlan};
use crate::model::checkpoint::Checkpoint;

/// Where parts keep their shards until the commit, inside OUT.
pub const PARTS_DIR: &str = ".devmap-parts";
/// Each part's record of what it wrote, in its folder.
const MANIFEST: &str = "manifest.json";

/// Part `k` of `n` (1 ≤ k ≤ n).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub k: u32,
    pub n: u32,
}

/// What a distributed save does in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distributed {
    /// Write this part's shards and its manifest; publish nothing.
    Part(Part),
    /// Check the N parts' manifests and publish OUT.
    Commit(u32),
    /// One rank of a sharded job: every tensor is planned whole, and this process
    /// writes the blocks of it it holds into the shard files all ranks share
    /// (`save::ranks`).
    Ranks(crate::formats::live::RankOf),
}

impl Part {
    /// `K/N`, or `auto`: the rank and world size the launcher put in the environment.
    pub fn parse(text: &str) -> Result<Part, String> {
        if text == "auto" {
            return Part::from_env(|k| std::env::var(k).ok());
        }
        let (k, n) = text
            .split_once('/')
            .ok_or_else(|| format!("`{text}` is not K/N (e.g. 2/4) or auto"))?;
        let number = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{text}` is not K/N (e.g. 2/4) or auto"))
        };
        Part::new(number(k)?, number(n)?)
    }

    fn new(k: u32, n: u32) -> Result<Part, String> {
        if n == 0 || k == 0 || k > n {
            return Err(format!("part {k}/{n}: K must be between 1 and N"));
        }
        Ok(Part { k, n })
    }

    /// The launchers people use, by the variables they set: a Slurm array
    /// (`SLURM_ARRAY_TASK_ID` of `SLURM_ARRAY_TASK_COUNT`, counted from
    /// `SLURM_ARRAY_TASK_MIN`), an `srun` step (`SLURM_PROCID` of `SLURM_NTASKS`),
    /// torchrun (`RANK` of `WORLD_SIZE`), Open MPI (`OMPI_COMM_WORLD_RANK` of
    /// `OMPI_COMM_WORLD_SIZE`). Ranks count from 0, parts from 1.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Part, String> {
        let number = |name: &str| -> Result<Option<u32>, String> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse::<u32>()
                        .map_err(|_| format!("{name}={v} is not a number"))
                })
                .transpose()
        };
        let pairs = [
            ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"),
            ("SLURM_PROCID", "SLURM_NTASKS"),
            ("RANK", "WORLD_SIZE"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ];
        for (rank, size) in pairs {
            if let (Some(r), Some(n)) = (number(rank)?, number(size)?) {
                let first = if rank == "SLURM_ARRAY_TASK_ID" {
                    number("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0)
                } else {
                    0
                };
                let r = r
                    .checked_sub(first)
                    .ok_or_else(|| format!("{rank}={r} is below SLURM_ARRAY_TASK_MIN={first}"))?;
                return Part::new(r + 1, n).map_err(|e| format!("{e} (from {rank} and {size})"));
            }
        }
        Err("--part auto found no launcher's rank and world size (SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT, SLURM_PROCID/SLURM_NTASKS, RANK/WORLD_SIZE or OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE); give --part K/N".to_owned())
    }
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.k, self.n)
    }
}

/// The part (1-based) that writes each shard of `plan`: the largest shards first, each
/// to the part with the fewest bytes so far (the lowest-numbered on a tie). The same
/// plan always deals the same way.
pub fn assign(plan: &SavePlan, n: u32) -> Vec<u32> {
    let mut order: Vec<usize> = (0..plan.shards.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(plan.shards[i].file_bytes()), i));
    let mut load = vec![0u64; n.max(1) as usize];
    let mut part = vec![0u32; plan.shards.len()];
    for i in order {
        let (least, _) = load
            .iter()
            .enumerate()
            .min_by_key(|&(p, b)| (*b, p))
            .unwrap_or((0, &0));
        load[least] += plan.shards[i].file_bytes();
        part[i] = least as u32 + 1;
    }
    part
}

/// The shards of `plan` that part `part` writes ([`assign`]'s deal).
pub fn shards_of(plan: &SavePlan, part: Part) -> impl Iterator<Item = &ShardPlan> {
    plan.shards
        .iter()
        .zip(assign(plan, part.n))
        .filter(move |(_, p)| *p == part.k)
        .map(|(s, _)| s)
}

/// What identifies a plan across processes: every shard's name and header (names,
/// dtypes, shapes, offsets) and every source file's path, size and modification time.
/// Two saves of different models, or of a model changed in between, differ.
pub fn fingerprint(ckpt: &Checkpoint, plan: &SavePlan) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    hash_shards(&mut h, ckpt, plan);
    for file in &ckpt.files {
        h.update(file.path.as_os_str().as_encoded_bytes());
        h.update(&file.len.to_le_bytes());
        let modified = file
            .modified
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        h.update(&modified.to_le_bytes());
    }
    format!("{:032x}", h.digest128())
}

/// Every shard's name and header (names, dtypes, shapes, offsets) into `h`.
pub(super) fn hash_shards(h: &mut xxhash_rust::xxh3::Xxh3, ckpt: &Checkpoint, plan: &SavePlan) {
    for shard in &plan.shards {
        h.update(shard.file_name.as_bytes());
        let mut header = Vec::new();
        let _ = shard.write_header(ckpt, &mut header);
        h.update(&header);
    }
}

/// The folder of part `part` of the plan `fingerprint` in `out`.
pub fn part_dir(out: &Path, fingerprint: &str, part: Part) -> PathBuf {
    out.join(PARTS_DIR)
        .join(fingerprint)
        .join(format!("{}-of-{}", part.k, part.n))
}

/// A part's record of what it wrote.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub fingerprint: String,
    pub part: u32,
    pub parts: u32,
    pub shards: Vec<WrittenShard>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct WrittenShard {
    pub file: String,
    pub bytes: u64,
    /// XXH3-128 of the whole file, hex.
    pub xxh3: String,
}

/// XXH3-128 of a file, read in 1 MiB pieces.
fn digest(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:032x}", h.digest128()))
}

/// Writes part `part`'s manifest for the shards `files` now in `dir` (under a
/// temporary name, synced, then renamed: a manifest is whole or absent).
pub fn write_manifest(
    dir: &Path,
    fingerprint: &str,
    part: Part,
    files: &[String],
) -> Result<(), SaveError> {
    let shards = files
        .iter()
        .map(|f| {
            let path = dir.join(f);
            let bytes = std::fs::metadata(&path)
                .map_err(|e| SaveError::io(&path, e))?
                .len();
            let xxh3 = digest(&path).map_err(|e| SaveError::io(&path, e))?;
            Ok(WrittenShard {
                file: f.clone(),
                bytes,
                xxh3,
            })
        })
        .collect::<Result<Vec<_>, SaveError>>()?;
    let manifest = Manifest {
        fingerprint: fingerprint.to_owned(),
        part: part.k,
        parts: part.n,
        shards,
    };
    let text = serde_json::to_string_pretty(&manifest).unwrap_or_default();
    let path = dir.join(MANIFEST);
    write_whole(&path, text.as_bytes()).map_err(|e| SaveError::io(path, e))
}

/// Writes `bytes` to `path` whole or not at all: under a temporary name, synced, then
/// renamed (a record the commit reads is never half there).
pub(super) fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.partial", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Before part `part` writes: no other plan's parts in OUT (two models into one OUT
/// would publish a mix; `--force` clears them), no other process writing this part,
/// and nothing left of an earlier run of it but what it will replace (its manifest and
/// any unfinished files go).
pub fn prepare_part(
    out: &Path,
    fingerprint: &str,
    part: Part,
    force: bool,
) -> Result<PathBuf, SaveError> {
    let root = out.join(PARTS_DIR);
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            if name.to_str() == Some(fingerprint) {
                continue;
            }
            if force {
                let _ = std::fs::remove_dir_all(entry.path());
            } else {
                return Err(SaveError::Refused(vec![Refusal::ForeignParts {
                    out: out.to_path_buf(),
                    found: name.to_string_lossy().into_owned(),
                }]));
            }
        }
    }
    let dir = part_dir(out, fingerprint, part);
    std::fs::create_dir_all(&dir).map_err(|e| SaveError::io(&dir, e))?;
    let lock = File::open(&dir).map_err(|e| SaveError::io(&dir, e))?;
    if lock.try_lock().is_err() {
        return Err(SaveError::Busy(dir));
    }
    let _ = std::fs::remove_file(dir.join(MANIFEST));
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.filter_map(Result::ok) {
            if super::names::is_unfinished_name(&entry.file_name()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    Ok(dir)
}

/// The commit's check: every part of `n` present, finished (not being written),
/// from this plan (its `fingerprint`), holding exactly the shards the plan deals it,
/// at their sizes. Returns each shard's file in its part's folder, by shard index.
pub fn gather(
    out: &Path,
    fingerprint: &str,
    plan: &SavePlan,
    n: u32,
) -> Result<Vec<PathBuf>, SaveError> {
    let dealt = assign(plan, n);
    let mut problems = Vec::new();
    let mut files = vec![PathBuf::new(); plan.shards.len()];
    for k in 1..=n {
        let part = Part { k, n };
        let dir = part_dir(out, fingerprint, part);
        let Ok(lock) = File::open(&dir) else {
            problems.push(Refusal::PartMissing {
                part: part.to_string(),
                why: "no part folder: it never ran, or ran for another model or shard size".into(),
            });
            continue;
        };
        if lock.try_lock().is_err() {
            problems.push(Refusal::PartMissing {
                part: part.to_string(),
                why: "it is still writing".into(),
            });
            continue;
        }
        let manifest: Manifest = match std::fs::read(dir.join(MANIFEST))
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(m) => m,
            Err(e) => {
                problems.push(Refusal::PartMissing {
                    part: part.to_string(),
                    why: format!("no manifest ({e}): it did not finish"),
                });
                continue;
            }
        };
        if manifest.fingerprint != fingerprint || manifest.parts != n || manifest.part != k {
            problems.push(Refusal::PartMissing {
                part: part.to_string(),
                why: "its manifest is of another plan".into(),
            });
            continue;
        }
        let want: BTreeSet<&str> = plan
            .shards
            .iter()
            .zip(&dealt)
            .filter(|(_, p)| **p == k)
            .map(|(s, _)| s.file_name.as_str())
            .collect();
        let have: BTreeSet<&str> = manifest.shards.iter().map(|s| s.file.as_str()).collect();
        if want != have {
            problems.push(Refusal::PartMissing {
                part: part.to_string(),
                why: format!(
                    "it wrote {} shards, the plan deals it {}",
                    have.len(),
                    want.len()
                ),
            });
            continue;
        }
        for (i, shard) in plan
            .shards
            .iter()
            .enumerate()
            .filter(|(i, _)| dealt[*i] == k)
        {
            let path = dir.join(&shard.file_name);
            match std::fs::metadata(&path) {
                Ok(m) if m.len() == shard.file_bytes() => files[i] = path,
                Ok(m) => problems.push(Refusal::PartMissing {
                    part: part.to_string(),
                    why: format!(
                        "{} is {} bytes, the plan says {}",
                        shard.file_name,
                        m.len(),
                        shard.file_bytes()
                    ),
                }),
                Err(e) => problems.push(Refusal::PartMissing {
                    part: part.to_string(),
                    why: format!("{}: {e}", shard.file_name),
                }),
            }
        }
    }
    if problems.is_empty() {
        Ok(files)
    } else {
        Err(SaveError::Refused(problems))
    }
}

/// After the commit: the parts' folder of this plan goes (the shards now live in OUT),
/// and the parts folder too once empty.
pub fn clear(out: &Path, fingerprint: &str) {
    let root = out.join(PARTS_DIR);
    let _ = std::fs::remove_dir_all(root.join(fingerprint));
    let _ = std::fs::remove_dir(root);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_parse_from_text_and_from_each_launcher() {
        assert_eq!(Part::parse("2/4"), Ok(Part { k: 2, n: 4 }));
        assert!(Part::parse("0/4").is_err() && Part::parse("5/4").is_err());
        assert!(Part::parse("2").is_err() && Part::parse("a/b").is_err());
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            Part::from_env(env(&[("RANK", "3"), ("WORLD_SIZE", "4")])),
            Ok(Part { k: 4, n: 4 })
        );
        assert_eq!(
            Part::from_env(env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")])),
            Ok(Part { k: 1, n: 2 })
        );
        assert_eq!(
            Part::from_env(env(&[
                ("SLURM_ARRAY_TASK_ID", "5"),
                ("SLURM_ARRAY_TASK_MIN", "4"),
                ("SLURM_ARRAY_TASK_COUNT", "3")
            ])),
            Ok(Part { k: 2, n: 3 })
        );
        assert_eq!(
            Part::from_env(env(&[
                ("OMPI_COMM_WORLD_RANK", "1"),
                ("OMPI_COMM_WORLD_SIZE", "2")
            ])),
            Ok(Part { k: 2, n: 2 })
        );
        assert!(Part::from_env(env(&[])).is_err());
        assert!(Part::from_env(env(&[("RANK", "4"), ("WORLD_SIZE", "4")])).is_err());
    }
}
