//! A run's configuration kept as YAML, read as the Megatron reader's arguments: NeMo
//! 2's `context/model.yaml` and Megatron-Bridge's (and newer Megatron-LM's)
//! `run_config.yaml` both hold the model's megatron-core TransformerConfig, field by
//! field, defaults included.
//!
//! The YAML is read as data: no tag is resolved, no alias expanded (a value that is
//! an alias counts as absent), nesting beyond 64 levels is refused.

use std::path::Path;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};
use yaml_rust2::yaml::Yaml;

use super::args::Args;
use crate::formats::pickle::Value;
use crate::formats::{FormatError, Kind};

/// Mappings and sequences inside one another beyond this are refused: a run's
/// configuration has a handful.
const MAX_DEPTH: usize = 64;
/// The largest file read (a run's configuration takes a few kilobytes).
const MAX_YAML_BYTES: u64 = 4 << 20;

/// The mapping `section` of the YAML file at `path` (NeMo 2's `context/model.yaml`:
/// `config`; Megatron-Bridge's `run_config.yaml`: `model`), a megatron-core
/// TransformerConfig's fields, as the Megatron reader's arguments: scalars as they are,
/// a function or class (`{_target_: torch.nn.functional.silu, _call_: false}`) as its
/// dotted name, and NeMo's `gated_linear_unit` with a SiLU activation as Megatron-LM's
/// `swiglu`. RoPE scaling (Llama 3.1's `scale_factor`) is refused by name: devmap does
/// not write transformers' `rope_scaling` from it.
pub fn read(path: &Path, section: &str) -> Result<Args, FormatError> {
    let text = crate::formats::input::read_small_text(
        path,
        MAX_YAML_BYTES,
        "a run's configuration takes a few kilobytes",
    )?;
    let bad = |kind, message: String| FormatError::invalid_as(kind, path, message);
    let root = parse(&text).map_err(|why| bad(Kind::Malformed, why))?;
    let config = root.get(section).and_then(Node::entries).ok_or_else(|| {
        bad(
            Kind::NotTheFormat,
            format!("has no `{section}:` mapping (the model's TransformerConfig)"),
        )
    })?;
    let mut args: Args = Vec::new();
    for (key, value) in config {
        let Some(key) = key.as_str() else { continue };
        let value = match value {
            Node::Scalar(Yaml::Integer(i)) => Value::Int(*i),
            Node::Scalar(y @ Yaml::Real(_)) => match y.as_f64() {
                Some(f) => Value::Float(f),
                None => continue,
            },
            Node::Scalar(Yaml::Boolean(b)) => Value::Bool(*b),
            Node::Scalar(Yaml::String(s)) => Value::Str(s.clone()),
            Node::Map(_) => match value.get("_target_").and_then(Node::as_str) {
                Some(target) => Value::Str(target.to_owned()),
                None => continue,
            },
            _ => continue,
        };
        args.push((key.to_owned(), value));
    }
    let said = |name: &str| args.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    if let Some(v) = said("scale_factor").filter(|v| !matches!(v, Value::None)) {
        return Err(bad(
            Kind::Unsupported,
            format!(
                "configures RoPE scaling (scale_factor {v:?}, as NeMo's Llama 3.1 and later configs do), which devmap does not write into config.json yet; give --config DIR with the model's Hugging Face config.json"
            ),
        ));
    }
    let gated = matches!(said("gated_linear_unit"), Some(Value::Bool(true)));
    // A dotted Python name (`torch.nn.functional.silu`), not a file name.
    let silu = matches!(said("activation_func"), Some(Value::Str(f)) if f.rsplit('.').next() == Some("silu"));
    args.push(("swiglu".to_owned(), Value::Bool(gated && silu)));
    Ok(args)
}

/// A YAML node as parsed, aliases left unexpanded.
#[derive(Debug)]
enum Node {
    Scalar(Yaml),
    /// Keys and values, alternating.
    Map(Vec<Node>),
    Seq(Vec<Node>),
    Alias,
}

