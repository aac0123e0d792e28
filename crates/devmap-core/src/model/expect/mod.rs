//! What a checkpoint of an architecture holds, as transformers itself says:
//! `scripts/gen_expect_table.py` instantiates each class and records the tensors
//! `save_pretrained` writes and their shapes as functions of config.json (see the
//! script for how the shapes are fitted and for the format). `devmap verify` checks a
//! folder against this, independently of how devmap saves.
//!
//! A [`Form`] is a tree: tensors, and lists (`model.layers`) whose members each take
//! one of a few variants (dense and MoE layers). The saved form is what
//! `save_pretrained` writes; the runtime form, where it differs, is the loaded
//! model's own names and fused experts, which transformers loads as well.
//!
//! A second table, `buffer_table.txt` (`scripts/gen_buffer_table.py`, the same fit and
//! format), holds a buffers form per architecture: the non-persistent buffers (rotary
//! `inv_freq`, BERT-family `position_ids`), never in a checkpoint but counted by
//! accelerate when it plans a device map, so the planner counts them too
//! ([`buffers_of`]).

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::Value;

use super::table::{Blocks, Parsed, index};
use crate::types::DType;

mod pattern;

use pattern::glob_search;
pub use pattern::regex_search;

const TABLE: &str = include_str!("../expect_table.txt");
const BUFFER_TABLE: &str = include_str!("../buffer_table.txt");

/// One architecture's expected checkpoint.
#[derive(Debug, Default)]
pub struct Expect {
    /// Config attributes' defaults: what an attribute config.json leaves out is.
    defaults: HashMap<String, u64>,
    /// Attributes the config class derives from others when config.json leaves them
    /// out, and how (Llama's `head_dim`: `hidden_size/num_attention_heads`).
    derived: HashMap<String, Expr>,
    /// Other names config.json may give an attribute under (the config class's
    /// `attribute_map`: Qwen3-MoE's `num_experts` is its `num_local_experts`), by the
    /// attribute.
    aliases: HashMap<String, Vec<String>>,
    /// `tie_word_embeddings` when config.json leaves it out (where a tie depends on it).
    pub ties_by_default: Option<bool>,
    pub saved: Form,
    pub runtime: Option<Form>,
    /// The non-persistent buffers, under runtime names, each with its dtype.
    pub buffers: Option<Form>,
    /// `_keys_to_ignore_on_load_missing`: absent tensors transformers does not report.
    ignore_missing: Vec<String>,
    /// `_keys_to_ignore_on_load_unexpected`: extra tensors it drops without a word.
    ignore_unexpected: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Form {
    pub root: Node,
}

/// Tensors and lists under one prefix.
#[derive(Debug, Default)]
pub struct Node {
    pub tensors: Vec<ExpectedTensor>,
    pub lists: Vec<List>,
}

#[derive(Debug)]
pub struct ExpectedTensor {
    /// Relative to the node's prefix.
    pub name: String,
    pub dims: Vec<Expr>,
    pub tied: Tied,
    /// A buffer's dtype (the buffers form only), as the model holds it loaded in
    /// float32.
    pub dtype: Option<DType>,
    /// A floating buffer that follows the dtype the model is loaded in (made in the
    /// default dtype), unlike one made in float32 explicitly.
    pub follows_load: bool,
}

impl ExpectedTensor {
    /// Its name under `prefix` (which ends in `.`); a nameless tensor is the list
    /// member `prefix` names.
    pub fn full_name(&self, prefix: &str) -> String {
        match self.name.as_str() {
            "" => prefix.trim_end_matches('.').to_owned(),
            name => format!("{prefix}{name}"),
        }
    }
}

/// A non-persistent buffer of a model as config.json sizes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buffer {
    /// Runtime name, indices filled in.
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Follows the dtype the model is loaded in (see [`ExpectedTensor::follows_load`]).
    pub follows_load: bool,
}

/// Whether a tensor may be left out: a tied copy transformers does not save, or one
/// only some configs have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tied {
    No,
    /// Always a tied copy: `save_pretrained` leaves it out.
    Always,
    /// A tied copy while `tie_word_embeddings` is true.
    IfTiedWords,
    /// Only some configs have it (OPT's `project_in`): allowed, never required.
    Optional,
}

