//! Step 1 and 2 of a save: resolve every tensor to its bytes, collapse ties, and cut
//! the list into shards. Pure: nothing is read or written, so the TUI can preview it.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;

use super::error::SaveError;
use super::execute::Recipe;
use super::execute::packed;
use super::reasons::Unsaveable;
use crate::formats::hf_index::{SINGLE_FILE, shard_file_name};
use crate::formats::safetensors::{HeaderEntry, write_header};
use crate::model::checkpoint::{ByteRange, Checkpoint, TensorId};
use crate::types::dtype::DType;

mod dequantize;
mod dequantize_packed;
mod quantize;

use dequantize::{Dequantize, Dequantized, Refused};

/// What the user asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveOptions {
    pub out: PathBuf,
    pub max_shard_size: u64,
    /// Write every name of a tie group instead of once under the kept name.
    pub keep_tied: bool,
    /// Write into a non-empty output folder.
    pub force: bool,
    /// Do not copy config, tokenizer and other files beside the weights.
    pub weights_only: bool,
    /// Shards written at the same time (at least 1).
    pub jobs: usize,
    /// fsync every shard before it is renamed into place (the default). Off trades
    /// durability after a power loss for speed, as `cp` does.
    pub fsync: bool,
    /// What to do with the page cache of copied input.
    pub cache: CachePolicy,
    /// RAM free for the page cache, as the caller's monitor read it; `None` when
    /// unknown. [`CachePolicy::Auto`] compares the model against it.
    pub available_ram: Option<u64>,
    /// The dtype of the floating-point tensors written.
    pub dtype: DtypeChoice,
    /// Save even when device-map entries cover no tensor that has data (the weights
    /// of those modules exist nowhere, so the output lacks them).
    pub allow_partial: bool,
    /// For tests: fail the commit at this rename, to check that it rolls back.
    #[doc(hidden)]
    pub commit_fault: Option<usize>,
    /// For tests: once the first tensor is written, create `<file>.reached` and wait
    /// while `file` exists, so a test can interrupt a save that is surely mid-shard.
    /// The CLI takes it from `DEVMAP_TEST_PAUSE`.
    #[doc(hidden)]
    pub pause_file: Option<PathBuf>,
    /// The caller's last look before the commit: a live model's Python side checks
    /// that no tensor changed while it was read. An `Err` refuses the save with its
    /// message, nothing committed.
    pub commit_check: Option<CommitCheck>,
    /// What fills staged sources (a live model's GPU tensors), see `save::stage`.
    pub stage: Option<super::stage::StageRef>,
    /// What the user's transformers says of the model at the dtype the save casts to
    /// ([`crate::oracle`]): the modules it keeps in float32 come from there instead of
    /// devmap's table.
    pub asked: Option<std::sync::Arc<crate::oracle::Answer>>,
    /// A save split over processes: write one part, or commit the parts
    /// (`save::parts`).
    pub distributed: Option<super::parts::Distributed>,
    /// `--quantize fp8-block`: write the linear weights as fine-grained FP8.
    pub quantize_fp8: bool,
}

/// See [`SaveOptions::commit_check`].
#[derive(Clone)]
pub struct CommitCheck(pub std::sync::Arc<dyn Fn() -> Result<(), String> + Send + Sync>);

impl std::fmt::Debug for CommitCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitCheck")
    }
}

/// Two checks are the same when they are the same closure.
impl PartialEq for CommitCheck {
    fn eq(&self, other: &CommitCheck) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

/// `--dtype`: what floating-point tensors are written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeChoice {
    /// Cast to the model's runtime dtype when the offload folder shows one that
    /// differs from the checkpoint's (the model was loaded with `dtype=`), as
    /// `save_pretrained` writes one dtype; otherwise keep.
    Auto,
    /// Every tensor as stored.
    Keep,
    /// Every tensor in the dtype the model holds it in (`Tensor::load_dtype`, else as
    /// stored): what `save_pretrained` writes from a live model, where transformers
    /// already applied the run dtype and the modules it keeps in float32.
    AsLoaded,
    /// Every floating-point tensor cast to this dtype (integers and bools untouched).
    To(DType),
}

/// The dtype a save casts floating-point tensors to, if any.
/// A quantized checkpoint (config.json's `quantization_config`) under `auto` is
/// written as stored, as `save_pretrained` writes a quantized model.
pub fn resolve_dtype(ckpt: &Checkpoint, choice: DtypeChoice) -> Option<DType> {
    match choice {
        DtypeChoice::Keep | DtypeChoice::AsLoaded => None,
        DtypeChoice::To(d) => Some(d),
        DtypeChoice::Auto if ckpt.config.quantization.is_some() => None,
        DtypeChoice::Auto => runtime_dtype(ckpt),
    }
}

