//! verl FSDP checkpoints written by `devmap::fixtures::verl` (each FSDP2 rank's
//! `model_world_size_N_rank_K.pt` of DTensors, without torch): 2 and 4 ranks, float32
//! and bfloat16, blocks cut as `torch.chunk` cuts them (uneven, and empty on the last
//! rank), a replicated tensor, put together byte for byte and read back with the
//! `safetensors` crate; a missing rank, a 2-dimensional mesh and a placement devmap
//! does not read refused by name with nothing written. The same against torch's own
//! files: tests/real/verl.rs.

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

#[test]
fn a_missing_rank_a_2d_mesh_or_a_strided_shard_is_refused_by_name() {
    refused(
        "a rank's file gone",
        4,
        fsdp,
        |actor| std::fs::remove_file(actor.join("model_world_size_4_rank_2.pt")).expect("rm"),
        &["model_world_size_4_rank_2.pt"],
    );
    refused(
        "HSDP",
        2,
        |_| Placement::Mesh(vec![Placement::Replicate, Placement::Shard(0)]),
        |_| {},
        &["model.embed_tokens.weight", "2-dimensional device mesh"],
    );
    refused(
        "strided",
        2,
        |_| Placement::Other("_StridedShard", 0),
        |_| {},
        &["model.embed_tokens.weight", "`_StridedShard`"],
    );
}
