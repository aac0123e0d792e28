//! `devmap plan` against accelerate's own `infer_auto_device_map` (see
//! tests/python/accelerate_plan.py): the acceptance test of the planner. Skipped, with
//! the reason printed, where torch, transformers and accelerate are not importable
//! (CI does not install torch). DEVMAP_HF_PYTHON or `.venv-hf` choose the interpreter.

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
            .args(["-c", "import torch, transformers, accelerate"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(py);
        }
    }
    Err("torch, transformers and accelerate are not importable (pip install torch transformers accelerate into .venv-hf to run it)".into())
}

#[test]
fn devmap_plan_places_every_tensor_where_accelerate_does() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIPPED devmap_plan_places_every_tensor_where_accelerate_does: {why}");
            return;
        }
    };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/accelerate_plan.py"
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
        "plans differ from accelerate:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out.matches(": same").count(), 10, "{out}");
}
