//! `devmap plan --device-map MODE` against what `from_pretrained(device_map=MODE)`
//! really plans (tests/python/transformers_plan.py): six families × ten budgets over
//! one, two and three GPUs × "auto", "balanced_low_0" and "sequential" × four dtype
//! setups (stored bfloat16 or float32, loaded as stored or in the other), captured
//! from transformers' own `from_pretrained`. Ignored by a bare `cargo test`; `.ci/run`
//! runs it with the reference libraries.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn devmap_plan_places_every_tensor_where_from_pretrained_does() {
    let _serial = crate::serial();
    let (ok, out, err) = crate::common::run_hf_script("transformers_plan.py");
    assert!(ok, "plans differ from from_pretrained's:\n{out}\n{err}");
    assert!(
        out.contains("720 of 720 cases place every tensor as from_pretrained does"),
        "{out}"
    );
    // And the map itself, key for key: the modules without tensors it names
    // (`transformer.drop`) included.
    assert!(
        out.contains("720 of 720 cases give from_pretrained's map key for key"),
        "{out}"
    );
    // `--transformers` asks the planner itself: agreement said, a difference named.
    assert_eq!(out.matches("\nasked ").count(), 2, "{out}");
}