/// A list of numbered members (`model.layers.0`, `.1`, …).
#[derive(Debug)]
pub struct List {
    pub path: String,
    pub count: Expr,
    pub variants: Vec<Variant>,
}

/// One form the members of a list take.
#[derive(Debug)]
pub struct Variant {
    /// The indices it is the form of; `None`: any index no pinned variant claims.
    pub pinned: Option<Vec<u64>>,
    pub node: Node,
}

/// A size: unknown, or a product of integers and config attributes over another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Unknown,
    Product { up: Vec<Factor>, down: Vec<Factor> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Factor {
    Number(u64),
    /// A config attribute's dotted path (`text_config.hidden_size`).
    Attribute(String),
}

/// The first of `architectures` (config.json's list) the table has.
pub fn lookup(architectures: &[String]) -> Option<&'static Expect> {
    lookup_named(architectures).map(|(_, e)| e)
}

/// [`lookup`], with the name of the architecture found.
pub fn lookup_named(architectures: &[String]) -> Option<(&str, &'static Expect)> {
    static PARSED: Parsed<Expect> = Parsed::new();
    let t = table();
    let name = architectures
        .iter()
        .find(|a| t.by_name.contains_key(a.as_str()))?;
    let block = t.by_name[name.as_str()];
    Some((name, PARSED.get(block, || parse_block(t.bodies[block]))))
}

/// Where the table comes from, for reports: `transformers 5.25.0, torch 2.15.0`.
pub fn source() -> &'static str {
    table().source
}

/// The non-persistent buffers of the first of `architectures` the buffer table has,
/// sized by `config` (config.json); empty for an architecture it lacks (one without
/// such buffers, or unknown).
pub fn buffers_of(architectures: &[String], config: &Value) -> Vec<Buffer> {
    static INDEX: OnceLock<Blocks> = OnceLock::new();
    static PARSED: Parsed<Expect> = Parsed::new();
    let t = INDEX.get_or_init(|| index(BUFFER_TABLE));
    let Some(block) = t.find(architectures) else {
        return Vec::new();
    };
    PARSED
        .get(block, || parse_block(t.bodies[block]))
        .buffers(config)
}

fn table() -> &'static Blocks {
    static INDEX: OnceLock<Blocks> = OnceLock::new();
    INDEX.get_or_init(|| index(TABLE))
}

/// config.json's values as the shapes read them.
pub struct Values<'a> {
    expect: &'a Expect,
    config: &'a Value,
}

impl Expect {
    /// Whether transformers leaves `name` out of its MISSING report.
    pub fn ignores_missing(&self, name: &str) -> bool {
        self.ignore_missing.iter().any(|p| glob_search(p, name))
    }

    /// Whether transformers leaves `name` out of its UNEXPECTED report.
    pub fn ignores_unexpected(&self, name: &str) -> bool {
        self.ignore_unexpected.iter().any(|p| glob_search(p, name))
    }

    pub fn values<'a>(&'a self, config: &'a Value) -> Values<'a> {
        Values {
            expect: self,
            config,
        }
    }

    /// The non-persistent buffers a model of this config holds, as sized by it. What
    /// the config does not size (an unknown dimension or list count, a list whose
    /// members could take differing forms) is left out: the planner then counts it
    /// as it did before it knew of buffers, never with a made-up size.
    pub fn buffers(&self, config: &Value) -> Vec<Buffer> {
        let mut out = Vec::new();
        if let Some(form) = &self.buffers {
            expand_buffers(&form.root, "", &self.values(config), &mut out);
        }
        out
    }
}

fn expand_buffers(node: &Node, prefix: &str, values: &Values<'_>, out: &mut Vec<Buffer>) {
    for t in &node.tensors {
        let shape: Option<Vec<u64>> = t.dims.iter().map(|d| values.eval(d)).collect();
        if let (Some(shape), Some(dtype)) = (shape, t.dtype) {
            out.push(Buffer {
                name: t.full_name(prefix),
                dtype,
                shape,
                follows_load: t.follows_load,
            });
        }
    }
    for list in &node.lists {
        let Some(count) = values.eval(&list.count) else {
            continue;
        };
        for i in 0..count {
            let pinned: Vec<&Variant> = list
                .variants
                .iter()
                .filter(|v| v.pinned.as_ref().is_some_and(|p| p.contains(&i)))
                .collect();
            let free: Vec<&Variant> = list
                .variants
                .iter()
                .filter(|v| v.pinned.is_none())
                .collect();
            // One form for this member, or none known: several unpinned forms depend
            // on the config in ways the table does not say (which layers are local).
            let variant = match (pinned.as_slice(), free.as_slice()) {
                ([one], _) | ([], [one]) => *one,
                _ => continue,
            };
            expand_buffers(
                &variant.node,
                &format!("{prefix}{}.{i}.", list.path),
                values,
                out,
            );
        }
    }
}

