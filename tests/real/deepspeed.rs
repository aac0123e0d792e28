//! DeepSpeed ZeRO checkpoints written by DeepSpeed itself (tests/python/deepspeed_zero.py):
//! a tiny tied Llama trained one AdamW step by 2 CPU ranks under ZeRO stages 1 (fp32,
//! and bfloat16 with DeepSpeed's bf16 optimizer's `bf16_zero_…` files), 2 and 3 (the
//! fp32 runs with part of the model frozen), saved by `engine.save_checkpoint`, read
//! by devmap bit for bit as DeepSpeed's own zero_to_fp32 rebuilds it (and cast to
//! bfloat16 as torch casts; ZeRO 1's frozen parameters, which zero_to_fp32 leaves out,
//! as the model states hold them), logits equal; a folder missing a rank's optimizer
//! states refused. Ignored by a bare `cargo test`;
//! `.ci/run` installs DeepSpeed and runs it.

#[test]
#[ignore = "needs torch, transformers, deepspeed: run .ci/run"]
fn zero_checkpoints_save_as_zero_to_fp32_rebuilds_them() {
    let (ok, out, err) = crate::common::run_hf_script("deepspeed_zero.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 5, "{out}");
}
