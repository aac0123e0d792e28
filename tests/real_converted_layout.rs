//! transformers 5's fused offload experts beside per-expert checkpoint tensors, from
//! real transformers (tests/python/converted_layout.py). Ignored by a bare `cargo
//! test`; `.ci/run` runs it with the reference libraries installed.

mod common;

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn transformers_fused_offload_experts_are_named_and_refused() {
    let (ok, out, err) = common::run_hf_script("converted_layout.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 1, "{out}");
}
