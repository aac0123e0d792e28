//! The model's hyperparameters: from the HF config.json `--config` names, else from the
//! training run's arguments Megatron-LM keeps in `common.pt` (`args`, an
//! `argparse.Namespace`), checked against the tensors' shapes. From the arguments
//! devmap writes the config.json transformers loads.

use std::path::Path;

use serde_json::{Value as Json, json};

use super::layout::{Heads, MoeNames};
use crate::formats::pickle::{Allow, Value};
use crate::formats::{FormatError, Kind};

/// The file beside `.metadata` holding what is not sharded.
pub const COMMON: &str = "common.pt";

/// The training run's arguments, by name (`None`: `common.pt` has none).
pub type Args = Vec<(String, Value)>;

/// `common.pt`'s `args`, read as data (a pickle naming anything else than the
/// arguments' namespace, torch's dtypes and Megatron-Core's enums is refused).
pub fn read_args(dir: &Path) -> Result<Option<Args>, FormatError> {
    let path = dir.join(COMMON);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    let Value::Dict(items) = read_pickled(&path, None)? else {
        return Err(FormatError::invalid_as(
            Kind::NotTheFormat,
            &path,
            "does not hold a dict: not Megatron-Core's common state",
        ));
    };
    Ok(items.into_iter().find_map(|(k, v)| match k {
        Value::Str(k) if k == "args" => namespace_fields(v),
        _ => None,
    }))
}

/// The arguments a checkpoint keeps as an entry of its own (`object`: Megatron-LM's
/// `fsdp_dtensor` format, where torch.distributed.checkpoint pickled `args` with
/// `torch.save` into a `.distcp` file), read as data like [`read_args`]'s.
pub fn read_args_object(object: &crate::formats::dcp::Object) -> Result<Args, FormatError> {
    let entry = (object.fqn.as_str(), object.offset, object.length);
    let value = read_pickled(&object.file, Some(entry))?;
    namespace_fields(value).ok_or_else(|| {
        FormatError::invalid_as(
            Kind::NotTheFormat,
            &object.file,
            format!(
                "entry `{}` does not hold an argparse Namespace: not Megatron-LM's training arguments",
                object.fqn
            ),
        )
    })
}

/// What the `torch.save` archive `path` holds (`entry`: the one at bytes `offset`,
/// `length` long, of it, named in errors), read as data knowing only what Megatron's
/// arguments name.
fn read_pickled(path: &Path, entry: Option<(&str, u64, u64)>) -> Result<Value, FormatError> {
    let file = crate::formats::input::open_regular(path)?;
    let len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    let (offset, length) = match entry {
        Some((fqn, offset, length)) => {
            if offset.checked_add(length).is_none_or(|end| end > len) {
                return Err(FormatError::invalid_as(
                    Kind::Truncated,
                    path,
                    format!(
                        "entry `{fqn}` is stored at bytes {offset}..{} of a file of {len}",
                        offset.saturating_add(length)
                    ),
                ));
            }
            (offset, length)
        }
        None => (0, len),
    };
    let members = crate::formats::zip::members_in(path, &file, offset, length)?;
    let (_, value) = crate::formats::torch_bin::read_archive(
        path,
        &file,
        &members,
        Allow::MegatronCommon,
        &|kind, m| match entry {
            Some((fqn, ..)) => FormatError::invalid_as(kind, path, format!("entry `{fqn}`: {m}")),
            None => FormatError::invalid_as(kind, path, m),
        },
    )?;
    Ok(value)
}

/// The fields of a pickled `argparse.Namespace`, by name.
fn namespace_fields(value: Value) -> Option<Args> {
    match value {
        Value::Object {
            class: "Namespace",
            state,
        } => match *state {
            Value::Dict(fields) => Some(
                fields
                    .into_iter()
                    .filter_map(|(k, v)| match k {
                        Value::Str(k) => Some((k, v)),
                        _ => None,
                    })
                    .collect(),
            ),
            _ => None,
        },
        _ => None,
    }
}

