//! The mixture-of-experts half of the map in [`super::layout`]: each family's
//! transformers names for megatron-core's router, routed experts and shared expert.

use super::layout::Cut;

/// transformers' names for a mixture-of-experts layer, by family: Qwen3-MoE (per-head
/// q/k norms), Qwen2-MoE (a gated shared expert beside the routed ones), Mixtral,
/// DeepSeek-V3 (latent attention) and GLM-4-MoE (grouped-query attention); the last two
/// route by a sigmoid with a correction bias and have an ungated shared expert and
/// dense first layers. `{}` is the layer index, `{e}` the expert's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeNames {
    Qwen3Moe,
    Qwen2Moe,
    Mixtral,
    DeepseekV3,
    Glm4Moe,
}

impl MoeNames {
    /// transformers' `model_type` of the family.
    pub fn model_type(self) -> &'static str {
        match self {
            MoeNames::Qwen3Moe => "qwen3_moe",
            MoeNames::Qwen2Moe => "qwen2_moe",
            MoeNames::Mixtral => "mixtral",
            MoeNames::DeepseekV3 => "deepseek_v3",
            MoeNames::Glm4Moe => "glm4_moe",
        }
    }

    /// transformers' class of the family's causal LM (config.json's `architectures`).
    pub fn architecture(self) -> &'static str {
        match self {
            MoeNames::Qwen3Moe => "Qwen3MoeForCausalLM",
            MoeNames::Qwen2Moe => "Qwen2MoeForCausalLM",
            MoeNames::Mixtral => "MixtralForCausalLM",
            MoeNames::DeepseekV3 => "DeepseekV3ForCausalLM",
            MoeNames::Glm4Moe => "Glm4MoeForCausalLM",
        }
    }

    /// The family of a `model_type`, when it is one of these.
    pub fn of_model_type(model_type: &str) -> Option<MoeNames> {
        [
            MoeNames::Qwen3Moe,
            MoeNames::Qwen2Moe,
            MoeNames::Mixtral,
            MoeNames::DeepseekV3,
            MoeNames::Glm4Moe,
        ]
        .into_iter()
        .find(|f| f.model_type() == model_type)
    }
}

/// One row of the experts' map: the Megatron-Core name, each family's name (`None`: the
/// family has no such tensor), the cut, and whether the source has an expert axis
/// after its layer axis (`[layers, experts, rows, columns]` stacked).
pub struct MoeRule {
    pub megatron: &'static str,
    pub qwen3_moe: Option<&'static str>,
    pub qwen2_moe: Option<&'static str>,
    pub mixtral: Option<&'static str>,
    /// DeepSeek-V3's and GLM-4-MoE's (named alike).
    pub deepseek: Option<&'static str>,
    pub cut: Cut,
    pub per_expert: bool,
}

impl MoeRule {
    pub fn name(&self, family: MoeNames) -> Option<&'static str> {
        match family {
            MoeNames::Qwen3Moe => self.qwen3_moe,
            MoeNames::Qwen2Moe => self.qwen2_moe,
            MoeNames::Mixtral => self.mixtral,
            MoeNames::DeepseekV3 | MoeNames::Glm4Moe => self.deepseek,
        }
    }
}

/// A routed expert's or the router's tensor, which every family has: `qwen` for the
/// Qwen families, DeepSeek-V3 and GLM-4-MoE (named alike), `mixtral` for Mixtral.
const fn routed(
    megatron: &'static str,
    qwen: &'static str,
    mixtral: &'static str,
    cut: Cut,
    per_expert: bool,
) -> MoeRule {
    MoeRule {
        megatron,
        qwen3_moe: Some(qwen),
        qwen2_moe: Some(qwen),
        mixtral: Some(mixtral),
        deepseek: Some(qwen),
        cut,
        per_expert,
    }
}

/// A shared expert's tensor: Qwen2-MoE's `shared_expert` (gated) and DeepSeek-V3's and
/// GLM-4-MoE's `shared_experts` (not), when the family has one.
const fn shared(
    megatron: &'static str,
    qwen2: Option<&'static str>,
    deepseek: Option<&'static str>,
    cut: Cut,
) -> MoeRule {
    MoeRule {
        megatron,
        qwen3_moe: None,
        qwen2_moe: qwen2,
        mixtral: None,
        deepseek,
        cut,
        per_expert: false,
    }
}

/// A GPTModel's MoE layer as megatron-core saves it with its local spec's experts
/// (`SequentialMLP`: every expert's `linear_fc1`/`linear_fc2` stacked on an expert axis,
/// expert-parallel ranks holding blocks of it), its router (with
/// `moe_router_enable_expert_bias`, the bias added to its scores to choose experts:
/// DeepSeek-V3's `e_score_correction_bias`), and its shared expert
/// (`SharedExpertMLP`: a gated MLP every token goes through, scaled by
/// `sigmoid(gate_weight · x)` when `moe_shared_expert_gate`).
pub const MOE_RULES: &[MoeRule] = &[
    routed(
        "decoder.layers.mlp.router.weight",
        "model.layers.{}.mlp.gate.weight",
        "model.layers.{}.block_sparse_moe.gate.weight",
        Cut::Whole,
        false,
    ),
    MoeRule {
        megatron: "decoder.layers.mlp.router.expert_bias",
        qwen3_moe: None,
        qwen2_moe: None,
        mixtral: None,
        deepseek: Some("model.layers.{}.mlp.gate.e_score_correction_bias"),
        cut: Cut::Whole,
        per_expert: false,
    },
    routed(
        "decoder.layers.mlp.experts.experts.linear_fc1.weight",
        "model.layers.{}.mlp.experts.{e}.gate_proj.weight",
        "model.layers.{}.block_sparse_moe.experts.{e}.w1.weight",
        Cut::GateUp(0),
        true,
    ),
    routed(
        "decoder.layers.mlp.experts.experts.linear_fc1.weight",
        "model.layers.{}.mlp.experts.{e}.up_proj.weight",
        "model.layers.{}.block_sparse_moe.experts.{e}.w3.weight",
        Cut::GateUp(1),
        true,
    ),
    routed(
        "decoder.layers.mlp.experts.experts.linear_fc2.weight",
        "model.layers.{}.mlp.experts.{e}.down_proj.weight",
        "model.layers.{}.block_sparse_moe.experts.{e}.w2.weight",
        Cut::Whole,
        true,
    ),
    shared(
        "decoder.layers.mlp.shared_experts.linear_fc1.weight",
        Some("model.layers.{}.mlp.shared_expert.gate_proj.weight"),
        Some("model.layers.{}.mlp.shared_experts.gate_proj.weight"),
        Cut::GateUp(0),
    ),
    shared(
        "decoder.layers.mlp.shared_experts.linear_fc1.weight",
        Some("model.layers.{}.mlp.shared_expert.up_proj.weight"),
        Some("model.layers.{}.mlp.shared_experts.up_proj.weight"),
        Cut::GateUp(1),
    ),
    shared(
        "decoder.layers.mlp.shared_experts.linear_fc2.weight",
        Some("model.layers.{}.mlp.shared_expert.down_proj.weight"),
        Some("model.layers.{}.mlp.shared_experts.down_proj.weight"),
        Cut::Whole,
    ),
    shared(
        "decoder.layers.mlp.shared_experts.gate_weight",
        Some("model.layers.{}.mlp.shared_expert_gate.weight"),
        None,
        Cut::Whole,
    ),
];