impl<'a> Values<'a> {
    pub fn expect(&self) -> &'a Expect {
        self.expect
    }

    /// An attribute's value: config.json's, else the default; `None` when config.json
    /// gives something that is not a whole number (a `null`, a list).
    pub fn attribute(&self, path: &str) -> Option<u64> {
        self.lookup(path, true)
    }

    /// [`Values::attribute`]; what config.json leaves out is its default, or, with
    /// `derive`, what the config class derives it from (whose attributes are never
    /// derived themselves: the generator writes plain defaults for them, so one level
    /// is all there is).
    fn lookup(&self, path: &str, derive: bool) -> Option<u64> {
        let mut at = self.config;
        for part in path.split('.') {
            let Some(next) = at.get(part) else {
                let mut alias = self.expect.aliases.get(path).into_iter().flatten();
                if let Some(value) = alias.find_map(|key| self.config.get(key)) {
                    return value.as_u64();
                }
                if let Some(&v) = self.expect.defaults.get(path) {
                    return Some(v);
                }
                let how = self.expect.derived.get(path).filter(|_| derive)?;
                return self.eval_with(how, false);
            };
            at = next;
        }
        at.as_u64()
    }

    /// Whether the word embeddings are tied: config.json's `tie_word_embeddings`, else
    /// the architecture's default.
    pub fn ties_words(&self) -> bool {
        match self
            .config
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
        {
            Some(b) => b,
            None => self.expect.ties_by_default.unwrap_or(true),
        }
    }

    /// The size `expr` stands for; `None` when unknown or not a whole number.
    pub fn eval(&self, expr: &Expr) -> Option<u64> {
        self.eval_with(expr, true)
    }

    /// [`Values::eval`], following derived defaults or not (see [`Values::lookup`]).
    fn eval_with(&self, expr: &Expr, derive: bool) -> Option<u64> {
        let Expr::Product { up, down } = expr else {
            return None;
        };
        let value = |f: &Factor| match f {
            Factor::Number(n) => Some(u128::from(*n)),
            Factor::Attribute(a) => self.lookup(a, derive).map(u128::from),
        };
        let mut num: u128 = 1;
        for f in up {
            num = num.checked_mul(value(f)?)?;
        }
        let mut den: u128 = 1;
        for f in down {
            den = den.checked_mul(value(f)?)?;
        }
        if den == 0 || !num.is_multiple_of(den) {
            return None;
        }
        u64::try_from(num / den).ok()
    }
}

impl std::fmt::Display for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Expr::Product { up, down } = self else {
            return f.write_str("?");
        };
        let show = |x: &Factor| match x {
            Factor::Number(n) => n.to_string(),
            Factor::Attribute(a) => a.clone(),
        };
        let ups: Vec<String> = up.iter().map(show).collect();
        f.write_str(&if ups.is_empty() {
            "1".to_owned()
        } else {
            ups.join("*")
        })?;
        for d in down {
            write!(f, "/{}", show(d))?;
        }
        Ok(())
    }
}

fn parse_expr(text: &str) -> Expr {
    if text == "?" {
        return Expr::Unknown;
    }
    let factor = |t: &str| match t.parse::<u64>() {
        Ok(n) => Factor::Number(n),
        Err(_) => Factor::Attribute(t.to_owned()),
    };
    let mut parts = text.split('/');
    let up = parts
        .next()
        .unwrap_or("")
        .split('*')
        .filter(|t| !t.is_empty())
        .map(factor)
        .collect();
    let down = parts.map(factor).collect();
    Expr::Product { up, down }
}

/// A line of a block: its indent and its text.
struct Line<'a> {
    depth: usize,
    text: &'a str,
}

