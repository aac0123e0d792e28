//! Step 1 and 2 of a save: resolve every tensor to its bytes, collapse ties, and cut
//! the list into shards. Pure: nothing is read or written, so the TUI can preview it.

use std::ops::Range;

use super::error::SaveError;
use super::execute::Recipe;
use super::reasons::Unsaveable;
use crate::formats::hf_index::{SINGLE_FILE, shard_file_name};
use crate::model::checkpoint::{ByteRange, Checkpoint, TensorId};
use crate::types::DType;

mod dequantize;
mod dequantize_gptq;
mod dequantize_packed;
mod options;
mod planned;
mod quantize;

pub(super) use options::PARALLEL_SHARD_BYTES;
pub use options::{
    CachePolicy, CommitCheck, DEFAULT_JOBS, DEFAULT_MAX_SHARD_SIZE, DEFAULT_MAX_SHARD_SIZE_TEXT,
    DtypeChoice, SaveOptions, resolve_dtype, runtime_dtype,
};
pub use planned::{MemoryNeed, PlannedTensor, SavePlan, ShardPlan};

use dequantize::{Dequantize, Dequantized, Refused};

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
    if let (Some(Dequantize::Gptq(..)), 0, Some(q)) =
        (dequantize, dequantized_count, &ckpt.config.quantization)
    {
        problems.push(Unsaveable::Quantization(format!(
            "config.json's quantization_config is `{}`, but no tensor is a quantized weight (`M.qweight` with `M.qzeros` and `M.scales`): there is nothing to dequantize, and a float --dtype would keep a quantization_config that no weight matches; save with --dtype keep",
            q.method
        )));
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