pub(super) fn arg<'a>(args: &'a Args, name: &str) -> Option<&'a Value> {
    args.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .filter(|v| !matches!(v, Value::None))
}

pub(super) fn arg_u64(args: &Args, name: &str) -> Option<u64> {
    arg(args, name)?.as_u64()
}

pub(super) fn arg_f64(args: &Args, name: &str) -> Option<f64> {
    match arg(args, name)? {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

pub(super) fn arg_bool(args: &Args, name: &str) -> Option<bool> {
    match arg(args, name)? {
        Value::Bool(b) => Some(*b),
        _ => None,
    }
}

pub(super) fn arg_str<'a>(args: &'a Args, name: &str) -> Option<&'a str> {
    match arg(args, name)? {
        Value::Str(s) => Some(s),
        _ => None,
    }
}

/// What the shapes say of the model.
#[derive(Debug, Clone, Copy)]
pub struct Shapes {
    pub layers: u64,
    pub hidden: u64,
    pub vocab: u64,
    pub ffn: u64,
    /// Rows of `linear_qkv` and columns of `linear_proj`.
    pub qkv_rows: u64,
    pub attention_width: u64,
    /// The length of `q_layernorm` (Qwen3's per-head norm), when there is one.
    pub qk_norm: Option<u64>,
    pub qkv_bias: bool,
    pub tied: bool,
    /// The experts of a MoE model, when it is one, and each expert's FFN width (`ffn`
    /// is the dense layers' when there are some, else the experts').
    pub experts: Option<u64>,
    pub expert_ffn: Option<u64>,
    /// Whether the router has a bias for choosing experts (`router.expert_bias`).
    pub expert_bias: bool,
    /// Whether some layer has a dense MLP, and how many layers do when they are the
    /// first ones (transformers' `first_k_dense_replace`; `None`: not only the first).
    pub dense_mlp: bool,
    pub dense_prefix: Option<u64>,
    /// Multi-latent attention's shapes, for an MLA model.
    pub latent: Option<LatentShapes>,
    /// The shared expert's FFN width (`shared_experts.linear_fc2`'s columns), when
    /// there is one, and whether it is gated (`shared_experts.gate_weight`).
    pub shared_ffn: Option<u64>,
    pub shared_gate: bool,
}

/// What an MLA model's tensors say of its attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatentShapes {
    /// `linear_q_down_proj`'s rows (`None`: queries through one `linear_q_proj`).
    pub q_lora_rank: Option<u64>,
    /// The query projection's rows: heads × (no-position + rotary head dims).
    pub q_rows: u64,
    /// `kv_layernorm`'s length, and `linear_kv_down_proj`'s rows beyond it (the
    /// rotary key's head dim).
    pub kv_lora_rank: u64,
    pub rope_dim: u64,
    /// `linear_kv_up_proj`'s rows: heads × (no-position key + value head dims).
    pub kv_up_rows: u64,
}

/// The head count from an HF config.json.
pub fn heads_from_config(config: &Json, shapes: &Shapes) -> Option<Heads> {
    let query = config.get("num_attention_heads")?.as_u64()?;
    let key_value = config
        .get("num_key_value_heads")
        .and_then(Json::as_u64)
        .unwrap_or(query);
    let dim = config
        .get("head_dim")
        .and_then(Json::as_u64)
        .unwrap_or(shapes.hidden / query.max(1));
    Some(Heads {
        query,
        key_value,
        dim,
    })
}

