//! `devmap save --merge-lora` against peft's own merge (tests/python/lora_merge.py):
//! Llama f32 and bf16, rsLoRA with rank and alpha patterns, GPT-2 Conv1D with
//! fan_in_fan_out, Qwen2 embedding LoRA with modules_to_save, lora_bias, DoRA, a tied
//! embedding, two adapters in sequence, peft's target_parameters on fused experts
//! (Mixtral f32 and bf16, GraniteMoE, Qwen3-MoE), Qwen2-MoE all-linear (a one-output
//! gate bit-identical: torch sums it as a matrix-vector product), Llava's renamed modules, and a LoHa
//! adapter refused. Ignored by a bare
//! `cargo test`; `.ci/run` runs it with the reference libraries installed.

#[test]
#[ignore = "needs torch, transformers, peft: run .ci/run"]
fn merges_match_peft_merge_and_unload() {
    let (ok, out, err) = crate::common::run_hf_script("lora_merge.py");
    assert!(ok, "LoRA merge check failed:\n{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 16, "{out}");
    assert!(out.contains("ok: llava-renamed-modules"), "{out}");
    for case in [
        "mixtral-target-parameters:",
        "mixtral-target-parameters-bf16:",
        "granitemoe-target-parameters:",
        "qwen3-moe-target-parameters:",
        "qwen2-moe-all-linear:",
    ] {
        assert!(
            out.contains(&format!("ok: {case}")),
            "{case} missing:\n{out}"
        );
    }
}
