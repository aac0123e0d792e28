//! DeepSeek-V3 and GLM-4-MoE from Megatron-Core: the config.json transformers loads,
//! and the head dimensions of multi-latent attention, which only the shapes and the
//! head count say.
//!
//! Both families route by a sigmoid: each token's top k of `sigmoid(router · x) +
//! bias` (the bias, megatron-core's `router.expert_bias`, chooses but does not weigh),
//! weighed by their sigmoid renormalised (for k > 1) and scaled
//! (`moe_router_topk_scaling_factor`, transformers' `routed_scaling_factor`), within
//! the best groups of experts when `moe_router_group_topk` limits them. Both have an
//! ungated shared expert of `n × moe_intermediate_size` and dense first layers. They
//! differ in the attention: DeepSeek-V3's is latent (MLA, its rotary part
//! interleaved as megatron-core's MLA rotates it), GLM-4-MoE's grouped-query with
//! query/key biases and a rotary part of each head (`rotary_percent`).

use serde_json::json;

use super::args::{Args, Shapes, arg_f64, arg_str, arg_u64};
use super::layout::{Heads, MoeNames};

/// What every family's config takes from the arguments, read by
/// [`super::args::config_json`].
pub struct Common<'a> {
    pub eps: f64,
    pub theta: f64,
    pub positions: u64,
    pub rotary_percent: f64,
    pub dtype: &'a str,
}

/// Multi-latent attention's head dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatentDims {
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: u64,
    /// transformers' `qk_rope_head_dim`, `qk_nope_head_dim` and `v_head_dim`.
    pub rope: u64,
    pub nope: u64,
    pub value: u64,
}

/// The head dimensions `heads` attention heads give the latent attention's shapes
/// (`linear_proj`'s columns are heads × value dims, `linear_kv_up_proj`'s rows heads ×
/// (no-position + value), the query's rows heads × (no-position + rotary)), or why
/// they do not fit.
pub fn latent_dims(heads: u64, shapes: &Shapes) -> Result<LatentDims, String> {
    let latent = shapes
        .latent
        .ok_or("is not a multi-latent attention model")?;
    let fits = heads > 0
        && shapes.attention_width.is_multiple_of(heads)
        && latent.kv_up_rows.is_multiple_of(heads)
        && latent.q_rows.is_multiple_of(heads);
    let value = shapes.attention_width / heads.max(1);
    let nope = (latent.kv_up_rows / heads.max(1)).saturating_sub(value);
    if !fits || nope == 0 || latent.q_rows != heads * (nope + latent.rope_dim) {
        return Err(format!(
            "{heads} attention heads do not divide the latent attention's shapes: linear_proj has {} columns, linear_kv_up_proj {} rows, the query projection {} rows, and the rotary key {} dims",
            shapes.attention_width, latent.kv_up_rows, latent.q_rows, latent.rope_dim
        ));
    }
    Ok(LatentDims {
        q_lora_rank: latent.q_lora_rank,
        kv_lora_rank: latent.kv_lora_rank,
        rope: latent.rope_dim,
        nope,
        value,
    })
}

