//! `devmap plan --device-map sequential` against the walk `from_pretrained` runs,
//! transformers' `infer_auto_device_map` (accelerate's walk with transformers' sizes;
//! see tests/python/accelerate_plan.py): the acceptance test of the planner's walk. Ignored by a
//! bare `cargo test`; `.ci/run` installs torch, transformers and accelerate into
//! `.venv-hf` and runs it with `--include-ignored` (DEVMAP_HF_PYTHON chooses another
//! interpreter).

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn devmap_plan_walks_as_transformers_walks() {
    let (ok, out, err) = crate::common::run_hf_script("accelerate_plan.py");
    assert!(ok, "plans differ from transformers' walk:\n{out}\n{err}");
    // 30 families x 11 budgets in bfloat16, x 5 in float32, a float32 Llama loaded as
    // bfloat16 x 11, the transformers 5 rule case, and an FP8 Llama whose config says
    // `dequantize: true` x 11 (planned as the plain bfloat16 model it loads as).
    assert_eq!(out.matches(": same").count(), 503, "{out}");
    // A GPU budget at every edge of accelerate's walk on the six families whose models
    // hold non-persistent buffers (the script fails on any difference).
    assert_eq!(out.matches(" edge budgets, ").count(), 6, "{out}");
}
