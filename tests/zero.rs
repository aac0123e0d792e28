//! DeepSpeed ZeRO checkpoints written by `devmap::fixtures::zero` (the layout
//! `engine.save_checkpoint` writes, without DeepSpeed): stages 1, 2 and 3 over two and
//! three ranks, parameters crossing the ranks' slices, a buffer and a tied head, put
//! together byte for byte and read back with the `safetensors` crate; a missing rank,
//! a rank count that disagrees and a model-parallel file refused by name with nothing
//! written. The same against DeepSpeed itself: tests/real/deepspeed.rs.

mod common;

use std::path::Path;

use common::{read_saved, stderr};
use devmap::fixtures::zero::{STEP, ZeroCheckpoint, write_zero};
use devmap::fixtures::{FixtureTensor, write_json};
use devmap::types::DType;

fn params() -> Vec<FixtureTensor> {
    vec![
        // 7 × 5 = 35 elements: no parameter ends where a rank's slice does.
        FixtureTensor::patterned("model.embed_tokens.weight", DType::F32, &[7, 5], 1),
        FixtureTensor::patterned("model.layers.0.mlp.up_proj.weight", DType::F32, &[3, 5], 2),
        FixtureTensor::patterned("model.norm.weight", DType::F32, &[5], 3),
    ]
}

fn buffers() -> Vec<FixtureTensor> {
    vec![FixtureTensor::patterned(
        "model.rotary_emb.inv_freq",
        DType::F32,
        &[4],
        4,
    )]
}

fn checkpoint(dir: &Path, stage: u8, ranks: usize) -> (Vec<FixtureTensor>, Vec<FixtureTensor>) {
    checkpoint_with(dir, stage, ranks, None)
}

fn checkpoint_with(
    dir: &Path,
    stage: u8,
    ranks: usize,
    shape_not_a_size: Option<&str>,
) -> (Vec<FixtureTensor>, Vec<FixtureTensor>) {
    let (params, buffers) = (params(), buffers());
    write_zero(
        dir,
        &ZeroCheckpoint {
            stage,
            ranks,
            params: &params,
            buffers: &buffers,
            shared: &[("lm_head.weight", "model.embed_tokens.weight")],
            shape_not_a_size,
        },
    )
    .expect("zero");
    write_json(
        &dir.join("config.json"),
        &serde_json::json!({"architectures": ["ToyForCausalLM"], "model_type": "toy"}),
    )
    .expect("config");
    (params, buffers)
}

#[test]
fn zero_checkpoints_of_every_stage_save_the_model_byte_for_byte() {
    for (stage, ranks) in [(1, 2), (2, 2), (2, 3), (3, 2), (3, 3)] {
        let tmp = tempfile::tempdir().expect("tmp");
        let src = tmp.path().join("ckpt");
        let (params, buffers) = checkpoint(&src, stage, ranks);
        let out = tmp.path().join("out");
        let o = common::save(&src, &out, &[]);
        assert!(
            o.status.success(),
            "stage {stage}, {ranks} ranks: {}",
            stderr(&o)
        );
        let saved = read_saved(&out);
        let case = format!("stage {stage}, {ranks} ranks");
        for t in params.iter().chain(&buffers) {
            let s = saved
                .get(&t.name)
                .unwrap_or_else(|| panic!("{case}: {} saved", t.name));
            assert_eq!(s.data, t.data, "{case}: {}", t.name);
            assert_eq!(
                s.shape,
                t.shape.iter().map(|&d| d as usize).collect::<Vec<_>>()
            );
        }
        // The tied head: saved under one name or both, never other bytes.
        if let Some(head) = saved.get("lm_head.weight") {
            assert_eq!(head.data, params[0].data, "{case}: the tied head");
        }
    }
}

fn refused(label: &str, damage: impl Fn(&Path), needles: &[&str]) {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("ckpt");
    checkpoint(&src, 2, 3);
    damage(&src.join(STEP));
    let out = tmp.path().join("out");
    let o = common::save(&src, &out, &[]);
    common::assert_refused(&o, &out, label, needles);
}

#[test]
fn a_missing_rank_or_a_model_parallel_file_is_refused_by_name() {
    let optim = |r: usize| format!("zero_pp_rank_{r}_mp_rank_00_optim_states.pt");
    refused(
        "a rank's file gone",
        |step| std::fs::remove_file(step.join(optim(2))).expect("rm"),
        &["saved by 3 ranks", "holds 2 optimizer-state files"],
    );
    refused(
        "a rank in the middle gone",
        |step| std::fs::rename(step.join(optim(1)), step.join(optim(3))).expect("mv"),
        &["is rank 2's", "rank 1's optimizer states are missing"],
    );
    refused(
        "a model-parallel rank",
        |step| {
            std::fs::copy(
                step.join("mp_rank_00_model_states.pt"),
                step.join("mp_rank_01_model_states.pt"),
            )
            .expect("cp");
        },
        &["mp_rank_01_model_states.pt", "model-parallel rank"],
    );
    refused(
        "an optimizer-state file cut short",
        |step| common::cut(&step.join(optim(1)), 100),
        &[&optim(1)],
    );
}

#[test]
fn a_parameter_shape_that_is_not_a_size_is_refused_by_name() {
    // A bare integer where torch.Size belongs: not read as a scalar (which would take
    // one element of the flat group, and shift every parameter after it).
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("ckpt");
    checkpoint_with(&src, 2, 2, Some("model.layers.0.mlp.up_proj.weight"));
    let out = tmp.path().join("out");
    let o = common::save(&src, &out, &[]);
    common::assert_refused(
        &o,
        &out,
        "a shape that is an integer",
        &["mp_rank_00_model_states.pt", "parameter shape"],
    );
}