/// The dtype the model ran in, where the offload folder shows it differs from the
/// checkpoint's: offloaded tensors held in another floating dtype than the same
/// tensors in the checkpoint, or (transformers' index) loaded as another dtype than
/// stored. `None` when nothing differs, or when the differences disagree.
pub fn runtime_dtype(ckpt: &Checkpoint) -> Option<DType> {
    use super::cast::is_castable;
    use crate::model::checkpoint::Source;
    let mut seen: std::collections::BTreeSet<DType> = std::collections::BTreeSet::new();
    let arch = crate::model::arch::lookup(&ckpt.config.architectures);
    for (id, t) in ckpt.tensors().iter().enumerate() {
        if !matches!(t.source, Source::Offload(_)) || !is_castable(t.dtype) {
            continue;
        }
        // Modules transformers keeps in float32 (at float16, where every entry, strict
        // or not, applies) do not show the dtype the rest of the model ran in.
        let loaded = ckpt.loaded_name(id).unwrap_or(&t.name);
        if arch.is_some_and(|a| a.kept_in_fp32(loaded, DType::F16).is_some()) {
            continue;
        }
        match t.load_dtype {
            Some(load) if load != t.dtype => {
                seen.insert(load);
            }
            _ if ckpt.checkpoint_dtype(id) != t.dtype && is_castable(ckpt.checkpoint_dtype(id)) => {
                seen.insert(t.dtype);
            }
            _ => {}
        }
    }
    let mut differing = seen.into_iter();
    match (differing.next(), differing.next()) {
        (Some(d), None) if is_castable(d) => Some(d),
        _ => None,
    }
}

/// Whether copied input stays in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachePolicy {
    /// Drop it when the model is larger than half the available RAM, where keeping it
    /// would push out everything else; keep it otherwise (dropping costs time).
    Auto,
    /// Always advise the kernel to drop copied ranges.
    Drop,
    /// Leave the page cache to the kernel, as `cp` does.
    Keep,
}

impl SaveOptions {
    /// The defaults of `devmap save`: 50GB shards (transformers 5's), ties collapsed, config files copied,
    /// two shards at a time, fsync on.
    pub fn new(out: impl Into<PathBuf>) -> SaveOptions {
        SaveOptions {
            out: out.into(),
            max_shard_size: DEFAULT_MAX_SHARD_SIZE,
            keep_tied: false,
            force: false,
            weights_only: false,
            jobs: DEFAULT_JOBS,
            fsync: true,
            cache: CachePolicy::Auto,
            available_ram: None,
            dtype: DtypeChoice::Auto,
            allow_partial: false,
            commit_fault: None,
            pause_file: None,
            commit_check: None,
            stage: None,
            asked: None,
            distributed: None,
            quantize_fp8: false,
        }
    }
}

/// Shards smaller than this are written by one thread; bigger ones by the jobs no other
/// shard needs, each taking a run of its tensors.
pub(super) const PARALLEL_SHARD_BYTES: u64 = 64 << 20;

/// Shards written in parallel by default: two writers overlap one shard's copy or
/// fsync with the other's (docs/performance.md, Saving).
pub const DEFAULT_JOBS: usize = 2;

/// What transformers 5's `save_pretrained` writes by default (`max_shard_size="50GB"`;
/// transformers 4 wrote 5GB, one preset away in the inspector).
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 50_000_000_000;
/// [`DEFAULT_MAX_SHARD_SIZE`] as typed.
pub const DEFAULT_MAX_SHARD_SIZE_TEXT: &str = "50GB";

/// One tensor's place in a shard. Its name and shape are the checkpoint's (by id):
/// a plan of a million tensors copies no names. A plan is read with the checkpoint it
/// was made from (its recipes find their sources there, see [`PlannedTensor::recipe`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTensor {
    /// The checkpoint's tensor, as 32 bits (see [`PlannedTensor::tensor`]): at a
    /// million tensors the plan is the save's largest list but the checkpoint's.
    tensor: u32,
    /// The dtype written.
    pub dtype: DType,
    /// How the bytes are made, kept small (see `packed`).
    packed: packed::Packed,
    /// Bytes written.
    pub len: u64,
    /// Offset in the shard's data region.
    pub begin: u64,
}

impl PlannedTensor {
    /// Tensor `id` made by `recipe`, at the start of its shard until laid out.
    fn new(ckpt: &Checkpoint, id: TensorId, recipe: Recipe) -> PlannedTensor {
        PlannedTensor {
            tensor: u32::try_from(id).expect("a checkpoint holds fewer than 2^32 tensors"),
            dtype: recipe.output_dtype(ckpt.tensors()[id].dtype),
            packed: recipe.pack(ckpt, id),
            len: recipe.output_len(ckpt.tensors()[id].dtype),
            begin: 0,
        }
    }

