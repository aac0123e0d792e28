//! What devmap understands of a model directory: placements, sources, ties, warnings,
//! and the `inspect --json` schema.

mod common;

use common::{devmap, mixed_model, stderr, stdout};
use devmap::fixtures::{FixtureTensor, write_json, write_safetensors};
use devmap::model::{LoadOptions, Placement, Source, load};
use devmap::types::DType;

fn json_of(dir: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["inspect", dir.to_str().expect("p"), "--json"];
    args.extend_from_slice(extra);
    let o = devmap(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).expect("inspect --json is JSON")
}

#[test]
fn json_schema_order_placements_and_sources() {
    let m = mixed_model();
    let v = json_of(&m.dir, &[]);
    let tensors = v["tensors"].as_array().expect("tensors");
    let names: Vec<&str> = tensors
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    // Module order, numbers compared as numbers.
    let l2 = names
        .iter()
        .position(|n| n.starts_with("model.layers.2."))
        .expect("l2");
    let l10 = names
        .iter()
        .position(|n| n.starts_with("model.layers.10."))
        .expect("l10");
    assert!(l2 < l10, "layers.2 must come before layers.10");
    let by_name = |n: &str| {
        tensors
            .iter()
            .find(|t| t["name"] == n)
            .unwrap_or_else(|| panic!("{n} missing"))
    };

    let head = by_name("lm_head.weight");
    assert_eq!(head["placement"], "gpu:0");
    assert_eq!(head["source"]["kind"], "tied");
    assert_eq!(head["source"]["to"], "model.embed_tokens.weight");
    assert_eq!(head["shape"], serde_json::json!([64, 16]));

    let on_disk = by_name("model.layers.9.proj.weight");
    assert_eq!(on_disk["placement"], "disk");
    assert_eq!(on_disk["source"]["kind"], "offload");
    assert!(
        on_disk["source"]["file"]
            .as_str()
            .expect("file")
            .ends_with("offload/model.layers.9.proj.weight.dat")
    );

    let on_cpu = by_name("model.layers.5.codes");
    assert_eq!(on_cpu["placement"], "cpu");
    assert_eq!(on_cpu["source"]["kind"], "safetensors");
    assert_eq!(on_cpu["dtype"], "U8");
    assert_eq!(on_cpu["bytes"], 5);
    assert!(on_cpu["source"]["offset"].as_u64().expect("offset") >= 8);

    let scalar = by_name("model.scale");
    assert_eq!(scalar["shape"], serde_json::json!([]));
    assert_eq!(scalar["bytes"], 4);

    assert_eq!(
        v["ties"],
        serde_json::json!([["model.embed_tokens.weight", "lm_head.weight"]])
    );
    let devices = v["devices"].as_object().expect("devices");
    let sum: u64 = devices.values().map(|b| b.as_u64().expect("u64")).sum();
    let all: u64 = tensors
        .iter()
        .map(|t| t["bytes"].as_u64().expect("b"))
        .sum();
    // The tied head sits on its embedding's device: one tensor in memory, counted
    // once (as accelerate counts it) in the devices and the total.
    let head = tensors
        .iter()
        .find(|t| t["name"] == "lm_head.weight")
        .expect("head");
    let embedding = tensors
        .iter()
        .find(|t| t["name"] == "model.embed_tokens.weight")
        .expect("embedding");
    assert_eq!(head["placement"], embedding["placement"]);
    let once = all - head["bytes"].as_u64().expect("b");
    assert_eq!(sum, once);
    assert_eq!(v["total_bytes"].as_u64(), Some(once));
    assert!(
        devices.contains_key("gpu:0")
            && devices.contains_key("cpu")
            && devices.contains_key("disk")
    );
}

/// Loads the mixed model with its device map changed by `edit` (written beside it,
/// so the model directory stays as generated).
fn with_edited_map(
    m: &common::Model,
    edit: impl FnOnce(&mut serde_json::Value),
) -> devmap::model::Checkpoint {
    let map_path = m.tmp.path().join("map.json");
    let text = std::fs::read_to_string(m.dir.join("device_map.json")).expect("read map");
    let mut map: serde_json::Value = serde_json::from_str(&text).expect("map is JSON");
    edit(&mut map);
    write_json(&map_path, &map).expect("write map");
    load(
        &m.dir,
        &LoadOptions {
            device_map: Some(map_path),
            ..Default::default()
        },
    )
    .expect("load")
}

