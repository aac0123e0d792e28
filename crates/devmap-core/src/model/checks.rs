//! Checks a user debugging a device map wants to hear about. Each returns
//! [`Warning`]s that name the tensors and devices involved.

use std::collections::{BTreeMap, HashMap};

use super::checkpoint::{Checkpoint, Source};
use super::warning::Warning;
use crate::types::placement::Placement;

pub use super::warning::name_list;

/// The loader's warnings followed by every placement check: all a model says.
pub fn all_warnings(ckpt: &Checkpoint) -> Vec<Warning> {
    let mut all = ckpt.warnings.clone();
    all.extend(run(ckpt));
    all
}

/// All checks, in the order a report lists them.
pub fn run(ckpt: &Checkpoint) -> Vec<Warning> {
    let mut out = Vec::new();
    out.extend(unmapped(ckpt));
    out.extend(ties_across_devices(ckpt));
    out.extend(offload_not_on_disk(ckpt));
    out.extend(disk_without_offload(ckpt));
    out.extend(meta_without_data(ckpt));
    out.extend(unused_map_keys(ckpt));
    out.extend(transformers_prefix_traps(ckpt));
    out
}

pub fn unmapped(ckpt: &Checkpoint) -> Option<Warning> {
    let tensors: Vec<String> = ckpt
        .tensors()
        .iter()
        .filter(|t| t.placement == Placement::Unmapped)
        .map(|t| t.name.to_string())
        .collect();
    (!tensors.is_empty()).then_some(Warning::Unmapped { tensors })
}

pub fn ties_across_devices(ckpt: &Checkpoint) -> Vec<Warning> {
    ckpt.ties
        .iter()
        .filter_map(|g| {
            let first = ckpt.tensors()[g.kept()].placement;
            if g.members
                .iter()
                .all(|&m| ckpt.tensors()[m].placement == first)
            {
                return None;
            }
            let members = g
                .members
                .iter()
                .map(|&m| {
                    (
                        ckpt.tensors()[m].name.to_string(),
                        ckpt.tensors()[m].placement,
                    )
                })
                .collect();
            Some(Warning::TiedAcrossDevices { members })
        })
        .collect()
}

/// Whether the tensor's value comes from the offload folder.
fn offloaded(t: &crate::model::Tensor) -> bool {
    matches!(t.source, Source::Offload(_))
}

pub fn offload_not_on_disk(ckpt: &Checkpoint) -> Option<Warning> {
    ckpt.device_map.as_ref()?;
    let arch = crate::model::arch::lookup(&ckpt.config.architectures);
    // A persistent buffer of a disk-offloaded module is in the offload folder but held
    // on the main device (accelerate's `offload_buffers=False`).
    let buffer = |name: &str| arch.is_some_and(|a| a.is_persistent_buffer(name));
    let tensors: Vec<(String, Placement)> = ckpt
        .tensors()
        .iter()
        .filter(|t| offloaded(t) && t.placement != Placement::Disk && !buffer(&t.name))
        .map(|t| (t.name.to_string(), t.placement))
        .collect();
    (!tensors.is_empty()).then_some(Warning::OffloadNotOnDisk { tensors })
}

pub fn disk_without_offload(ckpt: &Checkpoint) -> Option<Warning> {
    let tensors: Vec<String> = ckpt
        .tensors()
        .iter()
        .filter(|t| t.placement == Placement::Disk && !offloaded(t))
        .map(|t| t.name.to_string())
        .collect();
    (!tensors.is_empty()).then(|| Warning::DiskWithoutOffload {
        tensors,
        offload_dir: ckpt.offload_dir.clone(),
    })
}

pub fn meta_without_data(ckpt: &Checkpoint) -> Option<Warning> {
    let tensors: Vec<(String, Placement)> = (0..ckpt.tensors().len())
        .filter(|&i| !ckpt.has_data(i))
        .map(|i| {
            (
                ckpt.tensors()[i].name.to_string(),
                ckpt.tensors()[i].placement,
            )
        })
        .collect();
    (!tensors.is_empty()).then_some(Warning::NoData { tensors })
}

pub fn unused_map_keys(ckpt: &Checkpoint) -> Option<Warning> {
    let map = ckpt.device_map.as_ref()?;
    // A key is used when some tensor's placement came from it (its index in the map).
    let mut used = vec![false; map.entries().len()];
    for t in ckpt.tensors() {
        if let Some(u) = used.get_mut(t.map_key as usize) {
            *u = true;
        }
    }
    let arch = crate::model::arch::lookup(&ckpt.config.architectures);
    let keys: Vec<String> = map
        .entries()
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|((k, _), _)| k.as_str())
        // `""` covers every tensor there is.
        .filter(|k| (!k.is_empty() || ckpt.tensors().is_empty()) && !names_a_module(ckpt, k))
        // A module without tensors (`rotary_emb`, `act_fn`) is no typo:
        // `hf_device_map` lists them.
        .filter(|k| !holds_no_parameters(ckpt, k, arch))
        .map(str::to_owned)
        .collect();
    (!keys.is_empty()).then_some(Warning::UnusedMapKeys { keys })
}

