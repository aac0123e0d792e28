//! `model.safetensors.index.json`, as transformers reads and writes it.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::FormatError;
use super::json::{OrderedObject, to_python_pretty};

pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";

/// The weight map of an index: tensor name to shard file name, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightIndex {
    pub weight_map: Vec<(String, String)>,
}

pub fn read_index(path: &Path) -> Result<WeightIndex, FormatError> {
    let text = std::fs::read_to_string(path).map_err(|e| FormatError::io(path, e))?;
    let root: Value = serde_json::from_str(&text)
        .map_err(|e| FormatError::invalid(path, format!("not valid JSON: {e}")))?;
    let raw = root
        .get("weight_map")
        .ok_or_else(|| FormatError::invalid(path, "has no `weight_map` object"))?;
    let object: OrderedObject = serde_json::from_value(raw.clone())
        .map_err(|_| FormatError::invalid(path, "`weight_map` is not a JSON object"))?;
    if let Some(dup) = object.first_duplicate() {
        return Err(FormatError::tensor(
            path,
            dup,
            "appears twice in `weight_map`",
        ));
    }
    let weight_map = object
        .0
        .into_iter()
        .map(|(name, file)| match file {
            Value::String(f) => Ok((name, f)),
            _ => Err(FormatError::tensor(
                path,
                &name,
                "`weight_map` value is not a file name",
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(WeightIndex { weight_map })
}

/// The file name transformers gives shard `k` (1-based) of `n`.
pub fn shard_file_name(k: usize, n: usize) -> String {
    format!("model-{k:05}-of-{n:05}.safetensors")
}

/// The index text transformers writes: `{"metadata": {"total_parameters", "total_size"},
/// "weight_map"}`, indent 2, sorted keys, trailing newline.
pub fn encode_index(
    total_parameters: u64,
    total_size: u64,
    weight_map: &BTreeMap<String, String>,
) -> String {
    let metadata = BTreeMap::from([
        ("total_parameters", total_parameters),
        ("total_size", total_size),
    ]);
    #[derive(serde::Serialize)]
    struct Index<'a> {
        metadata: &'a BTreeMap<&'static str, u64>,
        weight_map: &'a BTreeMap<String, String>,
    }
    let mut text = to_python_pretty(&Index {
        metadata: &metadata,
        weight_map,
    });
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_text_matches_transformers() {
        let map = BTreeMap::from([
            ("b.weight".to_owned(), shard_file_name(2, 2)),
            ("a.weight".to_owned(), shard_file_name(1, 2)),
        ]);
        assert_eq!(
            encode_index(10, 40, &map),
            "{\n  \"metadata\": {\n    \"total_parameters\": 10,\n    \"total_size\": 40\n  },\n  \"weight_map\": {\n    \"a.weight\": \"model-00001-of-00002.safetensors\",\n    \"b.weight\": \"model-00002-of-00002.safetensors\"\n  }\n}\n"
        );
    }
}
