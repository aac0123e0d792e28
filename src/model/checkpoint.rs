//! A model directory read into memory: every tensor, where its bytes are, where the
//! device map puts it, and which tensors are tied.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::types::dtype::DType;
use crate::types::placement::{DeviceMap, Placement};

pub use crate::types::pieces::Piece;
pub use crate::types::range::{ByteRange, FileId};
/// Index of a tensor in [`Checkpoint::tensors`].
pub type TensorId = usize;

/// A file devmap reads tensor bytes from, with what it looked like when opened, so a
/// save can tell when it changed underneath.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceFile {
    /// The file; for input that is no file, a name for messages (`/proc/self/mem`,
    /// `devmap:staged/KEY`) that nothing parses: `kind` says what it is.
    pub path: PathBuf,
    pub len: u64,
    pub modified: Option<SystemTime>,
    pub kind: InputKind,
}

/// What a source "file" is: a file, or a live model's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputKind {
    /// A file on disk, opened and read with positioned reads.
    #[default]
    File,
    /// This process's memory (a live model's CPU tensors), read through
    /// `/proc/self/mem`; offsets are addresses.
    ProcessMemory,
    /// A live model's tensor the Python session copies into a stage when asked (a GPU
    /// tensor), by its key (see `save::stage`).
    Staged(u64),
}

/// Where a tensor's current value comes from, in the design's order of precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// An offload-folder entry: the current value, e.g. after a merge.
    Offload(ByteRange),
    /// The checkpoint's own safetensors entry.
    Checkpoint(ByteRange),
    /// A full replacement from a LoRA adapter (`modules_to_save`, an embedding's
    /// `base_layer`): it outranks both of the above.
    Adapter(ByteRange),
    /// The checkpoint's entry stored in blocks across files (a training run's ranks):
    /// [`Checkpoint::pieces`] of this index.
    Pieces(u32),
    /// No bytes of its own: it reads a tie partner's.
    Tied(TensorId),
    /// No data anywhere (a `meta` tensor that was never materialised).
    None,
}

/// One tensor. Kept small (88 bytes and no heap but the name): a checkpoint may hold
/// a million of them. The name is a `Box<str>`, allocated once as the header is
/// parsed: an `Arc<str>` would add 16 bytes of counts to each, and a copy made later
/// would leave the first allocation's hole behind.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: Box<str>,
    pub shape: crate::types::shape::Shape,
    pub source: Source,
    pub placement: Placement,
    /// Which device-map entry placed it: its position in the map, or [`NO_KEY`].
    /// [`Checkpoint::map_key`] gives the key itself.
    pub map_key: u32,
    pub dtype: super::DType,
    /// The dtype an offload index says the model loads this tensor as, when it differs
    /// from the stored bytes.
    pub load_dtype: Option<super::DType>,
}

/// `Tensor::map_key` when no device-map entry placed the tensor.
pub const NO_KEY: u32 = u32::MAX;

impl Tensor {
    pub fn numel(&self) -> u64 {
        self.shape
            .iter()
            .try_fold(1u64, u64::checked_mul)
            .unwrap_or(0)
    }

    /// Bytes of the tensor (validated against its source when it was read).
    pub fn bytes(&self) -> u64 {
        self.numel().saturating_mul(self.dtype.size())
    }
}

/// Tensors that must hold the same value. `members[0]` is the name written on save
/// (the one transformers keeps: the embedding, not the `_tied_weights_keys` head).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TieGroup {
    pub members: Vec<TensorId>,
    /// What says they are tied: a save drops names on this word alone, so it is never
    /// a name rule (an untied head with no config.json would be lost).
    pub evidence: TieEvidence,
}

/// Why devmap holds names tied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TieEvidence {
    /// config.json: `tie_word_embeddings`, or the architecture's tie keys (transformers
    /// ties them on load whatever the checkpoint holds).
    Config,
    /// One storage for both names: a `torch.save` pickle, a live model's parameter.
    SameStorage,
    /// The user's `--tie`.
    User,
}

