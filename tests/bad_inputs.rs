//! Every input a save must refuse: the message names the file and the tensor, nothing
//! is written, and the inputs are left as they were.

mod common;

use std::path::{Path, PathBuf};

use common::{arg, cut, demo_copy, devmap, mixed_model, snapshot, stderr, stdout};
use devmap::model::Placement;
use devmap::model::checkpoint::{Checkpoint, Parts, Source, Tensor};
use devmap::save::{SaveOptions, prepare};
use devmap::types::DType;

/// Runs `devmap save` on `dir` (with `extra` flags) and checks it fails without
/// writing or changing anything. Returns stderr.
fn refused(dir: &Path, out: &Path, extra: &[&str]) -> String {
    let before = snapshot(dir);
    let mut args = vec![
        "save",
        dir.to_str().expect("p"),
        "--out",
        out.to_str().expect("p"),
        "-q",
    ];
    args.extend_from_slice(extra);
    let o = devmap(&args);
    assert!(
        !o.status.success(),
        "save should fail; stderr: {}",
        stderr(&o)
    );
    assert!(
        !out.exists(),
        "a refused save must not create {}",
        out.display()
    );
    assert_eq!(snapshot(dir), before, "inputs changed");
    stderr(&o)
}

fn shard(dir: &Path, k: usize) -> PathBuf {
    dir.join(format!("model-{k:05}-of-00003.safetensors"))
}

fn raw_safetensors(path: &Path, header: &str, data_len: usize) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + data_len, 0);
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn missing_shard() {
    let m = mixed_model();
    std::fs::remove_file(shard(&m.dir, 2)).expect("rm");
    let err = refused(&m.dir, &m.out("o"), &[]);
    assert!(err.contains("model.safetensors.index.json"), "{err}");
    assert!(
        err.contains("model-00002-of-00003.safetensors, which is missing"),
        "{err}"
    );
}

#[test]
fn truncated_shard() {
    let m = mixed_model();
    let p = shard(&m.dir, 1);
    let len = std::fs::metadata(&p).expect("m").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .expect("open");
    f.set_len(len - 3).expect("truncate");
    let err = refused(&m.dir, &m.out("o"), &[]);
    assert!(
        err.contains("model-00001-of-00003.safetensors") && err.contains("truncated"),
        "{err}"
    );
    assert!(err.contains("tensor `"), "names the tensor: {err}");
}

#[test]
fn header_not_json() {
    let m = mixed_model();
    raw_safetensors(&shard(&m.dir, 3), "{\"oops\": ", 0);
    let err = refused(&m.dir, &m.out("o"), &[]);
    assert!(
        err.contains("model-00003-of-00003.safetensors") && err.contains("not a JSON object"),
        "{err}"
    );
}

#[test]
fn overlapping_offsets_and_size_mismatch_and_unknown_dtype() {
    let cases = [
        (
            r#"{"a.w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b.w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            12,
            "`b.w`: bytes from 4 overlap",
        ),
        (
            r#"{"a.w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
            "`a.w`: data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12",
        ),
        (
            r#"{"a.w":{"dtype":"Q4_K","shape":[3],"data_offsets":[0,3]}}"#,
            3,
            "`a.w`: unknown dtype `Q4_K`",
        ),
        (
            r#"{"a.w":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"a.w":{"dtype":"U8","shape":[3],"data_offsets":[3,6]}}"#,
            6,
            "`a.w`: appears twice",
        ),
        (
            r#"{"a.w":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}"#,
            9,
            "6 bytes after the last tensor",
        ),
    ];
    for (header, data, want) in cases {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("m");
        std::fs::create_dir(&dir).expect("mkdir");
        raw_safetensors(&dir.join("model.safetensors"), header, data);
        let err = refused(&dir, &tmp.path().join("o"), &[]);
        assert!(
            err.contains("model.safetensors") && err.contains(want),
            "want {want:?} in: {err}"
        );
    }
}

