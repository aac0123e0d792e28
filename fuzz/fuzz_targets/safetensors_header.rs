//! Any bytes as a whole safetensors file: the header reader returns a value or an
//! error, never panics, and what it accepts satisfies the layout rules.
#![no_main]

use devmap::formats::safetensors::parse_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = parse_header(std::path::Path::new("fuzz.safetensors"), data, data.len() as u64) {
        let mut cursor = header.data_start;
        for t in &header.tensors {
            assert_eq!(t.offset, cursor, "accepted a hole or an overlap");
            cursor += t.len;
        }
        assert_eq!(cursor, data.len() as u64, "accepted trailing bytes");
    }
});