fn lines(body: &str) -> Vec<Line<'_>> {
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let text = l.trim_start_matches(' ');
            // A list whose members are tensors themselves (Reformer's
            // `position_embeddings.weights.0`) has lines with an empty name: the space
            // before their shape is not indent.
            let separator = usize::from(text.starts_with('['));
            Line {
                depth: (l.len() - text.len()).saturating_sub(separator),
                text,
            }
        })
        .collect()
}

/// Parses one block (see the script for the format). The table is generated and
/// embedded, so a line it does not understand is skipped rather than reported.
fn parse_block(body: &str) -> Expect {
    let mut expect = Expect::default();
    let lines = lines(body);
    let mut at = 0;
    while at < lines.len() {
        let text = lines[at].text;
        at += 1;
        if let Some(rest) = text.strip_prefix("default ") {
            let (path, value) = rest.split_once(' ').unwrap_or((rest, ""));
            if path == "tie_word_embeddings" {
                expect.ties_by_default = Some(value == "true");
            } else if let Ok(v) = value.parse() {
                expect.defaults.insert(path.to_owned(), v);
            } else if value != "?" {
                expect.derived.insert(path.to_owned(), parse_expr(value));
            }
        } else if let Some(rest) = text.strip_prefix("alias ") {
            if let Some((key, path)) = rest.split_once(' ') {
                expect
                    .aliases
                    .entry(path.to_owned())
                    .or_default()
                    .push(key.to_owned());
            }
        } else if let Some(rest) = text.strip_prefix("ignore-missing ") {
            expect.ignore_missing = rest.split(' ').map(str::to_owned).collect();
        } else if let Some(rest) = text.strip_prefix("ignore-unexpected ") {
            expect.ignore_unexpected = rest.split(' ').map(str::to_owned).collect();
        } else if let Some(form) = text.strip_prefix("form ") {
            let node = parse_node(&lines, &mut at, 0);
            match form {
                "runtime" => expect.runtime = Some(Form { root: node }),
                "buffers" => expect.buffers = Some(Form { root: node }),
                _ => expect.saved = Form { root: node },
            }
        }
    }
    expect
}

fn parse_node(lines: &[Line<'_>], at: &mut usize, depth: usize) -> Node {
    let mut node = Node::default();
    while let Some(line) = lines.get(*at) {
        if line.depth != depth || line.text.starts_with("form ") {
            break;
        }
        *at += 1;
        if let Some(rest) = line.text.strip_prefix("list ") {
            let (path, count) = rest.split_once(' ').unwrap_or((rest, "?"));
            let mut variants = Vec::new();
            while let Some(v) = lines.get(*at) {
                let Some(rest) = v.text.strip_prefix("variant") else {
                    break;
                };
                if v.depth != depth + 1 {
                    break;
                }
                *at += 1;
                let pinned = rest.trim().strip_prefix('@').map(|list| {
                    list.split(',')
                        .filter_map(|i| i.parse().ok())
                        .collect::<Vec<u64>>()
                });
                variants.push(Variant {
                    pinned,
                    node: parse_node(lines, at, depth + 2),
                });
            }
            node.lists.push(List {
                path: path.to_owned(),
                count: parse_expr(count),
                variants,
            });
        } else {
            let mut words = line.text.split(' ');
            // No name: the list member is the tensor.
            let name = if line.text.starts_with('[') {
                String::new()
            } else {
                words.next().unwrap_or("").to_owned()
            };
            let dims = words
                .next()
                .and_then(|d| d.strip_prefix('[')?.strip_suffix(']'))
                .map(|d| {
                    if d.is_empty() {
                        Vec::new()
                    } else {
                        d.split(',').map(parse_expr).collect()
                    }
                })
                .unwrap_or_default();
            let mark = words.next();
            let tied = match mark {
                Some("tied") => Tied::Always,
                Some("tied?") => Tied::IfTiedWords,
                Some("optional") => Tied::Optional,
                _ => Tied::No,
            };
            let dtype = mark.and_then(DType::from_safetensors_name);
            let follows_load = words.next() == Some("load");
            node.tensors.push(ExpectedTensor {
                name,
                dims,
                tied,
                dtype,
                follows_load,
            });
        }
    }
    node
}

#[cfg(test)]
mod tests;
