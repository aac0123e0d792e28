//! The parts of a Hugging Face `config.json` that decide ties and naming.

use super::Kind;
use std::path::Path;

use serde_json::Value;

use super::FormatError;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelConfig {
    /// Read from a config.json; `false` for [`ModelConfig::absent`], where nothing
    /// says what the model is (ties then need other evidence).
    pub present: bool,
    /// `tie_word_embeddings`; a missing key means the model type's default
    /// ([`ties_by_default`]).
    pub tie_word_embeddings: bool,
    pub architectures: Vec<String>,
    pub torch_dtype: Option<String>,
    /// Keys devmap reads whose value has the wrong type: (key, what it is, what it
    /// should be). Ignored, and reported.
    pub mistyped: Vec<(String, String, &'static str)>,
    /// The whole file, for what reads other keys (verify's expected shapes).
    pub raw: Value,
    /// `quantization_config`, when the weights are quantized.
    pub quantization: Option<Quantization>,
}

/// What `quantization_config` says of how the weights are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantization {
    /// `quant_method`: `fp8`, `mxfp4`, `compressed-tensors`, `bitsandbytes`, …
    pub method: String,
    /// `weight_block_size` for fine-grained FP8 (transformers' default: 128 × 128).
    pub block: (u64, u64),
    /// compressed-tensors' `format` (`float-quantized`, `pack-quantized`, …): the
    /// config's own, else its first config group's.
    pub format: Option<String>,
    /// `dequantize: true`: transformers loads the weights dequantized (plain layers in
    /// the model's dtype), so they take that room on a device.
    pub dequantize: bool,
    /// compressed-tensors' integer weight schemes (`type: int`), one per distinct
    /// scheme among the config groups, in their order.
    pub int_weights: Vec<IntWeights>,
    /// GPTQ's and AWQ's scheme (`quant_method` `gptq` or `awq`).
    pub gptq: Option<GptqWeights>,
}

/// GPTQ's and AWQ's `quantization_config`: `bits`, `group_size`, …
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptqWeights {
    pub bits: u64,
    /// `group_size`; `None` for -1 (one group holds every input row).
    pub group_size: Option<u64>,
    /// GPTQ's `desc_act` (rows grouped by `g_idx`, activation order).
    pub desc_act: bool,
    pub sym: bool,
    /// GPTQ's `checkpoint_format` (GPTQModel's `format`): `gptq` (zero points stored
    /// minus one), `gptq_v2`, …; AWQ's `version`: `gemm`, `gemv`, …
    pub format: String,
    /// AWQ's `zero_point`.
    pub zero_point: bool,
}

fn gptq_weights(method: &str, q: &serde_json::Map<String, Value>) -> Option<GptqWeights> {
    let text = |key: &str| q.get(key).and_then(Value::as_str).map(str::to_lowercase);
    let format = match method {
        "gptq" => text("checkpoint_format")
            .or_else(|| text("format"))
            .unwrap_or_else(|| "gptq".to_owned()),
        "awq" => text("version").unwrap_or_else(|| "gemm".to_owned()),
        _ => return None,
    };
    Some(GptqWeights {
        bits: q.get("bits").and_then(Value::as_u64).unwrap_or(4),
        group_size: match q.get("group_size").and_then(Value::as_i64) {
            Some(g) if g > 0 => Some(g as u64),
            Some(_) => None,
            None => Some(128),
        },
        desc_act: q.get("desc_act").and_then(Value::as_bool).unwrap_or(false),
        sym: q.get("sym").and_then(Value::as_bool).unwrap_or(true),
        format,
        zero_point: q.get("zero_point").and_then(Value::as_bool).unwrap_or(true),
    })
}

/// A compressed-tensors config group's integer weights (`weights` with `type: int`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntWeights {
    pub num_bits: u64,
    /// `tensor`, `channel`, `group`, …
    pub strategy: String,
    pub group_size: Option<u64>,
    pub symmetric: bool,
    /// `actorder` (`group`, `weight`, `static`), when set.
    pub actorder: Option<String>,
}