/// DeepSeek-V3's or GLM-4-MoE's config.json, or the arguments (and layouts) it needs
/// that the checkpoint does not have.
pub fn config_json(
    args: &Args,
    shapes: &Shapes,
    (heads, moe): (Heads, MoeNames),
    common: Common<'_>,
) -> Result<String, Vec<&'static str>> {
    let mut missing = Vec::new();
    let latent = shapes.latent.is_some();
    if latent && moe != MoeNames::DeepseekV3 {
        missing.push(
            "no multi_latent_attention (of these families only DeepSeek-V3's attention is latent)",
        );
    }
    // transformers' DeepSeek-V3 builds q_a_layernorm and kv_a_layernorm with RMSNorm's
    // default eps, 1e-6, whatever rms_norm_eps says.
    if latent && (common.eps - 1e-6).abs() > 1e-12 {
        missing.push("norm_epsilon = 1e-6 (transformers' DeepSeek-V3 normalises the latent query and key/value with eps 1e-6, whatever rms_norm_eps says)");
    }
    if moe == MoeNames::DeepseekV3 && !latent {
        missing.push("multi_latent_attention (DeepSeek-V3's attention is latent; GLM-4-MoE's is grouped-query)");
    }
    let Some(experts) = shapes.experts else {
        missing.push("num_experts (DeepSeek-V3 and GLM-4-MoE are mixtures of experts)");
        return Err(missing);
    };
    let top_k = arg_u64(args, "moe_router_topk");
    if top_k.is_none() {
        missing.push("moe_router_topk");
    }
    if arg_str(args, "moe_router_score_function") != Some("sigmoid") {
        missing.push("moe_router_score_function = sigmoid (DeepSeek-V3's and GLM-4-MoE's routers)");
    }
    if !shapes.expert_bias {
        missing.push("moe_router_enable_expert_bias = true (transformers' router adds its e_score_correction_bias)");
    }
    let expert_ffn = shapes.expert_ffn.unwrap_or(shapes.ffn);
    let shared = match shapes.shared_ffn {
        Some(ffn) if !shapes.shared_gate && expert_ffn > 0 && ffn.is_multiple_of(expert_ffn) => {
            Some(ffn / expert_ffn)
        }
        _ => {
            missing.push("an ungated shared expert (moe_shared_expert_intermediate_size, a multiple of moe_ffn_hidden_size; no moe_shared_expert_gate) in every MoE layer");
            None
        }
    };
    let Some(first_dense) = shapes.dense_prefix else {
        missing.push("the dense layers first (moe_layer_freq [0]*k + [1]*…: transformers' first_k_dense_replace)");
        return Err(missing);
    };
    // Groups: transformers ranks a group by its two best scores, megatron-core by its
    // top k / group_topk.
    let group_topk = arg_u64(args, "moe_router_group_topk").filter(|&g| g > 0);
    let groups = match group_topk {
        Some(_) => arg_u64(args, "moe_router_num_groups").unwrap_or(1),
        None => 1,
    };
    if let (Some(g), Some(k)) = (group_topk, top_k)
        && (k / g != 2 || groups == 0 || !experts.is_multiple_of(groups))
    {
        missing.push("moe_router_topk / moe_router_group_topk = 2, and experts in whole groups (transformers ranks a group by its two best scores)");
    }
    let (Some(top_k), Some(shared), true) = (top_k, shared, missing.is_empty()) else {
        return Err(missing);
    };
    let scaling = arg_f64(args, "moe_router_topk_scaling_factor").unwrap_or(1.0);
    let mut rope = json!({"rope_type": "default", "rope_theta": common.theta});
    let mut config = json!({
        "hidden_size": shapes.hidden,
        "intermediate_size": shapes.ffn,
        "moe_intermediate_size": expert_ffn,
        "num_hidden_layers": shapes.layers,
        "num_attention_heads": heads.query,
        "num_key_value_heads": heads.key_value,
        "vocab_size": shapes.vocab,
        "max_position_embeddings": common.positions,
        "rms_norm_eps": common.eps,
        "hidden_act": "silu",
        "tie_word_embeddings": shapes.tied,
        "n_routed_experts": experts,
        "n_shared_experts": shared,
        "num_experts_per_tok": top_k,
        "first_k_dense_replace": first_dense,
        "n_group": groups,
        "topk_group": group_topk.unwrap_or(1),
        "norm_topk_prob": top_k > 1,
        "routed_scaling_factor": scaling,
        "num_mtp_layers": 0,
        "dtype": common.dtype,
        "architectures": [moe.architecture()],
        "model_type": moe.model_type(),
    });
    if moe == MoeNames::DeepseekV3 {
        let dims = latent_dims(heads.query, shapes)
            .map_err(|_| vec!["num_attention_heads dividing the latent attention's shapes"])?;
        config["num_key_value_heads"] = json!(heads.query);
        config["q_lora_rank"] = json!(dims.q_lora_rank);
        config["kv_lora_rank"] = json!(dims.kv_lora_rank);
        config["qk_rope_head_dim"] = json!(dims.rope);
        config["qk_nope_head_dim"] = json!(dims.nope);
        config["v_head_dim"] = json!(dims.value);
        config["rope_interleave"] = json!(true);
        config["attention_bias"] = json!(false);
        // megatron-core's MLA defaults to YaRN (MLATransformerConfig's rope_type).
        if arg_str(args, "rope_type").unwrap_or("yarn") == "yarn" {
            rope["rope_type"] = json!("yarn");
            for (name, hf, default) in [
                ("rotary_scaling_factor", "factor", 40.0),
                ("beta_fast", "beta_fast", 32.0),
                ("beta_slow", "beta_slow", 1.0),
                ("mscale", "mscale", 1.0),
                ("mscale_all_dim", "mscale_all_dim", 0.0),
            ] {
                rope[hf] = json!(arg_f64(args, name).unwrap_or(default));
            }
            let original = arg_f64(args, "original_max_position_embeddings").unwrap_or(4096.0);
            rope["original_max_position_embeddings"] = json!(original as u64);
        }
    } else {
        config["head_dim"] = json!(heads.dim);
        config["attention_bias"] = json!(shapes.qkv_bias);
        config["use_qk_norm"] = json!(shapes.qk_norm.is_some());
        config["partial_rotary_factor"] = json!(common.rotary_percent);
        rope["partial_rotary_factor"] = json!(common.rotary_percent);
    }
    config["rope_parameters"] = rope;
    Ok(super::args::config_text(&config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::megatron::args::LatentShapes;
    use crate::formats::pickle::Value;

    /// DeepSeek-V3's proportions at a tenth: 4 heads of 16 + 8 rotary dims, values 12.
    fn latent() -> Shapes {
        Shapes {
            layers: 4,
            hidden: 64,
            vocab: 128,
            ffn: 96,
            qkv_rows: 0,
            attention_width: 4 * 12,
            qk_norm: None,
            qkv_bias: false,
            tied: false,
            experts: Some(4),
            expert_ffn: Some(32),
            expert_bias: true,
            dense_mlp: true,
            dense_prefix: Some(1),
            latent: Some(LatentShapes {
                q_lora_rank: Some(24),
                q_rows: 4 * (16 + 8),
                kv_lora_rank: 16,
                rope_dim: 8,
                kv_up_rows: 4 * (16 + 12),
            }),
            shared_ffn: Some(64),
            shared_gate: false,
        }
    }

    fn args() -> Args {
        vec![
            ("moe_router_topk".into(), Value::Int(2)),
            (
                "moe_router_score_function".into(),
                Value::Str("sigmoid".into()),
            ),
            ("moe_router_num_groups".into(), Value::Int(2)),
            ("moe_router_group_topk".into(), Value::Int(1)),
            ("moe_router_topk_scaling_factor".into(), Value::Float(2.5)),
            ("rope_type".into(), Value::Str("rope".into())),
        ]
    }

    fn common() -> Common<'static> {
        Common {
            eps: 1e-6,
            theta: 10000.0,
            positions: 64,
            rotary_percent: 1.0,
            dtype: "float32",
        }
    }

    const HEADS: Heads = Heads {
        query: 4,
        key_value: 4,
        dim: 16,
    };

    #[test]
    fn the_latent_head_dims_follow_from_the_shapes_and_the_head_count() {
        let dims = latent_dims(4, &latent()).expect("dims");
        assert_eq!((dims.nope, dims.rope, dims.value), (16, 8, 12));
        assert_eq!((dims.q_lora_rank, dims.kv_lora_rank), (Some(24), 16));
        // 3 heads divide none of it; 2 heads make a query of another size.
        assert!(latent_dims(3, &latent()).is_err());
        assert!(latent_dims(2, &latent()).is_err());
    }

    #[test]
    fn a_deepseek_config_says_the_routing_the_arguments_give() {
        let text = config_json(&args(), &latent(), (HEADS, MoeNames::DeepseekV3), common())
            .expect("config");
        let config: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(config["architectures"][0], "DeepseekV3ForCausalLM");
        assert_eq!(config["n_shared_experts"], 2);
        assert_eq!(config["first_k_dense_replace"], 1);
        assert_eq!(
            (config["n_group"].clone(), config["topk_group"].clone()),
            (2.into(), 1.into())
        );
        assert_eq!(config["routed_scaling_factor"], 2.5);
        assert_eq!(config["qk_nope_head_dim"], 16);
        assert_eq!(config["rope_parameters"]["rope_type"], "default");
    }

    #[test]
    fn what_transformers_cannot_compute_is_named() {
        let refused = |args: &Args, shapes: &Shapes, eps: f64| {
            config_json(
                args,
                shapes,
                (HEADS, MoeNames::DeepseekV3),
                Common { eps, ..common() },
            )
            .expect_err("refused")
        };
        let mut four = args();
        four[0].1 = Value::Int(4);
        assert!(refused(&four, &latent(), 1e-6)[0].contains("moe_router_group_topk"));
        assert!(refused(&args(), &latent(), 1e-5)[0].starts_with("norm_epsilon = 1e-6"));
        let no_bias = Shapes {
            expert_bias: false,
            ..latent()
        };
        assert!(refused(&args(), &no_bias, 1e-6)[0].contains("expert_bias"));
        let dense_later = Shapes {
            dense_prefix: None,
            ..latent()
        };
        assert!(
            refused(&args(), &dense_later, 1e-6)
                .iter()
                .any(|m| m.contains("first_k_dense_replace"))
        );
        let gated = Shapes {
            shared_gate: true,
            ..latent()
        };
        assert!(
            refused(&args(), &gated, 1e-6)
                .iter()
                .any(|m| m.contains("ungated shared expert"))
        );
    }
}
