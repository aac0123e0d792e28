//! verl FSDP checkpoints written by `devmap::fixtures::verl` (each FSDP2 rank's
//! `model_world_size_N_rank_K.pt` of DTensors, without torch): 2 and 4 ranks, float32
//! and bfloat16, blocks cut as `torch.chunk` cuts them (uneven, and empty on the last
//! rank), a replicated tensor, and on 2-dimensional meshes (HSDP's replicas, shards
//! along both dimensions), put together byte for byte and read back with the
//! `safetensors` crate; a missing rank and a placement devmap does not read refused by
//! name with nothing written. The same against torch's own files (FSDP2 over tensor
//! parallelism among them): tests/real/verl.rs.

mod common;

use std::path::Path;

use common::stderr;
use devmap::fixtures::FixtureTensor;
use devmap::fixtures::verl::{Placement, write_verl};
use devmap::types::DType;

fn tensors(dtype: DType) -> Vec<FixtureTensor> {
    vec![
        // 7 rows: blocks of 2 over four ranks (2, 2, 2, 1), of 4 over two (4, 3).
        FixtureTensor::patterned("model.embed_tokens.weight", dtype, &[7, 8], 1),
        // 3 rows over four ranks: the last rank's block is empty.
        FixtureTensor::patterned("model.layers.0.mlp.up_proj.weight", dtype, &[3, 8], 2),
        FixtureTensor::patterned("model.layers.0.mlp.down_proj.weight", dtype, &[8, 3], 3),
        FixtureTensor::patterned("model.norm.weight", dtype, &[8], 4),
    ]
}

fn config() -> serde_json::Value {
    serde_json::json!({"architectures": ["ToyForCausalLM"], "model_type": "toy"})
}

fn fsdp(t: &FixtureTensor) -> Placement {
    if t.name == "model.norm.weight" {
        Placement::Replicate
    } else {
        Placement::Shard(0)
    }
}

#[test]
fn verl_rank_files_save_the_model_byte_for_byte() {
    for (world, dtype) in [(2, DType::F32), (4, DType::F32), (4, DType::BF16)] {
        let tmp = tempfile::tempdir().expect("tmp");
        let actor = tmp.path().join("actor");
        let ts = tensors(dtype);
        write_verl(&actor, world, &ts, fsdp, &config()).expect("verl");
        let out = tmp.path().join("out");
        let o = common::save(&actor, &out, &[]);
        let case = format!("{world} ranks, {dtype}");
        assert!(o.status.success(), "{case}: {}", stderr(&o));
        common::assert_saved_exactly(&out, &ts, &case);
    }
}

fn refused(
    label: &str,
    world: u64,
    how: impl Fn(&FixtureTensor) -> Placement,
    damage: impl Fn(&Path),
    needles: &[&str],
) {
    let tmp = tempfile::tempdir().expect("tmp");
    let actor = tmp.path().join("actor");
    write_verl(&actor, world, &tensors(DType::F32), how, &config()).expect("verl");
    damage(&actor);
    let out = tmp.path().join("out");
    let o = common::save(&actor, &out, &[]);
    common::assert_refused(&o, &out, label, needles);
}

/// A 2-dimensional mesh of 4 ranks: HSDP (replicas of an FSDP shard) and shards along
/// both mesh dimensions (rows, then columns; rows twice), blocks held by two ranks read
/// once.
#[test]
fn rank_files_on_a_2d_mesh_save_the_model_byte_for_byte() {
    type Layout = fn(&FixtureTensor) -> Placement;
    let layouts: [(&str, Layout); 3] = [
        ("HSDP", |_| {
            Placement::Mesh(vec![Placement::Replicate, Placement::Shard(0)])
        }),
        ("rows then columns", |t| match t.shape.len() {
            1 => Placement::Mesh(vec![Placement::Shard(0), Placement::Replicate]),
            _ => Placement::Mesh(vec![Placement::Shard(0), Placement::Shard(1)]),
        }),
        ("rows twice", |_| {
            Placement::Mesh(vec![Placement::Shard(0), Placement::Shard(0)])
        }),
    ];
    for (label, how) in layouts {
        let tmp = tempfile::tempdir().expect("tmp");
        let actor = tmp.path().join("actor");
        let ts = tensors(DType::F32);
        write_verl(&actor, 4, &ts, how, &config()).expect("verl");
        let out = tmp.path().join("out");
        let o = common::save(&actor, &out, &[]);
        assert!(o.status.success(), "{label}: {}", stderr(&o));
        common::assert_saved_exactly(&out, &ts, label);
    }
}

#[test]
fn a_missing_rank_or_a_partial_placement_is_refused_by_name() {
    refused(
        "a rank's file gone",
        4,
        fsdp,
        |actor| std::fs::remove_file(actor.join("model_world_size_4_rank_2.pt")).expect("rm"),
        &["model_world_size_4_rank_2.pt"],
    );
    refused(
        "partial",
        2,
        |_| Placement::Other("Partial", 0),
        |_| {},
        // The restricted pickle reader refuses the class before any tensor is read.
        &["model_world_size_2_rank_0.pt", "placement_types.Partial"],
    );
    // HSDP with a rank's file gone: its replica holds the blocks, but a rank is missing.
    refused(
        "a 2-D mesh's rank gone",
        4,
        |_| Placement::Mesh(vec![Placement::Replicate, Placement::Shard(0)]),
        |actor| std::fs::remove_file(actor.join("model_world_size_4_rank_3.pt")).expect("rm"),
        &["model_world_size_4_rank_3.pt"],
    );
}
