//! A peft adapter folder: `adapter_config.json` (the fields that change the merge) and
//! `adapter_model.safetensors`.

use super::Kind;
use std::path::Path;

use serde_json::Value;

use super::FormatError;

pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// What of `adapter_config.json` decides a merge.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterConfig {
    pub peft_type: String,
    pub r: u64,
    pub lora_alpha: f64,
    pub use_rslora: bool,
    /// Module-name patterns with their own rank / alpha, in the file's order.
    pub rank_pattern: Vec<(String, u64)>,
    pub alpha_pattern: Vec<(String, f64)>,
    pub fan_in_fan_out: bool,
    pub use_dora: bool,
    pub modules_to_save: Vec<String>,
    pub lora_bias: bool,
    /// Parameters adapted directly (`target_parameters`: fused experts'
    /// `mlp.experts.gate_up_proj`), as dotted suffixes of the loaded model's names.
    pub target_parameters: Vec<String>,
}

pub fn read_adapter_config(path: &Path) -> Result<AdapterConfig, FormatError> {
    let text = super::input::read_json_text(path)?;
    let root: Value = serde_json::from_str(&text).map_err(|e| {
        FormatError::invalid_as(Kind::NotTheFormat, path, format!("not valid JSON: {e}"))
    })?;
    let Value::Object(root) = root else {
        return Err(FormatError::invalid(path, "is not a JSON object"));
    };
    let bad = |key: &str, want: &str| FormatError::invalid(path, format!("`{key}` must be {want}"));
    let flag = |key: &str| -> Result<bool, FormatError> {
        match root.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(bad(key, "true or false")),
        }
    };
    let number = |key: &str, default: f64| -> Result<f64, FormatError> {
        match root.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| bad(key, "a number")),
        }
    };
    let pattern = |key: &str| -> Result<Vec<(String, f64)>, FormatError> {
        match root.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| {
                    v.as_f64()
                        .map(|n| (k.clone(), n))
                        .ok_or_else(|| bad(key, "an object of numbers"))
                })
                .collect(),
            Some(_) => Err(bad(key, "an object of numbers")),
        }
    };
    let peft_type = root
        .get("peft_type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("peft_type", "a string such as \"LORA\""))?
        .to_owned();
    let r = number("r", 8.0)?;
    if r < 1.0 || r.fract() != 0.0 {
        return Err(bad("r", "a positive whole number"));
    }
    let names = |key: &str| -> Result<Vec<String>, FormatError> {
        match root.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad(key, "a list of names")),
            Some(_) => Err(bad(key, "a list of names")),
        }
    };
    let modules_to_save = names("modules_to_save")?;
    let target_parameters = names("target_parameters")?;
    let rank_pattern = pattern("rank_pattern")?
        .into_iter()
        .map(|(k, v)| {
            if v >= 1.0 && v.fract() == 0.0 {
                Ok((k, v as u64))
            } else {
                Err(bad("rank_pattern", "an object of positive whole numbers"))
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(AdapterConfig {
        peft_type,
        r: r as u64,
        lora_alpha: number("lora_alpha", 8.0)?,
        use_rslora: flag("use_rslora")?,
        rank_pattern,
        alpha_pattern: pattern("alpha_pattern")?,
        fan_in_fan_out: flag("fan_in_fan_out")?,
        use_dora: flag("use_dora")?,
        modules_to_save,
        lora_bias: flag("lora_bias")?,
        target_parameters,
    })
}

/// Whether peft's `rank_pattern` / `alpha_pattern` key `pattern` applies to module
/// `name`: peft tests `re.match(rf"(.*\.)?({pattern})$", name)`, i.e. the pattern
/// matches the whole name or a part of it that starts after a dot. `.` in a pattern
/// matches any character, as in the regular expression; `None` when the pattern uses
/// other regular-expression syntax, which devmap does not read.
pub fn pattern_matches(pattern: &str, name: &str) -> Option<bool> {
    if pattern.chars().any(|c| "*+?[](){}|^$\\".contains(c)) {
        return None;
    }
    let p = pattern.as_bytes();
    let n = name.as_bytes();
    let matches_at = |start: usize| {
        n.len() - start == p.len() && p.iter().zip(&n[start..]).all(|(a, b)| *a == b'.' || a == b)
    };
    Some(
        (0..=n.len().saturating_sub(p.len()))
            .filter(|&s| s == 0 || n[s - 1] == b'.')
            .any(|s| n.len() >= p.len() && matches_at(s)),
    )
}

/// The value of the first key of `patterns` (a `rank_pattern` / `alpha_pattern`) that
/// matches module `name` ([`pattern_matches`]), `Ok(None)` when none does, and
/// `Err(key)` for a key in regular-expression syntax met first.
pub fn pattern_value<T: Copy>(patterns: &[(String, T)], name: &str) -> Result<Option<T>, String> {
    patterns
        .iter()
        .find_map(|(p, v)| match pattern_matches(p, name) {
            Some(true) => Some(Ok(*v)),
            Some(false) => None,
            None => Some(Err(p.clone())),
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_peft_matches_them() {
        let name = "model.layers.10.self_attn.q_proj";
        assert_eq!(pattern_matches("q_proj", name), Some(true));
        assert_eq!(pattern_matches("self_attn.q_proj", name), Some(true));
        assert_eq!(pattern_matches(name, name), Some(true));
        // A suffix that does not start after a dot is no match.
        assert_eq!(pattern_matches("_proj", name), Some(false));
        assert_eq!(pattern_matches("k_proj", name), Some(false));
        // `.` is any character, as in the regular expression.
        assert_eq!(
            pattern_matches("layers.10.self_attn.q.proj", name),
            Some(true)
        );
        assert_eq!(
            pattern_matches("layers.1.self_attn.q_proj", name),
            Some(false)
        );
        assert_eq!(pattern_matches("layers\\.\\d+", name), None);
        assert_eq!(
            pattern_matches("much.longer.than.the.name.itself.q_proj", "q_proj"),
            Some(false)
        );
    }
}