impl TieEvidence {
    /// How reports name it ("tied (config)").
    pub fn label(self) -> &'static str {
        match self {
            TieEvidence::Config => "config",
            TieEvidence::SameStorage => "same storage",
            TieEvidence::User => "--tie",
        }
    }
}

/// A tie group by name, as the loaders find them (the kept name first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedTie {
    pub names: Vec<String>,
    pub evidence: TieEvidence,
}

impl TieGroup {
    pub fn kept(&self) -> TensorId {
        self.members[0]
    }
}

/// Everything devmap knows about a model directory.
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub files: Vec<SourceFile>,
    /// In module order (see [`super::names::module_order`]): binary searches by name
    /// depend on it, so only this module changes the list.
    tensors: Vec<Tensor>,
    pub ties: Vec<TieGroup>,
    pub device_map: Option<DeviceMap>,
    pub device_map_path: Option<PathBuf>,
    pub offload_dir: Option<PathBuf>,
    pub config: crate::formats::config::ModelConfig,
    /// Files in `dir` that hold the checkpoint's weights (shards and index): a save
    /// does not copy them.
    pub weight_files: Vec<PathBuf>,
    /// `--config DIR`, when the checkpoint folder has no config.json: config.json and
    /// the other small files a save copies come from there.
    pub config_dir: Option<PathBuf>,
    /// What loading noticed (index omissions, dtype differences). The placement checks
    /// depend on the device map and are computed by [`crate::model::checks::all_warnings`].
    pub warnings: Vec<super::warning::Warning>,
    /// The folder of the config.json devmap wrote for a training checkpoint that has
    /// none (a Megatron-Core checkpoint's, from its training arguments); `config_dir`
    /// names it. Removed when the last copy of the checkpoint is dropped.
    pub generated_config: Option<std::sync::Arc<GeneratedConfig>>,
    /// Set for a model read over HTTP (`hf://…`, `https://…`): `dir` is then a header
    /// mirror whose shards hold no tensor data.
    pub remote: Option<RemoteModel>,
    /// LoRA merges by the tensor that holds the data (a tie group's kept member), in
    /// the order they apply (`--merge-lora`).
    pub merges: std::collections::HashMap<TensorId, Vec<super::merge::MergeStep>>,
    /// `(tensor, tie group)` for each tied tensor, sorted by tensor: a few entries,
    /// where a slot per tensor cost 4 MB at a million tensors for none.
    tie_of: Vec<(TensorId, u32)>,
    /// Checkpoint entries whose value an offload entry replaced, with the dtype the
    /// checkpoint stores them in, for `explain` and the save's `--dtype auto`.
    replaced: std::collections::HashMap<TensorId, (ByteRange, DType)>,
    /// The name the loaded model has for each tensor where transformers 5 renames or
    /// fuses it, computed once and shared by the copies a map edit makes (names do not
    /// change with the map; re-deriving them cost 60 ms a re-total at 92k tensors).
    loaded_names: std::sync::Arc<std::sync::OnceLock<std::collections::HashMap<u32, Box<str>>>>,
    /// What layers above derive from names, dtypes, shapes, ties and the config alone
    /// (the planner's runtime view, 120 ms at 92k tensors, and its walk tree, 60 ms),
    /// by a key of theirs: kept and shared by the copies a map edit makes (placements
    /// do not enter it); a change to those inputs resets it.
    derived: std::sync::Arc<std::sync::Mutex<Derived>>,
    /// What the index's `total_parameters` says, where the caller knows better than a
    /// count of the written tensors (a live model's `num_parameters()`).
    pub total_parameters: Option<u64>,
    /// How reports name a model that is no folder (a live model in a Python session).
    pub title: Option<String>,
    /// The blocks of each tensor stored in pieces ([`Source::Pieces`]).
    pieces: std::sync::Arc<[Box<[Piece]>]>,
    /// Modules the user's transformers says hold no tensor a checkpoint has (sorted):
    /// a device-map key naming one is no typo and no missing data.
    pub tensorless_modules: std::sync::Arc<[String]>,
}

