//! `model.safetensors.index.json`, as transformers reads and writes it.

use std::collections::BTreeMap;
use std::path::Path;

use super::FormatError;
use super::json::to_python_pretty;

pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";

/// The weight map of an index: tensor name to shard file name, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightIndex {
    pub weight_map: Vec<(String, String)>,
}

pub fn read_index(path: &Path) -> Result<WeightIndex, FormatError> {
    let text = std::fs::read_to_string(path).map_err(|e| FormatError::io(path, e))?;
    let root: RawIndex = serde_json::from_str(&text).map_err(|e| {
        FormatError::invalid(
            path,
            format!("not an index ({{\"weight_map\": {{tensor: file}}}}): {e}"),
        )
    })?;
    let weight_map = root
        .weight_map
        .ok_or_else(|| FormatError::invalid(path, "has no `weight_map` object"))?
        .0;
    let mut names: Vec<&str> = weight_map.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    if let Some(dup) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(FormatError::tensor(
            path,
            dup[0],
            "appears twice in `weight_map`",
        ));
    }
    Ok(WeightIndex { weight_map })
}

#[derive(serde::Deserialize)]
struct RawIndex {
    weight_map: Option<StringPairs>,
}

/// A JSON object of strings read in file order with duplicates kept.
struct StringPairs(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for StringPairs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> serde::de::Visitor<'de> for PairsVisitor {
            type Value = StringPairs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of tensor name to shard file name")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<StringPairs, A::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(pair) = map.next_entry::<String, String>()? {
                    pairs.push(pair);
                }
                Ok(StringPairs(pairs))
            }
        }
        deserializer.deserialize_map(PairsVisitor)
    }
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