    /// Whether this writes a second tensor made from its checkpoint tensor (a quantized
    /// weight's scales), not the tensor itself.
    pub fn is_companion(&self) -> bool {
        self.packed.whole().is_some_and(Recipe::is_companion)
    }

    /// The checkpoint's tensor this writes.
    pub fn tensor(&self) -> TensorId {
        self.tensor as TensorId
    }

    /// How the bytes are made, read with the checkpoint the plan was made from.
    ///
    /// # Panics
    /// With another checkpoint than the plan's, that lacks the tensor's source.
    pub fn recipe(&self, ckpt: &Checkpoint) -> Recipe {
        match self.packed.unpack(ckpt, self.tensor()) {
            Some(recipe) => recipe,
            None => panic!(
                "the plan of `{}` is read with another checkpoint than its own",
                ckpt.tensors()[self.tensor()].name
            ),
        }
    }

    /// Whether the recipe applies LoRA merges (into the stored or the dequantized value).
    pub fn merges(&self) -> bool {
        self.packed.merges()
    }

    /// The name written: the checkpoint's, but `P` for an MXFP4 `P_blocks` and
    /// `M.weight` for a packed `M.weight_packed` written dequantized.
    pub fn name<'c>(&self, ckpt: &'c Checkpoint) -> std::borrow::Cow<'c, str> {
        let name: &str = &ckpt.tensors()[self.tensor()].name;
        match self.packed.whole() {
            Some(recipe) => recipe.written_name(name),
            None => std::borrow::Cow::Borrowed(name),
        }
    }

    /// The shape written: the checkpoint's, but the dequantized experts' for MXFP4.
    pub fn shape(&self, ckpt: &Checkpoint) -> Vec<u64> {
        match self.packed.whole().and_then(Recipe::renamed_shape) {
            Some(shape) => shape,
            None => ckpt.tensors()[self.tensor()].shape.to_vec(),
        }
    }

    /// Where the tensor's bytes end in the shard's data region.
    pub fn end(&self) -> u64 {
        self.begin + self.len
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ShardPlan {
    pub file_name: String,
    /// In the order their bytes are written.
    pub tensors: Vec<PlannedTensor>,
    /// Bytes of the encoded header (length prefix included). The header itself is
    /// encoded again when the shard is written, so no plan holds every header at once.
    pub header_len: u64,
    pub data_bytes: u64,
}

impl ShardPlan {
    pub fn file_bytes(&self) -> u64 {
        self.header_len + self.data_bytes
    }

    /// Writes the shard's safetensors header (names and shapes from `ckpt`,
    /// `format: pt`) to `out`, streaming: returns its length.
    pub fn write_header(
        &self,
        ckpt: &Checkpoint,
        out: &mut impl std::io::Write,
    ) -> std::io::Result<u64> {
        write_header(out, self.header_entries(ckpt), &shard_metadata())
    }

    /// The length [`ShardPlan::write_header`] writes, counted without writing.
    fn counted_header_len(&self, ckpt: &Checkpoint) -> u64 {
        crate::formats::safetensors::header_len(self.header_entries(ckpt), &shard_metadata())
    }

    /// The shard's tensors as its header lists them: name, dtype, shape, and where
    /// the bytes lie in the data region.
    pub fn header_entries<'c>(
        &'c self,
        ckpt: &'c Checkpoint,
    ) -> impl Iterator<Item = HeaderEntry<'c>> + Clone + 'c {
        self.tensors.iter().map(move |p| HeaderEntry {
            name: p.name(ckpt),
            dtype: p.dtype,
            shape: p.shape(ckpt).into(),
            begin: p.begin,
            end: p.end(),
        })
    }
}

/// The `__metadata__` every shard carries, as transformers writes it.
fn shard_metadata() -> BTreeMap<String, String> {
    BTreeMap::from([("format".to_owned(), "pt".to_owned())])
}