/// See [`Checkpoint::derived`]: a few values by (type, key), the oldest dropped first.
#[derive(Default)]
struct Derived {
    values: Vec<(u64, std::sync::Arc<dyn std::any::Any + Send + Sync>)>,
}

impl Derived {
    /// Values kept at once (a plan tree of a 100k-tensor model is ~20 MB).
    const KEPT: usize = 4;

    fn find<T: std::any::Any + Send + Sync>(&self, key: u64) -> Option<std::sync::Arc<T>> {
        self.values
            .iter()
            .filter(|(k, _)| *k == key)
            .find_map(|(_, v)| v.clone().downcast::<T>().ok())
    }

    fn keep(&mut self, key: u64, value: std::sync::Arc<dyn std::any::Any + Send + Sync>) {
        if self.values.len() >= Self::KEPT {
            self.values.remove(0);
        }
        self.values.push((key, value));
    }
}

impl std::fmt::Debug for Derived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Derived({} values)", self.values.len())
    }
}

/// A temporary folder holding a config.json devmap wrote; removed when dropped.
#[derive(Debug)]
pub struct GeneratedConfig {
    pub dir: PathBuf,
}

impl GeneratedConfig {
    /// Writes `text` as config.json in a new folder under the system's temporary one.
    pub fn write(text: &str) -> std::io::Result<GeneratedConfig> {
        let base = std::env::temp_dir();
        let mut n = 0u32;
        let dir = loop {
            let dir = base.join(format!("devmap-config-{}-{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(e),
            }
        };
        let folder = GeneratedConfig { dir };
        std::fs::write(folder.dir.join("config.json"), text)?;
        Ok(folder)
    }
}

impl Drop for GeneratedConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where a remote model's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteModel {
    /// `hf://org/name[@rev]` or the URL given.
    pub name: String,
    /// What a file name is appended to for reports: `hf://org/name[@rev]/` (the paths
    /// huggingface_hub's HfFileSystem uses) or the URL's folder.
    pub files: String,
}

impl Checkpoint {
    /// Every tensor, in module order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The name the loaded model has for tensor `id`, where the architecture table says
    /// transformers 5 renames or fuses it ([`super::arch::Arch::loaded_form`]).
    pub fn loaded_name(&self, id: TensorId) -> Option<&str> {
        self.loaded_names
            .get_or_init(|| {
                // Only the renamed tensors are kept (none without an architecture): at
                // a million tensors a slot for every one would cost 16 MB.
                let Some(arch) = super::arch::lookup(&self.config.architectures) else {
                    return std::collections::HashMap::new();
                };
                self.tensors
                    .iter()
                    .enumerate()
                    .filter_map(|(i, t)| {
                        let (name, _) = arch.loaded_form(&t.name)?;
                        Some((i as u32, name.into_boxed_str()))
                    })
                    .collect()
            })
            .get(&(id as u32))
            .map(AsRef::as_ref)
    }

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
    fn group_data_holder(&self, group: usize) -> Option<TensorId> {
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

    /// What `make` derives from this checkpoint's names, dtypes, shapes, ties and
    /// config, made once per `key` and shared by the copies map edits make (see the
    /// field). `T` and `key` together name it: a layer uses its own types.
    pub fn derived<T: std::any::Any + Send + Sync>(
        &self,
        key: u64,
        make: impl FnOnce() -> T,
    ) -> std::sync::Arc<T> {
        let found = self.derived.lock().ok().and_then(|d| d.find::<T>(key));
        if let Some(value) = found {
            return value;
        }
        // Made outside the lock: two threads may both make it; the first kept wins.
        let value = std::sync::Arc::new(make());
        if let Ok(mut d) = self.derived.lock() {
            if let Some(kept) = d.find::<T>(key) {
                return kept;
            }
            d.keep(key, value.clone());
        }
        value
    }

    /// Finds a tensor by name (binary search: tensors are in module order).
    pub fn index_of(&self, name: &str) -> Option<TensorId> {
        search(&self.tensors, name).ok()
    }

    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.index_of(name).map(|i| &self.tensors[i])
    }

