//! transformers 5's fused offload experts read back as the checkpoint's per-expert
//! tensors, on real transformers output (tests/python/converted_layout.py): Mixtral,
//! Qwen2-MoE, LFM2-MoE and Nemotron-H (experts without a gate, `backbone.` loaded as
//! `model.`). Ignored by a bare `cargo test`; `.ci/run` runs it with the reference
//! libraries installed.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn transformers_fused_offload_experts_are_read_back() {
    let (ok, out, err) = crate::common::run_hf_script("converted_layout.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 4, "{out}");
    assert!(out.contains("ok: lfm2_moe"), "{out}");
    assert!(out.contains("ok: nemotron_h"), "{out}");
}
