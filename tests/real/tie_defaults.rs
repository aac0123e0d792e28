//! The embedded table of config defaults for `tie_word_embeddings` against the
//! installed transformers (see tests/python/tie_defaults.py). Ignored by a bare
//! `cargo test`; `.ci/run` runs it with the reference libraries.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn the_tie_default_table_is_transformers_own() {
    let (ok, out, err) = crate::common::run_hf_script("tie_defaults.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 1, "{out}");
}
