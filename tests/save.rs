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
                let dtype = devmap::types::DType::from_safetensors_name(&s.dtype).expect("dtype");
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

#[test]
fn dtype_casts_floating_tensors_only_and_records_the_dtype() {
    let m = mixed_model();
    std::fs::write(
        m.dir.join("config.json"),
        "{\"architectures\": [\"LlamaForCausalLM\"], \"torch_dtype\": \"bfloat16\", \"model_type\": \"llama\", \"tie_word_embeddings\": true}",
    )
    .expect("config");
    let as_f32 = m.out("f32");
    let o = devmap(&[
        "save",
        m.dir.to_str().expect("p"),
        "--out",
        as_f32.to_str().expect("p"),
        "--dtype",
        "float32",
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = read_saved(&as_f32);
    assert_eq!(saved.len(), m.expected.len());
    for (name, want) in &m.expected {
        let got = &saved[name];
        assert_eq!(got.shape, want.shape, "{name}");
        match want.dtype.as_str() {
            "F16" | "BF16" | "F32" => {
                let size = if want.dtype == "F32" { 4 } else { 2 };
                assert_eq!(got.dtype, "F32", "{name}");
                assert_eq!(got.data.len(), want.data.len() / size * 4, "{name}");
            }
            _ => assert_eq!(got, want, "{name}: not floating, so untouched"),
        }
    }
    // Widening then narrowing back gives every non-NaN value again: the casts are
    // exact where they must be.
    let back = m.out("back");
    let o = devmap(&[
        "save",
        as_f32.to_str().expect("p"),
        "--out",
        back.to_str().expect("p"),
        "--dtype",
        "float16",
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let round_trip = read_saved(&back);
    for (name, want) in m.expected.iter().filter(|(_, w)| w.dtype == "F16") {
        let got = &round_trip[name];
        assert_eq!(got.dtype, "F16");
        for (a, b) in want.data.chunks(2).zip(got.data.chunks(2)) {
            let x = u16::from_le_bytes([a[0], a[1]]);
            let is_nan = x & 0x7C00 == 0x7C00 && x & 0x03FF != 0;
            if !is_nan {
                assert_eq!(a, b, "{name}: {x:#06x} did not survive f16 -> f32 -> f16");
            }
        }
    }
    // config.json records each save's dtype; nothing else in it changes.
    let config =
        |dir: &std::path::Path| std::fs::read_to_string(dir.join("config.json")).expect("config");
    assert_eq!(
        config(&as_f32),
        "{\"architectures\": [\"LlamaForCausalLM\"], \"torch_dtype\": \"float32\", \"model_type\": \"llama\", \"tie_word_embeddings\": true}"
    );
    assert_eq!(
        config(&back),
        "{\"architectures\": [\"LlamaForCausalLM\"], \"torch_dtype\": \"float16\", \"model_type\": \"llama\", \"tie_word_embeddings\": true}"
    );
    // --dtype keep writes every tensor as stored.
    let kept = m.out("kept");
    let o = devmap(&[
        "save",
        m.dir.to_str().expect("p"),
        "--out",
        kept.to_str().expect("p"),
        "--dtype",
        "keep",
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(read_saved(&kept), m.expected);
}

#[test]
fn dtype_auto_follows_an_offload_folder_in_another_dtype() {
    use devmap::fixtures::{FixtureTensor, write_json, write_offload_dat, write_safetensors};
    use devmap::types::DType;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("model");
    std::fs::create_dir(&dir).expect("mkdir");
    // A float32 checkpoint (with an int64 buffer) whose second layer the model, run in
    // bfloat16, offloaded as bfloat16.
    let w0 = FixtureTensor::patterned("layers.0.w", DType::F32, &[4, 4], 1);
    let w1 = FixtureTensor::patterned("layers.1.w", DType::F32, &[4, 4], 2);
    let ids = FixtureTensor::patterned("layers.0.ids", DType::I64, &[3], 3);
    write_safetensors(&dir.join("model.safetensors"), &[&w0, &w1, &ids]).expect("w");
    std::fs::write(dir.join("config.json"), "{\"torch_dtype\": \"float32\"}").expect("config");
    write_json(
        &dir.join("device_map.json"),
        &serde_json::json!({"layers.0": "cpu", "layers.1": "disk"}),
    )
    .expect("map");
    let w1_bf16 = FixtureTensor::patterned("layers.1.w", DType::BF16, &[4, 4], 4);
    write_offload_dat(&dir.join("offload"), std::slice::from_ref(&w1_bf16)).expect("offload");
    let out = tmp.path().join("out");
    let o = devmap(&[
        "save",
        dir.to_str().expect("p"),
        "--out",
        out.to_str().expect("p"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("written as bfloat16"),
        "the save says it casts: {}",
        stderr(&o)
    );
    let saved = read_saved(&out);
    assert_eq!(
        saved["layers.0.w"].dtype, "BF16",
        "cast like the rest of the model"
    );
    assert_eq!(
        saved["layers.1.w"],
        Stored::of(&w1_bf16),
        "the offload value as it is"
    );
    assert_eq!(
        saved["layers.0.ids"],
        Stored::of(&ids),
        "integers untouched"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("config.json")).expect("config"),
        "{\"torch_dtype\": \"bfloat16\"}"
    );
}

/// One shard of 64 MiB or more is written by the threads no other shard needs, each
/// taking a run of its tensors: every byte lands where a one-thread save puts it, with
/// one thread, two or four, copied and cast.
#[test]
fn a_big_shard_written_by_several_threads_is_byte_identical() {
    use devmap::fixtures::{FixtureTensor, write_safetensors};
    use devmap::types::DType;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("model");
    std::fs::create_dir(&dir).expect("dir");
    // 13 tensors of 3–9 MiB (float32 and bfloat16): about 80 MiB in one shard.
    let tensors: Vec<FixtureTensor> = (0..13u64)
        .map(|i| {
            let dtype = if i % 3 == 0 { DType::BF16 } else { DType::F32 };
            let elements = ((3 + i % 7) << 20) / dtype.size();
            FixtureTensor::patterned(&format!("model.layers.{i}.w"), dtype, &[elements], i)
        })
        .collect();
    write_safetensors(
        &dir.join("model.safetensors"),
        &tensors.iter().collect::<Vec<_>>(),
    )
    .expect("write");
    let expected: std::collections::BTreeMap<String, Stored> = tensors
        .iter()
        .map(|t| (t.name.clone(), Stored::of(t)))
        .collect();
    let mut cast = None;
    for jobs in ["1", "2", "4"] {
        let out = tmp.path().join(format!("out{jobs}"));
        let o = common::save(&dir, &out, &["--jobs", jobs, "--max-shard-size", "5GB"]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(read_saved(&out), expected, "--jobs {jobs}");
        let out = tmp.path().join(format!("bf16-{jobs}"));
        let o = common::save(&dir, &out, &["--jobs", jobs, "--dtype", "bfloat16"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let saved = read_saved(&out);
        assert!(saved.values().all(|s| s.dtype == "BF16"));
        match &cast {
            None => cast = Some(saved),
            Some(first) => assert_eq!(&saved, first, "cast with --jobs {jobs}"),
        }
    }
}
