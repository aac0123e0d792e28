//! The embedded architecture tables (walk order, no-split modules, ties; the tensors a
//! checkpoint holds and their shapes; the non-persistent buffers a model holds) against
//! the installed transformers (see tests/python/arch_table.py). Ignored by a bare
//! `cargo test`; `.ci/run` runs it with the reference libraries.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn the_architecture_table_is_transformers_own() {
    let (ok, out, err) = crate::common::run_hf_script("arch_table.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 3, "{out}");
}