fn tiny_dir(names: &[&str]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tmp");
    let tensors: Vec<FixtureTensor> = names
        .iter()
        .enumerate()
        .map(|(i, n)| FixtureTensor::patterned(n, DType::F32, &[2], i as u64))
        .collect();
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    write_safetensors(&tmp.path().join("model.safetensors"), &refs).expect("write");
    tmp
}

#[test]
fn placement_matches_whole_components() {
    let tmp = tiny_dir(&[
        "model.layers.1.w",
        "model.layers.10.w",
        "model.layers.1x.w",
        "other.w",
    ]);
    write_json(
        &tmp.path().join("device_map.json"),
        &serde_json::json!({"model.layers.1": 1, "model.layers": "cpu"}),
    )
    .expect("map");
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    let at = |n: &str| ckpt.tensor(n).expect(n).placement;
    assert_eq!(at("model.layers.1.w"), Placement::Gpu(1));
    assert_eq!(
        at("model.layers.10.w"),
        Placement::Cpu,
        "layers.1 must not cover layers.10"
    );
    assert_eq!(at("model.layers.1x.w"), Placement::Cpu);
    assert_eq!(at("other.w"), Placement::Unmapped);
    assert_eq!(
        ckpt.map_key(ckpt.tensor("model.layers.10.w").expect("t")),
        Some("model.layers")
    );
    let all = common::warning_text(&ckpt);
    assert!(
        all.contains("unmapped") && all.contains("`other.w`"),
        "{all}"
    );
    assert!(
        all.contains("transformers 5") && all.contains("`model.layers.1`"),
        "{all}"
    );
    // `--json` carries each warning's kind and every name it is about.
    let v = json_of(tmp.path(), &[]);
    let warnings = v["warnings"].as_array().expect("warnings");
    let unmapped = warnings
        .iter()
        .find(|w| w["kind"] == "unmapped")
        .expect("an unmapped warning");
    assert_eq!(unmapped["names"], serde_json::json!(["other.w"]));
    assert!(
        unmapped["message"]
            .as_str()
            .is_some_and(|m| m.contains("covered by no device-map entry")),
        "{unmapped}"
    );
    let trap = warnings
        .iter()
        .find(|w| w["kind"] == "transformers5_placement")
        .expect("a transformers 5 warning");
    assert_eq!(
        trap["names"],
        serde_json::json!(["model.layers", "model.layers.1"])
    );
}

#[test]
fn no_map_means_cpu_and_no_warnings() {
    let tmp = tiny_dir(&["a.w", "b.w"]);
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    assert!(ckpt.tensors().iter().all(|t| t.placement == Placement::Cpu));
    assert!(
        devmap::model::checks::all_warnings(&ckpt).is_empty(),
        "{:?}",
        devmap::model::checks::all_warnings(&ckpt)
    );
}

#[test]
fn config_without_tie_key_ties_and_false_does_not() {
    let tmp = tempfile::tempdir().expect("tmp");
    let emb = FixtureTensor::patterned("transformer.wte.weight", DType::F16, &[8, 4], 1);
    let head = FixtureTensor::patterned("lm_head.weight", DType::F16, &[8, 4], 2);
    write_safetensors(&tmp.path().join("model.safetensors"), &[&emb, &head]).expect("w");
    write_json(
        &tmp.path().join("config.json"),
        &serde_json::json!({"architectures": ["GPT2LMHeadModel"]}),
    )
    .expect("c");
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    assert_eq!(ckpt.ties.len(), 1);
    assert_eq!(
        &*ckpt.tensors()[ckpt.ties[0].kept()].name,
        "transformer.wte.weight"
    );
    write_json(
        &tmp.path().join("config.json"),
        &serde_json::json!({"tie_word_embeddings": false}),
    )
    .expect("c");
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    assert!(ckpt.ties.is_empty());
}

#[test]
fn tied_head_on_another_device_is_a_warning() {
    let m = mixed_model();
    let ckpt = with_edited_map(&m, |map| {
        map["lm_head"] = "cpu".into();
    });
    let w = common::warning_text(&ckpt);
    assert!(w.contains("tied weights are on different devices"), "{w}");
    assert!(
        w.contains("`lm_head.weight` on cpu") && w.contains("`model.embed_tokens.weight` on gpu:0"),
        "{w}"
    );
}

#[test]
fn offload_entries_off_disk_and_disk_without_offload_are_reported() {
    let m = mixed_model();
    let ckpt = with_edited_map(&m, |map| {
        map["model.layers.8"] = 1.into();
        map["model.layers.3"] = "disk".into();
    });
    let w = common::warning_text(&ckpt);
    assert!(
        w.contains("does not put on disk") && w.contains("model.layers.8.proj.weight (gpu:1)"),
        "{w}"
    );
    assert!(
        w.contains("placed on disk but the offload folder") && w.contains("`model.layers.3."),
        "{w}"
    );
    // The offload value is still the current one.
    let t = ckpt.tensor("model.layers.8.proj.weight").expect("t");
    assert!(matches!(t.source, Source::Offload(_)));
}

