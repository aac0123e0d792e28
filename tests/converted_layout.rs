//! transformers 5 writes fused experts into the offload folder under runtime names
//! (`…mlp.experts.gate_up_proj` [E, 2I, H]) where the checkpoint stores them one by one
//! (`…block_sparse_moe.experts.N.w1.weight`). Until devmap converts them back (issue 11),
//! inspect says so and save refuses instead of writing both layouts.

mod common;

use common::{devmap, stderr, stdout};
use devmap::fixtures::{FixtureTensor, write_json, write_offload_per_tensor, write_sharded};
use devmap::model::DType;

#[test]
fn fused_runtime_experts_beside_per_expert_checkpoint_tensors_are_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("mixtral");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let (e, i, h) = (2u64, 8u64, 4u64);
    let mut tensors = vec![FixtureTensor::patterned(
        "model.embed_tokens.weight",
        DType::F32,
        &[16, h],
        1,
    )];
    for x in 0..e {
        for (w, shape) in [("w1", [i, h]), ("w2", [h, i]), ("w3", [i, h])] {
            tensors.push(FixtureTensor::patterned(
                &format!("model.layers.0.block_sparse_moe.experts.{x}.{w}.weight"),
                DType::F32,
                &shape,
                10 + x,
            ));
        }
    }
    write_sharded(&dir, &tensors, 1).expect("checkpoint");
    write_json(
        &dir.join("config.json"),
        &serde_json::json!({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"}),
    )
    .expect("config");
    let fused = [
        FixtureTensor::patterned(
            "model.layers.0.mlp.experts.gate_up_proj",
            DType::F32,
            &[e, 2 * i, h],
            50,
        ),
        FixtureTensor::patterned(
            "model.layers.0.mlp.experts.down_proj",
            DType::F32,
            &[e, h, i],
            51,
        ),
    ];
    write_offload_per_tensor(&dir.join("offload"), &fused).expect("offload");

    let o = devmap(&["inspect", dir.to_str().expect("p"), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let warning = report["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .find(|w| w["kind"] == "converted_layout")
        .expect("the converted layout is named");
    assert_eq!(warning["names"].as_array().map(Vec::len), Some(2));

    let out = tmp.path().join("out");
    let o = devmap(&[
        "save",
        dir.to_str().expect("p"),
        "--out",
        out.to_str().expect("p"),
    ]);
    assert!(
        !o.status.success(),
        "a save of both layouts must be refused"
    );
    let err = stderr(&o);
    assert!(
        err.contains("model.layers.0.mlp.experts.gate_up_proj"),
        "{err}"
    );
    assert!(err.contains("cannot convert them back"), "{err}");
    assert!(!out.exists(), "nothing written");

    // Without the offload folder (an empty one given instead), the checkpoint saves.
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let o = devmap(&[
        "save",
        dir.to_str().expect("p"),
        "--out",
        out.to_str().expect("p"),
        "--offload-folder",
        empty.to_str().expect("p"),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}
