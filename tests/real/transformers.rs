//! transformers + accelerate end to end (see tests/python/real_transformers.py).
//! Ignored by a bare `cargo test`; `.ci/run` installs torch, transformers and
//! accelerate into `.venv-hf` and runs it with `--include-ignored`. Set
//! DEVMAP_HF_PYTHON to choose another interpreter.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn transformers_loads_what_devmap_saved_from_an_offloaded_model() {
    let (ok, out, err) = crate::common::run_hf_script("real_transformers.py");
    assert!(ok, "real transformers check failed:\n{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 3, "{out}");
}
