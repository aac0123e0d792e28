//! Any bytes as a `pytorch_model.bin`: read or refused, never a panic, nothing run;
//! what reads has every tensor (and every strided view's storage span) inside the file.
#![no_main]

use devmap::formats::torch_bin::read_bin;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("devmap-fuzz-{}.bin", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok((header, views)) = read_bin(&path) {
        for t in &header.tensors {
            assert!(t.offset + t.len <= data.len() as u64);
        }
        for v in &views {
            let r = v.pieces[0].range;
            assert!(r.offset + r.len <= data.len() as u64);
        }
    }
});