#[derive(Debug, Clone, PartialEq)]
pub struct SavePlan {
    pub shards: Vec<ShardPlan>,
    /// The dtype floating-point tensors are cast to, when the save casts.
    pub cast_to: Option<DType>,
    pub total_size: u64,
    pub total_parameters: u64,
    /// `(dropped, kept)`: tied names not written because their group's kept name is.
    pub dropped_ties: Vec<(String, String)>,
    pub largest_tensor: Option<(String, u64)>,
    /// Tensors written as float32 although the save casts, because transformers
    /// keeps them in float32 at the dtype cast to (`--dtype auto`), with the
    /// `_keep_in_fp32_modules(_strict)` entry that keeps each.
    pub kept_fp32: Vec<(String, String)>,
    /// Tensors an explicit `--dtype` casts although transformers would keep them in
    /// float32 at that dtype, with the entry.
    pub cast_despite_fp32: Vec<(String, String)>,
    /// FP8 weights written dequantized, and their scale tensors left out: config.json
    /// is then written without its `quantization_config`.
    pub dequantized: usize,
    pub dropped_scales: Vec<String>,
    /// `--quantize fp8-block`: the weights written as FP8, and the
    /// `quantization_config` config.json gets.
    pub quantized: usize,
    pub quantization_config: Option<serde_json::Value>,
}

/// What a save holds in memory, for the inspector's save preview: its bytes and what
/// they are, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryNeed {
    pub bytes: u64,
    pub parts: Vec<&'static str>,
}

impl SavePlan {
    /// The quantized format this save dequantizes, in words (`FP8`, `MXFP4`).
    pub fn dequantized_format(&self) -> &'static str {
        self.planned()
            .find_map(|p| p.packed.whole().and_then(Recipe::quant_format))
            .unwrap_or("FP8")
    }

    /// What this save does about the modules transformers keeps in float32, in words,
    /// grouped (one line each for kept and cast; none when neither happens).
    pub fn fp32_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let entries = |list: &[(String, String)]| {
            let mut e: Vec<&str> = list.iter().map(|(_, m)| m.as_str()).collect();
            e.sort_unstable();
            e.dedup();
            e.iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        // The same "`a`, `b` … and N more" as every warning.
        let names = |list: &[(String, String)]| {
            let n: Vec<&str> = list.iter().map(|(t, _)| t.as_str()).collect();
            crate::model::warning::name_list(&n)
        };
        if !self.kept_fp32.is_empty() {
            lines.push(format!(
                "{} stay float32, as transformers keeps {} ({}): {}",
                crate::text::count(self.kept_fp32.len(), "tensor", "tensors"),
                if self.kept_fp32.len() == 1 {
                    "it"
                } else {
                    "them"
                },
                entries(&self.kept_fp32),
                names(&self.kept_fp32)
            ));
        }
        if let (false, Some(to)) = (self.cast_despite_fp32.is_empty(), self.cast_to) {
            lines.push(format!(
                "{} cast to {} although transformers keeps {} in float32 at that dtype ({}): {}; --dtype auto would keep {}",
                crate::text::count(self.cast_despite_fp32.len(), "tensor is", "tensors are"),
                to.torch_name(),
                if self.cast_despite_fp32.len() == 1 { "it" } else { "them" },
                entries(&self.cast_despite_fp32),
                names(&self.cast_despite_fp32),
                if self.cast_despite_fp32.len() == 1 { "it" } else { "them" },
            ));
        }
        lines
    }

    /// Every planned tensor, shard by shard.
    pub fn planned(&self) -> impl Iterator<Item = &PlannedTensor> {
        self.shards.iter().flat_map(|s| &s.tensors)
    }

    /// How many tensors the save computes through a LoRA merge.
    pub fn merged_count(&self) -> usize {
        self.planned().filter(|t| t.merges()).count()
    }

    /// The memory the save of this plan holds: a copy buffer per writer, a cast buffer
    /// per writer when it casts, and for LoRA merges the largest adapter pair in f32
    /// plus a block on every core. Never a shard, never a whole weight.
    pub fn memory_need(&self, ckpt: &Checkpoint, jobs: usize) -> MemoryNeed {
        // A job per shard; the spare jobs also write when a shard is big enough to be
        // written in parts (see `save::writer`).
        let big = self
            .shards
            .iter()
            .any(|s| s.file_bytes() >= PARALLEL_SHARD_BYTES);
        let writers = if big {
            jobs.max(1)
        } else {
            jobs.clamp(1, self.shards.len().max(1))
        } as u64;
        let chunk = super::copy::CHUNK as u64;
        let mut need = MemoryNeed {
            bytes: writers * chunk,
            parts: vec!["a copy buffer per writer"],
        };
        let recipes = || self.planned().map(|t| (t.tensor(), t.recipe(ckpt)));
        if recipes().any(|(_, r)| r.casts()) {
            need.bytes += writers * chunk;
            need.parts.push("a cast buffer per writer");
        }
        if recipes().any(|(_, r)| r.pieces().is_some()) {
            // A window of rows, a piece's share of it, and its cast (see save::stitch).
            need.bytes += writers * super::stitch::ASSEMBLY_BYTES;
            need.parts
                .push("a window of rows per writer, for tensors split across ranks");
        }
        let largest_scales = recipes().filter_map(|(_, r)| r.fp8_scales_len()).max();
        if let Some(scales) = largest_scales {
            // A band of FP8 rows, its float32 values and its output, and the scales.
            need.bytes += writers * (super::fp8::BAND_BYTES + scales);
            need.parts
                .push("a band of rows and the scales per dequantizing writer");
        }
        let largest_mxfp4 = recipes()
            .filter_map(|(_, r)| Some(r.mxfp4()?.memory()))
            .max();
        if let Some(bytes) = largest_mxfp4 {
            need.bytes += writers * bytes;
            need.parts
                .push("one expert's MXFP4 bytes and a band of rows per dequantizing writer");
        }
        // Each band-streaming dequantizer the save runs, once per writer.
        let mut bands: Vec<(u64, &'static str)> =
            recipes().filter_map(|(_, r)| r.band_memory()).collect();
        bands.sort_unstable();
        bands.dedup();
        for (bytes, what) in bands {
            need.bytes += writers * bytes;
            need.parts.push(what);
        }
        let largest_pair = recipes()
            .filter(|(_, r)| r.merge)
            .map(|(id, _)| {
                ckpt.merges_of(id)
                    .iter()
                    .map(|m| {
                        let f32s = |m: &crate::model::merge::Matrix| m.rows * m.cols * 4;
                        m.a.as_ref().map_or(0, f32s) + f32s(&m.b)
                    })
                    .max()
                    .unwrap_or(0)
            })
            .max();
        if let Some(pair) = largest_pair {
            let cores = std::thread::available_parallelism().map_or(1, usize::from) as u64;
            need.bytes += cores * (pair + (1 << 20));
            need.parts
                .push("the largest adapter pair in f32 and a block per core");
        }
        need
    }

    pub fn tensor_count(&self) -> usize {
        self.shards.iter().map(|s| s.tensors.len()).sum()
    }

    /// Bytes the shard files take, headers included.
    pub fn file_bytes(&self) -> u64 {
        self.shards.iter().map(ShardPlan::file_bytes).sum()
    }
}

