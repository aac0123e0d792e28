//! `devmap::fixtures::fuzz::torch_bin` under libFuzzer (the body, and what it checks,
//! is documented there; tests/fuzz_bodies.rs runs the same body at every CI run).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    devmap::fixtures::fuzz::torch_bin(data);
});
