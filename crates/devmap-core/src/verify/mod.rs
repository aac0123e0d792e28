//! `devmap verify`: checks a saved checkpoint folder before anyone deletes the
//! original, in three parts that prove different things:
//!
//! - files: the folder reads as transformers reads it (index, shards, headers,
//!   totals), and every tensor is read once, hashed (XXH3-128), its NaNs and
//!   infinities counted, empty and uniform tensors noted;
//! - as transformers expects (`expects`): the tensors, shapes and float32 modules
//!   config.json's architecture holds, from a table generated from transformers
//!   itself, so it does not share the saver's assumptions;
//! - as saved, with a [`SaveReference`] model (`--against`): what a save of that model
//!   writes, computed through the saver's own plan and recipes, compared tensor by
//!   tensor (name, dtype, shape, hash) — a proof of the copy, not of its meaning.
//!
//! Both sides stream through one fixed buffer each, on two threads: memory stays flat.

mod against;
mod asked;
mod digest;
mod expects;
mod report;
mod round_trip;
mod written;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub use against::SaveReference;
pub use expects::{Coverage, of_plan as expectations_of_plan};
pub use report::{Check, Finding, Kind, Severity, VerifyReport};

use crate::formats::FormatError;
use crate::save::copy::{Copier, CopyError};
use digest::{Digest, Digester, Uniform};
use written::Written;

/// Bytes read and hashed at a time: small enough to stay in the CPU's cache between
/// the read and the hash (see `Copier::with_stream_chunk`).
const READ_CHUNK: usize = 256 << 10;

/// Shared with whoever shows progress or cancels: bytes read so far of the total.
#[derive(Debug, Default)]
pub struct Progress {
    pub read: AtomicU64,
    pub total: AtomicU64,
    pub cancel: AtomicBool,
}

/// Why a verification could not run at all (`devmap verify` exits 2).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("{}", crate::text::not_a_folder(.0))]
    NotADirectory(PathBuf),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("verification cancelled")]
    Cancelled,
    #[error("the verification thread panicked")]
    Panicked,
}

/// Runs [`verify`] on a thread of its own and calls `tick` with its progress every
/// 100 ms until it ends; the wait ends the moment the work does, not at the next tick.
/// `tick` may stop it through `progress.cancel`.
pub fn verify_with_ticks(
    out: &Path,
    expected: Option<&SaveReference>,
    (allow_nonfinite, answer): (bool, Option<&crate::oracle::Answer>),
    progress: &Progress,
    tick: &mut dyn FnMut(&Progress),
) -> Result<VerifyReport, VerifyError> {
    std::thread::scope(|scope| {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        scope.spawn(move || {
            let _ = done_tx.send(verify_asking(
                out,
                expected,
                allow_nonfinite,
                answer,
                progress,
            ));
        });
        loop {
            match done_rx.recv_timeout(std::time::Duration::from_millis(100)) {
                Ok(result) => return result,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(VerifyError::Panicked);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => tick(progress),
            }
        }
    })
}

/// Verifies the checkpoint in `out`, and compares it with `expected` when given. A
/// NaN or infinity is a difference unless `allow_nonfinite`.
pub fn verify(
    out: &Path,
    expected: Option<&SaveReference>,
    allow_nonfinite: bool,
    progress: &Progress,
) -> Result<VerifyReport, VerifyError> {
    verify_asking(out, expected, allow_nonfinite, None, progress)
}

