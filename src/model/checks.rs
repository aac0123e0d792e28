//! Checks a user debugging a device map wants to hear about. Each returns plain
//! sentences that name the tensors and devices involved.

use std::collections::{BTreeMap, HashSet};

use super::checkpoint::{Checkpoint, Source};
use super::names::covers;
use crate::types::placement::Placement;

/// Names listed in a message before "and N more".
const LIST_LIMIT: usize = 5;

pub fn name_list<S: AsRef<str>>(names: &[S]) -> String {
    let mut out = names
        .iter()
        .take(LIST_LIMIT)
        .map(|n| format!("`{}`", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > LIST_LIMIT {
        out.push_str(&format!(" and {} more", names.len() - LIST_LIMIT));
    }
    out
}

/// All checks, in the order a report lists them.
pub fn run(ckpt: &Checkpoint) -> Vec<String> {
    let offloaded: HashSet<&str> = ckpt
        .tensors
        .iter()
        .filter(|t| matches!(t.source, Source::Offload(_)))
        .map(|t| t.name.as_str())
        .collect();
    let offloaded = &offloaded;
    let mut out = Vec::new();
    out.extend(unmapped(ckpt));
    out.extend(ties_across_devices(ckpt));
    out.extend(offload_not_on_disk(ckpt, offloaded));
    out.extend(disk_without_offload(ckpt, offloaded));
    out.extend(meta_without_data(ckpt));
    out.extend(unused_map_keys(ckpt));
    out.extend(transformers_prefix_traps(ckpt));
    out
}

pub fn unmapped(ckpt: &Checkpoint) -> Option<String> {
    let names: Vec<&str> = ckpt
        .tensors
        .iter()
        .filter(|t| t.placement == Placement::Unmapped)
        .map(|t| t.name.as_str())
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "{} tensor(s) are covered by no device-map entry (unmapped): {}; accelerate would fail to dispatch them, add a key for their module or \"\"",
            names.len(),
            name_list(&names)
        )
    })
}

pub fn ties_across_devices(ckpt: &Checkpoint) -> Vec<String> {
    ckpt.ties
        .iter()
        .filter_map(|g| {
            let first = ckpt.tensors[g.kept()].placement;
            if g.members.iter().all(|&m| ckpt.tensors[m].placement == first) {
                return None;
            }
            let parts: Vec<String> = g
                .members
                .iter()
                .map(|&m| format!("`{}` on {}", ckpt.tensors[m].name, ckpt.tensors[m].placement))
                .collect();
            Some(format!(
                "tied weights are on different devices: {}; accelerate warns and copies them, put their modules on one device",
                parts.join(", ")
            ))
        })
        .collect()
}

pub fn offload_not_on_disk(ckpt: &Checkpoint, offloaded: &HashSet<&str>) -> Option<String> {
    ckpt.device_map.as_ref()?;
    let names: Vec<String> = ckpt
        .tensors
        .iter()
        .filter(|t| offloaded.contains(t.name.as_str()) && t.placement != Placement::Disk)
        .map(|t| format!("{} ({})", t.name, t.placement))
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "{} offload-folder entr(ies) belong to tensors the device map does not put on disk: {}; devmap still treats the offload value as current",
            names.len(),
            name_list(&names)
        )
    })
}

pub fn disk_without_offload(ckpt: &Checkpoint, offloaded: &HashSet<&str>) -> Option<String> {
    let names: Vec<&str> = ckpt
        .tensors
        .iter()
        .filter(|t| t.placement == Placement::Disk && !offloaded.contains(t.name.as_str()))
        .map(|t| t.name.as_str())
        .collect();
    if names.is_empty() {
        return None;
    }
    let folder = match &ckpt.offload_dir {
        Some(d) => format!("the offload folder {} has no entry for them", d.display()),
        None => "there is no offload folder (give --offload-folder)".to_owned(),
    };
    Some(format!(
        "{} tensor(s) are placed on disk but {folder}: {}; their checkpoint bytes are used",
        names.len(),
        name_list(&names)
    ))
}

pub fn meta_without_data(ckpt: &Checkpoint) -> Option<String> {
    let names: Vec<String> = (0..ckpt.tensors.len())
        .filter(|&i| ckpt.data_range(i).is_none())
        .map(|i| format!("{} ({})", ckpt.tensors[i].name, ckpt.tensors[i].placement))
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "{} tensor(s) have no data anywhere, neither in the checkpoint, the offload folder nor a tie partner: {}; they can be inspected but not loaded or saved",
            names.len(),
            name_list(&names)
        )
    })
}