/// The head counts from Megatron's arguments (`num_query_groups` counts only with
/// `group_query_attention`; `kv_channels` defaults to hidden / heads).
pub fn heads_from_args(args: &Args, shapes: &Shapes) -> Option<Heads> {
    let query = arg_u64(args, "num_attention_heads")?;
    let key_value = match arg_bool(args, "group_query_attention") {
        Some(false) => query,
        _ => arg_u64(args, "num_query_groups").unwrap_or(query),
    };
    let dim = arg_u64(args, "kv_channels").unwrap_or(shapes.hidden / query.max(1));
    Some(Heads {
        query,
        key_value,
        dim,
    })
}

/// Whether the head counts fit the tensors, in words when not.
pub fn check_heads(heads: Heads, shapes: &Shapes) -> Result<(), String> {
    let rows = (heads.query + 2 * heads.key_value) * heads.dim;
    if rows != shapes.qkv_rows || heads.query * heads.dim != shapes.attention_width {
        return Err(format!(
            "{} query heads, {} key/value heads of dimension {} make a linear_qkv of {rows} rows and a linear_proj of {} columns, but the checkpoint's have {} and {}",
            heads.query,
            heads.key_value,
            heads.dim,
            heads.query * heads.dim,
            shapes.qkv_rows,
            shapes.attention_width
        ));
    }
    Ok(())
}

