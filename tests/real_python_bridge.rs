//! The devmap Python package on real models (tests/python/live_save.py): a live model
//! in a Python session — CPU and disk-offloaded values, in-memory edits, a merged LoRA,
//! fused MoE experts, tied weights — saved with `devmap.save_pretrained` and compared
//! with transformers' own `save_pretrained` of the same model (names, dtypes, bytes,
//! config), reloaded for the live model's logits; the GPU path's staging through a
//! small buffer, run on CPU tensors; meta tensors, a tensor changed
//! during the save and Ctrl-C refused with nothing committed. The package's compiled
//! module is built here with cargo (the same crate `pip install ./python` builds) and
//! put beside the package's Python files. Ignored by a bare `cargo test`; `.ci/run`
//! runs it with the reference libraries installed.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "needs torch, transformers, accelerate, peft: run .ci/run"]
fn live_models_save_as_transformers_saves_them() {
    let package = common::built_python_package();
    let py = common::hf_python().unwrap_or_else(|why| panic!("live_save.py cannot run: {why}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/live_save.py");
    let o = Command::new(py)
        .arg(script)
        .env("PYTHONPATH", package.path())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("python");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{out}");
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 7, "{out}");
}