/// [`verify`], with names, shapes and float32 modules checked against `answer` (what
/// the user's transformers says of OUT's config.json) instead of devmap's table.
pub fn verify_asking(
    out: &Path,
    expected: Option<&SaveReference>,
    allow_nonfinite: bool,
    answer: Option<&crate::oracle::Answer>,
    progress: &Progress,
) -> Result<VerifyReport, VerifyError> {
    let mut findings = Vec::new();
    let written = written::read(out, &mut findings)?;
    let names_checked = written
        .config
        .as_ref()
        .is_some_and(|c| expects::checked_against(c).is_some());
    written::check_config(
        &written,
        expected.is_none_or(SaveReference::has_config),
        names_checked,
        &mut findings,
    );
    if let Some(expected) = expected {
        // A head the save itself writes (--keep-tied) is no extra copy.
        findings.retain(|f| !(f.kind == Kind::TieExtra && expected.writes(&f.subject)));
    }
    let coverage = match answer {
        Some(answer) if written.config.is_some() => {
            asked::check(&written, answer, &mut findings);
            Coverage {
                architecture: Some(answer.architecture.clone()),
                source: Some(answer.source()),
            }
        }
        _ => expects::check(&written, &mut findings),
    };
    let pairs = match expected {
        Some(e) => against::match_up(&written, e, &mut findings),
        None => Vec::new(),
    };
    // Progress counts bytes as they reach the hash (a cast's converted bytes); the
    // report counts bytes read from disk.
    let written_bytes = written.tensors.iter().map(|t| t.len).sum::<u64>();
    let total = written_bytes + pairs.iter().map(|(_, p)| p.len).sum::<u64>();
    progress.total.store(total, Ordering::Relaxed);
    let bytes_read = written_bytes
        + pairs
            .iter()
            .filter_map(|(_, p)| Some(p.recipe(expected?.ckpt).source_len()))
            .sum::<u64>();

    // Two threads: the checkpoint on one and the sources on the other; alone, the
    // checkpoint's tensors split in two runs of about equal bytes, each read in file
    // order.
    let split = if expected.is_some() {
        written.tensors.len()
    } else {
        byte_midpoint(&written.tensors)
    };
    let (first, second, expected_hashes) = std::thread::scope(|scope| {
        let theirs = scope.spawn(|| match expected {
            Some(e) => (None, Some(hash_expected(e, &pairs, progress))),
            None => (
                Some(digest_written(
                    &written,
                    split..written.tensors.len(),
                    progress,
                )),
                None,
            ),
        });
        let ours = digest_written(&written, 0..split, progress);
        let (second, theirs) = theirs
            .join()
            .unwrap_or((Some(Err(VerifyError::Cancelled)), None));
        (ours, second, theirs)
    });
    let (mut digests, mut read_findings) = first?;
    if let Some(second) = second {
        let (mut more, mut more_findings) = second?;
        digests.append(&mut more);
        read_findings.append(&mut more_findings);
    }
    findings.append(&mut read_findings);
    for (t, digest) in written.tensors.iter().zip(&digests) {
        if t.numel() == 0 {
            // Reported, not failed: a few models do hold empty buffers.
            findings.push(Finding::note(
                Kind::EmptyTensor,
                &t.name,
                format!(
                    "has no elements (shape {:?}); a tensor left on the meta device is written like this",
                    t.shape
                ),
            ));
            continue;
        }
        if let Some(n) = digest.map(|d| d.nonfinite).filter(|n| n.nan + n.inf > 0) {
            let message = format!(
                "holds {} and {} of {} elements",
                crate::text::count(n.nan as usize, "NaN", "NaNs"),
                crate::text::count(n.inf as usize, "infinity", "infinities"),
                t.numel()
            );
            findings.push(if allow_nonfinite {
                Finding::note(Kind::NonFinite, &t.name, message)
            } else {
                Finding::difference(
                    Kind::NonFinite,
                    &t.name,
                    format!("{message} (--allow-nonfinite if the model means it)"),
                )
            });
        }
        match digest.map(|d| d.uniform) {
            Some(Uniform::Zero) => findings.push(Finding::note(
                Kind::AllZero,
                &t.name,
                format!("all {} elements are zero", t.numel()),
            )),
            Some(Uniform::Same) => findings.push(Finding::note(
                Kind::AllSame,
                &t.name,
                format!("all {} elements hold one value", t.numel()),
            )),
            _ => {}
        }
    }
    if let Some(e) = expected {
        against::dropped_ties(e, progress, &mut findings)?;
    }
    let mut compared = 0;
    if let Some((hashes, mut source_findings)) = expected_hashes.transpose()? {
        findings.append(&mut source_findings);
        for ((i, p), hash) in pairs.iter().zip(hashes) {
            let (Some(hash), Some(ours)) = (hash, digests[*i]) else {
                continue;
            };
            compared += 1;
            if hash != ours.hash {
                let Some(e) = expected else { continue };
                let how = format!(
                    "the bytes differ from {}",
                    p.recipe(e.ckpt).what_it_writes()
                );
                findings.push(Finding::difference(
                    Kind::Content,
                    &written.tensors[*i].name,
                    how,
                ));
            }
        }
    }
    if let Some(e) = expected {
        round_trip::check(&written, e, &pairs, &mut findings);
    }
    Ok(VerifyReport {
        out: out.to_path_buf(),
        against: expected.map(|e| e.dir().to_path_buf()),
        shards: written.shards.len(),
        tensors: written.tensors.len(),
        compared,
        bytes_read,
        coverage,
        findings,
    })
}

