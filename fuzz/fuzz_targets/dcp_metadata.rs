//! Any bytes as a torch.distributed.checkpoint `.metadata` (beside an empty `.distcp`):
//! read or refused, never a panic, nothing run; what reads has every tensor, and every
//! chunk of a split one, inside its file.
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
    if let Ok(split) = read_dcp(&dir, None) {
        let lens: Vec<u64> = split
            .files
            .iter()
            .map(|(path, _)| std::fs::metadata(path).map_or(0, |m| m.len()))
            .collect();
        for ((_, header), len) in split.files.iter().zip(&lens) {
            for t in &header.tensors {
                assert!(t.offset + t.len <= *len);
            }
        }
        for t in &split.pieced {
            for p in &t.pieces {
                assert!(p.range.offset + p.range.len <= lens[p.range.file]);
            }
        }
    }
});
