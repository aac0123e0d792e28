//! `model.safetensors.index.json`, as transformers reads and writes it.

use super::Kind;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use super::FormatError;
use super::json::to_python_pretty;

pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";

/// The weight map of an index: tensor name to shard file name, in file order. The
/// names borrow from the index text: a 100,000-tensor index allocates no strings.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightIndex<'a> {
    pub weight_map: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

/// Whether an index's shard name is a plain file name beside the index: one path
/// component, not `.` or `..` (an index naming `../x` or `a/b` would read elsewhere).
pub fn is_shard_file_name(name: &str) -> bool {
    // One plain component: not `/`, `.`, `..` or a path.
    let mut parts = Path::new(name).components();
    matches!(parts.next(), Some(std::path::Component::Normal(_))) && parts.next().is_none()
}

/// Reads the index file's text (parse it with [`parse_index`]).
pub fn read_index_text(path: &Path) -> Result<String, FormatError> {
    super::input::read_json_text(path)
}

/// Parses an index; `path` names it in errors.
pub fn parse_index<'a>(path: &Path, text: &'a str) -> Result<WeightIndex<'a>, FormatError> {
    let root: RawIndex<'a> = serde_json::from_str(text).map_err(|e| {
        FormatError::invalid_as(
            Kind::NotTheFormat,
            path,
            format!("not an index ({{\"weight_map\": {{tensor: file}}}}): {e}"),
        )
    })?;
    let weight_map = root
        .weight_map
        .ok_or_else(|| FormatError::invalid(path, "has no `weight_map` object"))?
        .0;
    let mut names: Vec<&str> = weight_map.iter().map(|(n, _)| n.as_ref()).collect();
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
struct RawIndex<'a> {
    #[serde(borrow)]
    weight_map: Option<StringPairs<'a>>,
}

/// A JSON object of strings read in file order with duplicates kept, borrowing each
/// string from the text unless it holds escapes.
struct StringPairs<'a>(Vec<(Cow<'a, str>, Cow<'a, str>)>);

/// A string that borrows from the JSON text when it can.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for TextVisitor<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(TextVisitor(std::marker::PhantomData))
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for StringPairs<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PairsVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for PairsVisitor<'a> {
            type Value = StringPairs<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of tensor name to shard file name")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<StringPairs<'a>, A::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((name, file)) = map.next_entry::<Text<'a>, Text<'a>>()? {
                    pairs.push((name.0, file.0));
                }
                Ok(StringPairs(pairs))
            }
        }
        deserializer.deserialize_map(PairsVisitor(std::marker::PhantomData))
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
    fn names_borrow_unless_escaped_and_duplicates_are_refused() {
        let text = r#"{"metadata": {"total_size": 4}, "weight_map": {"a.w": "s1.safetensors", "b\u0041.w": "s2.safetensors"}}"#;
        let index = parse_index(Path::new("i.json"), text).expect("valid");
        assert!(matches!(index.weight_map[0].0, Cow::Borrowed("a.w")));
        assert_eq!(index.weight_map[1].0, "bA.w");
        let dup = r#"{"weight_map": {"a": "x", "a": "y"}}"#;
        let err = parse_index(Path::new("i.json"), dup).expect_err("duplicate");
        assert!(err.to_string().contains("`a`: appears twice"), "{err}");
        let none = parse_index(Path::new("i.json"), "{}").expect_err("no map");
        assert!(none.to_string().contains("no `weight_map`"), "{none}");
    }

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
