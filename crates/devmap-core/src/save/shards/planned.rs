//! A plan: each tensor's place in a shard and the recipe that makes its bytes, the
//! shards' headers, and what the save needs (bytes, memory). Made by [`super::plan`].

use std::collections::BTreeMap;

use crate::formats::safetensors::{HeaderEntry, write_header};
use crate::model::checkpoint::{Checkpoint, TensorId};
use crate::save::execute::{Recipe, packed};
use crate::types::DType;

use super::options::PARALLEL_SHARD_BYTES;

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
    pub(super) fn new(ckpt: &Checkpoint, id: TensorId, recipe: Recipe) -> PlannedTensor {
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
    pub(super) fn counted_header_len(&self, ckpt: &Checkpoint) -> u64 {
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

    /// The memory the save of this plan holds on this machine: a copy buffer per
    /// writer, a cast buffer per writer when it casts, and for arithmetic recipes
    /// their working memory on each thread that computes (a band of rows; for LoRA
    /// merges the largest adapter pair in f32 and a block). Never a shard, never a
    /// whole weight.
    pub fn memory_need(&self, ckpt: &Checkpoint, jobs: usize) -> MemoryNeed {
        self.memory_need_on(ckpt, jobs, crate::save::compute::cores())
    }

    /// [`SavePlan::memory_need`] on a machine of `cores` cores.
    pub fn memory_need_on(&self, ckpt: &Checkpoint, jobs: usize, cores: u64) -> MemoryNeed {
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
        // Threads computing arithmetic recipes at once: a recipe's parts each hold
        // one of the cores' permits (`save::compute`), and each writer runs one
        // recipe at a time, split among at most `MOST_THREADS_A_RECIPE` threads.
        let computing = cores
            .min(writers * crate::save::compute::MOST_THREADS_A_RECIPE)
            .max(1);
        let chunk = crate::save::copy::CHUNK as u64;
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
            need.bytes += writers * crate::save::stitch::ASSEMBLY_BYTES;
            need.parts
                .push("a window of rows per writer, for tensors split across ranks");
        }
        let largest_scales = recipes().filter_map(|(_, r)| r.fp8_scales_len()).max();
        if let Some(scales) = largest_scales {
            // A band of FP8 rows, its float32 values and its output on each computing
            // thread, and the scales once a writer.
            need.bytes += computing * crate::save::fp8::BAND_BYTES + writers * scales;
            need.parts
                .push("a band of rows per computing thread and the scales per writer");
        }
        let largest_mxfp4 = recipes()
            .filter_map(|(_, r)| Some(r.mxfp4()?.memory()))
            .max();
        if let Some(bytes) = largest_mxfp4 {
            need.bytes += computing * bytes;
            need.parts
                .push("one expert's MXFP4 bytes and a band of rows per computing thread");
        }
        // Each band-streaming dequantizer the save runs, once per computing thread.
        let mut bands: Vec<(u64, &'static str)> =
            recipes().filter_map(|(_, r)| r.band_memory()).collect();
        bands.sort_unstable();
        bands.dedup();
        for (bytes, what) in bands {
            need.bytes += computing * bytes;
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
            need.bytes += computing * (pair + (1 << 20));
            need.parts
                .push("the largest adapter pair in f32 and a block per computing thread");
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
