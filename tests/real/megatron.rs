//! Megatron-Core distributed checkpoints written by megatron-core itself
//! (tests/python/megatron_dist.py): a tiny Llama-flavoured GPTModel trained one step on
//! CPU, saved as Megatron-LM saves it, and resharded by megatron-core into TP=2 and
//! PP=2; devmap's save of each is, bit for bit, the Megatron model's own parameters cut
//! and renamed as transformers names them, `from_pretrained` of it gives the Megatron
//! forward's logits, and missing rank files, cut data, a pickle naming a callable and a
//! tensor the map does not know are refused by name. Ignored by a bare `cargo test`;
//! `.ci/run` installs megatron-core and runs it.

#[test]
#[ignore = "needs torch, transformers, megatron-core: run .ci/run"]
fn megatron_checkpoints_convert_to_the_models_own_parameters() {
    let _serial = crate::serial();
    let (ok, out, err) = crate::common::run_hf_script("megatron_dist.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.matches("bit for bit").count(),
        4,
        "TP=1, TP=2, PP=2 in float32, TP=1 in bfloat16:\n{out}"
    );
    assert_eq!(out.matches(": refused (").count(), 5, "{out}");
    assert!(out.contains("megatron: all checks passed"), "{out}");
}