/// Whether some tensor lies in module `key` (its name is the key, or starts with the
/// key and a dot). In module order the names under a module come right where the key
/// itself would: one binary search, no sorted copy of the names.
fn names_a_module(ckpt: &Checkpoint, key: &str) -> bool {
    let Err(at) = crate::model::checkpoint::search(ckpt.tensors(), key) else {
        return true;
    };
    ckpt.tensors()
        .get(at)
        .is_some_and(|t| crate::model::names::covers(key, &t.name))
}

/// Whether some string in `sorted` starts with `key.` (a module below `key`). Such
/// strings sort together, from the first one at or after `key.`: one binary search.
fn has_a_name_below(sorted: &[&str], key: &str) -> bool {
    let dotted = format!("{key}.");
    let at = sorted.partition_point(|n| *n < dotted.as_str());
    sorted.get(at).is_some_and(|n| n.starts_with(&dotted))
}

/// Tensors transformers 5 would put on another device than accelerate does: it reads
/// device-map keys as unescaped regex prefixes, trying keys with the most dots first,
/// so `model.layers.1` also captures `model.layers.10.*`.
pub fn transformers_prefix_traps(ckpt: &Checkpoint) -> Vec<Warning> {
    let Some(map) = ckpt.device_map.as_ref() else {
        return Vec::new();
    };
    let index = map.transformers5_index();
    let fallback = map.get("").unwrap_or(Placement::Cpu);
    let mut traps: BTreeMap<(String, String), (Placement, Placement, usize)> = BTreeMap::new();
    // A key matches the start of a name, so names that agree on their first `longest`
    // bytes get the same answer: one search per distinct start (a few hundred at 92k
    // tensors), not one per tensor.
    let longest = map
        .entries()
        .iter()
        .map(|(k, _)| k.len())
        .max()
        .unwrap_or(0);
    let mut answers: HashMap<&str, Option<(usize, Placement)>> = HashMap::new();
    let mut last: Option<(&str, Option<(usize, Placement)>)> = None;
    for (id, t) in ckpt.tensors().iter().enumerate() {
        // transformers matches the keys against the names the loaded model has.
        let name = ckpt.loaded_name(id).unwrap_or(&t.name);
        let mut cut = name.len().min(longest);
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        // Neighbours in module order mostly share their start: the last answer first.
        let start = &name[..cut];
        let hit = match last {
            Some((prev, hit)) if prev == start => hit,
            _ => *answers
                .entry(start)
                .or_insert_with(|| index.locate(name).map(|hit| (hit.index, hit.placement))),
        };
        last = Some((start, hit));
        let (their_key, theirs) = match hit {
            Some((index, placement)) => (map.entries()[index].0.as_str(), placement),
            None => ("(none)", fallback),
        };
        let ours = t.placement;
        if theirs == ours || ours == Placement::Unmapped && hit.is_none() {
            continue;
        }
        let matched = ckpt.map_key(t).unwrap_or("(none)").to_owned();
        let e = traps
            .entry((their_key.to_owned(), matched))
            .or_insert((theirs, ours, 0));
        e.2 += 1;
    }
    traps
        .into_iter()
        .map(
            |((their_key, key), (theirs, ours, count))| Warning::Transformers5Placement {
                count,
                key,
                ours,
                theirs,
                their_key,
            },
        )
        .collect()
}

/// Modules that hold no parameters yet appear in accelerate's `hf_device_map` (the
/// rotary embedding's `inv_freq` is a non-persistent buffer, never in a checkpoint):
/// those the user's transformers named, the architecture table's empty modules, else
/// these names.
fn holds_no_parameters(
    ckpt: &Checkpoint,
    key: &str,
    arch: Option<&crate::model::arch::Arch>,
) -> bool {
    if ckpt.holds_no_tensors(key) || arch.is_some_and(|a| a.is_empty_module(key)) {
        return true;
    }
    let last = key.rsplit('.').next().unwrap_or(key);
    last.contains("rotary")
        || last.contains("dropout")
        || matches!(
            last,
            "drop" | "act" | "act_fn" | "activation_fn" | "pos_emb" | "rope"
        )
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
    for (id, t) in ckpt.tensors().iter().enumerate() {
        if t.map_key != crate::model::checkpoint::NO_KEY && ckpt.has_data(id) {
            has_data[t.map_key as usize] = true;
        }
    }
    let keys: Vec<&str> = map.entries().iter().map(|(k, _)| k.as_str()).collect();
    // Keys that stand behind a more specific key: `""` when there is another, and any
    // key some other key starts with followed by a dot (found by binary search in the
    // sorted keys: no cost that grows with a key's length squared).
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    let is_parent = |key: &str| {
        if key.is_empty() {
            keys.len() > 1
        } else {
            has_a_name_below(&sorted, key)
        }
    };
    let arch = crate::model::arch::lookup(&ckpt.config.architectures);
    keys.iter()
        .enumerate()
        .filter(|&(i, key)| {
            !has_data[i] && !holds_no_parameters(ckpt, key, arch) && !is_parent(key)
        })
        .map(|(_, key)| *key)
        .collect()
}
