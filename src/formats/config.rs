//! The parts of a Hugging Face `config.json` that decide ties and naming.

use std::path::Path;

use serde_json::Value;

use super::FormatError;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelConfig {
    /// `tie_word_embeddings`; transformers treats a missing key as `true`.
    pub tie_word_embeddings: bool,
    pub architectures: Vec<String>,
    pub torch_dtype: Option<String>,
}

impl ModelConfig {
    /// What transformers assumes when there is no config at all.
    pub fn absent() -> ModelConfig {
        ModelConfig {
            tie_word_embeddings: true,
            ..ModelConfig::default()
        }
    }
}

pub fn read_config(path: &Path) -> Result<ModelConfig, FormatError> {
    let text = super::input::read_json_text(path)?;
    let root: Value = serde_json::from_str(&text)
        .map_err(|e| FormatError::invalid(path, format!("not valid JSON: {e}")))?;
    let Value::Object(root) = root else {
        return Err(FormatError::invalid(path, "is not a JSON object"));
    };
    let tie_word_embeddings = match root.get("tie_word_embeddings") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(FormatError::invalid(
                path,
                format!("`tie_word_embeddings` must be true or false, not {other}"),
            ));
        }
    };
    let architectures = root
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let torch_dtype = root
        .get("torch_dtype")
        .or_else(|| root.get("dtype"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(ModelConfig {
        tie_word_embeddings,
        architectures,
        torch_dtype,
    })
}