/// Reads every written tensor in file order; unreadable ones are findings.
fn digest_written(
    written: &Written,
    range: std::ops::Range<usize>,
    progress: &Progress,
) -> Result<(Vec<Option<Digest>>, Vec<Finding>), VerifyError> {
    let mut copier = Copier::with_stream_chunk(READ_CHUNK);
    let mut digests = Vec::with_capacity(range.len());
    let mut findings = Vec::new();
    let mut open: Option<(usize, File)> = None;
    for t in &written.tensors[range] {
        if open.as_ref().is_none_or(|(s, _)| *s != t.shard) {
            let path = &written.shards[t.shard].path;
            match crate::formats::input::open_regular(path) {
                Ok(f) => open = Some((t.shard, f)),
                Err(e) => {
                    findings.push(Finding::difference(
                        Kind::Unreadable,
                        &written.shards[t.shard].name,
                        e.to_string(),
                    ));
                    open = None;
                }
            }
        }
        let Some((_, file)) = &open else {
            digests.push(None);
            continue;
        };
        let mut digester = Digester::new(t.dtype);
        match read_into(
            &mut copier,
            (file, t.offset),
            t.len,
            None,
            progress,
            &mut digester,
        ) {
            Ok(()) => digests.push(Some(digester.finish())),
            Err(CopyError::Cancelled) => return Err(VerifyError::Cancelled),
            Err(e) => {
                findings.push(Finding::difference(
                    Kind::Unreadable,
                    &t.name,
                    format!(
                        "cannot be read from {}: {}",
                        written.shards[t.shard].name,
                        describe(&e)
                    ),
                ));
                digests.push(None);
            }
        }
    }
    Ok((digests, findings))
}

/// Where to split `tensors` so both runs hold about half the bytes.
fn byte_midpoint(tensors: &[written::WrittenTensor]) -> usize {
    let half = tensors.iter().map(|t| t.len).sum::<u64>() / 2;
    let mut sum = 0;
    tensors
        .iter()
        .position(|t| {
            sum += t.len;
            sum > half
        })
        .map_or(tensors.len(), |i| i + 1)
}

/// The hash of what a save writes for each pair: the save's own recipe run by the
/// save's own executor (`save::execute`), into a digest instead of a file.
fn hash_expected(
    expected: &SaveReference,
    pairs: &[(usize, &crate::save::shards::PlannedTensor)],
    progress: &Progress,
) -> Result<(Vec<Option<u128>>, Vec<Finding>), VerifyError> {
    let hashed = hash_each(expected, pairs, progress);
    // The bands the recipes kept (GPTQ/AWQ's, up to 28 MiB) go, as at a save's end,
    // whether or not every tensor was hashed.
    crate::save::compute::release_scratch();
    hashed
}

/// Each expected tensor's hash, recomputed through the save's own recipes.
fn hash_each(
    expected: &SaveReference,
    pairs: &[(usize, &crate::save::shards::PlannedTensor)],
    progress: &Progress,
) -> Result<(Vec<Option<u128>>, Vec<Finding>), VerifyError> {
    use crate::model::checkpoint::InputKind;
    use crate::save::execute;
    let ckpt = expected.ckpt;
    let mut copier = Copier::with_stream_chunk(READ_CHUNK);
    let mut files: std::collections::HashMap<usize, Option<File>> =
        std::collections::HashMap::new();
    let mut hashes = Vec::with_capacity(pairs.len());
    let mut findings = Vec::new();
    for (_, p) in pairs {
        let recipe = p.recipe(ckpt);
        // The one source file, opened once for all the tensors it holds; none for an
        // empty tensor, pieces, or a staged tensor (read again through the stage).
        let staged = recipe
            .source()
            .is_some_and(|r| matches!(ckpt.input_kind(r.file), InputKind::Staged(_)));
        let source = recipe.source().filter(|r| r.len > 0 && !staged);
        let src = match source {
            Some(r) => {
                let path = ckpt.file_path(r.file);
                let file = files.entry(r.file).or_insert_with(|| {
                    crate::formats::input::open_regular(path)
                        .map_err(|e| {
                            findings.push(Finding::difference(
                                Kind::Unreadable,
                                crate::text::path(path),
                                e.to_string(),
                            ));
                        })
                        .ok()
                });
                let Some(file) = file.as_ref() else {
                    hashes.push(None);
                    continue;
                };
                Some(file)
            }
            None => None,
        };
        let mut digester = Digester::new(p.dtype);
        // What every recipe's bytes go through: the hash, and the progress count.
        let mut feed = |chunk: &[u8]| {
            digester.update(chunk);
            progress
                .read
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            Ok(())
        };
        let ran = execute::run(
            &recipe,
            execute::Inputs {
                ckpt,
                tensor: p.tensor(),
                source: src,
                stage: expected.stage.as_ref(),
                stop: &progress.cancel,
            },
            &mut copier,
            execute::Sink::Stream(&mut feed),
        );
        let (outcome, what) = match ran {
            Ok(()) => (Ok(digester.finish().hash), String::new()),
            Err(failed) => {
                let what = match (failed.file, recipe.pieces()) {
                    _ if staged => "its staged source cannot be read again".to_owned(),
                    (Some(file), Some(_)) => format!(
                        "its chunk in {} cannot be read",
                        crate::text::path(ckpt.file_path(file))
                    ),
                    (Some(file), None) => format!(
                        "{}, which it is made with, cannot be read",
                        crate::text::path(ckpt.file_path(file))
                    ),
                    (None, _) => format!(
                        "its source in {} cannot be read",
                        recipe
                            .source()
                            .map_or_else(String::new, |r| crate::text::path(
                                ckpt.file_path(r.file)
                            ))
                    ),
                };
                (Err(failed.error), what)
            }
        };
        hashes.push(hashed(outcome, &expected.name(p), &what, &mut findings)?);
    }
    Ok((hashes, findings))
}