pub fn unused_map_keys(ckpt: &Checkpoint) -> Option<String> {
    let map = ckpt.device_map.as_ref()?;
    let used: HashSet<&str> = ckpt
        .tensors
        .iter()
        .filter_map(|t| ckpt.map_key(t))
        .collect();
    let unused: Vec<&str> = map
        .entries()
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !used.contains(k) && !ckpt.tensors.iter().any(|t| covers(k, &t.name)))
        .collect();
    (!unused.is_empty()).then(|| {
        format!(
            "{} device-map key(s) match no tensor: {}; check for typos or a map from another model",
            unused.len(),
            name_list(&unused)
        )
    })
}

/// Tensors transformers 5 would put on another device than accelerate does: it reads
/// device-map keys as unescaped regex prefixes, trying keys with the most dots first,
/// so `model.layers.1` also captures `model.layers.10.*`.
pub fn transformers_prefix_traps(ckpt: &Checkpoint) -> Vec<String> {
    let Some(map) = ckpt.device_map.as_ref() else {
        return Vec::new();
    };
    let order = map.transformers5_order();
    let fallback = map.get("").unwrap_or(Placement::Cpu);
    let mut traps: BTreeMap<(String, String), (Placement, Placement, usize)> = BTreeMap::new();
    for t in &ckpt.tensors {
        let (their_key, theirs) = match map.locate_transformers5(&order, &t.name) {
            Some(hit) => (hit.key.to_owned(), hit.placement),
            None => ("(none)".to_owned(), fallback),
        };
        let ours = t.placement;
        if theirs == ours || ours == Placement::Unmapped && their_key == "(none)" {
            continue;
        }
        let matched = ckpt.map_key(t).unwrap_or("(none)").to_owned();
        let e = traps
            .entry((their_key, matched))
            .or_insert((theirs, ours, 0));
        e.2 += 1;
    }
    traps
        .into_iter()
        .map(|((trap, matched), (theirs, ours, n))| {
            format!(
                "transformers 5 puts {n} tensor(s) that key `{matched}` places on {ours} on {theirs} instead, by key `{trap}`: it matches keys as regex prefixes with no dot boundary; rename or add keys so both agree"
            )
        })
        .collect()
}

/// Modules that hold no parameters yet appear in accelerate's `hf_device_map` (the
/// rotary embedding's `inv_freq` is a non-persistent buffer, never in a checkpoint).
fn holds_no_parameters(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    last.contains("rotary") || last.contains("dropout") || matches!(last, "drop" | "act" | "act_fn")
}

/// Device-map keys under which no tensor has data: the weights of those modules exist
/// nowhere (the "saved model is almost empty" failure). Keys that only stand behind
/// more specific keys (`""` or a parent of another key) and modules that hold no
/// parameters are not counted.
pub fn keys_without_data(ckpt: &Checkpoint) -> Vec<&str> {
    let Some(map) = ckpt.device_map.as_ref() else {
        return Vec::new();
    };
    let mut has_data = vec![false; map.entries().len()];
    for (id, t) in ckpt.tensors.iter().enumerate() {
        if t.map_key != crate::model::checkpoint::NO_KEY && ckpt.data_range(id).is_some() {
            has_data[t.map_key as usize] = true;
        }
    }
    let keys: Vec<&str> = map.entries().iter().map(|(k, _)| k.as_str()).collect();
    let is_parent = |key: &str| {
        keys.iter()
            .any(|other| *other != key && (key.is_empty() || other.starts_with(&format!("{key}."))))
    };
    keys.iter()
        .enumerate()
        .filter(|&(i, key)| !has_data[i] && !holds_no_parameters(key) && !is_parent(key))
        .map(|(_, key)| *key)
        .collect()
}

/// Tensors a save cannot write: no data anywhere.
pub fn unsaveable(ckpt: &Checkpoint) -> Vec<&str> {
    (0..ckpt.tensors.len())
        .filter(|&i| ckpt.data_range(i).is_none())
        .map(|i| ckpt.tensors[i].name.as_str())
        .collect()
}
