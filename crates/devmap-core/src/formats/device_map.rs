//! `device_map.json`: accelerate's `hf_device_map` written out as JSON.

use super::Kind;
use std::path::Path;

use serde_json::Value;

use super::FormatError;
use super::json::OrderedObject;
use crate::types::placement::{DeviceMap, Placement};

pub const DEVICE_MAP_FILE: &str = "device_map.json";

pub fn read_device_map(path: &Path) -> Result<DeviceMap, FormatError> {
    let text = super::input::read_json_text(path)?;
    parse_device_map(path, &text)
}

pub fn parse_device_map(path: &Path, text: &str) -> Result<DeviceMap, FormatError> {
    let object: OrderedObject = serde_json::from_str(text).map_err(|e| {
        FormatError::invalid_as(
            Kind::NotTheFormat,
            path,
            format!("a device map must be a JSON object of module prefix to device: {e}"),
        )
    })?;
    if let Some(dup) = object.first_duplicate() {
        return Err(FormatError::invalid(
            path,
            format!("key `{dup}` appears twice"),
        ));
    }
    let mut entries = Vec::with_capacity(object.0.len());
    for (key, value) in object.0 {
        let placement = parse_value(&value).ok_or_else(|| {
            FormatError::invalid(
                path,
                format!(
                    "key `{key}`: {value} is not a device; use a GPU index (0, 1, ...), \"cuda\", \"cuda:N\", \"mps\", \"cpu\", \"disk\" or \"meta\""
                ),
            )
        })?;
        entries.push((key, placement));
    }
    Ok(DeviceMap::new(entries))
}

fn parse_value(value: &Value) -> Option<Placement> {
    match value {
        Value::Number(n) => n
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .map(Placement::Gpu),
        Value::String(s) => Placement::parse_device(s),
        _ => None,
    }
}

/// Writes a device map in `hf_device_map` form (GPU indexes as integers).
pub fn encode_device_map(map: &DeviceMap) -> String {
    let mut out = String::from("{\n");
    for (i, (key, placement)) in map.entries().iter().enumerate() {
        let sep = if i + 1 == map.entries().len() {
            ""
        } else {
            ","
        };
        out.push_str(&format!(
            "  {}: {}{sep}\n",
            Value::from(key.as_str()),
            placement.to_device_map_value()
        ));
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DeviceMap, String> {
        parse_device_map(Path::new("device_map.json"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_every_value_form() {
        let m = parse(r#"{"model.embed_tokens": 0, "model.layers.0": "cuda:1", "model.layers.1": "cuda", "model.norm": "cpu", "lm_head": "disk", "x": "meta", "y": "mps"}"#)
            .expect("valid");
        let got: Vec<String> = m.entries().iter().map(|(_, p)| p.to_string()).collect();
        assert_eq!(
            got,
            ["gpu:0", "gpu:1", "gpu:0", "cpu", "disk", "meta", "mps"]
        );
    }

    #[test]
    fn bad_values_name_the_key() {
        for (text, want) in [
            (r#"{"model.layers.3": -1}"#, "key `model.layers.3`"),
            (r#"{"lm_head": "tpu"}"#, "key `lm_head`"),
            (r#"{"a": 1.5}"#, "key `a`"),
            (r#"["cpu"]"#, "JSON object"),
            (r#"{"a": 0, "a": 1}"#, "twice"),
        ] {
            let err = parse(text).expect_err("must be refused");
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn encodes_round_trip() {
        let m = parse(r#"{"": "cpu", "model.layers.0": 1, "lm_head": "disk"}"#).expect("valid");
        let text = encode_device_map(&m);
        assert_eq!(parse(&text).expect("re-read"), m);
        assert!(text.contains("\"model.layers.0\": 1"));
    }
}
