//! transformers + accelerate end to end (see tests/python/real_transformers.py).
//! Skipped, with the reason printed, when no Python has torch, transformers and
//! accelerate: CI does not install torch (about 3 GB). Set DEVMAP_HF_PYTHON to choose
//! the interpreter; `.venv-hf` in the repository is tried too.

mod common;

#[test]
fn transformers_loads_what_devmap_saved_from_an_offloaded_model() {
    let Some((ok, out, err)) = common::run_hf_script("real_transformers.py") else {
        return;
    };
    assert!(ok, "real transformers check failed:\n{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 2, "{out}");
}