    /// Every tie group, by the names of its members (the kept one first).
    pub fn tie_names(&self) -> Vec<NamedTie> {
        self.ties
            .iter()
            .map(|g| NamedTie {
                names: g
                    .members
                    .iter()
                    .map(|&m| self.tensors[m].name.to_string())
                    .collect(),
                evidence: g.evidence,
            })
            .collect()
    }

    /// Whether transformers said module `key` holds no tensors (see
    /// [`Checkpoint::tensorless_modules`]).
    pub fn holds_no_tensors(&self, key: &str) -> bool {
        self.tensorless_modules
            .binary_search_by(|m| m.as_str().cmp(key))
            .is_ok()
    }

    /// What says tensor `name` is tied, when it is.
    pub fn tie_evidence(&self, name: &str) -> Option<TieEvidence> {
        self.tie_group(self.index_of(name)?).map(|g| g.evidence)
    }

    /// The tie group a tensor belongs to.
    pub fn tie_group(&self, id: TensorId) -> Option<&TieGroup> {
        self.tie_index(id).map(|g| &self.ties[g])
    }

    fn tie_index(&self, id: TensorId) -> Option<usize> {
        let at = self.tie_of.binary_search_by_key(&id, |&(m, _)| m).ok()?;
        Some(self.tie_of[at].1 as usize)
    }

    /// Where a tensor's current value is, following ties: an offload, checkpoint or
    /// adapter range, or pieces; `None` when no bytes hold it.
    pub fn data_source(&self, id: TensorId) -> Option<Source> {
        if let Some(g) = self.tie_index(id) {
            let holder = self.group_data_holder(g)?;
            return Some(self.tensors[holder].source).filter(Self::holds_data);
        }
        match self.tensors[id].source {
            Source::Tied(to) if to != id => self.data_source(to),
            source => Some(source).filter(Self::holds_data),
        }
    }

    fn holds_data(source: &Source) -> bool {
        !matches!(source, Source::Tied(_) | Source::None)
    }

    /// Whether some bytes hold a tensor's value (one range or pieces).
    pub fn has_data(&self, id: TensorId) -> bool {
        self.data_source(id).is_some()
    }

    /// The one byte range that holds a tensor's current value, following ties; `None`
    /// when no bytes do, or when pieces do ([`Checkpoint::data_source`]).
    pub fn data_range(&self, id: TensorId) -> Option<ByteRange> {
        match self.data_source(id)? {
            Source::Offload(r) | Source::Checkpoint(r) | Source::Adapter(r) => Some(r),
            _ => None,
        }
    }

    /// Every range that holds a tensor's current value: its one range, or each of its
    /// pieces'.
    pub fn data_ranges(&self, id: TensorId) -> Vec<ByteRange> {
        match self.data_source(id) {
            Some(Source::Offload(r) | Source::Checkpoint(r) | Source::Adapter(r)) => vec![r],
            Some(Source::Pieces(index)) => self.pieces(index).iter().map(|p| p.range).collect(),
            _ => Vec::new(),
        }
    }

