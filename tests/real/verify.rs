//! `devmap verify` on checkpoints written by transformers itself (see
//! tests/python/verify_real.py). Ignored by a bare `cargo test`; `.ci/run` runs it with
//! the reference libraries installed.

#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn checkpoints_transformers_wrote_verify_clean() {
    let (ok, out, err) = crate::common::run_hf_script("verify_real.py");
    assert!(
        ok,
        "verify on transformers' checkpoints failed:\n{out}\n{err}"
    );
    assert_eq!(out.matches("ok: ").count(), 4, "{out}");
}