/// The config.json transformers loads, from the arguments and the shapes; or the
/// arguments it needs that `args` does not hold.
pub fn config_json(
    args: &Args,
    shapes: &Shapes,
    (heads, moe): (Heads, MoeNames),
    dtype: &str,
) -> Result<String, Vec<&'static str>> {
    let mut missing = Vec::new();
    let normalization = arg_str(args, "normalization").unwrap_or("LayerNorm");
    if normalization != "RMSNorm" {
        missing.push("normalization = RMSNorm (the map is for Llama-type models)");
    }
    if arg_bool(args, "swiglu") == Some(false) {
        missing.push("swiglu = true (the map is for gated MLPs)");
    }
    if arg_str(args, "position_embedding_type").is_some_and(|p| p != "rope") {
        missing.push("position_embedding_type = rope");
    }
    let eps = arg_f64(args, "norm_epsilon").or_else(|| arg_f64(args, "layernorm_epsilon"));
    let theta = arg_f64(args, "rotary_base");
    let positions =
        arg_u64(args, "max_position_embeddings").or_else(|| arg_u64(args, "seq_length"));
    if eps.is_none() {
        missing.push("norm_epsilon");
    }
    if theta.is_none() {
        missing.push("rotary_base");
    }
    if positions.is_none() {
        missing.push("max_position_embeddings");
    }
    let rotary_percent = arg_f64(args, "rotary_percent").unwrap_or(1.0);
    let sigmoid_family = matches!(moe, MoeNames::DeepseekV3 | MoeNames::Glm4Moe);
    if moe != MoeNames::Glm4Moe && (rotary_percent - 1.0).abs() > f64::EPSILON {
        missing
            .push("rotary_percent = 1.0 (of these families only GLM-4-MoE rotates part of a head)");
    }
    let (Some(eps), Some(theta), Some(positions), true) =
        (eps, theta, positions, missing.is_empty())
    else {
        return Err(missing);
    };
    if sigmoid_family || shapes.latent.is_some() {
        let common = super::deepseek::Common {
            eps,
            theta,
            positions,
            rotary_percent,
            dtype,
        };
        return super::deepseek::config_json(args, shapes, (heads, moe), common);
    }
    // A MoE layer as transformers' Qwen2-MoE, Qwen3-MoE and Mixtral route: a softmax
    // over the experts' scores, the top k, renormalised (Megatron's top-k then softmax,
    // its default), or not (the Qwen families' norm_topk_prob = false: Megatron's
    // pre-softmax).
    let moe_args = shapes.experts.map(|_| {
        let top_k = arg_u64(args, "moe_router_topk");
        let pre_softmax = arg_bool(args, "moe_router_pre_softmax").unwrap_or(false);
        (top_k, pre_softmax)
    });
    if let Some((top_k, pre_softmax)) = moe_args {
        if top_k.is_none() {
            missing.push("moe_router_topk");
        }
        if arg_str(args, "moe_router_score_function").is_some_and(|f| f != "softmax") {
            missing.push("moe_router_score_function = softmax (Qwen2-MoE, Qwen3-MoE and Mixtral routers; a sigmoid router is DeepSeek-V3's and GLM-4-MoE's, which have a shared expert and moe_router_enable_expert_bias)");
        }
        if arg_f64(args, "moe_router_topk_scaling_factor")
            .is_some_and(|f| (f - 1.0).abs() > f64::EPSILON)
        {
            missing.push("no moe_router_topk_scaling_factor (transformers' routers do not scale)");
        }
        let shared = arg_u64(args, "moe_shared_expert_intermediate_size").is_some()
            || shapes.shared_ffn.is_some();
        if moe == MoeNames::Qwen2Moe {
            // Qwen2-MoE: every layer's shared expert, gated by a sigmoid; no q/k norms.
            if shapes.shared_ffn.is_none() {
                missing.push("a shared expert (moe_shared_expert_intermediate_size) in every layer, as Qwen2-MoE has");
            }
            if !shapes.shared_gate {
                missing.push("moe_shared_expert_gate = true (Qwen2-MoE's shared expert is gated)");
            }
            if shapes.qk_norm.is_some() {
                missing.push("no qk_layernorm (Qwen2-MoE has no q/k norms)");
            }
        } else if shared {
            missing
                .push("no shared experts (Qwen3-MoE and Mixtral have none; Qwen2-MoE's is gated)");
        }
        if shapes.dense_mlp {
            missing.push("every layer a MoE layer (moe_layer_freq = 1)");
        }
        if pre_softmax && moe == MoeNames::Mixtral {
            missing.push("moe_router_pre_softmax = false (Mixtral renormalises the top k)");
        }
    }
    if !missing.is_empty() {
        return Err(missing);
    }
    let (architecture, model_type) = match (shapes.experts, moe) {
        (Some(_), family) => (family.architecture(), family.model_type()),
        (None, _) => match (shapes.qk_norm.is_some(), shapes.qkv_bias) {
            (true, _) => ("Qwen3ForCausalLM", "qwen3"),
            (false, true) => ("Qwen2ForCausalLM", "qwen2"),
            (false, false) => ("LlamaForCausalLM", "llama"),
        },
    };
    let mut config = json!({
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": shapes.hidden,
        "intermediate_size": shapes.ffn,
        "num_hidden_layers": shapes.layers,
        "num_attention_heads": heads.query,
        "num_key_value_heads": heads.key_value,
        "head_dim": heads.dim,
        "vocab_size": shapes.vocab,
        "max_position_embeddings": positions,
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "hidden_act": "silu",
        "tie_word_embeddings": shapes.tied,
        "dtype": dtype,
    });
    if model_type == "llama" {
        config["attention_bias"] = json!(false);
        config["mlp_bias"] = json!(false);
    }
    if let (Some(experts), Some((top_k, pre_softmax))) = (shapes.experts, moe_args) {
        config["num_experts_per_tok"] = json!(top_k);
        if model_type != "mixtral" {
            config["num_experts"] = json!(experts);
            config["moe_intermediate_size"] = json!(shapes.ffn);
            config["norm_topk_prob"] = json!(!pre_softmax);
            config["decoder_sparse_step"] = json!(1);
            config["mlp_only_layers"] = json!([]);
        }
        if model_type == "qwen2_moe" {
            config["shared_expert_intermediate_size"] = json!(shapes.shared_ffn);
            config["qkv_bias"] = json!(shapes.qkv_bias);
        } else if model_type == "mixtral" {
            config["num_local_experts"] = json!(experts);
        }
    }
    Ok(config_text(&config))
}