#[test]
fn index_maps_a_tensor_its_shard_lacks() {
    let m = mixed_model();
    let p = m.dir.join("model.safetensors.index.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("r")).expect("j");
    v["weight_map"]["model.ghost.weight"] = "model-00001-of-00003.safetensors".into();
    std::fs::write(&p, v.to_string()).expect("w");
    let err = refused(&m.dir, &m.out("o"), &[]);
    assert!(
        err.contains("`model.ghost.weight`") && err.contains("does not hold it"),
        "{err}"
    );
}

/// An index that maps a tensor to `/`, `.`, `..` or a path: the error names the index
/// and the tensor, never just the folder it would have opened.
#[test]
fn index_maps_a_tensor_to_something_that_is_not_a_shard_name() {
    for bad in [
        "/",
        ".",
        "..",
        "../x.safetensors",
        "/etc/passwd",
        "sub/x.safetensors",
    ] {
        let m = mixed_model();
        let p = m.dir.join("model.safetensors.index.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).expect("r")).expect("j");
        v["weight_map"]["model.scale"] = bad.into();
        std::fs::write(&p, v.to_string()).expect("w");
        let err = refused(&m.dir, &m.out("o"), &[]);
        assert!(
            err.contains("model.safetensors.index.json")
                && err.contains("`model.scale`")
                && err.contains(&format!("shard `{bad}` is not a file name")),
            "{bad}: {err}"
        );
    }
}

#[test]
fn offload_dat_of_the_wrong_size() {
    let m = mixed_model();
    let p = m.dir.join("offload").join("model.layers.9.proj.weight.dat");
    let mut bytes = std::fs::read(&p).expect("r");
    bytes.push(0);
    std::fs::write(&p, bytes).expect("w");
    let err = refused(&m.dir, &m.out("o"), &[]);
    assert!(
        err.contains("model.layers.9.proj.weight.dat")
            && err.contains("`model.layers.9.proj.weight`"),
        "{err}"
    );
    assert!(
        err.contains("513 bytes") && err.contains("512 bytes"),
        "{err}"
    );
}

#[test]
fn offload_names_that_leave_the_folder() {
    for evil in ["../evil", "/etc/passwd", "a/b", ".."] {
        let m = mixed_model();
        let p = m.dir.join("offload").join("index.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).expect("r")).expect("j");
        v[evil] = serde_json::json!({"dtype": "float32", "shape": [1]});
        std::fs::write(&p, v.to_string()).expect("w");
        let err = refused(&m.dir, &m.out("o"), &[]);
        assert!(
            err.contains(&format!("`{evil}`")) && err.contains("outside the offload folder"),
            "{evil}: {err}"
        );
    }
}

#[test]
fn offload_index_malformed() {
    let m = mixed_model();
    std::fs::write(m.dir.join("offload").join("index.json"), "[1, 2]").expect("w");
    let err = refused(&m.dir, &m.out("o"), &[]);
    assert!(
        err.contains("offload/index.json") && err.contains("JSON object"),
        "{err}"
    );
}

#[test]
fn device_map_values_name_the_key() {
    for (value, key) in [
        (
            serde_json::json!({"model.layers.3": "tpu:0"}),
            "model.layers.3",
        ),
        (serde_json::json!({"lm_head": -1}), "lm_head"),
        (serde_json::json!({"model": true}), "model"),
    ] {
        let m = mixed_model();
        std::fs::write(m.dir.join("device_map.json"), value.to_string()).expect("w");
        let err = refused(&m.dir, &m.out("o"), &[]);
        assert!(
            err.contains("device_map.json") && err.contains(&format!("key `{key}`")),
            "{err}"
        );
    }
    let m = mixed_model();
    std::fs::write(m.dir.join("device_map.json"), "[\"cpu\"]").expect("w");
    let err = refused(&m.dir, &m.out("o"), &[]);
    assert!(err.contains("must be a JSON object"), "{err}");
}

/// The map is optional: a garbage device_map.json beside the weights opens the model
/// without it, with a warning that names the file (issue 40); a save still refuses,
/// and a map the user names with --device-map is an error.
#[test]
fn a_garbage_device_map_opens_without_it_and_warns() {
    let m = mixed_model();
    std::fs::write(m.dir.join("device_map.json"), "{ not json").expect("w");
    let o = common::devmap(&["inspect", m.dir.to_str().expect("p"), "--json"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&common::stdout(&o)).expect("json");
    let kinds: Vec<&str> = report["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(|w| w["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"device_map_unreadable"), "{kinds:?}");
    assert_eq!(
        report["devices"],
        serde_json::json!({"cpu": report["total_bytes"]})
    );
    let err = refused(&m.dir, &m.out("o"), &[]);
    assert!(err.contains("device_map.json cannot be read"), "{err}");
    let named = m.out("named.json");
    std::fs::write(&named, "{ not json").expect("w");
    let o = common::devmap(&[
        "inspect",
        m.dir.to_str().expect("p"),
        "--device-map",
        named.to_str().expect("p"),
    ]);
    assert!(!o.status.success());
    assert!(
        common::stderr(&o).contains("named.json"),
        "{}",
        common::stderr(&o)
    );
}

#[test]
fn output_inside_the_input_is_refused() {
    let m = mixed_model();
    let out = m.dir.join("saved");
    let err = refused(&m.dir, &out, &[]);
    assert!(err.contains("inside it"), "{err}");
}

#[test]
fn a_folder_without_weights() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("empty");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join("config.json"), "{}").expect("w");
    let err = refused(&dir, &tmp.path().join("o"), &[]);
    assert!(
        err.contains("no weights in") && err.contains("empty"),
        "{err}"
    );
}

#[test]
fn leftovers_of_an_interrupted_save_are_named() {
    let m = mixed_model();
    let out = m.out("o");
    std::fs::create_dir(&out).expect("mkdir");
    std::fs::write(
        out.join("model-00001-of-00002.safetensors.devmap-partial"),
        b"half",
    )
    .expect("w");
    let o = devmap(&[
        "save",
        m.dir.to_str().expect("p"),
        "--out",
        out.to_str().expect("p"),
        "--force",
        "-q",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("interrupted save") && err.contains("delete them"),
        "{err}"
    );
}

#[test]
fn meta_tensor_without_data_is_refused_by_name() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ghost = Tensor {
        name: "model.layers.0.mlp.weight".into(),
        dtype: DType::F16,
        shape: vec![4, 4].into(),
        placement: Placement::Meta,
        map_key: devmap::model::checkpoint::NO_KEY,
        source: Source::None,
        load_dtype: None,
    };
    let ckpt = Checkpoint::assemble(Parts {
        dir: tmp.path().to_path_buf(),
        tensors: vec![ghost],
        ..Default::default()
    });
    let options = SaveOptions {
        max_shard_size: 1000,
        weights_only: true,
        ..SaveOptions::new(tmp.path().join("out"))
    };
    let err = prepare(&ckpt, &options)
        .expect_err("must refuse")
        .to_string();
    assert!(
        err.contains("`model.layers.0.mlp.weight` (placed on meta) has no data"),
        "{err}"
    );
    assert!(!tmp.path().join("out").exists());
}

#[test]
fn bad_shard_size_is_a_usage_error() {
    let m = mixed_model();
    let o = devmap(&[
        "save",
        m.dir.to_str().expect("p"),
        "--out",
        m.out("o").to_str().expect("p"),
        "--max-shard-size",
        "5XB",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("`5XB` is not a size"), "{}", stderr(&o));
    assert!(!m.out("o").exists());
}

#[test]
fn the_same_tensor_in_two_files_without_an_index() {
    use devmap::fixtures::{FixtureTensor, write_safetensors};
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("m");
    std::fs::create_dir(&dir).expect("mkdir");
    let a = FixtureTensor::patterned("model.w", DType::F32, &[2], 1);
    let b = FixtureTensor::patterned("model.v", DType::F32, &[2], 2);
    write_safetensors(&dir.join("part-a.safetensors"), &[&a, &b]).expect("w");
    write_safetensors(&dir.join("part-b.safetensors"), &[&a]).expect("w");
    let err = refused(&dir, &tmp.path().join("o"), &[]);
    assert!(
        err.contains("`model.w`")
            && err.contains("part-a.safetensors")
            && err.contains("part-b.safetensors"),
        "{err}"
    );
}

#[test]
fn offload_dat_too_short() {
    let m = mixed_model();
    let p = m
        .dir
        .join("offload")
        .join("model.layers.10.norm.weight.dat");
    let bytes = std::fs::read(&p).expect("r");
    std::fs::write(&p, &bytes[..bytes.len() - 4]).expect("w");
    let err = refused(&m.dir, &m.out("o"), &[]);
    assert!(
        err.contains("model.layers.10.norm.weight.dat")
            && err.contains("holds 60 bytes")
            && err.contains("64 bytes"),
        "{err}"
    );
}

#[test]
fn ties_that_cannot_hold_are_refused_by_name() {
    let m = mixed_model();
    let err = refused(
        &m.dir,
        &m.out("o"),
        &["--tie", "model.scale=model.norm.weight"],
    );
    assert!(
        err.contains("--tie model.scale=model.norm.weight")
            && err.contains("F32 []")
            && err.contains("F32 [16]"),
        "{err}"
    );
    let err = refused(
        &m.dir,
        &m.out("o"),
        &["--tie", "lm_head.bias=model.nothing"],
    );
    assert!(err.contains("no tensor is named `model.nothing`"), "{err}");
    let err = refused(&m.dir, &m.out("o"), &["--tie", "model.scale=model.scale"]);
    assert!(err.contains("cannot be tied to itself"), "{err}");
    let o = devmap(&[
        "save",
        m.dir.to_str().expect("p"),
        "--out",
        m.out("o").to_str().expect("p"),
        "--tie",
        "nonsense",
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("is not TIED=KEPT"),
        "{}",
        stderr(&o)
    );
}

/// A config value of the wrong type is a warning naming the key, not ignored silently.
#[test]
fn a_config_value_of_the_wrong_type_is_named() {
    let m = mixed_model();
    let p = m.dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("r")).expect("j");
    v["torch_dtype"] = 5.into();
    std::fs::write(&p, v.to_string()).expect("w");
    let o = common::devmap(&["inspect", m.dir.to_str().expect("p")]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let text = common::stdout(&o);
    assert!(
        text.contains("`torch_dtype` is a number (5), not a dtype name"),
        "{text}"
    );
}

/// One shard cut short: `inspect` opens what is readable and names the broken file
/// and its tensors (those whose bytes are there are read as usual); a save refuses,
/// naming the file. Cut inside its header, every tensor the index maps to it is kept
/// without data.
#[test]
fn a_truncated_shard_opens_for_looking_and_is_refused_for_saving() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = demo_copy(tmp.path());
    let second = dir.join("model-00002-of-00002.safetensors");
    let len = std::fs::metadata(&second).expect("shard").len();
    cut(&second, len - 1000);
    let o = devmap(&["inspect", arg(&dir), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let broken = report["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .find(|w| w["kind"] == "broken_file")
        .unwrap_or_else(|| panic!("no broken_file warning: {report}"));
    let unreadable: Vec<&str> = broken["names"]
        .as_array()
        .expect("names")
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    assert!(!unreadable.is_empty(), "{broken}");
    // The shard's other tensors were read: fewer unreadable than the shard holds.
    let header = devmap::formats::safetensors::read_header_of_cut_file(&second).expect("header");
    assert!(unreadable.len() < header.tensors.len(), "{unreadable:?}");
    let text = devmap(&["inspect", arg(&dir)]);
    let said = stdout(&text) + &stderr(&text);
    assert!(
        said.contains("model-00002-of-00002.safetensors cannot be read whole"),
        "{said}"
    );
    let out = tmp.path().join("out");
    let e = refused(&dir, &out, &[]);
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");

    // Cut inside its header: every tensor the index maps there, without data.
    cut(&second, 100);
    let o = devmap(&["inspect", arg(&dir), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let broken = report["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .find(|w| w["kind"] == "broken_file")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(
        broken["names"].as_array().map(Vec::len),
        Some(header.tensors.len()),
        "{broken}"
    );
    let e = refused(&dir, &out, &[]);
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
}
