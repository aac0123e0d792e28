//! The saved checkpoint read by Python's `safetensors` library, a real client.
//! Ignored in a bare `cargo test`; CI makes the venv and runs it with
//! `--include-ignored`, where a missing library fails it.

mod common;

use std::process::Command;

use common::{devmap, mixed_model, python_with, stderr};

#[test]
#[ignore = "needs Python's safetensors (.ci/run makes the venv)"]
fn python_safetensors_reads_every_tensor_back() {
    let python = python_with("safetensors").unwrap_or_else(|why| panic!("{why}"));
    let m = mixed_model();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/read_checkpoint.py"
    );
    for size in ["700", "5GB"] {
        let out = m.out(&format!("py-{size}"));
        let o = devmap(&[
            "save",
            m.dir.to_str().expect("p"),
            "-o",
            out.to_str().expect("p"),
            "--max-shard-size",
            size,
            "-q",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let py = Command::new(&python)
            .arg(script)
            .arg(&out)
            .output()
            .expect("python");
        assert!(
            py.status.success(),
            "python failed: {}",
            String::from_utf8_lossy(&py.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&py.stdout).expect("json");
        let tensors = v["tensors"].as_object().expect("tensors");
        assert_eq!(tensors.len(), m.expected.len(), "size {size}");
        for (name, want) in &m.expected {
            let got = &tensors[name];
            assert_eq!(got["dtype"], want.dtype.as_str(), "{name}");
            let shape: Vec<usize> = got["shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|d| d.as_u64().expect("d") as usize)
                .collect();
            assert_eq!(shape, want.shape, "{name}");
            let hex: String = want.data.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(got["hex"], hex.as_str(), "{name} bytes (size {size})");
        }
        if size == "700" {
            let index = &v["index"];
            assert!(index["metadata"]["total_size"].is_u64(), "{index}");
            assert!(index["metadata"]["total_parameters"].is_u64(), "{index}");
        } else {
            assert!(v["index"].is_null());
        }
    }
}
