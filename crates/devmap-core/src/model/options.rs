//! The config options that switch tensors on and off, as transformers itself says:
//! `scripts/gen_option_table.py` sets each boolean, Optional and documented string
//! option of every architecture in the expect table to its other values and records
//! which saved tensors each value adds, removes or reshapes (see the script for the
//! format). The expect table is fitted on the default config's options; this table
//! says what a config.json that sets them otherwise changes — a T5 with
//! `feed_forward_proj: "gated-gelu"`, an OPT with `do_layer_norm_before: false` — so
//! verify follows it instead of crying wolf, and where config.json sets an option to a
//! value the table never tried, verify says "not checked" for what it could change.

use serde_json::Value;

use super::table::{Blocks, Parsed, index};

const TABLE: &str = include_str!("option_table.txt");

/// What one value of an option changes in the saved tensors (names with list indices
/// as `*`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub reshaped: Vec<String>,
}

impl Changes {
    /// Every name this value touches.
    fn touched(&self) -> impl Iterator<Item = &String> {
        self.added.iter().chain(&self.removed).chain(&self.reshaped)
    }
}

/// One option of an architecture: its path in config.json (dotted into sub-configs),
/// its default, and each value tried with what it changes. No value tried: no other
/// value could be instantiated, so any other value is unexplored.
#[derive(Debug, Default)]
struct ConfigOption {
    path: String,
    default: Value,
    values: Vec<(Value, Changes)>,
}

/// An architecture's options.
#[derive(Debug, Default)]
pub struct Options {
    options: Vec<ConfigOption>,
}

/// What config.json's options mean for the check of names and shapes.
#[derive(Debug, Default)]
pub struct Switched {
    /// Options set to a value the table tried: `key: value` and what it changes.
    pub explored: Vec<(String, Changes)>,
    /// Options set to a value it did not: `key: value`, and the names the option's
    /// tried values touched (none known: every name may be affected).
    pub unexplored: Vec<(String, Option<Vec<String>>)>,
}

impl Switched {
    /// Whether `name` is one an unexplored option could change, and which option.
    pub fn unexplored_for(&self, name: &str) -> Option<&str> {
        self.unexplored.iter().find_map(|(option, touched)| {
            let hit = touched
                .as_ref()
                .is_none_or(|t| t.iter().any(|p| matches(p, name)));
            hit.then_some(option.as_str())
        })
    }

    /// The option that removes `name` from the checkpoint, if one does.
    pub fn removes(&self, name: &str) -> Option<&str> {
        self.explored_with(name, |c| &c.removed)
    }

    /// The option that adds `name` to the checkpoint, if one does.
    pub fn adds(&self, name: &str) -> Option<&str> {
        self.explored_with(name, |c| &c.added)
    }

    /// The option that changes `name`'s shape (or adds it, with a shape the table
    /// does not fit), if one does.
    pub fn reshapes(&self, name: &str) -> Option<&str> {
        self.explored_with(name, |c| &c.reshaped)
            .or_else(|| self.adds(name))
    }

    fn explored_with(&self, name: &str, of: impl Fn(&Changes) -> &Vec<String>) -> Option<&str> {
        self.explored
            .iter()
            .find(|(_, c)| of(c).iter().any(|p| matches(p, name)))
            .map(|(option, _)| option.as_str())
    }
}

fn table() -> &'static Blocks {
    static TABLE_INDEX: std::sync::OnceLock<Blocks> = std::sync::OnceLock::new();
    TABLE_INDEX.get_or_init(|| index(TABLE))
}

/// The options of the first of `architectures` the table has; none when no option of
/// it switches a tensor (or the table lacks it).
pub fn lookup(architectures: &[String]) -> Option<&'static Options> {
    static PARSED: Parsed<Options> = Parsed::new();
    let table = table();
    let block = table.find(architectures)?;
    Some(PARSED.get(block, || parse_block(table.bodies[block])))
}

/// Where the table comes from: "transformers 5.25.0, torch …".
pub fn source() -> &'static str {
    table().source
}

impl Options {
    /// What `config` (config.json) sets otherwise than the defaults the expect table
    /// was fitted on.
    pub fn switched(&self, config: &Value) -> Switched {
        let mut out = Switched::default();
        for option in &self.options {
            let Some(value) = at_path(config, &option.path) else {
                continue;
            };
            if value == &option.default || same_number(value, &option.default) {
                continue;
            }
            let said = format!("`{}: {}`", option.path, value);
            if let Some((_, changes)) = option.values.iter().find(|(v, _)| v == value) {
                out.explored.push((said, changes.clone()));
                continue;
            }
            // An integer where the default is one: a size the expect table fits.
            if value.is_u64() && option.default.is_u64() || value.is_f64() {
                continue;
            }
            let touched: Vec<String> = option
                .values
                .iter()
                .flat_map(|(_, c)| c.touched().cloned())
                .collect();
            let touched = (!option.values.is_empty()).then_some(touched);
            out.unexplored.push((said, touched));
        }
        out
    }
}

fn same_number(a: &Value, b: &Value) -> bool {
    a.as_f64()
        .zip(b.as_f64())
        .is_some_and(|(a, b)| a.total_cmp(&b).is_eq())
}

/// The value at a dotted path of config.json (`text_config.attention_bias`).
fn at_path<'a>(config: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(config, |node, key| node.get(key))
}

