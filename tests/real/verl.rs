//! verl's FSDP checkpoints (tests/python/verl_fsdp.py): a tiny Llama trained under
//! FSDP2 on 2 and 4 CPU ranks and saved as verl saves it (each rank's DTensor state
//! dict in `model_world_size_N_rank_K.pt`) converts bit for bit to what transformers
//! saves of torch's gathering of the same weights, in float32 and bfloat16, tied and
//! untied; on a 2 × 2 mesh, HSDP and FSDP2 over tensor parallelism the same; a missing
//! rank file is refused by name.

#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn verl_fsdp_checkpoints_save_as_transformers_saves_the_gathered_model() {
    let (ok, out, err) = crate::common::run_hf_script("verl_fsdp.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.matches("bit for bit; verify clean; logits equal")
            .count(),
        4,
        "{out}"
    );
    assert!(out.contains("a missing rank file is refused"), "{out}");
    assert!(out.contains("ok: verl hsdp on a 2 x 2 mesh"), "{out}");
    assert!(out.contains("ok: verl tp on a 2 x 2 mesh"), "{out}");
    // FSDP2 over tensor parallelism places the column-parallel weights as torch's
    // strided shard: the case verl's own merger does not read.
    assert!(out.contains("_StridedShard"), "{out}");
}
