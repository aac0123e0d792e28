//! `plan --reserve-kv`: a device map whose devices hold their weights *and* the KV
//! cache their layers make. The planner itself places weights only (as
//! `from_pretrained` does), so the reservation is a search over budgets (see
//! [`plan_reserving_kv`]); the budgets it ends with are the `max_memory` to give
//! `from_pretrained` for that map.

use super::activation::{Activations, activations_by_device};
use super::auto::{PlanOptions, Planned, PlanningError, plan};
use super::kv::{KvCache, cache_device, execution_device, layer_placements};
use crate::model::checkpoint::Checkpoint;
use crate::types::placement::{DeviceMap, Placement};

/// Rounds of lowering at most; a handful settle every model tried (each round can only
/// lower budgets).
const ROUNDS: usize = 32;

/// The bytes of `cache` each device holds under `map`: a layer's cache where the layer
/// computes (its own device, or for a layer on cpu or disk the map's execution device).
pub fn kv_by_device(ckpt: &Checkpoint, map: &DeviceMap, cache: &KvCache) -> Vec<(Placement, u64)> {
    let places = layer_placements(ckpt, map, cache.layers.len());
    let main = execution_device(map.entries().iter().map(|(_, p)| *p));
    let mut on: Vec<(Placement, u64)> = Vec::new();
    for (layer, place) in cache.layers.iter().zip(places) {
        let place = cache_device(place.unwrap_or(Placement::Cpu), main);
        match on.iter_mut().find(|(p, _)| *p == place) {
            Some((_, b)) => *b += layer.bytes,
            None => on.push((place, layer.bytes)),
        }
    }
    on
}

/// The weights each device holds while the model runs under `map`, as loaded in
/// `dtype` (`None`: as stored): the tensors placed there (a tied tensor once), and on
/// the execution device room for the largest offloaded module — a map key on cpu or
/// disk, which accelerate's hooks bring there for its forward, one at a time. Unlike
/// the planner's accounting ([`Planned::used`]), no room kept free for a layer that
/// never comes.
pub fn weights_by_device(
    ckpt: &Checkpoint,
    map: &DeviceMap,
    dtype: Option<crate::types::DType>,
) -> Vec<(Placement, u64)> {
    use std::collections::HashMap;
    let arch = crate::model::arch::lookup(&ckpt.config.architectures);
    let main = execution_device(map.entries().iter().map(|(_, p)| *p));
    let mut on: Vec<(Placement, u64)> = Vec::new();
    let mut offloaded: HashMap<u32, u64> = HashMap::new();
    for (id, t) in ckpt.tensors().iter().enumerate() {
        if ckpt
            .tie_group(id)
            .is_some_and(|g| g.members.first() != Some(&id))
        {
            continue;
        }
        let (device, key) = crate::model::checkpoint::place(Some(map), &t.name, arch);
        let bytes = super::order::loaded_bytes(t, dtype, super::order::Held::AsLoaded);
        if matches!(device, Placement::Cpu | Placement::Disk) && main != Placement::Cpu {
            *offloaded.entry(key).or_default() += bytes;
        }
        match on.iter_mut().find(|(p, _)| *p == device) {
            Some((_, b)) => *b += bytes,
            None => on.push((device, bytes)),
        }
    }
    if let Some(&largest) = offloaded.values().max() {
        match on.iter_mut().find(|(p, _)| *p == main) {
            Some((_, b)) => *b += largest,
            None => on.push((main, largest)),
        }
    }
    on
}

/// The bytes `on` holds on `device`.
pub fn on_device(on: &[(Placement, u64)], device: Placement) -> u64 {
    on.iter()
        .filter(|(p, _)| *p == device)
        .map(|(_, b)| b)
        .sum()
}

/// A plan that leaves room for the KV cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Reserved {
    pub planned: Planned,
    /// The budgets the weights were planned against: the given ones less room for the
    /// cache (disk is never lowered).
    pub weight_budgets: Vec<(Placement, u64)>,
    /// The cache (and activations, when asked) each device holds under the final map.
    pub kv_on: Vec<(Placement, u64)>,
    /// The weights each device holds while it runs under that map
    /// ([`weights_by_device`]).
    pub weights_on: Vec<(Placement, u64)>,
    /// Plans made to find it.
    pub rounds: usize,
}

