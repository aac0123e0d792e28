//! Any text as an offload `index.json`: parsed or refused, never a panic, and no
//! accepted `.dat` entry names a file outside the folder.
#![no_main]

use std::path::Path;

use devmap::formats::offload::{OffloadForm, parse_index};
use devmap::formats::safetensors::HeaderCache;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let folder = Path::new("/nonexistent-devmap-fuzz/offload");
    let mut headers = HeaderCache::default();
    if let Ok(entries) = parse_index(folder, &folder.join("index.json"), text, folder, &mut headers) {
        for e in entries {
            if e.form == OffloadForm::Dat {
                assert_eq!(e.file.parent(), Some(folder), "{:?} escapes the folder", e.file);
            }
        }
    }
});