/// How tensor `id`, stored in pieces `index`, is written when the save casts
/// floating-point tensors to `cast_to`: put together when its pieces make it up exactly
/// once, else refused with the gap or overlap named.
fn stitch_recipe(
    ckpt: &Checkpoint,
    id: TensorId,
    index: u32,
    cast_to: Option<DType>,
    held_in_part: bool,
) -> Result<Recipe, String> {
    let tensor = &ckpt.tensors()[id];
    let pieces = ckpt.pieces(index);
    let chunks = crate::text::count(pieces.len(), "chunk", "chunks");
    // One rank of a sharded job holds some of each tensor, the others the rest: the
    // commit checks that all of them together make each tensor up.
    let check = if held_in_part {
        crate::types::pieces::held_apart
    } else {
        crate::types::pieces::tiling
    };
    check(&tensor.shape.to_vec(), pieces)
        .map_err(|problem| format!("is stored in {chunks} that do not make it up: {problem}"))?;
    // A block stored row-major holds exactly its elements; one stored with strides
    // was checked against its storage when read.
    let size = tensor.dtype.size();
    if let Some(p) = pieces
        .iter()
        .find(|p| p.stride.is_none() && p.range.len != p.numel() * size)
    {
        return Err(format!(
            "has a chunk at {:?} of {} bytes, but its sizes {:?} and dtype need {}",
            p.offsets,
            p.range.len,
            p.sizes,
            p.numel() * size
        ));
    }
    let len = tensor.bytes();
    if !ckpt.merges_of(id).is_empty() {
        return Err(format!(
            "is stored in {chunks} across ranks and a LoRA adapter merges into it: devmap merges into tensors stored whole; save the checkpoint once, then merge into what it wrote"
        ));
    }
    let first = pieces.first().map_or(
        ByteRange {
            file: 0,
            offset: 0,
            len: 0,
        },
        |p| p.range,
    );
    let make = recipe_for(tensor.dtype, first, cast_to)?.make;
    Ok(Recipe {
        read: super::execute::Read::Pieces { index, len },
        make,
        merge: false,
    })
}

/// How a tensor of `dtype` stored at `range` is written when the save casts
/// floating-point tensors to `cast_to`.
fn recipe_for(dtype: DType, range: ByteRange, cast_to: Option<DType>) -> Result<Recipe, String> {
    use super::cast::{is_castable, is_floating};
    match cast_to {
        Some(to) if is_floating(dtype) && dtype != to => {
            if is_castable(dtype) && is_castable(to) {
                Ok(Recipe::cast(range, dtype, to))
            } else {
                Err(format!(
                    "is {dtype}, which devmap does not cast (it casts float32, float16 and bfloat16); save with --dtype keep"
                ))
            }
        }
        _ => Ok(Recipe::copy(range)),
    }
}