    /// For a checkpoint split across ranks, the bytes of its tensors each rank's files
    /// hold (the rank read from the file's name), by rank; empty when no tensor is
    /// stored in pieces.
    pub fn rank_shares(&self) -> Vec<(u32, u64)> {
        if !self
            .tensors
            .iter()
            .any(|t| matches!(t.source, Source::Pieces(_)))
        {
            return Vec::new();
        }
        let rank_of: Vec<Option<u32>> = self
            .files
            .iter()
            .map(|f| crate::formats::pieced::rank_of(&f.path))
            .collect();
        let mut shares = std::collections::BTreeMap::new();
        let mut add = |r: &ByteRange| {
            if let Some(Some(rank)) = rank_of.get(r.file) {
                *shares.entry(*rank).or_insert(0u64) += r.len;
            }
        };
        for t in &self.tensors {
            match t.source {
                Source::Checkpoint(r) => add(&r),
                Source::Pieces(index) => self.pieces(index).iter().for_each(|p| add(&p.range)),
                _ => {}
            }
        }
        shares.into_iter().collect()
    }

    /// The blocks of a tensor stored in pieces, by the index its source gives.
    pub fn pieces(&self, index: u32) -> &[Piece] {
        self.pieces.get(index as usize).map_or(&[], |p| p)
    }

    pub fn file_path(&self, id: FileId) -> &Path {
        &self.files[id].path
    }

