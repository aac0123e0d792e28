//! torch.distributed.checkpoint folders written by torch itself (tests/python/dcp.py):
//! a tied bfloat16 Llama saved by `dcp.save` from one process, nested with its AdamW
//! state and flat, converted by `devmap save --config` and compared with what
//! transformers writes; a missing or cut-short `.distcp` refused naming it; a
//! `.metadata` naming `os.system` refused and never run. And folders 2 and 4 gloo ranks
//! wrote (tests/python/dcp_ranks.py), tensors sharded on dim 0 and dim 1, put together
//! bit for bit as torch loads them; transformers 5's rank files from 2 ranks (torch's
//! writer, and transformers' own FSDP and tensor-parallel `save_pretrained`), as torch
//! consolidates them and as transformers' ordinary save writes the model; a gap and an
//! overlap between chunks refused.
//! Ignored by a bare `cargo test`; `.ci/run` runs them with the reference libraries
//! installed.

#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn dcp_checkpoints_save_as_transformers_saves_the_model() {
    let (ok, out, err) = crate::common::run_hf_script("dcp.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 6, "{out}");
}

#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn dcp_checkpoints_of_several_ranks_are_put_together_as_torch_loads_them() {
    let (ok, out, err) = crate::common::run_hf_script("dcp_ranks.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 7, "{out}");
}