fn int_weights(q: &serde_json::Map<String, Value>) -> Vec<IntWeights> {
    let mut schemes: Vec<IntWeights> = Vec::new();
    let groups = q.get("config_groups").and_then(Value::as_object);
    for group in groups.into_iter().flat_map(|g| g.values()) {
        let Some(w) = group.get("weights").and_then(Value::as_object) else {
            continue;
        };
        if w.get("type").and_then(Value::as_str) != Some("int") {
            continue;
        }
        let scheme = IntWeights {
            num_bits: w.get("num_bits").and_then(Value::as_u64).unwrap_or(0),
            strategy: w
                .get("strategy")
                .and_then(Value::as_str)
                .unwrap_or("tensor")
                .to_owned(),
            group_size: w.get("group_size").and_then(Value::as_u64),
            symmetric: w.get("symmetric").and_then(Value::as_bool).unwrap_or(true),
            // Older configs say `actorder: true` for what is now `group`.
            actorder: match w.get("actorder") {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Bool(true)) => Some("group".to_owned()),
                _ => None,
            },
        };
        if !schemes.contains(&scheme) {
            schemes.push(scheme);
        }
    }
    schemes
}

fn quantization(root: &serde_json::Map<String, Value>) -> Option<Quantization> {
    let q = root.get("quantization_config")?.as_object()?;
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned();
    let block = q
        .get("weight_block_size")
        .and_then(Value::as_array)
        .and_then(|b| Some((b.first()?.as_u64()?, b.get(1)?.as_u64()?)))
        .unwrap_or((128, 128));
    let format = q
        .get("format")
        .and_then(Value::as_str)
        // ModelOpt names its scheme `quant_algo` (`NVFP4`, `FP8`, …).
        .or_else(|| q.get("quant_algo").and_then(Value::as_str))
        .or_else(|| {
            q.get("config_groups")?
                .as_object()?
                .values()
                .find_map(|g| g.get("format")?.as_str())
        })
        .map(str::to_owned);
    let dequantize = q.get("dequantize").and_then(Value::as_bool) == Some(true);
    let gptq = gptq_weights(&method, q);
    Some(Quantization {
        gptq,
        method,
        block,
        format,
        dequantize,
        int_weights: int_weights(q),
    })
}

/// `text` (a config.json object) with a top-level `key` set to `value`, written last
/// (any earlier value removed); every other byte stays as it was.
pub fn with_key(text: &str, key: &str, value: &Value) -> String {
    let text = without_key(text, key);
    let Some(end) = text.rfind('}') else {
        return text;
    };
    let body = text[..end].trim_end();
    let empty = body.ends_with('{');
    let pretty = serde_json::to_string_pretty(value)
        .unwrap_or_default()
        .replace('\n', "\n  ");
    let key = serde_json::to_string(key).unwrap_or_default();
    format!(
        "{body}{}\n  {key}: {pretty}\n{}",
        if empty { "" } else { "," },
        &text[end..]
    )
}

/// `text` (a config.json) without its top-level `key` and that key's value; every
/// other byte stays as it was. For the `quantization_config` of weights written
/// dequantized.
pub fn without_key(text: &str, key: &str) -> String {
    let bytes = text.as_bytes();
    let quoted = format!("\"{key}\"");
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let end = string_end(bytes, i);
                if depth == 1 && text[i..end] == quoted {
                    let colon = skip_ws(bytes, end);
                    if bytes.get(colon) == Some(&b':') {
                        let value_end = value_end(bytes, skip_ws(bytes, colon + 1));
                        let next = skip_ws(bytes, value_end);
                        return if bytes.get(next) == Some(&b',') {
                            // `"key": value,` and the space before the next key.
                            format!("{}{}", &text[..i], &text[skip_ws(bytes, next + 1)..])
                        } else {
                            // The last key: drop the comma before it instead.
                            let start = text[..i].trim_end().strip_suffix(',').map_or(i, str::len);
                            format!("{}{}", &text[..start], &text[value_end..])
                        };
                    }
                }
                i = end;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    text.to_owned()
}

