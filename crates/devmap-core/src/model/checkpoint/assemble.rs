//! A checkpoint put together from what a reader found ([`Parts`]): tensors sorted into
//! module order, ties mapped onto them, each tensor placed by the device map.

use std::path::PathBuf;

use super::{
    ByteRange, Checkpoint, DType, DeviceMap, NO_KEY, NamedTie, Piece, Placement, Source,
    SourceFile, Tensor, TensorId, TieGroup,
};

impl Checkpoint {
    /// Assembles a checkpoint from parts. Sorts tensors into module order, and maps tie
    /// groups given by name onto them (the first name of each group is kept on save).
    pub fn assemble(parts: Parts) -> Checkpoint {
        let Parts {
            dir,
            files,
            mut tensors,
            ties,
            device_map,
            device_map_path,
            offload_dir,
            config,
            weight_files,
            config_dir,
            warnings,
            replaced,
            pieces,
        } = parts;
        // Tied sources refer to names until here; sort and resolve them after.
        sort_in_module_order(&mut tensors);
        let find = |name: &str| search(&tensors, name).ok();
        let mut groups = Vec::new();
        let mut tie_of = Vec::new();
        for NamedTie { names, evidence } in ties {
            let members: Vec<TensorId> = names.iter().filter_map(|n| find(n)).collect();
            if members.len() < 2 {
                continue;
            }
            for &m in &members {
                tie_of.push((m, groups.len() as u32));
            }
            groups.push(TieGroup { members, evidence });
        }
        // A name in two groups belongs to the later one.
        tie_of.sort_unstable_by_key(|&(m, g)| (m, std::cmp::Reverse(g)));
        tie_of.dedup_by_key(|(m, _)| *m);
        let replaced = find_in_order(&tensors, replaced);
        let mut ckpt = Checkpoint {
            dir,
            files,
            tensors,
            ties: groups,
            device_map,
            device_map_path,
            offload_dir,
            config,
            weight_files,
            config_dir,
            warnings,
            replaced,
            side_dirs: Vec::new(),
            generated_config: None,
            remote: None,
            merges: std::collections::HashMap::new(),
            tie_of,
            loaded_names: std::sync::Arc::default(),
            derived: std::sync::Arc::default(),
            total_parameters: None,
            title: None,
            pieces: pieces.into(),
            tensorless_modules: std::sync::Arc::default(),
        };
        ckpt.point_tied_sources();
        ckpt
    }

    /// A tensor with no bytes of its own reads the group's data.
    fn point_tied_sources(&mut self) {
        for g in 0..self.ties.len() {
            let Some(with_data) = self.group_data_holder(g) else {
                continue;
            };
            for &m in &self.ties[g].members {
                if matches!(self.tensors[m].source, Source::None | Source::Tied(_))
                    && m != with_data
                {
                    self.tensors[m].source = Source::Tied(with_data);
                }
            }
        }
    }

    /// The member whose bytes are the group's value: an offload entry wins (it is the
    /// current value), the kept name before the others.
    pub(super) fn group_data_holder(&self, group: usize) -> Option<TensorId> {
        let members = &self.ties[group].members;
        let find = |want_offload: bool| {
            members
                .iter()
                .copied()
                .find(|&m| match self.tensors[m].source {
                    Source::Offload(_) | Source::Adapter(_) => true,
                    Source::Checkpoint(_) | Source::Pieces(_) => !want_offload,
                    _ => false,
                })
        };
        find(true).or_else(|| find(false))
    }
}

/// A tensor's placement and the entry that decided it. No map: everything is `cpu`.
/// `arch` (the architecture table's entry) knows the names the loaded model has.
pub fn place(
    map: Option<&DeviceMap>,
    name: &str,
    arch: Option<&crate::model::arch::Arch>,
) -> (Placement, u32) {
    match map {
        None => (Placement::Cpu, NO_KEY),
        // As stored; with transformers 5's module renames; as a piece of the fused
        // expert parameter it is loaded into (a map made from the loaded model, or by
        // `devmap plan`, names that).
        Some(m) => match m
            .locate(name)
            .or_else(|| m.locate(&arch?.loaded_name(name)?))
            .or_else(|| m.locate(&crate::model::names::runtime_name(name)?))
            .or_else(|| {
                let fused = crate::model::names::expert_piece(name)?.fused;
                m.locate(&arch.map_or_else(|| fused.clone(), |a| a.loaded_or_same(&fused)))
            }) {
            Some(hit) if arch.is_some_and(|a| a.is_persistent_buffer(name)) => {
                (m.buffer_placement(hit.placement), hit.index as u32)
            }
            Some(hit) => (hit.placement, hit.index as u32),
            None => (Placement::Unmapped, NO_KEY),
        },
    }
}

