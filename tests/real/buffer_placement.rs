//! Buffers where accelerate holds them (tests/python/buffer_placement.py): a GLM-4-MoE
//! loaded by transformers with layers on disk holds its routers' persistent buffers on
//! the CPU; `devmap inspect` places every tensor where the loaded model holds it.
//! Ignored by a bare `cargo test`; `.ci/run` runs it with the reference libraries.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn buffers_of_disk_offloaded_modules_are_placed_on_the_main_device() {
    let (ok, out, err) = crate::common::run_hf_script("buffer_placement.py");
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("router buffers on cpu"), "{out}");
}
