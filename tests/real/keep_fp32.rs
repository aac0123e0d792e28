//! Modules transformers keeps in float32, against transformers' own `save_pretrained`
//! (see tests/python/keep_fp32.py). Ignored by a bare `cargo test`; `.ci/run` runs it
//! with `--include-ignored`.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn dtype_auto_writes_what_save_pretrained_writes_for_kept_float32_modules() {
    let (ok, out, err) = crate::common::run_hf_script("keep_fp32.py");
    assert!(ok, "keep-in-float32 check failed:\n{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 4, "{out}");
    assert!(
        out.contains("kept in float32 (model.layers.1.mlp.gate.weight"),
        "{out}"
    );
}
