//! Saving generated checkpoints and reading them back with the `safetensors` crate.

mod common;

use common::{Stored, devmap, mixed_model, read_saved, snapshot, stderr};
use devmap::model::{LoadOptions, load};
use devmap::save::{SaveOptions, prepare};

#[test]
fn saves_current_values_at_several_shard_sizes() {
    let m = mixed_model();
    let before = snapshot(&m.dir);
    let total: u64 = m.expected.values().map(|s| s.data.len() as u64).sum();
    for (i, size) in ["1", "600", "2KB", "3KiB", "5GB"].iter().enumerate() {
        let out = m.out(&format!("out{i}"));
        let o = devmap(&[
            "save",
            m.dir.to_str().expect("utf8"),
            "--out",
            out.to_str().expect("utf8"),
            "--max-shard-size",
            size,
            "--quiet",
        ]);
        assert!(o.status.success(), "save at {size} failed: {}", stderr(&o));
        let saved = read_saved(&out);
        assert_eq!(saved, m.expected, "values differ at shard size {size}");
        assert!(
            !saved.contains_key("lm_head.weight"),
            "the tied head is written once, as the embedding"
        );

        let limit = devmap::formats::size::parse_size(size).expect("size");
        let shards: Vec<_> = std::fs::read_dir(&out)
            .expect("out")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        let index_path = out.join("model.safetensors.index.json");
        if shards.len() == 1 {
            assert!(out.join("model.safetensors").exists());
            assert!(!index_path.exists(), "one shard means no index");
        } else {
            let text = std::fs::read_to_string(&index_path).expect("index");
            assert!(text.ends_with("}\n"));
            let v: serde_json::Value = serde_json::from_str(&text).expect("json");
            assert_eq!(v["metadata"]["total_size"].as_u64(), Some(total));
            let map = v["weight_map"].as_object().expect("map");
            assert_eq!(map.len(), m.expected.len());
            for (name, file) in map {
                let f = file.as_str().expect("str");
                assert!(
                    f.ends_with(&format!("-of-{:05}.safetensors", shards.len())),
                    "{f}"
                );
                assert!(m.expected.contains_key(name));
            }
            // Keys sorted, as transformers writes them.
            let keys: Vec<&String> = map.keys().collect();
            let mut sorted = keys.clone();
            sorted.sort();
            assert_eq!(keys, sorted);
            for s in &shards {
                let bytes = std::fs::read(s).expect("shard");
                let st = safetensors::SafeTensors::deserialize(&bytes).expect("parse");
                let data: u64 = st
                    .tensors()
                    .iter()
                    .map(|(_, v)| v.data().len() as u64)
                    .sum();
                assert!(
                    data <= limit || st.len() == 1,
                    "{} holds {data} bytes > {limit}",
                    s.display()
                );
            }
        }
        // The other files come along; the input's map, offload folder and weights of
        // other frameworks do not.
        assert!(out.join("config.json").exists());
        assert!(out.join("tokenizer.json").exists());
        assert!(!out.join("device_map.json").exists());
        assert!(
            !out.join("pytorch_model.bin").exists() && !out.join("flax_model.msgpack").exists()
        );
        assert!(!out.join("offload").exists());
        let leftovers: Vec<_> = std::fs::read_dir(&out)
            .expect("out")
            .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("devmap-partial"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
    assert_eq!(snapshot(&m.dir), before, "inputs must not change");
}

#[test]
fn shard_count_follows_the_limit() {
    let m = mixed_model();
    let ckpt = load(&m.dir, &LoadOptions::default()).expect("load");
    let opts = |size: u64| SaveOptions {
        max_shard_size: size,
        ..SaveOptions::new(m.out("x"))
    };
    assert_eq!(
        prepare(&ckpt, &opts(1)).expect("plan").shards.len(),
        m.expected.len(),
        "every tensor alone"
    );
    assert_eq!(
        prepare(&ckpt, &opts(u64::MAX / 4))
            .expect("plan")
            .shards
            .len(),
        1
    );
}

#[test]
fn keep_tied_writes_the_head_with_the_embedding_bytes() {
    let m = mixed_model();
    let out = m.out("tied");
    let o = devmap(&[
        "save",
        m.dir.to_str().expect("p"),
        "-o",
        out.to_str().expect("p"),
        "--keep-tied",
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = read_saved(&out);
    assert_eq!(
        saved["lm_head.weight"],
        m.expected["model.embed_tokens.weight"]
    );
    assert_eq!(saved.len(), m.expected.len() + 1);
}

#[test]
fn force_replaces_an_earlier_save_and_removes_stale_shards() {
    let m = mixed_model();
    let out = m.out("again");
    let p = |x: &std::path::Path| x.to_str().expect("p").to_owned();
    let first = devmap(&[
        "save",
        &p(&m.dir),
        "-o",
        &p(&out),
        "--max-shard-size",
        "1KB",
        "-q",
    ]);
    assert!(first.status.success(), "{}", stderr(&first));
    let refused = devmap(&["save", &p(&m.dir), "-o", &p(&out), "-q"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("not empty"),
        "{}",
        stderr(&refused)
    );
    std::fs::write(out.join("README.md"), "keep me").expect("write");
    std::fs::write(out.join("tf_model.h5"), "not ours").expect("write");
    let forced = devmap(&["save", &p(&m.dir), "-o", &p(&out), "--force", "-q"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    let names: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"model.safetensors".to_owned()));
    assert!(
        !names.iter().any(|n| n.starts_with("model-0")),
        "stale shards left: {names:?}"
    );
    assert!(!names.contains(&"model.safetensors.index.json".to_owned()));
    assert!(
        names.contains(&"README.md".to_owned()),
        "unrelated files stay"
    );
    assert_eq!(read_saved(&out), m.expected);
}

#[test]
fn weights_only_copies_nothing_else() {
    let m = mixed_model();
    let out = m.out("w");
    let o = devmap(&[
        "save",
        m.dir.to_str().expect("p"),
        "-o",
        out.to_str().expect("p"),
        "--weights-only",
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!out.join("config.json").exists());
    assert_eq!(read_saved(&out), m.expected);
}

#[test]
fn other_offload_forms_give_the_same_result() {
    use devmap::fixtures::{FixtureTensor, write_offload_indexed, write_offload_per_tensor};
    for form in ["indexed", "per-tensor"] {
        let m = mixed_model();
        // Replace the .dat folder with the same tensors in another form, new values.
        let folder = m.dir.join("offload");
        let index: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(folder.join("index.json")).expect("i"))
                .expect("j");
        std::fs::remove_dir_all(&folder).expect("rm");
        let mut expected = m.expected.clone();
        let tensors: Vec<FixtureTensor> = index
            .as_object()
            .expect("obj")
            .keys()
            .enumerate()
            .map(|(i, name)| {
                let s = &m.expected[name];
                let dtype = devmap::model::DType::from_safetensors_name(&s.dtype).expect("dtype");
                let shape: Vec<u64> = s.shape.iter().map(|&d| d as u64).collect();
                let t = FixtureTensor::patterned(name, dtype, &shape, 77_000 + i as u64);
                expected.insert(name.clone(), Stored::of(&t));
                t
            })
            .collect();
        let alt = m.tmp.path().join("elsewhere");
        match form {
            "indexed" => write_offload_indexed(&alt, &tensors).expect("write"),
            _ => write_offload_per_tensor(&alt, &tensors).expect("write"),
        }
        let out = m.out("o");
        let o = devmap(&[
            "save",
            m.dir.to_str().expect("p"),
            "--offload-folder",
            alt.to_str().expect("p"),
            "-o",
            out.to_str().expect("p"),
            "--max-shard-size",
            "2KB",
            "-q",
        ]);
        assert!(o.status.success(), "{form}: {}", stderr(&o));
        assert_eq!(read_saved(&out), expected, "{form}");
    }
}

#[test]
fn explicit_tie_reads_the_partner() {
    let m = mixed_model();
    let out = m.out("t");
    let o = devmap(&[
        "save",
        m.dir.to_str().expect("p"),
        "--tie",
        "model.output.weight=model.norm.weight",
        "--keep-tied",
        "-o",
        out.to_str().expect("p"),
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = read_saved(&out);
    assert_eq!(
        saved["model.output.weight"], m.expected["model.norm.weight"],
        "offload value of the partner"
    );
}
