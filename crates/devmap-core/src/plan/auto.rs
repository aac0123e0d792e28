//! accelerate's `infer_auto_device_map`, re-expressed over a checkpoint's module tree.
//!
//! The walk, as accelerate does it: modules are treated in definition order, GPU 0
//! first, then 1, …, then cpu, then disk; a module that does not fit is split into its
//! parameters and children unless it is a no-split layer; once a device is passed, later
//! modules never go back to it; on the main devices (the first GPU and the cpu) room
//! for the largest no-split layer stays reserved; tied parameters are placed with the
//! module that reaches them first. The result is cleaned the way accelerate cleans it:
//! keys whose children all share a device collapse into their parent.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::order::{PlanNode, PlanTree};
use super::view::PlanView;
use crate::model::checkpoint::Checkpoint;
use crate::types::placement::{DeviceMap, Placement};

/// What the planner is asked to do.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// Budgets in accelerate's `max_memory` sense. GPUs, `mps` and `cpu`; `disk` is
    /// always available after them.
    pub max_memory: Vec<(Placement, u64)>,
    /// Module names (with `*` matching one name component) that are never split.
    /// Empty: the repeated decoder block (`…layers.N`, `…h.N`, `…blocks.N`);
    /// `["none"]`: every module may be split.
    pub no_split: Vec<String>,
    /// The dtype the model will be loaded as (`torch_dtype`); `None`: as stored.
    pub dtype: Option<crate::types::DType>,
    /// `from_pretrained`'s `device_map` string.
    pub mode: PlanMode,
}

/// How `from_pretrained(device_map=...)` plans: every mode but `sequential` first
/// caps the GPUs to balance the model over them (transformers'
/// `get_balanced_memory`), then walks as `sequential` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlanMode {
    /// `"auto"` and `"balanced"` (the same in transformers 5).
    #[default]
    Balanced,
    /// `"balanced_low_0"`: as little as fits on GPU 0, which generation uses for
    /// other work.
    BalancedLow0,
    /// `"sequential"`: GPU 0 filled first, then 1, …
    Sequential,
}

impl PlanMode {
    /// The name `from_pretrained` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            PlanMode::Balanced => "auto",
            PlanMode::BalancedLow0 => "balanced_low_0",
            PlanMode::Sequential => "sequential",
        }
    }

    /// The mode `from_pretrained` takes under this name.
    pub fn parse(text: &str) -> Option<PlanMode> {
        match text {
            "auto" | "balanced" => Some(PlanMode::Balanced),
            "balanced_low_0" => Some(PlanMode::BalancedLow0),
            "sequential" => Some(PlanMode::Sequential),
            _ => None,
        }
    }
}

/// A device map and the reasons behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub map: DeviceMap,
    /// Every split and every move to the next device, in the order they happened.
    pub explain: Vec<String>,
    /// Bytes each device received (plus the reservation on main devices it was left
    /// with), as accelerate counts them.
    pub used: Vec<(Placement, u64)>,
    /// Set when the walk order and no-split modules came from name heuristics, not
    /// from the architecture table: the plan may differ from accelerate's, said plainly.
    pub heuristics: Option<String>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanningError {
    #[error("--max-memory names no device; give e.g. 0=22GiB,cpu=64GiB")]
    NoDevices,
    #[error("the model has no tensors to place")]
    Empty,
}

/// Where the walk order, no-split modules and ties come from: transformers' own classes
/// (the architecture table) or, for an architecture the table lacks, name heuristics.
fn architecture_note(ckpt: &Checkpoint, from_table: bool) -> String {
    let archs = &ckpt.config.architectures;
    let source = crate::model::arch::source();
    match (crate::model::arch::lookup(archs), archs.first()) {
        (Some(_), Some(arch)) if from_table => format!(
            "{arch}: walk order, no-split modules and ties as {source}'s class defines them"
        ),
        (Some(_), Some(arch)) => format!(
            "{arch} is in devmap's architecture table ({source}), but not under these names: module order and no-split blocks follow name heuristics, which may differ from accelerate"
        ),
        (None, Some(_)) => format!(
            "{} is not in devmap's architecture table ({source}): module order and no-split blocks follow name heuristics (embeddings, numbered blocks, norm, head), which may differ from accelerate",
            archs.join(", ")
        ),
        (_, None) => format!(
            "config.json names no architecture: module order and no-split blocks follow name heuristics ({source}'s table needs `architectures`), which may differ from accelerate"
        ),
    }
}

