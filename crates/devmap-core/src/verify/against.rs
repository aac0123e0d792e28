//! `--against DIR`: what a save of DIR writes, tensor by tensor, from the saver's own
//! plan and recipes, so verify and save cannot disagree about a value.

use std::collections::HashMap;
use std::path::Path;

use super::report::{Finding, Kind};
use super::written::Written;
use crate::model::checkpoint::Checkpoint;
use crate::save::shards::PlannedTensor;
use crate::save::{SaveError, SaveOptions, SavePlan};

/// A model and the plan of saving it: the reference a checkpoint is compared with
/// (what a save writes; `verify::expects` is transformers' view instead).
pub struct SaveReference<'a> {
    pub(super) ckpt: &'a Checkpoint,
    pub(super) plan: SavePlan,
    /// Whether the save copies config.json (not with `--weights-only`).
    copies_config: bool,
    /// What fills staged sources (a live model's GPU tensors) when they are read again.
    pub(super) stage: Option<crate::save::stage::StageRef>,
}

impl<'a> SaveReference<'a> {
    /// What `devmap save` of `ckpt` with `options` writes (the shard size does not
    /// matter: tensors are compared by name).
    pub fn new(
        ckpt: &'a Checkpoint,
        options: &SaveOptions,
    ) -> Result<SaveReference<'a>, SaveError> {
        Ok(SaveReference {
            ckpt,
            plan: crate::save::plan(ckpt, options)?,
            copies_config: true,
            stage: options.stage.clone(),
        })
    }

    /// A plan already made (the one a save just wrote).
    pub fn from_plan(ckpt: &'a Checkpoint, plan: SavePlan) -> SaveReference<'a> {
        SaveReference {
            ckpt,
            plan,
            copies_config: true,
            stage: None,
        }
    }

    /// Staged sources (a live model's GPU tensors) are read again through `stage`.
    #[must_use]
    pub fn with_stage(mut self, stage: Option<crate::save::stage::StageRef>) -> SaveReference<'a> {
        self.stage = stage;
        self
    }

    /// The save wrote the weights only (`--weights-only`): no config.json is expected.
    #[must_use]
    pub fn weights_only(mut self) -> SaveReference<'a> {
        self.copies_config = false;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.ckpt.dir
    }

    /// Whether the save copies a config.json: the source has one, and the save was
    /// not `--weights-only`.
    pub fn has_config(&self) -> bool {
        self.copies_config && std::fs::symlink_metadata(self.ckpt.dir.join("config.json")).is_ok()
    }

    pub(super) fn name<'p>(&'p self, p: &PlannedTensor) -> std::borrow::Cow<'p, str> {
        p.name(self.ckpt)
    }

    pub(super) fn writes(&self, name: &str) -> bool {
        self.planned().any(|p| p.name(self.ckpt) == name)
    }

    pub(super) fn planned(&self) -> impl Iterator<Item = &PlannedTensor> {
        self.plan.planned()
    }
}

