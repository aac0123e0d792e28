//! `pytorch_model.bin` folders written by torch itself (tests/python/torch_bin.py): a
//! tied bfloat16 Llama in one file and a float32 Qwen2 in three shards with
//! transformers' index, converted by `devmap save` and compared with what transformers
//! writes after loading them; views kept with their strides (transposed, a slice of a
//! wider matrix, one past an assembly window, cast) read as torch reads them; a view
//! with no contiguous dimension and a pickle naming `os.system` refused by name. Ignored by a bare `cargo test`; `.ci/run` runs it with the
//! reference libraries installed.

#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn bin_checkpoints_save_as_transformers_saves_them() {
    let (ok, out, err) = crate::common::run_hf_script("torch_bin.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 6, "{out}");
}
