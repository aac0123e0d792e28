//! Megatron-Core distributed checkpoints written by megatron-core itself
//! (tests/python/megatron_dist.py): a tiny Llama-flavoured GPTModel trained one step on
//! CPU, saved as Megatron-LM saves it, and resharded by megatron-core into TP=2 and
//! PP=2; devmap's save of each is, bit for bit, the Megatron model's own parameters cut
//! and renamed as transformers names them, `from_pretrained` of it gives the Megatron
//! forward's logits, and missing rank files, cut data, a pickle naming a callable and a
//! tensor the map does not know are refused by name; `devmap plan --tp 2` / `--pp 2`
//! (and for MoE `--ep 2`) count each rank's bytes as megatron-core's ranks hold them.
//! Ignored by a bare `cargo test`;
//! `.ci/run` installs megatron-core and runs it.

#[test]
#[ignore = "needs torch, transformers, megatron-core: run .ci/run"]
fn megatron_checkpoints_convert_to_the_models_own_parameters() {
    let (ok, out, err) = crate::common::run_hf_script("megatron_dist.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.matches("bit for bit").count(),
        5,
        "TP=1, TP=2, PP=2 in float32, TP=1 in bfloat16, NeMo 2 at TP=2:\n{out}"
    );
    assert!(
        out.contains("NeMo 2: from_pretrained(OUT) logits = Megatron TP=2 forward"),
        "{out}"
    );
    assert!(
        out.contains("NeMo 2: the tokenizer (context/nemo_tokenizer) and generation_config.json"),
        "{out}"
    );
    assert!(
        out.contains("no args + run_config.yaml (Megatron-Bridge): identical"),
        "{out}"
    );
    assert_eq!(out.matches(": refused (").count(), 7, "{out}");
    // `devmap plan --tp 2` and `--pp 2`: each rank's bytes are those of megatron-core's
    // rank of the same layout.
    assert_eq!(
        out.matches("per-rank bytes = megatron-core's ranks")
            .count(),
        2,
        "{out}"
    );
    assert!(out.contains("megatron: all checks passed"), "{out}");
}

/// Megatron-Core MoE checkpoints (tests/python/megatron_moe.py): megatron-core's own
/// experts and router, at TP=1, TP=2 and EP=2 (also in its `singleton_local_shards`
/// form: each expert and each half of `linear_fc1` apart), become transformers' Qwen3-MoE (with
/// per-head q/k norms), Mixtral (without) and Qwen2-MoE (a gated shared expert, QKV
/// biases; TP=1 and TP=2) bit for bit, config.json from the arguments loads with
/// logits equal to Megatron's forward; a sigmoid router, and a shared expert asked to
/// become Qwen3-MoE, are refused by name.
#[test]
#[ignore = "needs torch, transformers, megatron-core: run .ci/run"]
fn megatron_moe_checkpoints_convert_to_qwen3_moe_and_mixtral() {
    let (ok, out, err) = crate::common::run_hf_script("megatron_moe.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.matches("bit for bit").count(),
        8,
        "Qwen3-MoE at TP=1, TP=2, EP=2 (and both as singleton_local_shards); Mixtral at TP=1; Qwen2-MoE at TP=1, TP=2:\n{out}"
    );
    assert!(out.contains("qwen2_moe TP=2: 107 tensors"), "{out}");
    assert_eq!(out.matches("logits = Megatron forward").count(), 3, "{out}");
    assert_eq!(out.matches(": refused (").count(), 2, "{out}");
    // `devmap plan --tp 2` (experts split by their intermediate) and `--ep 2` (half
    // the experts a rank): megatron-core's ranks hold the same bytes.
    assert_eq!(
        out.matches("per-rank bytes = megatron-core's ranks")
            .count(),
        2,
        "{out}"
    );
    assert!(out.contains("megatron moe: all checks passed"), "{out}");
}

/// DeepSeek-V3-shaped (multi-latent attention with YaRN) and
/// GLM-4-MoE-shaped (grouped-query attention with biases, half-rotary heads)
/// Megatron-Core checkpoints (tests/python/megatron_deepseek.py): a dense first layer,
/// a sigmoid router with its expert bias in groups, an ungated shared expert; at TP=1,
/// TP=2 and (GLM-4-MoE) EP=2 they become transformers' DeepseekV3ForCausalLM and
/// Glm4MoeForCausalLM bit for bit, with logits equal to Megatron's forward; a grouping
/// transformers cannot compute and latent norms of another epsilon are refused by name;
/// `devmap plan --tp 2 / --ep 2` gives each rank megatron-core's rank's bytes.
#[test]
#[ignore = "needs torch, transformers, megatron-core: run .ci/run"]
fn megatron_deepseek_v3_and_glm4_moe_checkpoints_convert() {
    let (ok, out, err) = crate::common::run_hf_script("megatron_deepseek.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.matches("bit for bit").count(),
        5,
        "DeepSeek-V3 (YaRN) at TP=1, TP=2; GLM-4-MoE at TP=1, TP=2, EP=2:\n{out}"
    );
    assert_eq!(out.matches("logits = Megatron forward").count(), 2, "{out}");
    assert_eq!(out.matches(": refused (").count(), 2, "{out}");
    // `devmap plan --tp 2` / `--ep 2`: the bytes of megatron-core's ranks (vLLM's
    // layout: MLA's down projections whole on every rank).
    assert_eq!(
        out.matches("per-rank bytes = megatron-core's ranks")
            .count(),
        3,
        "{out}"
    );
    assert!(
        out.contains("megatron deepseek/glm: all checks passed"),
        "{out}"
    );
}

/// Megatron-LM's `fsdp_dtensor` checkpoints (tests/python/megatron_fsdp.py): what
/// Megatron-FSDP would hold of a Llama-shaped GPTModel at DP=2 × TP=2 (one matrix split
/// unevenly between the data-parallel ranks) and of a Qwen3-MoE-shaped one at TP=2 ×
/// EP=2, put through megatron-core's own swiglu and expert preprocessing and saved by
/// torch's DCP, and the flat form Megatron-LM's converter writes. Each becomes the
/// Megatron model's own parameters bit for bit, identical to the torch_dist
/// checkpoint's conversion, config.json from the `args` entry, with logits equal to
/// Megatron's forward; the optimizer's state is left out and said so; a missing rank
/// file and an `args` pickle naming a callable are refused by name.
#[test]
#[ignore = "needs torch, transformers, megatron-core: run .ci/run"]
fn megatron_fsdp_dtensor_checkpoints_convert() {
    let (ok, out, err) = crate::common::run_hf_script("megatron_fsdp.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.matches("bit for bit").count(),
        5,
        "Llama: torch_dist TP=1, fsdp_dtensor DP=2 TP=2, its flat form; Qwen3-MoE: torch_dist TP=1, fsdp_dtensor TP=2 EP=2:\n{out}"
    );
    assert_eq!(out.matches("logits = Megatron forward").count(), 2, "{out}");
    assert_eq!(out.matches(": refused (").count(), 2, "{out}");
    assert!(
        out.contains("megatron fsdp_dtensor: all checks passed"),
        "{out}"
    );
}
