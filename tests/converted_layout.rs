//! transformers 5 writes fused experts into the offload folder under runtime names
//! (`…mlp.experts.gate_up_proj` [E, 2I, H]) where the checkpoint stores them one by one
//! (`…block_sparse_moe.experts.N.w1.weight`). devmap reads them back as the per-expert
//! tensors (Mixtral and Qwen2-MoE templates); a fused entry it has no template for is
//! named by inspect and refused by save instead of writing both layouts.

mod common;

use common::{devmap, stderr, stdout};
use devmap::fixtures::{FixtureTensor, write_json, write_offload_per_tensor, write_sharded};
use devmap::types::DType;

/// transformers 5's fused offload entries for layer `layer`'s `e` experts
/// (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]), written as per-tensor files.
fn write_fused_experts(
    dir: &std::path::Path,
    layer: usize,
    dtype: DType,
    (e, i, h): (u64, u64, u64),
) -> [FixtureTensor; 2] {
    let fused = [
        FixtureTensor::patterned(
            &format!("model.layers.{layer}.mlp.experts.gate_up_proj"),
            dtype,
            &[e, 2 * i, h],
            50,
        ),
        FixtureTensor::patterned(
            &format!("model.layers.{layer}.mlp.experts.down_proj"),
            dtype,
            &[e, h, i],
            51,
        ),
    ];
    write_offload_per_tensor(&dir.join("offload"), &fused).expect("offload");
    fused
}