/// The index just past the string that opens at `start`.
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && bytes[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The index just past the JSON value that starts at `start`.
fn value_end(bytes: &[u8], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i = string_end(bytes, i);
                if depth == 0 {
                    return i;
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                if depth == 0 {
                    return i;
                }
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            b',' if depth == 0 => return i,
            c if depth == 0 && c.is_ascii_whitespace() => return i,
            _ => {}
        }
        i += 1;
    }
    bytes.len()
}

impl ModelConfig {
    /// What transformers assumes when there is no config at all (`present` false: the
    /// loader ties nothing on this default alone).
    pub fn absent() -> ModelConfig {
        ModelConfig {
            tie_word_embeddings: true,
            ..ModelConfig::default()
        }
    }
}

/// Model types whose transformers config class defaults `tie_word_embeddings` to
/// false, generated from transformers by `scripts/gen_tie_defaults.py` (the file's
/// first line names the version).
const UNTIED_BY_DEFAULT: &str = include_str!("tie_defaults.txt");

/// What a config.json without `tie_word_embeddings` means: false for the model types
/// whose config class says so (Llama, Qwen2, Mistral, ...), true otherwise
/// (PretrainedConfig's default, and GPT-2's, Gemma's, ...).
pub fn ties_by_default(model_type: Option<&str>) -> bool {
    model_type.is_none_or(|t| {
        !UNTIED_BY_DEFAULT
            .lines()
            .filter(|l| !l.starts_with('#'))
            .any(|l| l == t)
    })
}

