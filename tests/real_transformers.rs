//! transformers + accelerate end to end (see tests/python/real_transformers.py).
//! Skipped, with the reason printed, when no Python has torch, transformers and
//! accelerate: CI does not install torch (about 3 GB). Set DEVMAP_HF_PYTHON to choose
//! the interpreter; `.venv-hf` in the repository is tried too.

use std::path::PathBuf;
use std::process::Command;

fn python() -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = std::env::var_os("DEVMAP_HF_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-hf/bin/python"),
            PathBuf::from("python3"),
        ])
        .collect();
    for py in candidates {
        let ok = Command::new(&py)
            .args(["-c", "import torch, transformers, accelerate, safetensors"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(py);
        }
    }
    Err("torch, transformers and accelerate are not importable (pip install torch transformers accelerate into .venv-hf to run it)".into())
}

#[test]
fn transformers_loads_what_devmap_saved_from_an_offloaded_model() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => {
            eprintln!(
                "SKIPPED transformers_loads_what_devmap_saved_from_an_offloaded_model: {why}"
            );
            return;
        }
    };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/real_transformers.py"
    );
    let o = Command::new(py)
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_devmap"))
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("python");
    let out = String::from_utf8_lossy(&o.stdout);
    eprintln!("{out}");
    assert!(
        o.status.success(),
        "real transformers check failed:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out.matches("ok: ").count(), 2, "{out}");
}
