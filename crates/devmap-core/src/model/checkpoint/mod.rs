//! A model directory read into memory: every tensor, where its bytes are, where the
//! device map puts it, and which tensors are tied.

use std::path::{Path, PathBuf};

use crate::types::DType;
use crate::types::placement::{DeviceMap, Placement};

pub use crate::types::pieces::Piece;
pub use crate::types::range::{ByteRange, FileId};
/// Index of a tensor in [`Checkpoint::tensors`].
pub type TensorId = usize;

mod assemble;
mod derived;
mod tensor;

use derived::Derived;

pub use assemble::{Parts, place};
pub(crate) use assemble::{search, sort_in_module_order};
pub use tensor::{
    GeneratedConfig, InputKind, NO_KEY, NamedTie, RemoteModel, Source, SourceFile, Tensor,
    TieEvidence, TieGroup,
};

/// Everything devmap knows about a model directory.
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub files: Vec<SourceFile>,
    /// In module order (see [`crate::model::names::module_order`]): binary searches by name
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
    /// Folders of the checkpoint beside its weights whose small files a save also
    /// copies, where the checkpoint folder has none of the name: a NeMo 2
    /// checkpoint's tokenizer (`context/nemo_tokenizer/`) and `context/artifacts/`.
    pub side_dirs: Vec<PathBuf>,
    /// What loading noticed (index omissions, dtype differences). The placement checks
    /// depend on the device map and are computed by [`crate::model::checks::all_warnings`].
    pub warnings: Vec<crate::model::warning::Warning>,
    /// The folder of the config.json devmap wrote for a training checkpoint that has
    /// none (a Megatron-Core checkpoint's, from its training arguments); `config_dir`
    /// names it. Removed when the last copy of the checkpoint is dropped.
    pub generated_config: Option<std::sync::Arc<GeneratedConfig>>,
    /// Set for a model read over HTTP (`hf://…`, `https://…`): `dir` is then a header
    /// mirror whose shards hold no tensor data.
    pub remote: Option<RemoteModel>,
    /// LoRA merges by the tensor that holds the data (a tie group's kept member), in
    /// the order they apply (`--merge-lora`).
    pub merges: std::collections::HashMap<TensorId, Vec<crate::model::merge::MergeStep>>,
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

impl Checkpoint {
    /// Every tensor, in module order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The name the loaded model has for tensor `id`, where the architecture table says
    /// transformers 5 renames or fuses it ([`crate::model::arch::Arch::loaded_form`]).
    pub fn loaded_name(&self, id: TensorId) -> Option<&str> {
        self.loaded_names
            .get_or_init(|| {
                // Only the renamed tensors are kept (none without an architecture): at
                // a million tensors a slot for every one would cost 16 MB.
                let Some(arch) = crate::model::arch::lookup(&self.config.architectures) else {
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
            .map(|f| crate::formats::split::rank_of(&f.path))
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
        let arch = crate::model::arch::lookup(&self.config.architectures);
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
        let arch = crate::model::arch::lookup(&self.config.architectures);
        for t in &mut self.tensors {
            t.map_key = place(Some(&map), &t.name, arch).1;
        }
        self.device_map = Some(map);
    }

    /// Bytes per device as the model holds them, in display order.
    pub fn device_totals(&self) -> Vec<(Placement, u64)> {
        let mut totals = std::collections::BTreeMap::<Placement, u64>::new();
        for (id, t) in self.tensors.iter().enumerate() {
            if !self.counted_elsewhere(id) {
                *totals.entry(t.placement).or_default() += t.held_bytes();
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
    pub fn merges_of(&self, id: TensorId) -> &[crate::model::merge::MergeStep] {
        let holder = self.tie_group(id).map_or(id, TieGroup::kept);
        self.merges.get(&holder).map_or(&[], Vec::as_slice)
    }

    /// config.json's `quantization_config` in words, with the FP8 weights counted:
    /// `fp8, 128×128 blocks: 61 F8_E4M3 weights with their scales`.
    pub fn quantization_summary(&self) -> Option<String> {
        use crate::model::quantized::{QuantizedPart, dequantized_dtype, quantized_part};
        let q = self.config.quantization.as_ref()?;
        let method = match q.method.as_str() {
            "fp8" => format!("fp8, {}×{} blocks", q.block.0, q.block.1),
            "mxfp4" => "mxfp4".to_owned(),
            "modelopt" if q.format.as_deref() == Some("NVFP4") => "modelopt NVFP4".to_owned(),
            "gptq" | "awq" => match &q.gptq {
                Some(g) => format!("{} `{}`, {} bits", q.method, g.format, g.bits),
                None => q.method.clone(),
            },
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
                    "{other}{} (devmap copies it as stored; it dequantizes fine-grained FP8, MXFP4, GPTQ, AWQ, ModelOpt NVFP4, and compressed-tensors float-quantized, mxfp8-quantized, pack-quantized and nvfp4-pack-quantized)",
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
            .map(|(_, t)| t.held_bytes())
            .sum()
    }
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