pub fn read_config(path: &Path) -> Result<ModelConfig, FormatError> {
    let text = super::input::read_json_text(path)?;
    let root: Value = serde_json::from_str(&text).map_err(|e| {
        FormatError::invalid_as(Kind::NotTheFormat, path, format!("not valid JSON: {e}"))
    })?;
    let Value::Object(root) = root else {
        return Err(FormatError::invalid(path, "is not a JSON object"));
    };
    let model_type = root.get("model_type").and_then(Value::as_str);
    let tie_word_embeddings = match root.get("tie_word_embeddings") {
        // Absent: the default of the model type's config class, as transformers reads it.
        None | Some(Value::Null) => ties_by_default(model_type),
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
    let mut mistyped = Vec::new();
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    for key in ["dtype", "torch_dtype"] {
        if let Some(v) = root.get(key).filter(|v| !v.is_string() && !v.is_null()) {
            mistyped.push((
                key.to_owned(),
                format!("{} ({v})", kind(v)),
                "a dtype name such as \"bfloat16\"",
            ));
        }
    }
    if let Some(v) = root
        .get("architectures")
        .filter(|v| !v.is_array() && !v.is_null())
    {
        mistyped.push((
            "architectures".to_owned(),
            format!("{} ({v})", kind(v)),
            "a list of class names",
        ));
    }
    // transformers 5 reads `dtype` and falls back to the older `torch_dtype`.
    let torch_dtype = ["dtype", "torch_dtype"]
        .iter()
        .find_map(|key| root.get(*key).and_then(Value::as_str))
        .map(str::to_owned);
    let quantization = quantization(&root);
    Ok(ModelConfig {
        present: true,
        tie_word_embeddings,
        architectures,
        torch_dtype,
        mistyped,
        raw: Value::Object(root),
        quantization,
    })
}

/// `text` (a config.json) with the dtype it records set to `dtype` (a torch name such
/// as `bfloat16`): the value of every `"dtype"` and `"torch_dtype"` key that names a
/// floating dtype is replaced, and every other byte stays as it was.
pub fn with_dtype(text: &str, dtype: &str) -> String {
    const FLOATING: [&str; 5] = ["float32", "float16", "bfloat16", "float64", "half"];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("dtype\"") {
        // The key must be exactly "dtype" or "torch_dtype".
        let before = &rest[..at];
        if !(before.ends_with("\"torch_") || before.ends_with('"')) {
            out.push_str(&rest[..at + 6]);
            rest = &rest[at + 6..];
            continue;
        }
        let after_key = &rest[at + 6..];
        let colon = after_key.trim_start();
        let Some(value) = colon.strip_prefix(':').map(str::trim_start) else {
            out.push_str(&rest[..at + 6]);
            rest = after_key;
            continue;
        };
        let replaced = FLOATING.iter().find_map(|name| {
            value
                .strip_prefix('"')
                .and_then(|v| v.strip_prefix(name))
                .and_then(|v| v.strip_prefix('"'))
        });
        if let Some(tail) = replaced {
            // Everything up to the opening quote of the value, then the new name.
            let value_start = rest.len() - value.len();
            out.push_str(&rest[..value_start]);
            out.push('"');
            out.push_str(dtype);
            out.push('"');
            rest = tail;
        } else {
            out.push_str(&rest[..at + 6]);
            rest = after_key;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_top_level_key_is_removed_with_its_value_and_nothing_else() {
        let text = "{\n  \"a\": 1,\n  \"quantization_config\": {\"x\": [1, {\"y\": \"}\"}]},\n  \"b\": {\"quantization_config\": 2}\n}\n";
        assert_eq!(
            without_key(text, "quantization_config"),
            "{\n  \"a\": 1,\n  \"b\": {\"quantization_config\": 2}\n}\n"
        );
        let last = "{\n  \"a\": 1,\n  \"quantization_config\": {\"q\": 1}\n}";
        assert_eq!(without_key(last, "quantization_config"), "{\n  \"a\": 1\n}");
        let added = with_key("{\n  \"a\": 1\n}\n", "q", &serde_json::json!({"m": [1, 2]}));
        let v: serde_json::Value = serde_json::from_str(&added).expect("json");
        assert_eq!(v, serde_json::json!({"a": 1, "q": {"m": [1, 2]}}));
        assert!(added.starts_with("{\n  \"a\": 1,\n  \"q\": {"), "{added}");
        let replaced = with_key(&added, "q", &serde_json::json!(3));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&replaced).expect("json"),
            serde_json::json!({"a": 1, "q": 3})
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&with_key("{}", "q", &serde_json::json!(1)))
                .expect("json"),
            serde_json::json!({"q": 1})
        );
        let only = "{\"quantization_config\": null}";
        assert_eq!(without_key(only, "quantization_config"), "{}");
        assert_eq!(without_key(text, "absent"), text);
        for t in [text, last, only] {
            let v: Value =
                serde_json::from_str(&without_key(t, "quantization_config")).expect("json");
            assert!(v.get("quantization_config").is_none());
        }
    }

    #[test]
    fn an_absent_tie_key_means_the_model_types_default() {
        assert!(!ties_by_default(Some("llama")));
        assert!(!ties_by_default(Some("qwen2")));
        assert!(ties_by_default(Some("gpt2")));
        assert!(ties_by_default(Some("gemma")));
        assert!(ties_by_default(None), "PretrainedConfig's default");
        assert!(ties_by_default(Some("a-type-transformers-does-not-know")));
    }

    #[test]
    fn only_the_dtype_values_change() {
        let text = "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"torch_dtype\": \"float32\",\n  \"text_config\": {\"dtype\" : \"float32\"},\n  \"quant_dtype\": \"float32\",\n  \"vocab_size\": 32\n}\n";
        assert_eq!(
            with_dtype(text, "bfloat16"),
            "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"torch_dtype\": \"bfloat16\",\n  \"text_config\": {\"dtype\" : \"bfloat16\"},\n  \"quant_dtype\": \"float32\",\n  \"vocab_size\": 32\n}\n"
        );
        // Nothing to change: the text comes back as it was.
        let plain = "{\"dtype\": \"auto\", \"x\": 1}";
        assert_eq!(with_dtype(plain, "float16"), plain);
    }
}