impl Node {
    fn get(&self, key: &str) -> Option<&Node> {
        self.entries()?
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    fn entries(&self) -> Option<impl Iterator<Item = (&Node, &Node)>> {
        match self {
            Node::Map(flat) => Some(flat.chunks_exact(2).map(|kv| (&kv[0], &kv[1]))),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Node::Scalar(Yaml::String(s)) => Some(s),
            _ => None,
        }
    }
}

/// Builds [`Node`]s from the parser's events, one container per level.
#[derive(Default)]
struct Builder {
    open: Vec<Node>,
    root: Option<Node>,
    too_deep: bool,
}

impl Builder {
    fn add(&mut self, node: Node) {
        match self.open.last_mut() {
            Some(Node::Map(items) | Node::Seq(items)) => items.push(node),
            _ => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, _: Marker) {
        if self.too_deep {
            return;
        }
        match event {
            Event::Scalar(text, style, _, _) => self.add(Node::Scalar(match style {
                // Plain scalars by the core schema (true, 12, 1.0e-05, null); quoted
                // ones are strings.
                TScalarStyle::Plain => Yaml::from_str(&text),
                _ => Yaml::String(text),
            })),
            Event::Alias(_) => self.add(Node::Alias),
            Event::MappingStart(..) | Event::SequenceStart(..) if self.open.len() >= MAX_DEPTH => {
                self.too_deep = true;
            }
            Event::MappingStart(..) => self.open.push(Node::Map(Vec::new())),
            Event::SequenceStart(..) => self.open.push(Node::Seq(Vec::new())),
            Event::MappingEnd | Event::SequenceEnd => {
                if let Some(done) = self.open.pop() {
                    self.add(done);
                }
            }
            _ => {}
        }
    }
}

/// The first document of `text`.
fn parse(text: &str) -> Result<Node, String> {
    let mut builder = Builder::default();
    Parser::new_from_str(text)
        .load(&mut builder, false)
        .map_err(|e| format!("is not valid YAML: {e}"))?;
    if builder.too_deep {
        return Err(format!(
            "nests mappings and lists more than {MAX_DEPTH} deep; NeMo writes a handful"
        ));
    }
    builder
        .root
        .ok_or_else(|| "holds no YAML document".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_of(text: &str) -> Result<Args, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("model.yaml");
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        read(&path, "config").map_err(|e| e.to_string())
    }

    #[test]
    fn reads_the_config_scalars_and_functions_as_arguments() {
        let args = config_of(
            "_target_: nemo.collections.llm.gpt.model.llama.LlamaModel\n\
             config:\n  _target_: nemo.collections.llm.gpt.model.llama.LlamaConfig\n  \
             num_layers: 4\n  layernorm_epsilon: 1.0e-05\n  normalization: RMSNorm\n  \
             gated_linear_unit: true\n  num_query_groups: null\n  \
             activation_func:\n    _call_: false\n    _target_: torch.nn.functional.silu\n  \
             paths: &id001\n  - a\n  again: *id001\n  name: 'quoted: 12'\n\
             tokenizer:\n  _target_: x\n",
        )
        .expect("reads");
        let get = |k: &str| args.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("num_layers"), Some(Value::Int(4)));
        assert_eq!(get("layernorm_epsilon"), Some(Value::Float(1.0e-05)));
        assert_eq!(get("normalization"), Some(Value::Str("RMSNorm".into())));
        assert_eq!(get("num_query_groups"), None);
        assert_eq!(get("swiglu"), Some(Value::Bool(true)));
        assert_eq!(
            get("activation_func"),
            Some(Value::Str("torch.nn.functional.silu".into()))
        );
        assert_eq!(get("name"), Some(Value::Str("quoted: 12".into())));
        assert_eq!(get("again"), None, "an alias is not expanded");
    }

    #[test]
    fn refuses_what_it_cannot_read_by_name() {
        let err = config_of("tokenizer: {}\n").expect_err("no config");
        assert!(err.contains("has no `config:`"), "{err}");
        let err = config_of("config:\n  scale_factor: 8.0\n").expect_err("rope scaling");
        assert!(
            err.contains("scale_factor") && err.contains("--config"),
            "{err}"
        );
        let deep = format!("config: {}1{}\n", "[".repeat(100), "]".repeat(100));
        let err = config_of(&deep).expect_err("deep");
        assert!(err.contains("more than 64 deep"), "{err}");
        let err = config_of("config: [unclosed\n").expect_err("broken");
        assert!(err.contains("not valid YAML"), "{err}");
        // Not gated: no swiglu, which config.json's writer then names.
        let args = config_of("config:\n  gated_linear_unit: false\n").expect("reads");
        assert!(args.contains(&("swiglu".to_owned(), Value::Bool(false))));
    }
}
