//! NeMo 2 checkpoints (`nemo.lightning`: what a NeMo 2 training run's checkpoint
//! callback and `llm.import_ckpt` write): `weights/` is a Megatron-Core distributed
//! checkpoint whose tensors carry the `module.` prefix of NeMo's `MegatronParallel`
//! wrapper before megatron-core's names (Megatron-LM's own loader strips the same
//! prefix from a NeMo 2 `weights` folder), and `context/model.yaml` is the model as
//! NeMo serialises it: `_target_` the model class, `config:` every field of its
//! megatron-core `TransformerConfig`, defaults included. The hyperparameters come from
//! there (NeMo's `common.pt` holds the trainer's state, not Megatron-LM's `args`); the
//! tensors are read, renamed and cut by the Megatron reader.
//! The YAML is read as [`megatron::yaml_args`] reads Megatron-Bridge's
//! `run_config.yaml`: as data.

use std::path::{Path, PathBuf};

use super::FormatError;
use super::megatron::{self, Origin, Read};

/// The folder holding the Megatron-Core checkpoint.
pub const WEIGHTS: &str = "weights";
/// The folder holding NeMo's serialised model, trainer and tokenizer.
pub const CONTEXT: &str = "context";
/// The model's configuration in [`CONTEXT`].
pub const MODEL_YAML: &str = "model.yaml";
/// What NeMo's wrapper puts before megatron-core's tensor names.
pub const PREFIX: &str = "module.";

/// Whether `dir` is a NeMo 2 checkpoint: a Megatron-Core checkpoint in `weights/` and
/// `context/model.yaml` beside it.
pub fn is_nemo(dir: &Path) -> bool {
    megatron::is_megatron(&dir.join(WEIGHTS)) && std::fs::symlink_metadata(model_yaml(dir)).is_ok()
}

/// The folders of `context/` whose files belong beside the Hugging Face model: the
/// tokenizer NeMo's importer saves with transformers' `save_pretrained`
/// (`nemo_tokenizer/`: tokenizer.json, tokenizer_config.json, …) and `artifacts/`
/// (generation_config.json). Those of them `dir` has when it is a NeMo 2 checkpoint;
/// none otherwise.
pub fn side_dirs(dir: &Path) -> Vec<PathBuf> {
    if !is_nemo(dir) {
        return Vec::new();
    }
    ["nemo_tokenizer", "artifacts"]
        .iter()
        .map(|name| dir.join(CONTEXT).join(name))
        .filter(|p| p.is_dir())
        .collect()
}

fn model_yaml(dir: &Path) -> PathBuf {
    dir.join(CONTEXT).join(MODEL_YAML)
}

/// Reads the NeMo 2 checkpoint in `dir`: `weights/` by the Megatron reader, the
/// hyperparameters from `context/model.yaml` (`config`: `--config`'s config.json, whose
/// head counts are used and no config is written).
pub fn read_nemo(dir: &Path, config: Option<&serde_json::Value>) -> Result<Read, FormatError> {
    let yaml = model_yaml(dir);
    let args = megatron::yaml_args::read(&yaml, "config")?;
    megatron::read_megatron_from(
        &dir.join(WEIGHTS),
        config,
        Origin {
            args: Some(args),
            args_file: yaml,
            prefix: PREFIX.to_owned(),
        },
    )
}
