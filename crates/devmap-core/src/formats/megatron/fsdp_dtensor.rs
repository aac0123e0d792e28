//! Megatron-LM's `fsdp_dtensor` checkpoints (`--ckpt-format fsdp_dtensor`, the format
//! Megatron-FSDP training saves). They are plain torch.distributed.checkpoint
//! folders: no `metadata.json`, no `common.pt`. One state dict holds:
//! - `args`, the training arguments, pickled by `torch.save` as a bytes entry;
//! - `model`, the model's state dict behind its wrappers' `module.`, a layer per name;
//! - the optimizer's state, `rng_state` and counters.
//!
//! Before saving, Megatron-LM cuts each gated `linear_fc1` into `…weight_w` (the
//! gate) and `…weight_v` (the up projection): saved whole across tensor-parallel
//! ranks, it would interleave each rank's gate and up. It also numbers experts
//! globally: `…experts.local_experts.E.…`, or a grouped GEMM's `…linear_fc1.weightE`.
//! Megatron-LM's converter from torch_dist (`checkpoint_inspector.py`) writes the same
//! names flat, as `model.module.…`.
//!
//! So such a checkpoint is a DCP folder whose tensors carry megatron-core's names after
//! a prefix of `model.` and `module.`. The same map as torch_dist's converts it
//! (`megatron::convert`): the names say the layer, the expert and the half.

use std::path::Path;

use super::{Origin, Read, convert};
use crate::formats::FormatError;
use crate::formats::dcp;

/// The name every Megatron-Core GPT model's embedding has after the prefix.
const EMBEDDING: &str = "embedding.word_embeddings.weight";

/// The prefix before megatron-core's names when `split` (a DCP folder read without a
/// `--state-dict-key`) holds a Megatron-Core GPT model: its embedding and at least one
/// layer of its decoder, both behind the same run of `model.` and `module.`. `None`
/// for anything else, such as a transformers model (whose BART-like
/// `model.decoder.layers.…` has no such embedding).
pub fn prefix(split: &crate::formats::split::Split) -> Option<String> {
    let mut names = split
        .files
        .iter()
        .flat_map(|(_, header)| header.tensors.iter().map(|t| &*t.name))
        .chain(split.pieced.iter().map(|t| t.name.as_str()));
    let is_wrappers = |p: &str| {
        p.split_terminator('.')
            .all(|part| part == "model" || part == "module")
    };
    let prefix = names.clone().find_map(|name| {
        let at = name.find(super::layout::LAYERS)?;
        let prefix = &name[..at];
        let layer = name[at + super::layout::LAYERS.len()..].split('.').next()?;
        (is_wrappers(prefix) && layer.parse::<u64>().is_ok()).then(|| prefix.to_owned())
    })?;
    let embedding = format!("{prefix}{EMBEDDING}");
    names.any(|n| n == embedding).then_some(prefix)
}

/// Reads the `fsdp_dtensor` checkpoint `read` (of the folder `dir`) whose names carry
/// `prefix`: the tensors under it converted as Megatron-Core's, the hyperparameters
/// from its `args` entry. `config`: `--config`'s config.json.
pub fn read_fsdp_dtensor(
    dir: &Path,
    read: dcp::Read,
    prefix: String,
    config: Option<&serde_json::Value>,
) -> Result<Read, FormatError> {
    let dcp::Read { mut split, objects } = read;
    let args = match objects.iter().find(|o| o.fqn == "args") {
        Some(object) => Some(super::args::read_args_object(object)?),
        None => None,
    };
    // What is not under the prefix (the flat form's optimizer state, for one) is not
    // the model's: left out, counted by its first key.
    let mut others = std::collections::BTreeMap::<String, usize>::new();
    let mut count = |name: &str| {
        let top = name.split('.').next().unwrap_or(name).to_owned();
        *others.entry(top).or_default() += 1;
    };
    for (_, header) in &mut split.files {
        header.tensors.retain(|t| {
            let keep = t.name.starts_with(&prefix);
            if !keep {
                count(&t.name);
            }
            keep
        });
    }
    split.pieced.retain(|t| {
        let keep = t.name.starts_with(&prefix);
        if !keep {
            count(&t.name);
        }
        keep
    });
    // `args` is read, not left out.
    split.left_out.retain(|line| line != "`args`");
    split.left_out.extend(
        others
            .into_iter()
            .map(|(key, n)| format!("`{key}` ({})", crate::text::count(n, "tensor", "tensors"))),
    );
    let args_file = match objects.iter().find(|o| o.fqn == "args") {
        Some(object) => object.file.clone(),
        None => dir.join(dcp::METADATA),
    };
    convert(
        dir,
        split,
        config,
        Origin {
            args,
            args_file,
            prefix,
        },
    )
}
