//! Any text as a device map: parsed or refused, never a panic; what parses writes
//! back out and parses to the same map.
#![no_main]

use std::path::Path;

use devmap::formats::device_map::{encode_device_map, parse_device_map};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(map) = parse_device_map(Path::new("device_map.json"), text) {
        let again = parse_device_map(Path::new("again.json"), &encode_device_map(&map)).expect("round trip");
        assert_eq!(again, map);
    }
});