/// config.json's text: pretty-printed, ending in a newline, as transformers writes it.
pub(super) fn config_text(config: &Json) -> String {
    let mut text = serde_json::to_string_pretty(config).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Shapes {
        Shapes {
            layers: 4,
            hidden: 64,
            vocab: 128,
            ffn: 96,
            qkv_rows: 96,
            attention_width: 64,
            qk_norm: None,
            qkv_bias: false,
            tied: false,
            experts: None,
            expert_ffn: None,
            expert_bias: false,
            dense_mlp: true,
            dense_prefix: Some(4),
            latent: None,
            shared_ffn: None,
            shared_gate: false,
        }
    }

    #[test]
    fn query_groups_count_only_with_group_query_attention() {
        let mut args: Args = vec![
            ("num_attention_heads".into(), Value::Int(8)),
            ("num_query_groups".into(), Value::Int(2)),
            ("group_query_attention".into(), Value::Bool(true)),
        ];
        let heads = heads_from_args(&args, &shapes()).expect("heads");
        assert_eq!((heads.query, heads.key_value, heads.dim), (8, 2, 8));
        assert!(check_heads(heads, &shapes()).is_ok());
        args[2].1 = Value::Bool(false);
        let heads = heads_from_args(&args, &shapes()).expect("heads");
        assert_eq!(heads.key_value, 8);
        assert!(check_heads(heads, &shapes()).is_err());
    }

    #[test]
    fn a_config_needs_every_value_it_cannot_see_in_the_shapes() {
        let args: Args = vec![("normalization".into(), Value::Str("RMSNorm".into()))];
        let heads = Heads {
            query: 8,
            key_value: 2,
            dim: 8,
        };
        let missing = config_json(&args, &shapes(), (heads, MoeNames::Mixtral), "float32")
            .expect_err("missing");
        assert_eq!(
            missing,
            ["norm_epsilon", "rotary_base", "max_position_embeddings"]
        );
    }

    #[test]
    fn a_shared_expert_is_qwen2_moe_and_refused_elsewhere() {
        let args: Args = vec![
            ("normalization".into(), Value::Str("RMSNorm".into())),
            ("norm_epsilon".into(), Value::Float(1e-6)),
            ("rotary_base".into(), Value::Float(1e6)),
            ("max_position_embeddings".into(), Value::Int(64)),
            ("moe_router_topk".into(), Value::Int(2)),
            ("moe_router_pre_softmax".into(), Value::Bool(true)),
        ];
        let heads = Heads {
            query: 8,
            key_value: 2,
            dim: 8,
        };
        let moe = Shapes {
            experts: Some(4),
            expert_ffn: Some(96),
            dense_mlp: false,
            dense_prefix: Some(0),
            shared_ffn: Some(48),
            shared_gate: true,
            qkv_bias: true,
            ..shapes()
        };
        let text =
            config_json(&args, &moe, (heads, MoeNames::Qwen2Moe), "float32").expect("config");
        let config: Json = serde_json::from_str(&text).expect("json");
        assert_eq!(config["architectures"][0], "Qwen2MoeForCausalLM");
        assert_eq!(config["shared_expert_intermediate_size"], 48);
        assert_eq!(config["norm_topk_prob"], false);
        assert_eq!(config["qkv_bias"], true);
        // Families without a shared expert, and Qwen2-MoE's without its gate.
        for family in [MoeNames::Qwen3Moe, MoeNames::Mixtral] {
            let missing =
                config_json(&args, &moe, (heads, family), "float32").expect_err("refused");
            assert!(
                missing.iter().any(|m| m.starts_with("no shared experts")),
                "{missing:?}"
            );
        }
        let ungated = Shapes {
            shared_gate: false,
            ..moe
        };
        let missing = config_json(&args, &ungated, (heads, MoeNames::Qwen2Moe), "float32")
            .expect_err("refused");
        assert!(
            missing[0].starts_with("moe_shared_expert_gate"),
            "{missing:?}"
        );
    }
}
