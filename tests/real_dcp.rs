//! torch.distributed.checkpoint folders written by torch itself (tests/python/dcp.py):
//! a tied bfloat16 Llama saved by `dcp.save` from one process, nested with its AdamW
//! state and flat, converted by `devmap save --config` and compared with what
//! transformers writes; a tensor split across two gloo ranks refused, naming it and
//! its chunks; a missing or cut-short `.distcp` refused naming it; a `.metadata` naming
//! `os.system` refused and never run. Ignored by a
//! bare `cargo test`; `.ci/run` runs it with the reference libraries installed.

mod common;

#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn dcp_checkpoints_save_as_transformers_saves_the_model() {
    let (ok, out, err) = common::run_hf_script("dcp.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 7, "{out}");
}
