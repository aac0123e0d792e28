//! The tests against the real libraries (transformers, accelerate, peft, torch,
//! DeepSpeed, compressed-tensors and the installed Python package), one module each,
//! in one test binary: ignored by a bare `cargo test`, run by `.ci/run` with
//! `--include-ignored`. One binary links the library once instead of two dozen times;
//! the tests still run one at a time ([`serial`]): each drives torch on every core, and
//! some start training runs of their own on fixed ports.

#[path = "../common/mod.rs"]
mod common;

mod accelerate_plan;
mod arch_table;
mod buffer_placement;
mod converted_layout;
mod dcp;
mod deepspeed;
mod dtype_cast;
mod fp8_dequant;
mod hub_cache;
mod keep_fp32;
mod lora_merge;
mod megatron;
mod option_sweep;
mod oracle;
mod parts;
mod python_bridge;
mod readme_quickstart;
mod table_versions;
mod tie_defaults;
mod tie_sweep;
mod torch_bin;
mod transformers;
mod transformers_plan;
mod verify;
mod verify_expects;

/// Held by every test of this binary while it runs, so they run one at a time as they
/// did when each was its own binary (cargo runs a binary's tests in parallel).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that panicked while holding it poisons it; the next one still runs.
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
