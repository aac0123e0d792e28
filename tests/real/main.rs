//! The tests against the real libraries (transformers, accelerate, peft, torch,
//! DeepSpeed, compressed-tensors and the installed Python package), one module each,
//! in one test binary: ignored by a bare `cargo test`, run by `.ci/run` with
//! `--include-ignored`. One binary links the library once instead of two dozen times.
//! The tests run side by side (two at a time on two cores): most of a test's time is
//! Python starting and importing torch, one core's work. So nothing here may share
//! state: each Python script works in a folder of its own (`saved.workdir`), and the
//! scripts that start training runs of their own take ports no other script takes
//! (each script its own range of 29300–29999, listed in CONTRIBUTING).

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
mod verl;
mod zygote;