/// Whether a saved name matches a pattern whose `*` parts stand for list indices.
pub fn matches(pattern: &str, name: &str) -> bool {
    let mut p = pattern.split('.');
    let mut n = name.split('.');
    loop {
        match (p.next(), n.next()) {
            (None, None) => return true,
            (Some("*"), Some(part))
                if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) => {}
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

/// Parses one block (see the script for the format). The table is generated and
/// embedded, so a line it does not understand is skipped rather than reported.
fn parse_block(body: &str) -> Options {
    let mut options: Vec<ConfigOption> = Vec::new();
    for line in body.lines() {
        let text = line.trim_start();
        if let Some(rest) = text.strip_prefix("key ") {
            let (path, default) = rest.split_once(' ').unwrap_or((rest, "null"));
            options.push(ConfigOption {
                path: path.to_owned(),
                default: serde_json::from_str(default).unwrap_or(Value::Null),
                values: Vec::new(),
            });
        } else if let Some(rest) = text.strip_prefix("value ") {
            if let Some(option) = options.last_mut() {
                let value = serde_json::from_str(rest).unwrap_or(Value::Null);
                option.values.push((value, Changes::default()));
            }
        } else if let Some((sign, name)) = text.split_once(' ') {
            let Some((_, changes)) = options.last_mut().and_then(|o| o.values.last_mut()) else {
                continue;
            };
            let list = match sign {
                "+" => &mut changes.added,
                "-" => &mut changes.removed,
                "~" => &mut changes.reshaped,
                _ => continue,
            };
            list.push(name.to_owned());
        }
    }
    Options { options }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: &str = "key feed_forward_proj \"relu\"\n value \"gated-gelu\"\n  + encoder.block.*.layer.*.DenseReluDense.wi_0.weight\n  - encoder.block.*.layer.*.DenseReluDense.wi.weight\nkey q_lora_rank 1536\n value null\n  + model.layers.*.self_attn.q_proj.weight\n  - model.layers.*.self_attn.q_a_proj.weight\n  ~ model.layers.*.self_attn.q_b_proj.weight\nkey flag false\n";

    #[test]
    fn options_set_to_tried_values_say_what_they_change() {
        let options = parse_block(BLOCK);
        let config = serde_json::json!({"feed_forward_proj": "gated-gelu", "q_lora_rank": null});
        let s = options.switched(&config);
        assert_eq!(s.explored.len(), 2);
        assert!(s.unexplored.is_empty());
        let wi0 = "encoder.block.3.layer.1.DenseReluDense.wi_0.weight";
        assert_eq!(s.adds(wi0), Some("`feed_forward_proj: \"gated-gelu\"`"));
        assert!(
            s.removes("encoder.block.0.layer.1.DenseReluDense.wi.weight")
                .is_some()
        );
        assert!(
            s.reshapes("model.layers.2.self_attn.q_b_proj.weight")
                .is_some()
        );
        assert!(
            s.removes("decoder.block.0.layer.1.DenseReluDense.wi.weight")
                .is_none()
        );
    }

    #[test]
    fn defaults_and_sizes_are_not_switches_and_untried_values_are_unexplored() {
        let options = parse_block(BLOCK);
        // The default, and an integer where the default is one (the fit's business).
        let config = serde_json::json!({"feed_forward_proj": "relu", "q_lora_rank": 768});
        let s = options.switched(&config);
        assert!(s.explored.is_empty() && s.unexplored.is_empty());

        let config = serde_json::json!({"feed_forward_proj": "gated-silu", "flag": true});
        let s = options.switched(&config);
        assert_eq!(s.unexplored.len(), 2);
        // A value never tried: what the option's tried values touch is not checked.
        let wi = "encoder.block.0.layer.1.DenseReluDense.wi.weight";
        assert_eq!(
            s.unexplored_for(wi),
            Some("`feed_forward_proj: \"gated-silu\"`")
        );
        // An option no other value of which could be tried: anything may change.
        assert_eq!(s.unexplored_for("lm_head.weight"), Some("`flag: true`"));
    }

    #[test]
    fn index_patterns_match_digits_only() {
        assert!(matches("a.*.b", "a.12.b"));
        assert!(!matches("a.*.b", "a.x.b"));
        assert!(!matches("a.*.b", "a.1.b.c"));
        assert!(!matches("a.*", "a."));
    }

    #[test]
    fn the_embedded_table_knows_the_options_that_cried_wolf() {
        let arch = |a: &str| lookup(&[a.to_owned()]).expect(a);
        let t5 = arch("T5ForConditionalGeneration")
            .switched(&serde_json::json!({"feed_forward_proj": "gated-gelu"}));
        assert!(
            t5.removes("encoder.block.0.layer.1.DenseReluDense.wi.weight")
                .is_some()
        );
        let opt =
            arch("OPTForCausalLM").switched(&serde_json::json!({"do_layer_norm_before": false}));
        assert!(
            opt.removes("model.decoder.final_layer_norm.weight")
                .is_some()
        );
        let v2 = arch("DeepseekV2ForCausalLM").switched(&serde_json::json!({"q_lora_rank": null}));
        assert!(v2.adds("model.layers.0.self_attn.q_proj.weight").is_some());
    }
}
