//! The check against what transformers expects, with the user's transformers itself as
//! the oracle ([`crate::oracle`]): the names, shapes and float32 modules of the exact
//! config, as `save_pretrained` writes them or as the loaded model names them
//! (whichever the checkpoint follows), instead of the table's fit. Names what
//! transformers' loader would report: MISSING, UNEXPECTED, MISMATCHED.

use std::collections::{HashMap, HashSet};

use super::report::{Finding, Kind};
use super::written::{Written, WrittenTensor};
use crate::oracle::{Answer, Entry};
use crate::types::DType;

/// Checks `written` against `answer`; findings go to `findings`.
pub fn check(written: &Written, answer: &Answer, findings: &mut Vec<Finding>) {
    if let Some(reason) = &answer.refused {
        findings.push(Finding::difference(
            Kind::ConfigRefused,
            "config.json",
            format!(
                "transformers {} refuses it: {reason}; from_pretrained fails before it loads a tensor",
                answer.transformers
            ),
        ));
        return;
    }
    let present: HashMap<&str, &WrittenTensor> = written
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let quantized = written
        .config
        .as_ref()
        .is_some_and(|c| c.quantization.is_some());
    // Tied copies are in the loaded model's state dict but never saved: neither
    // missing nor unexpected.
    let tied: HashSet<&str> = answer.tied.iter().map(String::as_str).collect();
    let saved = problems(
        &answer.saved,
        &present,
        (answer, quantized, &tied),
        &HashSet::new(),
    );
    // The form the checkpoint follows; the other one's names, if any, are a layout
    // mixed into it.
    let (chosen, other): (_, &[Entry]) = match &answer.runtime {
        Some(runtime) => {
            let saved_names: HashSet<&str> = answer.saved.iter().map(|e| e.name.as_str()).collect();
            let optional: HashSet<&str> = runtime
                .iter()
                .map(|e| e.name.as_str())
                .filter(|n| tied.contains(n) && !saved_names.contains(n))
                .collect();
            let loaded = problems(runtime, &present, (answer, quantized, &tied), &optional);
            if loaded.len() < saved.len() {
                (loaded, &answer.saved)
            } else {
                (saved, runtime)
            }
        }
        None => (saved, &[]),
    };
    let in_other: HashSet<&str> = other.iter().map(|e| e.name.as_str()).collect();
    let arch = &answer.architecture;
    let source = answer.source();
    for p in chosen {
        findings.push(match p {
            Problem::Missing(e) => Finding::difference(
                Kind::Missing,
                &e.name,
                format!(
                    "MISSING: {arch} has it (shape {:?}, {source}) but the checkpoint does not; transformers would leave it randomly initialised",
                    e.shape
                ),
            ),
            Problem::Mismatched(e, have) => Finding::difference(
                Kind::Mismatched,
                &e.name,
                format!(
                    "MISMATCHED: shape {have:?}, but {arch} expects {:?} ({source}); transformers refuses to load it",
                    e.shape
                ),
            ),
            Problem::Unexpected(name) if in_other.contains(name) => Finding::difference(
                Kind::MixedLayout,
                name,
                format!(
                    "UNEXPECTED: {arch}'s checkpoint holds this tensor in the other layout (fused experts or renamed modules) than the rest ({source}); a mix of the two does not load as one model"
                ),
            ),
            Problem::Unexpected(name) => Finding::difference(
                Kind::Unexpected,
                name,
                format!(
                    "UNEXPECTED: {arch} has no such tensor for this config.json ({source}); transformers would ignore it"
                ),
            ),
        });
    }
    kept_float32(written, answer, findings);
}

enum Problem<'a> {
    Missing(&'a Entry),
    Mismatched(&'a Entry, Vec<u64>),
    Unexpected(&'a str),
}

/// What transformers would report of `present` against the form `expected`, given
/// its answer, whether the checkpoint is quantized (scales are no UNEXPECTED) and the
/// tied names; `optional` names may be absent.
fn problems<'a>(
    expected: &'a [Entry],
    present: &HashMap<&'a str, &'a WrittenTensor>,
    (answer, quantized, tied): (&Answer, bool, &HashSet<&str>),
    optional: &HashSet<&str>,
) -> Vec<Problem<'a>> {
    let mut out = Vec::new();
    let mut known: HashSet<&str> = HashSet::with_capacity(expected.len());
    for e in expected {
        known.insert(&e.name);
        match present.get(e.name.as_str()) {
            None if optional.contains(e.name.as_str()) || answer.ignores_missing(&e.name) => {}
            None => out.push(Problem::Missing(e)),
            Some(t) => {
                let have: Vec<u64> = t.shape.iter().collect();
                if have != e.shape {
                    out.push(Problem::Mismatched(e, have));
                }
            }
        }
    }
    let mut unexpected: Vec<&str> = present
        .keys()
        .copied()
        .filter(|n| {
            let accounted = known.contains(n)
                || tied.contains(n)
                || answer.ignores_unexpected(n)
                || (quantized && crate::save::fp8::is_companion(n));
            !accounted
        })
        .collect();
    unexpected.sort_unstable();
    out.extend(unexpected.into_iter().map(Problem::Unexpected));
    out
}

/// Tensors transformers holds in float32 at the config's dtype, written in another
/// floating dtype.
fn kept_float32(written: &Written, answer: &Answer, findings: &mut Vec<Finding>) {
    let Some(dtype) = answer.dtype.filter(|&d| d != DType::F32) else {
        return;
    };
    super::expects::kept_float32_findings(
        written,
        dtype,
        |name| answer.keeps_fp32(name).then(|| answer.source()),
        findings,
    );
}