/// accelerate's device order: GPUs by index, then mps, then cpu, then disk.
fn device_order(max_memory: &[(Placement, u64)]) -> Vec<Placement> {
    let mut gpus: Vec<Placement> = max_memory
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| matches!(p, Placement::Gpu(_)))
        .collect();
    gpus.sort();
    gpus.dedup();
    for p in [Placement::Mps, Placement::Cpu] {
        if max_memory.iter().any(|(d, _)| *d == p) {
            gpus.push(p);
        }
    }
    gpus.push(Placement::Disk);
    gpus
}

/// [`Checkpoint::derived`] key of the runtime view.
const RUNTIME_VIEW: u64 = 0;

/// [`Checkpoint::derived`] key of the walk tree for these options (never 0).
fn tree_key(options: &PlanOptions) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    options.no_split.hash(&mut hasher);
    options.dtype.hash(&mut hasher);
    hasher.finish() | 1
}

/// Makes now what [`plan`] with these options (their budgets aside) builds the first
/// time on this checkpoint: the runtime view and the walk tree (120 and 60 ms at 92,000
/// tensors). The inspector calls it as it opens, off the UI thread, so its first `p` is
/// as quick as later ones.
pub fn warm_up(ckpt: &Checkpoint, options: &PlanOptions) {
    prepared(ckpt, options);
}

/// The plan view (the loaded model's names, layout and buffers) and the walk tree, made
/// once per checkpoint and plan options, shared by the copies map edits make.
fn prepared(ckpt: &Checkpoint, options: &PlanOptions) -> (Arc<PlanView>, Arc<PlanTree>) {
    let view = ckpt.derived(RUNTIME_VIEW, || {
        super::view::plan_view(ckpt, crate::model::arch::lookup(&ckpt.config.architectures))
    });
    let viewed = view.ckpt.as_ref().unwrap_or(ckpt);
    let tree = ckpt.derived(tree_key(options), || {
        PlanTree::build(
            viewed,
            (&view.buffers, &view.fixed),
            &options.no_split,
            options.dtype,
        )
    });
    (view, tree)
}