/// The pieces [`Checkpoint::assemble`] puts together. Tie groups are given by name.
#[derive(Debug, Default)]
pub struct Parts {
    pub dir: PathBuf,
    pub files: Vec<SourceFile>,
    pub tensors: Vec<Tensor>,
    pub ties: Vec<NamedTie>,
    pub device_map: Option<DeviceMap>,
    pub device_map_path: Option<PathBuf>,
    pub offload_dir: Option<PathBuf>,
    pub config: crate::formats::config::ModelConfig,
    pub weight_files: Vec<PathBuf>,
    pub config_dir: Option<PathBuf>,
    pub warnings: Vec<crate::model::warning::Warning>,
    /// `(name, checkpoint range, checkpoint dtype)` of tensors whose offload value
    /// replaced it.
    pub replaced: Vec<(String, ByteRange, DType)>,
    /// The blocks of the tensors whose source is [`Source::Pieces`], by its index.
    pub pieces: Vec<Box<[Piece]>>,
}

/// Binary search of tensors kept in module order: where `name` is, or would go.
pub(crate) fn search(tensors: &[Tensor], name: &str) -> Result<TensorId, TensorId> {
    tensors.binary_search_by(|t| crate::model::names::module_order(&t.name, name))
}

/// The tensors replaced by other values (offload entries), by id. They come in module
/// order, as the loader merged them: found by walking both lists together, not by a
/// search per name (tens of thousands on a big offload folder).
fn find_in_order(
    tensors: &[Tensor],
    mut replaced: Vec<(String, ByteRange, DType)>,
) -> std::collections::HashMap<TensorId, (ByteRange, DType)> {
    let order = |a: &str, b: &str| crate::model::names::module_order(a, b);
    if !replaced.is_sorted_by(|a, b| order(&a.0, &b.0).is_le()) {
        replaced.sort_by(|a, b| order(&a.0, &b.0));
    }
    let mut found = std::collections::HashMap::with_capacity(replaced.len());
    let mut at = 0;
    for (name, range, dtype) in replaced {
        while at < tensors.len() && order(&tensors[at].name, &name).is_lt() {
            at += 1;
        }
        if tensors.get(at).is_some_and(|t| *t.name == *name) {
            found.insert(at, (range, dtype));
        }
    }
    found
}

/// Sorts tensors into module order.
pub(crate) fn sort_in_module_order(tensors: &mut Vec<Tensor>) {
    if tensors.is_sorted_by(|a, b| crate::model::names::module_order(&a.name, &b.name).is_le()) {
        return;
    }
    // Split names cached as keys sort twice as fast, but each component of a key
    // costs 48 bytes: past a million components (a million tensors, or a few thousand
    // names thousands of levels deep), sort in place instead, comparing names as they
    // are (names are unique, so an unstable sort gives the one order).
    const CACHED_COMPONENTS_UP_TO: usize = 1 << 20;
    let components: usize = tensors
        .iter()
        .map(|t| t.name.bytes().filter(|&b| b == b'.').count() + 1)
        .sum();
    if components > CACHED_COMPONENTS_UP_TO {
        tensors.sort_unstable_by(|a, b| crate::model::names::module_order(&a.name, &b.name));
        return;
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    {
        let keys: Vec<crate::model::names::OrderKey<'_>> = tensors
            .iter()
            .map(|t| crate::model::names::order_key(&t.name))
            .collect();
        order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
    }
    let mut slots: Vec<Option<Tensor>> = std::mem::take(tensors).into_iter().map(Some).collect();
    tensors.extend(order.into_iter().filter_map(|i| slots[i].take()));
}
