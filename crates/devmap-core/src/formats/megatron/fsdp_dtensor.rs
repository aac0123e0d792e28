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
    let mut names = split.names();
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
    let metadata = dir.join(dcp::METADATA);
    let args_object = objects.iter().find(|o| o.fqn == "args");
    let args = args_object.map(super::args::read_args_object).transpose()?;
    check_gated_halves(args.as_ref(), split.names(), &metadata)?;
    // What is not under the prefix (the flat form's optimizer state, for one) is not
    // the model's: left out, counted by its first key.
    let mut others = std::collections::BTreeMap::<String, usize>::new();
    let mut keep = |name: &str| {
        let under = name.starts_with(&prefix);
        if !under {
            let top = name.split('.').next().unwrap_or(name).to_owned();
            *others.entry(top).or_default() += 1;
        }
        under
    };
    for (_, header) in &mut split.files {
        header.tensors.retain(|t| keep(&t.name));
    }
    split.pieced.retain(|t| keep(&t.name));
    // `args` is read, not left out.
    split.left_out.retain(|line| line != "`args`");
    split.left_out.extend(
        others
            .into_iter()
            .map(|(key, n)| format!("`{key}` ({})", crate::text::count(n, "tensor", "tensors"))),
    );
    let args_file = args_object.map_or(metadata, |object| object.file.clone());
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

/// Refuses a gated `linear_fc1` saved whole from more than one tensor-parallel rank
/// (the arguments say `swiglu` and `tensor_model_parallel_size` > 1): the whole
/// tensor then holds each rank's gate and up halves in turn, which no name says.
/// Megatron-LM's `fsdp_dtensor` save cuts it into `_w` and `_v` for this reason; a
/// folder of the same names without them (a `torch_dcp` save, say) would be cut wrong.
fn check_gated_halves<'a>(
    args: Option<&super::args::Args>,
    mut names: impl Iterator<Item = &'a str>,
    metadata: &Path,
) -> Result<(), FormatError> {
    let Some(args) = args else {
        return Ok(());
    };
    let ranks = super::args::arg_u64(args, "tensor_model_parallel_size").unwrap_or(1);
    if ranks <= 1 || super::args::arg_bool(args, "swiglu") != Some(true) {
        return Ok(());
    }
    match names.find(|n| n.ends_with(".linear_fc1.weight")) {
        Some(name) => Err(FormatError::tensor_as(
            crate::formats::Kind::Unsupported,
            metadata,
            name,
            format!(
                "is a gated MLP's gate and up projections saved whole from {ranks} tensor-parallel ranks (tensor_model_parallel_size): each rank's two halves lie in turn, and nothing says where. Megatron-LM's fsdp_dtensor save cuts it into `…weight_w` and `…weight_v`; devmap reads those. Nothing was written"
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::pickle::Value;

    #[test]
    fn a_gated_fc1_saved_whole_from_several_ranks_is_refused() {
        let args = |tp: i64, swiglu: bool| {
            vec![
                ("tensor_model_parallel_size".to_owned(), Value::Int(tp)),
                ("swiglu".to_owned(), Value::Bool(swiglu)),
            ]
        };
        let whole = ["module.decoder.layers.0.mlp.linear_fc1.weight"];
        let halves = [
            "module.decoder.layers.0.mlp.linear_fc1.weight_w",
            "module.decoder.layers.0.mlp.linear_fc1.weight_v",
        ];
        let at = Path::new("ckpt/.metadata");
        let err =
            check_gated_halves(Some(&args(2, true)), whole.into_iter(), at).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("linear_fc1.weight") && text.contains("2 tensor-parallel ranks"),
            "{text}"
        );
        // Its halves apart, one rank, an ungated MLP, or no arguments: read.
        assert!(check_gated_halves(Some(&args(2, true)), halves.into_iter(), at).is_ok());
        assert!(check_gated_halves(Some(&args(1, true)), whole.into_iter(), at).is_ok());
        assert!(check_gated_halves(Some(&args(2, false)), whole.into_iter(), at).is_ok());
        assert!(check_gated_halves(None, whole.into_iter(), at).is_ok());
    }

    #[test]
    fn megatron_names_behind_wrappers_are_recognised() {
        use crate::formats::safetensors::HeaderTensor;
        use crate::formats::split::Split;
        use crate::types::DType;
        use crate::types::shape::Shape;
        let split_of = |names: &[&str]| {
            let tensors = names
                .iter()
                .map(|n| HeaderTensor {
                    name: (*n).into(),
                    dtype: DType::F32,
                    shape: Shape::new(&[1]),
                    offset: 0,
                    len: 4,
                })
                .collect();
            Split {
                files: vec![(
                    "f".into(),
                    crate::formats::safetensors::Header {
                        data_start: 0,
                        file_len: 4,
                        tensors,
                        metadata: None,
                    },
                )],
                pieced: Vec::new(),
                left_out: Vec::new(),
            }
        };
        let megatron = |p: &str| {
            split_of(&[
                &format!("{p}embedding.word_embeddings.weight"),
                &format!("{p}decoder.layers.0.self_attention.linear_qkv.weight"),
            ])
        };
        assert_eq!(prefix(&megatron("module.")).as_deref(), Some("module."));
        assert_eq!(
            prefix(&megatron("model.module.")).as_deref(),
            Some("model.module.")
        );
        assert_eq!(prefix(&megatron("")).as_deref(), Some(""));
        // A BART-like transformers model, and a prefix that is not a wrapper's: not.
        let bart = split_of(&["model.decoder.layers.0.fc1.weight", "model.shared.weight"]);
        assert_eq!(prefix(&bart), None);
        assert_eq!(prefix(&megatron("encoder.")), None);
    }
}
