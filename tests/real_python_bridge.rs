//! The devmap Python package on real models (tests/python/live_save.py): a live model
//! in a Python session — CPU and disk-offloaded values, in-memory edits, a merged LoRA,
//! fused MoE experts, tied weights — saved with `devmap.save_pretrained` and compared
//! with transformers' own `save_pretrained` of the same model (names, dtypes, bytes,
//! config), reloaded for the live model's logits; meta tensors, a tensor changed
//! during the save and Ctrl-C refused with nothing committed. The package's compiled
//! module is built here with cargo (the same crate `pip install ./python` builds) and
//! put beside the package's Python files. Ignored by a bare `cargo test`; `.ci/run`
//! runs it with the reference libraries installed.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the binding and lays the package out in a temporary folder: `devmap/*.py`
/// from python/devmap, `devmap/_devmap.abi3.so` from the build.
fn built_package() -> tempfile::TempDir {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let build = Command::new(cargo)
        .args([
            "build",
            "--locked",
            "-p",
            "devmap-python",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(root)
        .output()
        .expect("cargo build");
    let stdout = String::from_utf8_lossy(&build.stdout);
    assert!(
        build.status.success(),
        "building the binding failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let library: PathBuf = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "_devmap")
        .find_map(|m| m["filenames"][0].as_str().map(PathBuf::from))
        .expect("cargo names the built library");
    let tmp = tempfile::tempdir().expect("tempdir");
    let package = tmp.path().join("devmap");
    std::fs::create_dir(&package).expect("mkdir");
    for entry in std::fs::read_dir(root.join("python/devmap")).expect("python/devmap") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "py") {
            std::fs::copy(&path, package.join(path.file_name().expect("name"))).expect("copy");
        }
    }
    std::fs::copy(&library, package.join("_devmap.abi3.so")).expect("copy library");
    tmp
}

#[test]
#[ignore = "needs torch, transformers, accelerate, peft: run .ci/run"]
fn live_models_save_as_transformers_saves_them() {
    let package = built_package();
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
    assert_eq!(out.matches("ok: ").count(), 6, "{out}");
}