#[test]
fn text_report_shows_tree_devices_ties_and_warnings() {
    let m = mixed_model();
    let o = devmap(&["inspect", m.dir.to_str().expect("p")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("lm_head.weight"), "{text}");
    assert!(
        text.contains("⇄ tied to model.embed_tokens.weight"),
        "{text}"
    );
    assert!(text.contains("mixed ("), "{text}");
    assert!(text.contains("0–3 ×4"), "numbered runs collapse: {text}");
    assert!(
        text.contains("DEVICES") && text.contains("gpu:0") && text.contains("disk"),
        "{text}"
    );
    assert!(text.contains("TIES"), "{text}");
}

#[test]
fn demo_model_opens() {
    let o = devmap(&[
        "inspect",
        concat!(env!("CARGO_MANIFEST_DIR"), "/assets/demo"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let devices = v["devices"].as_object().expect("devices");
    for d in ["gpu:0", "gpu:1", "cpu", "disk"] {
        assert!(devices.contains_key(d), "demo uses {d}");
    }
    assert_eq!(v["ties"][0][1], "lm_head.weight");
}

#[test]
fn symlinked_inputs_outside_the_directory_are_followed_and_named() {
    let m = mixed_model();
    // Move a shard out of the model directory and link it back, as HF caches do.
    let blobs = m.tmp.path().join("blobs");
    std::fs::create_dir(&blobs).expect("mkdir");
    let shard = m.dir.join("model-00001-of-00003.safetensors");
    let blob = blobs.join("abc123");
    std::fs::rename(&shard, &blob).expect("mv");
    std::os::unix::fs::symlink(&blob, &shard).expect("ln");
    let o = devmap(&["inspect", m.dir.to_str().expect("p")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("reached through symlinks") && text.contains("blobs/abc123"),
        "{text}"
    );
    // And a save still reads through the link.
    let out = m.out("saved");
    let o = devmap(&[
        "save",
        m.dir.to_str().expect("p"),
        "-o",
        out.to_str().expect("p"),
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(common::read_saved(&out), m.expected);
}

#[test]
fn map_keys_that_match_nothing_and_tensors_without_data_are_named() {
    use devmap::model::checkpoint::{Checkpoint, Parts, Source, Tensor};
    let tmp = tiny_dir(&["model.a.w", "model.b.w"]);
    write_json(
        &tmp.path().join("device_map.json"),
        &serde_json::json!({"model.a": 0, "model.b": "cpu", "model.c": "disk", "model.a.w.extra": 1}),
    )
    .expect("map");
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    let w = common::warning_text(&ckpt);
    assert!(
        w.contains("2 device-map keys match no tensor")
            && w.contains("`model.c`")
            && w.contains("`model.a.w.extra`"),
        "{w}"
    );

    let ghost = Tensor {
        name: "model.layers.0.w".into(),
        dtype: DType::F16,
        shape: vec![2].into(),
        placement: Placement::Disk,
        map_key: devmap::model::checkpoint::NO_KEY,
        source: Source::None,
        load_dtype: None,
    };
    let ckpt = Checkpoint::assemble(Parts {
        tensors: vec![ghost],
        ..Default::default()
    });
    let w = common::warning_text(&ckpt);
    assert!(
        w.contains("no data anywhere") && w.contains("model.layers.0.w (disk)"),
        "{w}"
    );
}

#[test]
fn devmap_without_arguments_reports_on_the_demo_when_not_in_a_terminal() {
    // The README's first command: outside a terminal (as here, stdout is a pipe) it
    // prints the same picture as text instead of opening the inspector.
    let o = devmap(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("assets/demo") && text.contains("57 tensors") && text.contains("DEVICES"),
        "{text}"
    );
    let help = stdout(&devmap(&["--help"]));
    for sub in ["inspect", "save", "plan"] {
        assert!(help.contains(sub), "--help lists {sub}: {help}");
    }
}

/// An installed devmap has no source tree: `devmap` with no argument unpacks the demo
/// it carries into the temporary folder, opens that, and removes it when done
/// (DEVMAP_DEMO_EMBEDDED=1 makes a checkout's binary behave so). That the built-in
/// files are assets/demo byte for byte is the binary's unit test.
#[test]
fn the_built_in_demo_opens_without_the_source_tree_and_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_devmap"))
            .env("DEVMAP_DEMO_EMBEDDED", "1")
            .env("TMPDIR", tmp.path())
            .output()
            .expect("devmap")
    };
    let o = run();
    assert!(o.status.success(), "{}", stderr(&o));
    let report = stdout(&o);
    assert!(
        report.contains("57 tensors") && report.contains("offload folder"),
        "{report}"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in the temporary folder: {left:?}");
    // A second run unpacks it again, the same model.
    let o = run();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).replace(|c: char| c.is_ascii_hexdigit(), ""),
        report.replace(|c: char| c.is_ascii_hexdigit(), ""),
    );
}

/// A folder holding two training formats (a torch.distributed.checkpoint's
/// `.metadata` and a DeepSpeed rank's optimizer states) is refused, naming both,
/// instead of one silently winning; a model's own weights beside a training format
/// are read, as transformers would (the training files are not the model).
#[test]
fn two_training_formats_in_one_folder_are_named_not_guessed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("ckpt");
    std::fs::create_dir(&dir).expect("dir");
    std::fs::write(dir.join(".metadata"), b"").expect("metadata");
    std::fs::write(dir.join("zero_pp_rank_0_mp_rank_00_optim_states.pt"), b"").expect("zero");
    let e = load(&dir, &LoadOptions::default())
        .expect_err("ambiguous")
        .to_string();
    assert!(
        e.contains("torch.distributed.checkpoint") && e.contains("DeepSpeed"),
        "{e}"
    );
    let o = devmap(&["inspect", dir.to_str().expect("p")]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("holds both"), "{}", stderr(&o));
    // With the model's safetensors beside them, those are the model.
    let w = FixtureTensor::patterned("w", DType::F32, &[2, 2], 1);
    write_safetensors(&dir.join("model.safetensors"), &[&w]).expect("weights");
    let ckpt = load(&dir, &LoadOptions::default()).expect("the safetensors");
    assert_eq!(ckpt.tensors().len(), 1);
}

/// An export's offload folder stores every entry as F32 while its index says the
/// model holds them as bfloat16: one warning says so for all of them, not a line each,
/// and sizes are counted as the model holds them.
#[test]
fn offload_entries_stored_in_another_dtype_are_one_warning() {
    let tmp = tempfile::tempdir().expect("tmp");
    let names: Vec<String> = (0..7).map(|i| format!("layers.{i}.w")).collect();
    let tensors: Vec<FixtureTensor> = names
        .iter()
        .enumerate()
        .map(|(i, n)| FixtureTensor::patterned(n, DType::F32, &[2, 2], i as u64))
        .collect();
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    write_safetensors(&tmp.path().join("model.safetensors"), &refs).expect("weights");
    let offload = tmp.path().join("offload");
    std::fs::create_dir(&offload).expect("mkdir");
    write_safetensors(&offload.join("values.safetensors"), &refs).expect("values");
    let index: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .map(|n| {
            let entry = serde_json::json!({
                "safetensors_file": "values.safetensors", "weight_name": n, "dtype": "bfloat16"
            });
            (n.clone(), entry)
        })
        .collect();
    write_json(&offload.join("index.json"), &index.into()).expect("index");

    let v = json_of(tmp.path(), &[]);
    let grouped: Vec<&serde_json::Value> = v["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter(|w| w["kind"] == "offload_load_dtype")
        .collect();
    assert_eq!(grouped.len(), 1, "{grouped:?}");
    assert_eq!(grouped[0]["names"], serde_json::json!(names));
    let message = grouped[0]["message"].as_str().expect("message");
    for needle in [
        "7 offload entries",
        "stored as F32",
        "holds them as bfloat16",
        "`layers.0.w`",
        "and 2 more",
    ] {
        assert!(message.contains(needle), "{needle:?} in {message}");
    }
    // Sizes are what the model holds: 7 × 4 bfloat16 values, not the stored F32.
    let t0 = &v["tensors"][0];
    assert_eq!(
        (&t0["bytes"], &t0["loads_as"], &t0["held_bytes"]),
        (
            &serde_json::json!(16),
            &serde_json::json!("bfloat16"),
            &serde_json::json!(8)
        ),
        "{t0}"
    );
    assert_eq!(v["total_bytes"], 7 * 8, "{}", v["total_bytes"]);
    assert_eq!(v["devices"]["cpu"], 7 * 8, "{}", v["devices"]);
    let o = devmap(&["inspect", tmp.path().to_str().expect("p")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(text.matches("stored as F32").count(), 1, "{text}");
    assert!(text.contains("56 B"), "{text}");
}