pub fn plan(ckpt: &Checkpoint, options: &PlanOptions) -> Result<Planned, PlanningError> {
    if ckpt.tensors().is_empty() {
        return Err(PlanningError::Empty);
    }
    if options.max_memory.is_empty() {
        return Err(PlanningError::NoDevices);
    }
    // Planned under the names and layout the loaded model has (see `view`), and walked
    // as accelerate walks it: both made once per checkpoint (and plan options), shared
    // by the copies map edits make.
    let (view, tree) = prepared(ckpt, options);
    let ckpt = view.ckpt.as_ref().unwrap_or(ckpt);
    let note = architecture_note(ckpt, tree.from_table);
    let mut explain = vec![note.clone()];
    let max_memory = match options.mode {
        PlanMode::Sequential => options.max_memory.clone(),
        PlanMode::Balanced => balanced(&tree, &options.max_memory, false, &mut explain),
        PlanMode::BalancedLow0 => balanced(&tree, &options.max_memory, true, &mut explain),
    };
    let devices = device_order(&max_memory);
    let budget: HashMap<Placement, u64> = max_memory.iter().copied().collect();
    let gpus: Vec<Placement> = devices
        .iter()
        .copied()
        .filter(|p| matches!(p, Placement::Gpu(_) | Placement::Mps))
        .collect();
    let main_devices: Vec<Placement> = if gpus.contains(&Placement::Mps) {
        vec![Placement::Mps]
    } else if let Some(&first) = gpus.first() {
        vec![first, Placement::Cpu]
    } else {
        vec![Placement::Cpu]
    };
    let ties = ckpt.tie_names();

    let mut queue: VecDeque<usize> = tree.children_in_order(PlanTree::ROOT).into();
    let mut used: HashMap<Placement, i128> = devices.iter().map(|d| (*d, 0)).collect();
    let mut assigned: Vec<(String, Placement)> = Vec::new();
    let heuristics = (!tree.from_table).then_some(note);
    let mut current = 0usize;
    let (mut max_layer, mut max_layer_names) = tree.max_layer(queue.iter().copied());

    while let Some(id) = queue.pop_front() {
        let node: &PlanNode = &tree.nodes[id];
        let name: &str = &node.name;
        max_layer_names.retain(|n| n != name && !n.starts_with(&format!("{name}.")));
        if max_layer_names.is_empty() {
            (max_layer, max_layer_names) =
                tree.max_layer(queue.iter().copied().filter(|&q| !tree.nodes[q].is_param));
        }
        let size = i128::from(node.size);
        // Tie groups reaching outside this module, as accelerate finds them (a
        // substring test on dotted names).
        let inside = |k: &str| format!("{k}.").contains(&format!("{name}."));
        let tied_params: Vec<&str> = ties
            .iter()
            .map(|g| &g.names)
            .filter(|g| g.iter().any(|k| inside(k)) && !g.iter().all(|k| inside(k)))
            .flat_map(|g| g.iter().filter(|k| !inside(k)).map(String::as_str))
            .collect();
        let device = devices[current];
        let mut max_size: Option<i128> = budget.get(&device).map(|&b| i128::from(b));
        if device == Placement::Disk {
            max_size = None;
        }
        let mut reserved = 0i128;
        if main_devices.contains(&device) {
            max_size = max_size.map(|m| m - i128::from(max_layer));
            reserved = i128::from(max_layer);
        }
        // The modules in the queue that hold the tied parameters.
        let mut tied_modules: Vec<usize> = Vec::new();
        let mut size_with_ties = size;
        for p in &tied_params {
            if let Some(&q) = queue.iter().find(|&&q| {
                tree.nodes[q].name == *p || p.starts_with(&format!("{}.", tree.nodes[q].name))
            }) {
                tied_modules.push(q);
                size_with_ties += i128::from(tree.nodes[q].size) - i128::from(tree.size_of(p));
            }
        }
        let used_here = used[&device];
        let fits = max_size.is_none_or(|m| used_here + size_with_ties <= m);
        if fits {
            *used.entry(device).or_default() += size_with_ties;
            assigned.push((name.to_owned(), device));
            for q in tied_modules {
                if let Some(pos) = queue.iter().position(|&x| x == q) {
                    queue.remove(pos);
                }
                assigned.push((tree.nodes[q].name.clone(), device));
                explain.push(format!(
                    "{} goes with {name} to {device}: they hold tied weights",
                    tree.nodes[q].name
                ));
            }
            continue;
        }
        let max = max_size.unwrap_or(i128::MAX);
        if !tied_params.is_empty() && used_here + size <= max {
            // It would fit without its tied partners: split a partner instead.
            let splittable = tied_modules
                .iter()
                .copied()
                .find(|&q| !tree.nodes[q].is_param && tree.splittable(q));
            if let Some(q) = splittable {
                let pos = queue.iter().position(|&x| x == q).unwrap_or(0);
                let mut rest: Vec<usize> = queue.drain(..).collect();
                rest.splice(pos..=pos, tree.children_in_order(q));
                queue = std::iter::once(id).chain(rest).collect();
                (max_layer, max_layer_names) =
                    tree.max_layer(queue.iter().copied().filter(|&x| !tree.nodes[x].is_param));
                explain.push(format!(
                    "{name} fits on {device} but not with its tied partner {}: splitting {}",
                    tree.nodes[q].name, tree.nodes[q].name
                ));
                continue;
            }
        }
        if used_here + size >= max && !node.is_param && tree.splittable(id) {
            explain.push(format!(
                "{name} ({}) does not fit in the {} left on {device}{}: split into its children",
                crate::human_bytes(node.size),
                crate::human_bytes((max - used_here).max(0) as u64),
                reserve_note(reserved, &max_layer_names)
            ));
            let children = tree.children_in_order(id);
            for c in children.into_iter().rev() {
                queue.push_front(c);
            }
            (max_layer, max_layer_names) =
                tree.max_layer(queue.iter().copied().filter(|&x| !tree.nodes[x].is_param));
            continue;
        }

        let next = devices.get(current + 1).copied().unwrap_or(Placement::Disk);
        explain.push(format!(
            "{name} ({}) does not fit in the {} left on {device}{}{}: moving on to {next}",
            crate::human_bytes(size_with_ties as u64),
            crate::human_bytes((max - used_here).max(0) as u64),
            reserve_note(reserved, &max_layer_names),
            if node.is_param || !tree.splittable(id) {
                if node.is_param {
                    ""
                } else {
                    " and it is not split"
                }
            } else {
                ""
            }
        ));
        *used.entry(device).or_default() += reserved;
        current += 1;
        queue.push_front(id);
    }
    let cleaned = clean(assigned);
    let used = devices
        .iter()
        .filter_map(|d| used.get(d).filter(|&&u| u > 0).map(|&u| (*d, u as u64)))
        .collect();
    Ok(Planned {
        map: DeviceMap::new(cleaned),
        explain,
        used,
        heuristics,
    })
}

