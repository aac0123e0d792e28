//! `--dtype` against torch and transformers (see tests/python/dtype_cast.py): every
//! float16 and bfloat16 value and millions of float32 ones cast bit for bit as torch's
//! `.to()` does, and `--dtype auto` on a float32 model loaded as bfloat16 writing what
//! `save_pretrained` writes. Ignored by a bare `cargo test`; `.ci/run` installs the
//! libraries and runs it with `--include-ignored`.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn casts_are_torchs_and_auto_writes_what_save_pretrained_writes() {
    let (ok, out, err) = crate::common::run_hf_script("dtype_cast.py");
    assert!(ok, "dtype check failed:\n{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 4, "{out}");
}