/// Whether a device can hold cache: every one but disk, and the CPU only when no GPU
/// is given (otherwise offloaded layers compute, and cache, on the first GPU).
fn holds_cache(device: Placement, budgets: &[(Placement, u64)]) -> bool {
    match device {
        Placement::Disk => false,
        Placement::Cpu => !budgets
            .iter()
            .any(|(p, _)| matches!(p, Placement::Gpu(_) | Placement::Mps)),
        _ => true,
    }
}

/// Plans with `options`' budgets lowered to leave room for the KV cache each device's
/// layers make (and with `act`, the activations of one forward):
///
/// 1. every device that holds cache starts at its budget × weights / (weights + cache)
///    (what uniform layers would need);
/// 2. while a device's weights + cache exceed its budget, its weight budget is lowered
///    to what the cache leaves (budgets only go down, so this ends, at a map that fits);
/// 3. each GPU in turn, its weight budget is raised as far as the map still fits
///    (a bisection to 1 MiB), so no GPU is left emptier than it must be.
pub fn plan_reserving_kv(
    ckpt: &Checkpoint,
    options: &PlanOptions,
    cache: &KvCache,
    act: Option<&Activations>,
) -> Result<Reserved, PlanningError> {
    let given = &options.max_memory;
    // What runs beside the weights on each device: its cache and, with `act`, one
    // forward's activations.
    let runtime = |map: &DeviceMap| {
        let mut on = kv_by_device(ckpt, map, cache);
        if let Some(act) = act {
            for (device, bytes) in activations_by_device(ckpt, map, act, cache.layers.len()) {
                match on.iter_mut().find(|(p, _)| *p == device) {
                    Some((_, b)) => *b += bytes,
                    None => on.push((device, bytes)),
                }
            }
        }
        on
    };
    let runtime_total = cache.bytes() + act.map_or(0, |a| a.per_layer + a.logits);
    let mut rounds = 0;
    let mut attempt = |budgets: &[(Placement, u64)]| -> Result<Reserved, PlanningError> {
        rounds += 1;
        let asked = PlanOptions {
            max_memory: budgets.to_vec(),
            ..options.clone()
        };
        let planned = plan(ckpt, &asked)?;
        let kv_on = runtime(&planned.map);
        let weights_on = weights_by_device(ckpt, &planned.map, options.dtype);
        Ok(Reserved {
            planned,
            weight_budgets: budgets.to_vec(),
            kv_on,
            weights_on,
            rounds,
        })
    };
    // Whether every device (disk aside) holds its weights and what runs within its
    // given budget.
    let fits = |r: &Reserved| {
        given
            .iter()
            .filter(|(d, _)| *d != Placement::Disk)
            .all(|&(d, budget)| on_device(&r.weights_on, d) + on_device(&r.kv_on, d) <= budget)
    };
    // 1. Uniform layers' share.
    let unreserved = attempt(given)?;
    if fits(&unreserved) {
        return Ok(unreserved);
    }
    let weights: u64 = unreserved.planned.used.iter().map(|(_, b)| b).sum();
    let share = weights as f64 / (weights + runtime_total).max(1) as f64;
    let mut budgets: Vec<(Placement, u64)> = given
        .iter()
        .map(|&(d, b)| {
            if holds_cache(d, given) {
                (d, (b as f64 * share) as u64)
            } else {
                (d, b)
            }
        })
        .collect();
    // 2. Down until it fits.
    let mut best = loop {
        let now = attempt(&budgets)?;
        let lowered: Vec<(Placement, u64)> = budgets
            .iter()
            .zip(given)
            .map(|(&(d, b), &(_, full))| match d {
                Placement::Disk => (d, b),
                _ => (d, b.min(full.saturating_sub(on_device(&now.kv_on, d)))),
            })
            .collect();
        if lowered == budgets || now.rounds >= ROUNDS {
            break now;
        }
        budgets = lowered;
    };
    // 3. Up as far as it still fits, one GPU at a time.
    const STEP: u64 = 1 << 20;
    for i in 0..budgets.len() {
        let (device, full) = given[i];
        if !matches!(device, Placement::Gpu(_) | Placement::Mps) || !fits(&best) {
            continue;
        }
        let (mut low, mut high) = (best.weight_budgets[i].1, full);
        while high - low > STEP {
            let mid = low + (high - low) / 2;
            let mut trial = best.weight_budgets.clone();
            trial[i].1 = mid;
            let r = attempt(&trial)?;
            if fits(&r) {
                low = mid;
                best = r;
            } else {
                high = mid;
            }
        }
    }
    Ok(best)
}