/// The hash of the bytes `source` holds for tensor `id`, as stored (a range, or pieces
/// put together); `None` for a source with no bytes of its own.
fn stored_hash(
    ckpt: &crate::model::Checkpoint,
    id: crate::model::TensorId,
    source: crate::model::Source,
    copier: &mut Copier,
    progress: &Progress,
) -> Result<Option<u128>, CopyError> {
    use crate::model::Source;
    let tensor = &ckpt.tensors()[id];
    let mut digester = Digester::new(tensor.dtype);
    match source {
        Source::Checkpoint(r) | Source::Offload(r) | Source::Adapter(r) => {
            let file = crate::formats::input::open_regular(ckpt.file_path(r.file))
                .map_err(|e| CopyError::Io(std::io::Error::other(e)))?;
            read_into(
                copier,
                (&file, r.offset),
                r.len,
                None,
                progress,
                &mut digester,
            )?;
        }
        Source::Pieces(index) => {
            let mut open = |file| {
                crate::formats::input::open_regular(ckpt.file_path(file))
                    .map_err(|e| CopyError::Io(std::io::Error::other(e)))
            };
            let mut feed = |chunk: &[u8]| {
                digester.update(chunk);
                Ok(())
            };
            crate::save::stitch::put_together(
                ckpt,
                (id, index),
                &mut open,
                copier,
                crate::save::stitch::Sink::Stream {
                    cast: None,
                    feed: &mut feed,
                },
                &progress.cancel,
            )
            .map_err(|failed| failed.error)?;
        }
        Source::Tied(_) | Source::None => return Ok(None),
    }
    Ok(Some(digester.finish().hash))
}

/// A source's hash, or the finding that says why it could not be read (`what`, then
/// the cause); a cancel ends the verification.
fn hashed(
    outcome: Result<u128, CopyError>,
    name: &str,
    what: &str,
    findings: &mut Vec<Finding>,
) -> Result<Option<u128>, VerifyError> {
    match outcome {
        Ok(hash) => Ok(Some(hash)),
        Err(CopyError::Cancelled) => Err(VerifyError::Cancelled),
        Err(e) => {
            findings.push(Finding::difference(
                Kind::Unreadable,
                name,
                format!("{what}: {}", describe(&e)),
            ));
            Ok(None)
        }
    }
}

fn read_into(
    copier: &mut Copier,
    at: (&File, u64),
    len: u64,
    cast: Option<(crate::types::DType, crate::types::DType)>,
    progress: &Progress,
    digester: &mut Digester,
) -> Result<(), CopyError> {
    copier.stream(at, len, cast, &progress.cancel, &mut |chunk| {
        digester.update(chunk);
        progress
            .read
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Ok(())
    })
}

fn describe(e: &CopyError) -> String {
    match e {
        CopyError::Io(io) => io.to_string(),
        CopyError::ShortSource { copied } => format!("the file ends after {copied} bytes of it"),
        CopyError::Cancelled => "cancelled".to_owned(),
    }
}
