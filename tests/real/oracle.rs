//! The user's transformers as the oracle (tests/python/oracle.py): pristine
//! `save_pretrained` output of seven configs whose options switch modules on and off
//! verifies clean with `--transformers`, and its save warns of nothing; five
//! architectures devmap's table lacks, loaded in bfloat16 with layers on disk, save
//! byte for byte as transformers does (float32 modules kept), and without an oracle a
//! cast warns and verify says "not checked"; the time to ask about a 70B-size config.
//! Ignored by a bare `cargo test`; `.ci/run` runs it with the reference libraries.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn transformers_asked_is_exact_where_the_table_is_not() {
    let (ok, out, err) = crate::common::run_hf_script("oracle.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 7 + 5 + 1, "{out}");
}
