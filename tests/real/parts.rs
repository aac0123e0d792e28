//! A save split over processes on the inputs of training jobs
//! (tests/python/parts_sources.py): a 4-rank torch.distributed.checkpoint folder and a
//! 2-rank DeepSpeed ZeRO-3 checkpoint, saved by `--part 1/4` … `--part 4/4` and
//! `--commit 4`, are byte-identical to a single save; the 4 parts also run under
//! `torchrun --nproc-per-node 4` with `--part auto`. Ignored by a bare `cargo test`;
//! `.ci/run` runs it with the reference libraries.

#[test]
#[ignore = "needs torch, transformers, deepspeed: run .ci/run"]
fn split_saves_of_dcp_and_zero3_equal_a_single_save_also_under_torchrun() {
    let (ok, out, err) = crate::common::run_hf_script("parts_sources.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.matches("byte-identical to a single save").count(),
        3,
        "{out}"
    );
    assert!(out.contains("under torchrun (--part auto)"), "{out}");
}