    /// What the weights were read from, in a few words: `safetensors`, `.bin`, `DCP`,
    /// `ZeRO`, `rank files`, `live model`, `remote headers`, with `+ offload` when an
    /// offload folder's values are read too.
    pub fn source_kind(&self) -> String {
        let names: Vec<String> = self
            .weight_files
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        let any = |f: &dyn Fn(&str) -> bool| names.iter().any(|n| f(n));
        let kind = if self.remote.is_some() {
            "remote headers"
        } else if self.files.iter().any(|f| f.kind != InputKind::File) {
            "live model"
        } else if any(&|n| n == crate::formats::megatron::MARKER) {
            "Megatron-Core"
        } else if any(&|n| n.ends_with(".distcp") || n == ".metadata") {
            "DCP"
        } else if any(&|n| n.ends_with("_model_states.pt") || n.ends_with("_optim_states.pt")) {
            "ZeRO"
        } else if !names.is_empty()
            && names.iter().all(|n| {
                !n.ends_with(".safetensors") || crate::formats::rank_files::is_rank_file_name(n)
            })
            && any(&crate::formats::rank_files::is_rank_file_name)
        {
            "rank files"
        } else if self
            .weight_files
            .iter()
            .any(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("bin")))
        {
            ".bin"
        } else {
            "safetensors"
        };
        match self.offload_dir {
            Some(_) => format!("{kind} + offload"),
            None => kind.to_owned(),
        }
    }

    /// What source `id` is: a file, or a live model's memory.
    pub fn input_kind(&self, id: FileId) -> InputKind {
        self.files[id].kind
    }

    /// The checkpoint entry of a tensor: its source, or the entry an offload value
    /// replaced.
    pub fn checkpoint_range(&self, id: TensorId) -> Option<ByteRange> {
        match self.tensors[id].source {
            Source::Checkpoint(r) => Some(r),
            _ => self.replaced.get(&id).map(|&(r, _)| r),
        }
    }

    /// The dtype the checkpoint stores a tensor in, where an offload value with its
    /// own dtype replaced it.
    pub fn checkpoint_dtype(&self, id: TensorId) -> DType {
        self.replaced
            .get(&id)
            .map_or(self.tensors[id].dtype, |&(_, d)| d)
    }

    /// The device-map key that placed a tensor.
    pub fn map_key(&self, tensor: &Tensor) -> Option<&str> {
        let map = self.device_map.as_ref()?;
        if tensor.map_key == NO_KEY {
            return None;
        }
        map.entries()
            .get(tensor.map_key as usize)
            .map(|(k, _)| k.as_str())
    }

    /// Re-places every tensor with `map` (used when the user edits the map).
    pub fn apply_device_map(&mut self, map: Option<DeviceMap>) {
        let arch = super::arch::lookup(&self.config.architectures);
        for t in &mut self.tensors {
            let (placement, key) = place(map.as_ref(), &t.name, arch);
            t.placement = placement;
            t.map_key = key;
        }
        self.device_map = map;
    }

    /// Takes `map` as the model's device map and names each tensor's key in it, without
    /// re-placing anything: a live model's tensors are where the session has them.
    pub fn record_device_map(&mut self, map: DeviceMap) {
        let arch = super::arch::lookup(&self.config.architectures);
        for t in &mut self.tensors {
            t.map_key = place(Some(&map), &t.name, arch).1;
        }
        self.device_map = Some(map);
    }

    /// Bytes per device, in display order.
    pub fn device_totals(&self) -> Vec<(Placement, u64)> {
        let mut totals = std::collections::BTreeMap::<Placement, u64>::new();
        for (id, t) in self.tensors.iter().enumerate() {
            if !self.counted_elsewhere(id) {
                *totals.entry(t.placement).or_default() += t.bytes();
            }
        }
        totals.into_iter().collect()
    }

    /// Whether tensor `id` is a tied copy of one on the same device: one tensor in
    /// memory under two names, counted once (under the group's first member there), as
    /// accelerate counts a tied parameter once. Members of a tie split across devices
    /// each count on their own device: accelerate copies the weights there.
    pub fn counted_elsewhere(&self, id: TensorId) -> bool {
        self.counted_with(id).is_some()
    }

    /// The tie partner a tensor [counted elsewhere](Checkpoint::counted_elsewhere) is
    /// counted with: the group's first member on the same device.
    pub fn counted_with(&self, id: TensorId) -> Option<TensorId> {
        let group = self.tie_group(id)?;
        let placement = self.tensors[id].placement;
        group
            .members
            .iter()
            .take_while(|&&m| m != id)
            .copied()
            .find(|&m| self.tensors[m].placement == placement)
    }

    /// The LoRA merges that change a tensor's value (a tie group's merges are
    /// every member's).
    pub fn merges_of(&self, id: TensorId) -> &[super::merge::MergeStep] {
        let holder = self.tie_group(id).map_or(id, TieGroup::kept);
        self.merges.get(&holder).map_or(&[], Vec::as_slice)
    }

    /// config.json's `quantization_config` in words, with the FP8 weights counted:
    /// `fp8, 128×128 blocks: 61 F8_E4M3 weights with their scales`.
    pub fn quantization_summary(&self) -> Option<String> {
        use super::quantized::{QuantizedPart, dequantized_dtype, quantized_part};
        let q = self.config.quantization.as_ref()?;
        let method = match q.method.as_str() {
            "fp8" => format!("fp8, {}×{} blocks", q.block.0, q.block.1),
            "mxfp4" => "mxfp4".to_owned(),
            "compressed-tensors" if q.format.as_deref() == Some("float-quantized") => {
                "compressed-tensors float-quantized".to_owned()
            }
            "compressed-tensors"
                if matches!(
                    q.format.as_deref(),
                    Some("pack-quantized" | "nvfp4-pack-quantized" | "mxfp8-quantized")
                ) =>
            {
                format!(
                    "compressed-tensors {}",
                    q.format.as_deref().unwrap_or_default()
                )
            }
            other => {
                return Some(format!(
                    "{other}{} (devmap copies it as stored; it dequantizes fine-grained FP8, MXFP4, and compressed-tensors float-quantized, mxfp8-quantized, pack-quantized and nvfp4-pack-quantized)",
                    q.format
                        .as_deref()
                        .map_or_else(String::new, |f| format!(" `{f}`"))
                ));
            }
        };
        let dtype = dequantized_dtype(self);
        let (mut weights, mut stored, mut dequantized) = (0usize, 0u64, 0u64);
        for (id, t) in self.tensors.iter().enumerate() {
            match quantized_part(self, id) {
                Some(part @ QuantizedPart::Weight { .. }) => {
                    weights += 1;
                    stored += t.bytes();
                    dequantized += part.dequantized_bytes(dtype);
                }
                Some(QuantizedPart::Scales { .. }) => stored += t.bytes(),
                None => {}
            }
        }
        Some(format!(
            "{method}: {} with {} scales, {} stored, {} as {} (save --dtype {} dequantizes)",
            crate::text::count(weights, "quantized weight", "quantized weights"),
            if weights == 1 { "its" } else { "their" },
            crate::human_bytes(stored),
            crate::human_bytes(dequantized),
            dtype.torch_name(),
            dtype.torch_name()
        ))
    }

    /// Whether some merge was allowed to carry NaN or infinite values
    /// (`--allow-nonfinite`): a check of the output then notes them rather than fails.
    pub fn merges_allow_nonfinite(&self) -> bool {
        self.merges.values().flatten().any(|s| s.allow_nonfinite)
    }

    /// Whether an adapter (`--merge-lora`) replaces the tensor's value outright (peft's
    /// `modules_to_save`, a trained embedding), rather than merging into it.
    pub fn replaced_by_adapter(&self, id: TensorId) -> bool {
        matches!(self.tensors[id].source, Source::Adapter(_))
    }

    /// Whether an adapter changes the tensor on save: merged into, or replaced.
    pub fn changed_by_adapter(&self, id: TensorId) -> bool {
        self.replaced_by_adapter(id) || !self.merges_of(id).is_empty()
    }

    /// Registers a file outside the model folder (an adapter's weights) as a source,
    /// returning its id; the same path twice gives the same id.
    pub fn add_source_file(&mut self, path: &Path, len: u64) -> FileId {
        if let Some(i) = self.files.iter().position(|f| f.path == path) {
            return i;
        }
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        self.files.push(SourceFile {
            path: path.to_path_buf(),
            len,
            modified,
            kind: InputKind::File,
        });
        self.files.len() - 1
    }

    /// Makes a tensor's value the bytes at `range` (an adapter's replacement for a
    /// `modules_to_save` module or an embedding's `base_layer`).
    pub fn replace_value(&mut self, id: TensorId, range: ByteRange, dtype: DType) {
        // The dtype may change: what was derived from dtypes is derived again.
        self.derived = std::sync::Arc::default();
        let t = &mut self.tensors[id];
        if let Source::Checkpoint(old) = t.source {
            self.replaced.insert(id, (old, t.dtype));
        }
        t.source = Source::Adapter(range);
        t.dtype = dtype;
    }

    /// How reports name the model: its folder, or the URL of a remote one.
    pub fn display_name(&self) -> String {
        match (&self.remote, &self.title) {
            (Some(remote), _) => crate::text::escaped(&remote.name).into_owned(),
            (None, Some(title)) => crate::text::escaped(title).into_owned(),
            (None, None) => crate::text::path(&self.dir),
        }
    }

    /// How reports name a source file: its path, or its remote address.
    pub fn file_label(&self, id: FileId) -> String {
        let path = self.file_path(id);
        match &self.remote {
            Some(remote) => format!(
                "{}{}",
                remote.files,
                path.file_name().unwrap_or_default().to_string_lossy()
            ),
            None => path.display().to_string(),
        }
    }

    /// The bytes the model holds, a tied tensor once per device it is on.
    pub fn total_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .enumerate()
            .filter(|&(id, _)| !self.counted_elsewhere(id))
            .map(|(_, t)| t.bytes())
            .sum()
    }
}

