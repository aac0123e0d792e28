//! `devmap plan` against accelerate's own `infer_auto_device_map` (see
//! tests/python/accelerate_plan.py): the acceptance test of the planner. Skipped, with
//! the reason printed, where torch, transformers and accelerate are not importable
//! (CI does not install torch). DEVMAP_HF_PYTHON or `.venv-hf` choose the interpreter.

mod common;

#[test]
fn devmap_plan_places_every_tensor_where_accelerate_does() {
    let Some((ok, out, err)) = common::run_hf_script("accelerate_plan.py") else {
        return;
    };
    assert!(ok, "plans differ from accelerate:\n{out}\n{err}");
    assert_eq!(out.matches(": same").count(), 61, "{out}");
}
