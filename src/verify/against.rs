//! `--against DIR`: what a save of DIR writes, tensor by tensor, from the saver's own
//! plan and recipes, so verify and save cannot disagree about a value.

use std::collections::HashMap;
use std::path::Path;

use super::report::{Finding, Kind};
use super::written::Written;
use crate::model::checkpoint::Checkpoint;
use crate::save::shards::PlannedTensor;
use crate::save::{SaveError, SaveOptions, SavePlan};

/// A model and the plan of saving it: the reference a checkpoint is compared with.
pub struct Expected<'a> {
    pub(super) ckpt: &'a Checkpoint,
    pub(super) plan: SavePlan,
    /// Whether the save copies config.json (not with `--weights-only`).
    copies_config: bool,
    /// What fills staged sources (a live model's GPU tensors) when they are read again.
    pub(super) stage: Option<crate::save::stage::StageRef>,
}

impl<'a> Expected<'a> {
    /// What `devmap save` of `ckpt` with `options` writes (the shard size does not
    /// matter: tensors are compared by name).
    pub fn new(ckpt: &'a Checkpoint, options: &SaveOptions) -> Result<Expected<'a>, SaveError> {
        Ok(Expected {
            ckpt,
            plan: crate::save::plan(ckpt, options)?,
            copies_config: true,
            stage: options.stage.clone(),
        })
    }

    /// A plan already made (the one a save just wrote).
    pub fn from_plan(ckpt: &'a Checkpoint, plan: SavePlan) -> Expected<'a> {
        Expected {
            ckpt,
            plan,
            copies_config: true,
            stage: None,
        }
    }

    /// Staged sources (a live model's GPU tensors) are read again through `stage`.
    #[must_use]
    pub fn with_stage(mut self, stage: Option<crate::save::stage::StageRef>) -> Expected<'a> {
        self.stage = stage;
        self
    }

    /// The save wrote the weights only (`--weights-only`): no config.json is expected.
    #[must_use]
    pub fn weights_only(mut self) -> Expected<'a> {
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

    pub(super) fn name(&self, p: &PlannedTensor) -> &str {
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
    expected: &'e Expected<'_>,
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
        let Some(&i) = by_name.get(name) else {
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