#[test]
fn fused_runtime_experts_without_a_template_are_refused() {
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
        // Names no template knows (a made-up family).
        for (w, shape) in [("fc_in", [i, h]), ("fc_out", [h, i]), ("fc_gate", [i, h])] {
            tensors.push(FixtureTensor::patterned(
                &format!("model.layers.0.moe_block.experts.{x}.{w}.weight"),
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
    write_fused_experts(&dir, 0, DType::F32, (e, i, h));

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

/// How a family names an expert layer's module and its gate, up and down pieces in the
/// checkpoint: Mixtral's, `qwen2_moe`'s, and dots3's vision encoder's.
const MIXTRAL: (&str, &str, &str, &str) = ("block_sparse_moe", "w1", "w3", "w2");
const LAYOUTS: [(&str, &str, &str, &str); 3] = [
    MIXTRAL,
    ("mlp", "gate_proj", "up_proj", "down_proj"),
    ("mlp", "fc1", "fc3", "fc2"),
];

/// A checkpoint named as `layout` and its fused offload entries; returns the model
/// folder.
fn moe(
    tmp: &std::path::Path,
    layout: (&str, &str, &str, &str),
) -> (std::path::PathBuf, Vec<FixtureTensor>, [FixtureTensor; 2]) {
    let dir = tmp.join(layout.1);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let (e, i, h) = (3u64, 4u64, 6u64);
    let (block, gate, up, down) = layout;
    let mut tensors = vec![FixtureTensor::patterned(
        "model.embed_tokens.weight",
        DType::BF16,
        &[16, h],
        1,
    )];
    for x in 0..e {
        for (w, shape) in [(gate, [i, h]), (down, [h, i]), (up, [i, h])] {
            tensors.push(FixtureTensor::patterned(
                &format!("model.layers.1.{block}.experts.{x}.{w}.weight"),
                DType::BF16,
                &shape,
                10 + x,
            ));
        }
    }
    write_sharded(&dir, &tensors, 1).expect("checkpoint");
    let fused = write_fused_experts(&dir, 1, DType::BF16, (e, i, h));
    (dir, tensors, fused)
}

#[test]
fn fused_offload_experts_are_read_back_as_the_checkpoints_tensors() {
    for layout in LAYOUTS {
        let tmp = tempfile::tempdir().expect("tmp");
        let (dir, tensors, fused) = moe(tmp.path(), layout);
        let (block, gate, up, down) = layout;
        let out = tmp.path().join("out");
        let o = devmap(&[
            "save",
            dir.to_str().expect("p"),
            "--out",
            out.to_str().expect("p"),
            "--quiet",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let saved = common::read_saved(&out);
        // Exactly the checkpoint's names: no fused tensor written.
        let mut names: Vec<&String> = saved.keys().collect();
        names.sort();
        let mut want: Vec<&String> = tensors.iter().map(|t| &t.name).collect();
        want.sort();
        assert_eq!(names, want);
        let (e, i, h) = (3usize, 4usize, 6usize);
        let bf = 2;
        for x in 0..e {
            let at =
                |n: &str| &saved[&format!("model.layers.1.{block}.experts.{x}.{n}.weight")].data;
            let gate_up = &fused[0].data[x * 2 * i * h * bf..(x + 1) * 2 * i * h * bf];
            assert_eq!(at(gate)[..], gate_up[..i * h * bf], "expert {x} gate");
            assert_eq!(at(up)[..], gate_up[i * h * bf..], "expert {x} up");
            assert_eq!(
                at(down)[..],
                fused[1].data[x * h * i * bf..(x + 1) * h * i * bf],
                "expert {x} down"
            );
        }
        // inspect counts the experts once and says where their values come from.
        let o = devmap(&["inspect", dir.to_str().expect("p"), "--json"]);
        let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
        let kinds: Vec<&str> = report["warnings"]
            .as_array()
            .expect("w")
            .iter()
            .filter_map(|w| w["kind"].as_str())
            .collect();
        assert!(
            kinds.contains(&"experts_unfused") && !kinds.contains(&"converted_layout"),
            "{kinds:?}"
        );
        let total: u64 = tensors.iter().map(|t| t.data.len() as u64).sum();
        assert_eq!(
            report["total_bytes"].as_u64(),
            Some(total),
            "experts counted once"
        );
    }
}

#[test]
fn a_device_map_with_runtime_module_names_places_the_checkpoints_experts() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (dir, _, _) = moe(tmp.path(), MIXTRAL);
    // What hf_device_map of a loaded transformers 5 Mixtral says: `mlp`, not
    // `block_sparse_moe`.
    write_json(
        &dir.join("device_map.json"),
        &serde_json::json!({"model.embed_tokens": "cpu", "model.layers.1.mlp": "disk"}),
    )
    .expect("map");
    let o = devmap(&["inspect", dir.to_str().expect("p"), "--json"]);
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    for t in report["tensors"].as_array().expect("tensors") {
        if t["name"].as_str().is_some_and(|n| n.contains(".experts.")) {
            assert_eq!(t["placement"], "disk", "{t}");
            assert_eq!(t["map_key"], "model.layers.1.mlp", "{t}");
        }
    }
}

/// An offload folder used by accelerate (`index.json` + `.dat`) and by transformers 5
/// (one `<name>.safetensors` per tensor): both are read; one name in both is refused,
/// naming both files.
#[test]
fn per_tensor_files_beside_an_accelerate_index_are_read_and_a_name_in_both_is_refused() {
    let m = common::mixed_model();
    let offload = m.dir.join("offload");
    // Layer 3 is on disk in the map but the index does not hold it.
    let fresh = FixtureTensor::patterned("model.layers.3.proj.weight", DType::F16, &[16, 16], 777);
    assert_ne!(m.expected["model.layers.3.proj.weight"].data, fresh.data);
    write_offload_per_tensor(&offload, std::slice::from_ref(&fresh)).expect("file");
    let out = m.out("both-forms");
    let saved = devmap(&[
        "save",
        m.dir.to_str().expect("utf8"),
        "--out",
        out.to_str().expect("utf8"),
    ]);
    assert!(saved.status.success(), "{}", stderr(&saved));
    let back = common::read_saved(&out);
    assert_eq!(back["model.layers.3.proj.weight"].data, fresh.data);
    // Everything else as before, the index's offload values included.
    for (name, want) in &m.expected {
        if name != "model.layers.3.proj.weight" {
            assert_eq!(&back[name], want, "{name}");
        }
    }
    // Layer 9 is in the index (`.dat`); a per-tensor file for it too is refused.
    let twice = FixtureTensor::patterned("model.layers.9.proj.weight", DType::F16, &[16, 16], 778);
    write_offload_per_tensor(&offload, &[twice]).expect("file");
    let inspected = devmap(&["inspect", m.dir.to_str().expect("utf8")]);
    assert!(!inspected.status.success(), "{}", stdout(&inspected));
    let err = stderr(&inspected);
    assert!(
        err.contains("model.layers.9.proj.weight.safetensors")
            && err.contains("model.layers.9.proj.weight.dat")
            && err.contains("twice"),
        "{err}"
    );
}