/// A tensor's placement and the entry that decided it. No map: everything is `cpu`.
/// `arch` (the architecture table's entry) knows the names the loaded model has.
pub fn place(
    map: Option<&DeviceMap>,
    name: &str,
    arch: Option<&super::arch::Arch>,
) -> (Placement, u32) {
    match map {
        None => (Placement::Cpu, NO_KEY),
        // As stored; with transformers 5's module renames; as a piece of the fused
        // expert parameter it is loaded into (a map made from the loaded model, or by
        // `devmap plan`, names that).
        Some(m) => match m
            .locate(name)
            .or_else(|| m.locate(&arch?.loaded_name(name)?))
            .or_else(|| m.locate(&super::names::runtime_name(name)?))
            .or_else(|| {
                let fused = super::names::expert_piece(name)?.fused;
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
    pub warnings: Vec<super::warning::Warning>,
    /// `(name, checkpoint range, checkpoint dtype)` of tensors whose offload value
    /// replaced it.
    pub replaced: Vec<(String, ByteRange, DType)>,
    /// The blocks of the tensors whose source is [`Source::Pieces`], by its index.
    pub pieces: Vec<Box<[Piece]>>,
}

/// Binary search of tensors kept in module order: where `name` is, or would go.
pub(crate) fn search(tensors: &[Tensor], name: &str) -> Result<TensorId, TensorId> {
    tensors.binary_search_by(|t| super::names::module_order(&t.name, name))
}

/// The tensors replaced by other values (offload entries), by id. They come in module
/// order, as the loader merged them: found by walking both lists together, not by a
/// search per name (tens of thousands on a big offload folder).
fn find_in_order(
    tensors: &[Tensor],
    mut replaced: Vec<(String, ByteRange, DType)>,
) -> std::collections::HashMap<TensorId, (ByteRange, DType)> {
    let order = |a: &str, b: &str| super::names::module_order(a, b);
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
    if tensors.is_sorted_by(|a, b| super::names::module_order(&a.name, &b.name).is_le()) {
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
        tensors.sort_unstable_by(|a, b| super::names::module_order(&a.name, &b.name));
        return;
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    {
        let keys: Vec<super::names::OrderKey<'_>> = tensors
            .iter()
            .map(|t| super::names::order_key(&t.name))
            .collect();
        order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
    }
    let mut slots: Vec<Option<Tensor>> = std::mem::take(tensors).into_iter().map(Some).collect();
    tensors.extend(order.into_iter().filter_map(|i| slots[i].take()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_values_are_shared_by_copies_kept_by_type_and_key_and_reset_by_a_dtype_change() {
        let tensor = Tensor {
            name: "w".into(),
            shape: crate::types::shape::Shape::new(&[2]),
            source: Source::None,
            placement: Placement::Cpu,
            map_key: NO_KEY,
            dtype: DType::F32,
            load_dtype: None,
        };
        let ckpt = Checkpoint::assemble(Parts {
            dir: PathBuf::new(),
            files: Vec::new(),
            tensors: vec![tensor],
            ties: Vec::new(),
            device_map: None,
            device_map_path: None,
            offload_dir: None,
            config: crate::formats::config::ModelConfig::absent(),
            weight_files: Vec::new(),
            config_dir: None,
            warnings: Vec::new(),
            replaced: Vec::new(),
            pieces: Vec::new(),
        });
        let made = std::sync::atomic::AtomicUsize::new(0);
        let make = |v: u32| {
            made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            v
        };
        assert_eq!(*ckpt.derived(1, || make(10)), 10);
        // A copy (what a map edit makes) finds it; another type under the same key is
        // another value.
        let mut copy = ckpt.clone();
        copy.apply_device_map(None);
        assert_eq!(*copy.derived(1, || make(11)), 10);
        assert_eq!(*copy.derived(1, || String::from("s")), "s");
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Past the few kept, the oldest goes.
        for key in 2..=5 {
            copy.derived(key, || make(0));
        }
        assert_eq!(*copy.derived(1, || make(12)), 12);
        // A value whose dtype changes resets what was derived.
        copy.replace_value(
            0,
            ByteRange {
                file: 0,
                offset: 0,
                len: 4,
            },
            DType::BF16,
        );
        assert_eq!(*copy.derived(2, || make(13)), 13);
    }
}