/// Splits consecutive items into shards as huggingface_hub does: start a new shard when
/// the next item would pass `max`; an item larger than `max` gets a shard to itself.
pub fn split_into_shards(sizes: &[u64], max: u64) -> Vec<Range<usize>> {
    split_sizes(sizes.iter().copied(), max)
}

/// [`split_into_shards`] of sizes as they come (no list of them held).
fn split_sizes(sizes: impl ExactSizeIterator<Item = u64>, max: u64) -> Vec<Range<usize>> {
    let count = sizes.len();
    let mut shards = Vec::new();
    let mut start = 0;
    let mut current = 0u64;
    for (i, size) in sizes.enumerate() {
        if size > max {
            if i > start {
                shards.push(start..i);
            }
            shards.push(i..i + 1);
            start = i + 1;
            current = 0;
            continue;
        }
        if i > start && current + size > max {
            shards.push(start..i);
            start = i;
            current = 0;
        }
        current += size;
    }
    if start < count {
        shards.push(start..count);
    }
    shards
}

pub fn plan(ckpt: &Checkpoint, options: &SaveOptions) -> Result<SavePlan, SaveError> {
    if let Some(remote) = &ckpt.remote {
        return Err(SaveError::Refused(vec![super::reasons::Refusal::Remote {
            name: remote.name.clone(),
        }]));
    }
    let mut problems = Vec::new();
    // Two layouts of the same expert weights would both be written, and transformers
    // could load neither: refused until devmap converts them back (issue 11).
    for w in &ckpt.warnings {
        match w {
            crate::model::Warning::ConvertedLayout { .. } => {
                problems.push(Unsaveable::ConvertedLayout(w.to_string()));
            }
            // Writing the model without the head, or with the embedding under its
            // name, would each be a guess: the user says which.
            crate::model::Warning::HeadTieUnknown { .. } => {
                problems.push(Unsaveable::HeadTieUnknown(w.to_string()));
            }
            crate::model::Warning::DeviceMapUnreadable { .. } => {
                problems.push(Unsaveable::DeviceMapUnreadable(w.to_string()));
            }
            _ => {}
        }
    }
    let mut dropped_ties = Vec::new();
    let cast_to = resolve_dtype(ckpt, options.dtype);
    // An explicit float dtype on quantized weights dequantizes them, or refuses: never
    // quantized bytes under a float promise.
    let dequantize = match Dequantize::for_save(ckpt, options.dtype) {
        Ok(how) => how,
        Err(Refused::Alone(problem)) => {
            problems.push(problem);
            return Err(SaveError::Unsaveable(problems));
        }
        Err(Refused::WithOthers(problem)) => {
            problems.push(problem);
            None
        }
    };
    let mut dequantized_count = 0;
    let mut dropped_scales = Vec::new();
    let arch = crate::model::arch::lookup(&ckpt.config.architectures);
    let (mut kept_fp32, mut cast_despite_fp32) = (Vec::new(), Vec::new());
    // transformers' own answer, when it was asked at the dtype this save casts to.
    let asked = options
        .asked
        .as_deref()
        .filter(|a| cast_to.is_some() && a.dtype == cast_to);
    // One planned tensor per tensor, reserved once: at a million tensors this list is
    // most of what a save holds, so it is never grown by doubling nor copied.
    // A quantized weight is two planned tensors (its values and its scales).
    let mut chosen: Vec<PlannedTensor> =
        Vec::with_capacity(ckpt.tensors().len() * if options.quantize_fp8 { 2 } else { 1 });
    let (mut quantized_count, mut not_converted) = (0usize, Vec::new());
    if options.quantize_fp8 && ckpt.config.quantization.is_some() {
        problems.push(Unsaveable::Quantization(
            "--quantize fp8-block quantizes a float model, and config.json's quantization_config says this one is quantized already: save it with --dtype bfloat16 first (which dequantizes it), then quantize that".to_owned(),
        ));
    }
    let mut chosen_push = |id: TensorId, recipe: Recipe| {
        chosen.push(PlannedTensor::new(ckpt, id, recipe));
    };
    for (id, tensor) in ckpt.tensors().iter().enumerate() {
        if &*tensor.name == "__metadata__" {
            // The one key a safetensors header keeps for itself.
            problems.push(Unsaveable::ReservedName);
            continue;
        }
        if let Some(group) = ckpt.tie_group(id)
            && !options.keep_tied
            && group.kept() != id
        {
            dropped_ties.push((
                tensor.name.to_string(),
                ckpt.tensors()[group.kept()].name.to_string(),
            ));
            continue;
        }
        if let Some(how) = dequantize {
            match how.tensor(ckpt, id) {
                Ok(Dequantized::NotFp8) => {}
                Ok(Dequantized::Written(recipe)) => {
                    dequantized_count += 1;
                    chosen_push(id, recipe);
                    continue;
                }
                Ok(Dequantized::Dropped) => {
                    dropped_scales.push(tensor.name.to_string());
                    continue;
                }
                Err(why) => {
                    problems.push(Unsaveable::NotDequantized {
                        tensor: tensor.name.to_string(),
                        why,
                    });
                    continue;
                }
            }
        }
        if options.quantize_fp8 {
            match quantize::choose(ckpt, id) {
                Ok(quantize::Fp8Choice::Quantized(recipes)) => {
                    quantized_count += 1;
                    for recipe in *recipes {
                        chosen_push(id, recipe);
                    }
                    continue;
                }
                Ok(quantize::Fp8Choice::Kept { module }) => not_converted.extend(module),
                Err(why) => {
                    problems.push(Unsaveable::NoRecipe {
                        tensor: tensor.name.to_string(),
                        why,
                    });
                    continue;
                }
            }
        }
        // What transformers keeps in float32 at the dtype the save casts to.
        // Matched on the loaded name (renamed, or the fused expert parameter it becomes),
        // as transformers matches it; computed once per checkpoint.
        let loaded = ckpt.loaded_name(id).unwrap_or(&tensor.name);
        let keep = match asked {
            Some(answer) => (super::cast::is_floating(tensor.dtype) && answer.keeps_fp32(loaded))
                .then_some("transformers, asked"),
            None => cast_to
                .filter(|_| super::cast::is_floating(tensor.dtype))
                .and_then(|to| arch?.kept_in_fp32(loaded, to)),
        };
        let cast_to = match (keep, options.dtype) {
            (_, DtypeChoice::AsLoaded) => tensor.load_dtype.filter(|&d| d != tensor.dtype),
            (Some(entry), DtypeChoice::Auto) => {
                kept_fp32.push((tensor.name.to_string(), entry.to_owned()));
                Some(DType::F32)
            }
            (Some(entry), _) => {
                cast_despite_fp32.push((tensor.name.to_string(), entry.to_owned()));
                cast_to
            }
            (None, _) => cast_to,
        };
        if let Some(crate::model::checkpoint::Source::Pieces(index)) = ckpt.data_source(id) {
            let held_in_part = matches!(
                options.distributed,
                Some(super::parts::Distributed::Ranks(_))
            );
            match stitch_recipe(ckpt, id, index, cast_to, held_in_part) {
                Ok(recipe) => chosen_push(id, recipe),
                Err(why) => problems.push(Unsaveable::NoRecipe {
                    tensor: tensor.name.to_string(),
                    why,
                }),
            }
            continue;
        }
        match ckpt.data_range(id) {
            Some(range) if range.len == tensor.bytes() => {
                if ckpt.merges_of(id).is_empty() {
                    match recipe_for(tensor.dtype, range, cast_to) {
                        Ok(recipe) => chosen_push(id, recipe),
                        Err(why) => problems.push(Unsaveable::NoRecipe {
                            tensor: tensor.name.to_string(),
                            why,
                        }),
                    }
                } else if !matches!(tensor.dtype, DType::F32 | DType::F16 | DType::BF16) {
                    problems.push(Unsaveable::NoRecipe {
                        tensor: tensor.name.to_string(),
                        why: format!(
                            "is {} and a LoRA adapter merges into it: the merge works on the dequantized weight, so save with --dtype bfloat16 (or float16, float32)",
                            tensor.dtype
                        ),
                    });
                } else {
                    let to = cast_to.unwrap_or(tensor.dtype);
                    let recipe = if to == tensor.dtype {
                        Recipe::copy(range)
                    } else {
                        Recipe::cast(range, tensor.dtype, to)
                    };
                    chosen_push(id, recipe.merged(true));
                }
            }
            Some(range) => problems.push(Unsaveable::WrongSize {
                tensor: tensor.name.to_string(),
                needs: tensor.bytes(),
                file: ckpt.file_path(range.file).to_path_buf(),
                holds: range.len,
            }),
            None => problems.push(Unsaveable::NoData {
                tensor: tensor.name.to_string(),
                placement: tensor.placement.to_string(),
            }),
        }
    }
    if matches!(dequantize, Some(Dequantize::Mxfp4(_))) && dequantized_count == 0 {
        problems.push(Unsaveable::Quantization(
            "config.json's quantization_config is `mxfp4`, but no tensor is MXFP4 blocks (`…_blocks` with `…_scales`): there is nothing to dequantize, and a float --dtype would keep a quantization_config that no weight matches; save with --dtype keep".to_owned(),
        ));
    }
    if options.quantize_fp8 && quantized_count == 0 && ckpt.config.quantization.is_none() {
        problems.push(Unsaveable::Quantization(
            "--quantize fp8-block found no weight to quantize: it quantizes the 2-D weights of linear layers whose both dimensions are multiples of 128".to_owned(),
        ));
    }
    if !problems.is_empty() {
        return Err(SaveError::Unsaveable(problems));
    }
    not_converted.sort_unstable();
    not_converted.dedup();
    let total_parameters = ckpt.total_parameters.unwrap_or_else(|| {
        chosen
            .iter()
            .map(|p| p.shape(ckpt).iter().product::<u64>())
            .sum()
    });
    let total_size = chosen.iter().map(|p| p.len).sum();
    let ranges = split_sizes(chosen.iter().map(|p| p.len), options.max_shard_size);
    let count = ranges.len();
    // Each shard takes its part of the list from the end, and the list gives the memory
    // back as it shrinks: the tensors are held once, never twice.
    let mut shards: Vec<ShardPlan> = Vec::with_capacity(count);
    for (k, range) in ranges.into_iter().enumerate().rev() {
        let file_name = if count == 1 {
            SINGLE_FILE.to_owned()
        } else {
            shard_file_name(k + 1, count)
        };
        let mut tensors = if range.start == 0 {
            std::mem::take(&mut chosen)
        } else {
            let tail = chosen.split_off(range.start);
            chosen.shrink_to_fit();
            tail
        };
        // Widest elements first keeps every tensor aligned to its element size,
        // as the safetensors library lays files out; module order (the tensor id)
        // otherwise. In place: no copy of the list.
        tensors.sort_unstable_by_key(|p| (std::cmp::Reverse(p.dtype.size()), p.tensor()));
        let mut begin = 0;
        for p in &mut tensors {
            p.begin = begin;
            begin += p.len;
        }
        let mut shard = ShardPlan {
            file_name,
            tensors,
            header_len: 0,
            data_bytes: begin,
        };
        shard.header_len = shard.counted_header_len(ckpt);
        shards.push(shard);
    }
    shards.reverse();
    let largest_tensor = shards
        .iter()
        .flat_map(|s: &ShardPlan| &s.tensors)
        .max_by_key(|p| p.len)
        .map(|p| (p.name(ckpt).into_owned(), p.len));
    Ok(SavePlan {
        shards,
        cast_to,
        total_size,
        total_parameters,
        dropped_ties,
        largest_tensor,
        kept_fp32,
        cast_despite_fp32,
        dequantized: dequantized_count,
        quantized: quantized_count,
        quantization_config: (quantized_count > 0).then(|| quantize::config(&not_converted)),
        dropped_scales,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn oversized_tensor_gets_its_own_shard() {
        assert_eq!(split_into_shards(&[3, 3, 10, 3], 6), vec![0..2, 2..3, 3..4]);
        assert_eq!(split_into_shards(&[3, 4], 6), vec![0..1, 1..2]);
        assert_eq!(split_into_shards(&[3, 3], 6), vec![0..2]);
        assert_eq!(split_into_shards(&[], 6), Vec::<Range<usize>>::new());
        assert_eq!(split_into_shards(&[0, 0, 7], 6), vec![0..2, 2..3]);
    }

    proptest! {
        #[test]
        fn every_item_once_in_order_and_under_the_limit(
            sizes in proptest::collection::vec(0u64..1000, 0..60),
            max in 1u64..2000,
        ) {
            let shards = split_into_shards(&sizes, max);
            let flat: Vec<usize> = shards.iter().flat_map(std::clone::Clone::clone).collect();
            prop_assert_eq!(flat, (0..sizes.len()).collect::<Vec<_>>());
            for r in &shards {
                prop_assert!(!r.is_empty());
                let total: u64 = sizes[r.clone()].iter().sum();
                prop_assert!(total <= max || r.len() == 1, "shard {:?} holds {} > {}", r, total, max);
            }
            // Greedy: a shard could not have taken the next item without passing the limit.
            for pair in shards.windows(2) {
                let total: u64 = sizes[pair[0].clone()].iter().sum();
                let next = sizes[pair[1].start];
                prop_assert!(total + next > max || next > max || total > max);
            }
        }
    }
}
