//! Any bytes as a torch.distributed.checkpoint `.metadata` (beside an empty `.distcp`):
//! read or refused, never a panic, nothing run; what reads has every tensor inside
//! its file.
#![no_main]

use devmap::formats::dcp::read_dcp;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("devmap-fuzz-dcp-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err()
        || std::fs::write(dir.join(".metadata"), data).is_err()
        || std::fs::write(dir.join("__0_0.distcp"), b"").is_err()
    {
        return;
    }
    if let Ok(files) = read_dcp(&dir, None) {
        for (path, header) in files {
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            for t in &header.tensors {
                assert!(t.offset + t.len <= len);
            }
        }
    }
});
