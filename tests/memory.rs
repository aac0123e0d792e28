//! Peak memory of a save does not grow with the shard: a few-hundred-MB model saved
//! as one shard, in a child process whose kernel-measured peak RSS (VmHWM) is read
//! back. This is a bound on memory, not a timing.

mod common;

use std::process::Command;

use devmap::fixtures::{FixtureTensor, write_offload_dat};
use devmap::model::DType;

const LIMIT: u64 = 64 << 20;

#[test]
fn one_big_shard_stays_under_64_mib() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("big");
    // 4 files x 9 tensors x 8 MiB = 288 MiB, plus 32 MiB offloaded.
    common::big_model(&dir, 4, 9, 8);
    let total: u64 = 4 * 9 * (8 << 20);
    let offloaded: Vec<FixtureTensor> = (0..4)
        .map(|i| FixtureTensor {
            name: format!("model.layers.3.w{i}"),
            dtype: DType::F32,
            shape: vec![2 << 20],
            data: vec![7u8; 8 << 20],
        })
        .collect();
    write_offload_dat(&dir.join("offload"), &offloaded).expect("offload");

    let out = tmp.path().join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_devmap"))
        .args([
            "save",
            dir.to_str().expect("p"),
            "--out",
            out.to_str().expect("p"),
            "--max-shard-size",
            "100GB",
            "--quiet",
        ])
        .env("DEVMAP_REPORT_PEAK_RSS", "1")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let peak = common::peak_rss(&err);
    let written = std::fs::metadata(out.join("model.safetensors"))
        .expect("shard")
        .len();
    assert!(written > total, "one shard holding everything");
    eprintln!(
        "peak RSS {} MiB for a {} MiB shard",
        peak >> 20,
        written >> 20
    );
    assert!(
        peak < LIMIT,
        "peak RSS {peak} bytes >= 64 MiB while writing a {written}-byte shard"
    );
}