/// Pairs each planned tensor with the written one of its name: names missing on either
/// side, and dtypes or shapes that differ, are findings. Returns `(written index,
/// planned tensor)` for the pairs whose content is to be compared.
pub(super) fn match_up<'e>(
    written: &Written,
    expected: &'e SaveReference<'_>,
    findings: &mut Vec<Finding>,
) -> Vec<(usize, &'e PlannedTensor)> {
    let by_name: HashMap<&str, usize> = written
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let dropped: HashMap<&str, &str> = expected
        .plan
        .dropped_ties
        .iter()
        .map(|(d, k)| (d.as_str(), k.as_str()))
        .collect();
    let mut pairs = Vec::new();
    let mut matched = vec![false; written.tensors.len()];
    for p in expected.planned() {
        let name = expected.name(p);
        let Some(&i) = by_name.get(&*name) else {
            findings.push(Finding::difference(
                Kind::MissingTensor,
                name,
                format!(
                    "is missing: a save of {} writes it",
                    crate::text::path(expected.dir())
                ),
            ));
            continue;
        };
        matched[i] = true;
        let w = &written.tensors[i];
        let shape = p.shape(expected.ckpt);
        if w.dtype != p.dtype {
            findings.push(Finding::difference(
                Kind::Dtype,
                name,
                format!("is {}, a save writes {}", w.dtype, p.dtype),
            ));
        } else if w.shape != shape {
            findings.push(Finding::difference(
                Kind::Shape,
                name,
                format!("has shape {:?}, a save writes {:?}", w.shape, shape),
            ));
        } else {
            pairs.push((i, p));
        }
    }
    for (i, w) in written.tensors.iter().enumerate() {
        if matched[i] {
            continue;
        }
        let message = match dropped.get(w.name.as_str()) {
            Some(kept) => {
                format!("is a tied copy of `{kept}`, which a save writes once (under `{kept}`)")
            }
            None => format!(
                "is not in {}: a save of it does not write this tensor",
                crate::text::path(expected.dir())
            ),
        };
        findings.push(Finding::difference(Kind::ExtraTensor, &w.name, message));
    }
    pairs
}

/// Names the save drops as tied copies that hold values of their own in the source:
/// each is compared with the value written under the kept name, read from the source
/// as stored. The tie's evidence (a config, a `--tie`) decided the drop; the source's
/// own bytes decide whether it lost anything, so a head tied by mistake is a
/// difference, not "0 differences" by the same decision replayed.
pub(super) fn dropped_ties(
    expected: &SaveReference<'_>,
    progress: &super::Progress,
    findings: &mut Vec<Finding>,
) -> Result<(), super::VerifyError> {
    use crate::model::checkpoint::Source;
    let ckpt = expected.ckpt;
    let mut copier = crate::save::copy::Copier::with_stream_chunk(super::READ_CHUNK);
    for (dropped, kept) in &expected.plan.dropped_ties {
        let (Some(d), Some(k)) = (ckpt.index_of(dropped), ckpt.index_of(kept)) else {
            continue;
        };
        let own = ckpt.tensors()[d].source;
        let Some(kept_source) = ckpt.data_source(k) else {
            continue;
        };
        if matches!(own, Source::Tied(_) | Source::None) || own == kept_source {
            continue;
        }
        let evidence = ckpt
            .tie_evidence(dropped)
            .map_or("tied", crate::model::checkpoint::TieEvidence::label);
        let (a, b) = (&ckpt.tensors()[d], &ckpt.tensors()[k]);
        if a.dtype != b.dtype {
            findings.push(Finding::note(
                Kind::TieLostValues,
                dropped,
                format!(
                    "is dropped as a tied copy of `{kept}` ({evidence}), but the source stores it as {} and `{kept}` as {}: their values were not compared",
                    a.dtype, b.dtype
                ),
            ));
            continue;
        }
        let hash = |id, source, copier: &mut _| {
            super::stored_hash(ckpt, id, source, copier, progress).map_err(|e| match e {
                crate::save::copy::CopyError::Cancelled => super::VerifyError::Cancelled,
                other => super::VerifyError::Format(crate::formats::FormatError::invalid(
                    &ckpt.dir,
                    format!(
                        "`{}` cannot be read to compare it with its tie partner: {}",
                        ckpt.tensors()[id].name,
                        super::describe(&other)
                    ),
                )),
            })
        };
        let ours = hash(d, own, &mut copier)?;
        let theirs = hash(k, kept_source, &mut copier)?;
        if ours != theirs {
            findings.push(Finding::difference(
                Kind::TieLostValues,
                dropped,
                format!(
                    "is dropped as a tied copy of `{kept}` ({evidence}), but the source holds different values for it: the saved model loses them (save with --keep-tied, or without the tie)"
                ),
            ));
        }
    }
    Ok(())
}
