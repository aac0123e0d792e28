//! Peak memory of a save does not grow with the shard: a few-hundred-MB model saved
//! as one shard, in a child process whose kernel-measured peak RSS (VmHWM) is read
//! back. This is a bound on memory, not a timing.

mod common;

use std::process::Command;

use devmap::fixtures::{FixtureTensor, write_offload_dat, write_safetensors};
use devmap::model::DType;

const LIMIT: u64 = 64 << 20;

#[test]
fn one_big_shard_stays_under_64_mib() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("big");
    std::fs::create_dir(&dir).expect("mkdir");
    // 4 files x 9 tensors x 8 MiB = 288 MiB, plus 32 MiB offloaded.
    let mib8 = [1024u64, 2048];
    let mut total = 0u64;
    for f in 0..4 {
        let tensors: Vec<FixtureTensor> = (0..9)
            .map(|i| {
                let mut t = FixtureTensor {
                    name: format!("model.layers.{}.w{i}", f),
                    dtype: DType::F32,
                    shape: mib8.to_vec(),
                    data: vec![0u8; 8 << 20],
                };
                t.data[..8].copy_from_slice(&(f * 100 + i as u64).to_le_bytes());
                t
            })
            .collect();
        total += tensors.iter().map(|t| t.data.len() as u64).sum::<u64>();
        let refs: Vec<&FixtureTensor> = tensors.iter().collect();
        write_safetensors(&dir.join(format!("part{f}.safetensors")), &refs).expect("write");
    }
    let offloaded: Vec<FixtureTensor> = (0..4)
        .map(|i| FixtureTensor {
            name: format!("model.layers.3.w{i}"),
            dtype: DType::F32,
            shape: mib8.to_vec(),
            data: vec![7u8; 8 << 20],
        })
        .collect();
    write_offload_dat(&dir.join("offload"), &offloaded).expect("offload");
    assert!(total >= 280 << 20);

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
    let peak: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("devmap-peak-rss-bytes="))
        .and_then(|v| v.parse().ok())
        .expect("peak RSS line");
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