/// transformers' `get_balanced_memory` on budgets the user gave: with more than one
/// GPU, every GPU but the last is capped at the model's size over the GPUs plus a
/// margin of 1.25 × the largest no-split module or module's own tensors, so the walk
/// spreads the layers; with `low_zero`, GPU 0 gets only what the others cannot hold.
fn balanced(
    tree: &PlanTree,
    max_memory: &[(Placement, u64)],
    low_zero: bool,
    explain: &mut Vec<String>,
) -> Vec<(Placement, u64)> {
    let accelerators = max_memory
        .iter()
        .filter(|(p, b)| matches!(p, Placement::Gpu(_) | Placement::Mps) && *b > 0)
        .count() as u64;
    if accelerators < 2 {
        return max_memory.to_vec();
    }
    let total = tree.nodes[PlanTree::ROOT].size;
    let per_gpu = total
        / if low_zero {
            accelerators - 1
        } else {
            accelerators
        };
    let (largest, what) = tree.largest_unit();
    // Python's int(1.25 * size).
    let margin = (1.25 * largest as f64) as u64;
    let per_gpu = per_gpu + margin;
    let mut gpus: Vec<u32> = max_memory
        .iter()
        .filter_map(|(p, b)| match p {
            Placement::Gpu(i) if *b > 0 => Some(*i),
            _ => None,
        })
        .collect();
    gpus.sort_unstable();
    let mut out = max_memory.to_vec();
    let budget_of = |out: &[(Placement, u64)], i: u32| {
        out.iter()
            .find(|(p, _)| *p == Placement::Gpu(i))
            .map_or(0, |(_, b)| *b)
    };
    // With `low_zero`, GPU 0 keeps its own budget here (transformers caps it at
    // itself) and is cut below.
    for &i in gpus.iter().take(gpus.len().saturating_sub(1)) {
        if low_zero && i == 0 {
            continue;
        }
        if let Some((_, b)) = out.iter_mut().find(|(p, _)| *p == Placement::Gpu(i)) {
            *b = (*b).min(per_gpu);
        }
    }
    if low_zero {
        let others: u64 = (1..accelerators as u32).map(|i| budget_of(&out, i)).sum();
        let least = total.saturating_sub(others);
        if let Some((_, b)) = out.iter_mut().find(|(p, _)| *p == Placement::Gpu(0)) {
            *b = (*b).min(least);
        }
    }
    explain.push(format!(
        "balanced over {accelerators} GPUs (from_pretrained's device_map=\"{}\"): each GPU but the last capped at {} = {} / {} + 1.25 × {} ({what}){}",
        if low_zero { "balanced_low_0" } else { "auto" },
        crate::human_bytes(per_gpu),
        crate::human_bytes(total),
        if low_zero { accelerators - 1 } else { accelerators },
        crate::human_bytes(largest),
        if low_zero { "; GPU 0 holds only what the others cannot" } else { "" }
    ));
    out
}

fn reserve_note(reserved: i128, names: &[String]) -> String {
    if reserved > 0 {
        let largest = names.first().map_or("?", String::as_str);
        format!(
            " ({} kept free for the largest layer, {largest})",
            crate::human_bytes(reserved as u64)
        )
    } else {
        String::new()
    }
}

/// accelerate's `clean_device_map`: where every key under a module maps to one device
/// (and there is more than one key), they become one key for the module, appended at
/// the end as a Python dict would.
pub fn clean(mut map: Vec<(String, Placement)>) -> Vec<(String, Placement)> {
    clean_under(&mut map, "");
    map
}

fn clean_under(map: &mut Vec<(String, Placement)>, module: &str) {
    let prefix = if module.is_empty() {
        String::new()
    } else {
        format!("{module}.")
    };
    let values: Vec<Placement> = map
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(_, v)| *v)
        .collect();
    if values.len() > 1 && values.iter().all(|v| *v == values[0]) {
        map.retain(|(k, _)| !k.starts_with(&prefix));
        map.push((module.to_owned(), values[0]));
    }
    let depth = if module.is_empty() {
        1
    } else {
        module.split('.').count() + 1
    };
    let mut children: Vec<String> = map
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix) && k.len() > module.len())
        .map(|(k, _)| k.split('.').take(depth).collect::<Vec<_>>().join("."))
        .collect();
    children.sort();
    children.dedup();
    for child in children {
        clean_under(map, &child);
    }
}
