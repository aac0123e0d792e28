//! The live-model manifest (what the Python package hands the saver) without Python:
//! values in this process's memory (a Rust buffer's address, read through
//! /proc/self/mem), in an accelerate `.dat` stored as bfloat16 for a model that holds
//! float32, and as slices of a fused safetensors entry; saved, read back with the
//! `safetensors` crate and checked against the bytes put there. Bad manifests are
//! refused naming the tensor and file; a commit check that says no leaves nothing.

mod common;

use std::path::Path;
use std::sync::Arc;

use devmap::fixtures::{FixtureTensor, write_safetensors};
use devmap::formats::live::parse_manifest;
use devmap::model::load::load_live;
use devmap::save::shards::DtypeChoice;
use devmap::save::{CommitCheck, Refusal, SaveError, SaveOptions};
use devmap::types::DType;

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// bfloat16 → float32 is exact: the float32's top half is the bfloat16.
fn widened(bf16: &[u8]) -> Vec<u8> {
    bf16.chunks(2).flat_map(|b| [0, 0, b[0], b[1]]).collect()
}

fn manifest(config_dir: &Path, tensors: &serde_json::Value) -> String {
    serde_json::json!({
        "format": devmap::formats::live::FORMAT,
        "config_dir": config_dir,
        "tensors": tensors,
    })
    .to_string()
}

/// Why a test's save did not happen: the manifest was refused, or the save was.
#[derive(Debug)]
enum Failed {
    Manifest(String),
    Save(SaveError),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Manifest(why) => f.write_str(why),
            Failed::Save(e) => e.fmt(f),
        }
    }
}

impl From<SaveError> for Failed {
    fn from(e: SaveError) -> Failed {
        Failed::Save(e)
    }
}

fn save(text: &str, out: &Path, check: Option<CommitCheck>) -> Result<(), Failed> {
    let origin = Path::new("manifest");
    let manifest = parse_manifest(text, origin).map_err(|e| Failed::Manifest(e.to_string()))?;
    let ckpt = load_live(&manifest, origin).map_err(|e| Failed::Manifest(e.to_string()))?;
    let mut options = SaveOptions::new(out);
    options.dtype = DtypeChoice::AsLoaded;
    options.max_shard_size = 300;
    options.commit_check = check;
    let plan = devmap::save::prepare(&ckpt, &options)?;
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let reporter = devmap::save::Reporter::new(None, &cancel);
    devmap::save::write(&ckpt, &plan, &options, &cancel, &reporter)?;
    // The saver's own replay agrees too (reading the memory again).
    let expected = devmap::verify::SaveReference::from_plan(&ckpt, plan);
    let report = devmap::verify::verify(
        out,
        Some(&expected),
        false,
        &devmap::verify::Progress::default(),
    )
    .expect("verify runs");
    assert_eq!(report.differences(), 0, "{}", report.to_text());
    Ok(())
}

#[test]
fn memory_dat_and_fused_safetensors_sources_are_saved_as_the_model_holds_them() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = tmp.path().join("config");
    std::fs::create_dir(&config).expect("mkdir");
    std::fs::write(
        config.join("config.json"),
        r#"{"model_type": "toy", "dtype": "float32"}"#,
    )
    .expect("config");

    // In memory: 64 float32 values; `a` is all of them, `b` the second half.
    let values: Vec<f32> = (0..64).map(|i| i as f32 * 0.5 - 3.0).collect();
    let memory = f32_bytes(&values);
    let address = memory.as_ptr() as u64;

    // On disk: a bfloat16 .dat the model holds as float32.
    let dat = FixtureTensor::patterned("c.weight", DType::BF16, &[8], 3);
    let dat_path = tmp.path().join("c.weight.dat");
    std::fs::write(&dat_path, &dat.data).expect("dat");

    // A fused [2, 4, 8] float32 entry; the model saves its second half as `e.1.weight`.
    let fused = FixtureTensor::patterned("experts.fused", DType::F32, &[2, 4, 8], 5);
    let fused_path = tmp.path().join("offload.safetensors");
    write_safetensors(&fused_path, &[&fused]).expect("safetensors");

    let text = manifest(
        &config,
        &serde_json::json!([
            {"name": "a.weight", "dtype": "float32", "shape": [4, 16], "device": "cpu",
             "source": {"kind": "memory", "address": address}},
            {"name": "b.weight", "dtype": "float32", "shape": [32], "device": "cpu",
             "source": {"kind": "memory", "address": address + 128}},
            {"name": "c.weight", "dtype": "float32", "shape": [8], "device": "disk",
             "source": {"kind": "file", "path": dat_path, "dtype": "bfloat16"}},
            {"name": "e.1.weight", "dtype": "float32", "shape": [4, 8], "device": "disk",
             "source": {"kind": "safetensors", "path": fused_path, "tensor": "experts.fused", "first": 32}},
        ]),
    );
    let out = tmp.path().join("out");
    save(&text, &out, None).expect("saves");

    let saved = common::read_saved(&out);
    assert!(
        out.join("model.safetensors.index.json").exists(),
        "300-byte shards make several files"
    );
    let check = |name: &str, dtype: &str, shape: &[usize], data: &[u8]| {
        let t = &saved[name];
        assert_eq!(
            (t.dtype.as_str(), t.shape.as_slice()),
            (dtype, shape),
            "{name}"
        );
        assert_eq!(t.data, data, "{name}");
    };
    check("a.weight", "F32", &[4, 16], &memory);
    check("b.weight", "F32", &[32], &memory[128..]);
    check("c.weight", "F32", &[8], &widened(&dat.data));
    check("e.1.weight", "F32", &[4, 8], &fused.data[128..]);
    assert_eq!(saved.len(), 4);
    let config_out = std::fs::read_to_string(out.join("config.json")).expect("config copied");
    assert!(config_out.contains("toy"), "{config_out}");
    drop(memory);
}

#[test]
fn bad_manifests_are_refused_naming_the_tensor_and_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = tmp.path().join("config");
    std::fs::create_dir(&config).expect("mkdir");
    let fused = FixtureTensor::patterned("experts.fused", DType::F32, &[2, 4], 5);
    let path = tmp.path().join("o.safetensors");
    write_safetensors(&path, &[&fused]).expect("safetensors");
    let short = tmp.path().join("short.dat");
    std::fs::write(&short, [0u8; 10]).expect("dat");
    let one = |tensor: serde_json::Value| manifest(&config, &serde_json::json!([tensor]));
    let refused = |text: String, wants: &[&str]| {
        let out = tmp.path().join("out");
        let err = save(&text, &out, None).expect_err("refused").to_string();
        for want in wants {
            assert!(err.contains(want), "{want:?} not in: {err}");
        }
        assert!(!out.join("model.safetensors").exists(), "{err}");
    };
    refused(
        one(
            serde_json::json!({"name": "w", "dtype": "float32", "shape": [4], "device": "disk",
            "source": {"kind": "safetensors", "path": path, "tensor": "other"}}),
        ),
        &["o.safetensors", "other", "not in the file", "`w`"],
    );
    refused(
        one(
            serde_json::json!({"name": "w", "dtype": "float32", "shape": [4], "device": "disk",
            "source": {"kind": "safetensors", "path": path, "tensor": "experts.fused", "first": 6}}),
        ),
        &["experts.fused", "element 6"],
    );
    refused(
        one(
            serde_json::json!({"name": "w", "dtype": "float32", "shape": [4], "device": "disk",
            "source": {"kind": "file", "path": short, "dtype": "float32"}}),
        ),
        &["short.dat", "`w`", "holds 10 bytes"],
    );
    refused(
        one(
            serde_json::json!({"name": "w", "dtype": "float4_e2m1", "shape": [4], "device": "cpu",
            "source": {"kind": "memory", "address": 0}}),
        ),
        &["`w`", "float4_e2m1", "cannot store"],
    );
    // Memory that is not mapped (a freed tensor): the tensor is named.
    refused(
        one(
            serde_json::json!({"name": "w", "dtype": "float32", "shape": [4], "device": "cpu",
            "source": {"kind": "memory", "address": 16}}),
        ),
        &["`w`", "0x10", "freed or moved"],
    );
    refused(
        one(
            serde_json::json!({"name": "w", "dtype": "float32", "shape": [4], "device": "meta",
            "source": {"kind": "none"}}),
        ),
        &["`w`", "has no data"],
    );
    let twice = serde_json::json!({"name": "w", "dtype": "float32", "shape": [2], "device": "disk",
        "source": {"kind": "safetensors", "path": path, "tensor": "experts.fused"}});
    refused(
        manifest(&config, &serde_json::json!([twice, twice])),
        &["`w` twice"],
    );
    // A source inside OUT: the commit would replace what the model reads.
    let inner = tmp.path().join("out/model.safetensors");
    std::fs::create_dir_all(tmp.path().join("out")).expect("mkdir");
    write_safetensors(&inner, &[&fused]).expect("safetensors");
    let text = one(
        serde_json::json!({"name": "w", "dtype": "float32", "shape": [8], "device": "disk",
        "source": {"kind": "safetensors", "path": inner, "tensor": "experts.fused"}}),
    );
    let err = save(&text, &tmp.path().join("out"), None)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("which the save reads from"), "{err}");
    assert!(err.contains("out/model.safetensors"), "{err}");
}

#[test]
fn a_commit_check_that_says_no_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = tmp.path().join("config");
    std::fs::create_dir(&config).expect("mkdir");
    let memory = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let text = manifest(
        &config,
        &serde_json::json!([{"name": "w", "dtype": "float32", "shape": [4], "device": "cpu",
            "source": {"kind": "memory", "address": memory.as_ptr() as u64}}]),
    );
    let out = tmp.path().join("out");
    let asked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = asked.clone();
    let check = CommitCheck(Arc::new(move || {
        seen.store(true, std::sync::atomic::Ordering::SeqCst);
        Err("`w` changed while devmap was saving".to_owned())
    }));
    let err = save(&text, &out, Some(check)).expect_err("refused");
    assert!(asked.load(std::sync::atomic::Ordering::SeqCst));
    assert!(
        matches!(&err, Failed::Save(SaveError::Refused(reasons))
            if matches!(reasons.as_slice(), [Refusal::ModelChanged(why)] if why.contains("`w` changed"))),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&out)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in OUT: {left:?}");
    drop(memory);
}

#[test]
fn staged_and_dat_sources_are_reported_as_what_they_are() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = tmp.path().join("config");
    std::fs::create_dir(&config).expect("mkdir");
    let dat = tmp.path().join("w.dat");
    std::fs::write(&dat, [0u8; 16]).expect("dat");
    let text = manifest(
        &config,
        &serde_json::json!([
            {"name": "gpu.weight", "dtype": "float32", "shape": [4], "device": "cuda:0",
             "source": {"kind": "staged", "key": 0}},
            {"name": "disk.weight", "dtype": "float32", "shape": [4], "device": "disk",
             "source": {"kind": "file", "path": dat, "dtype": "float32"}},
        ]),
    );
    let origin = Path::new("manifest");
    let ckpt = load_live(&parse_manifest(&text, origin).expect("parses"), origin).expect("loads");
    // A `.dat` an offload loader reads is an offload value, not a checkpoint entry left
    // without its offload folder.
    let report = devmap::inspect::to_text(&ckpt, devmap::inspect::TextOptions::default());
    assert!(!report.contains("no offload folder"), "{report}");
    // A staged source names no file: it is never "inside" the output folder, even when
    // that folder is the one devmap runs in (its pseudo path is relative).
    let mut options = SaveOptions::new(std::env::current_dir().expect("cwd"));
    options.force = true;
    let plan = devmap::save::plan(&ckpt, &options).expect("plans");
    let problems = devmap::save::preflight::check(&ckpt, &plan, &options);
    assert!(
        !problems
            .iter()
            .any(|p| matches!(p, Refusal::OutHoldsInput { .. })),
        "{problems:?}"
    );
}

/// A manifest naming the process whose memory holds its tensors (`devmap.inspect`
/// hands one to the `devmap` command): this process named is read as before; a process
/// whose memory cannot be read (here one that has exited) is refused before anything is
/// written, naming its memory and what decides who may read it.
#[test]
fn a_manifest_names_the_process_whose_memory_is_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = tmp.path().join("config");
    std::fs::create_dir(&config).expect("mkdir");
    let values: Vec<f32> = (0..8).map(|i| i as f32 + 0.25).collect();
    let memory = f32_bytes(&values);
    let of = |pid: u32| {
        serde_json::json!({
            "format": devmap::formats::live::FORMAT,
            "config_dir": config,
            "pid": pid,
            "tensors": [{"name": "w", "dtype": "float32", "shape": [8], "device": "cpu",
                "source": {"kind": "memory", "address": memory.as_ptr() as u64}}],
        })
        .to_string()
    };
    let out = tmp.path().join("here");
    save(&of(std::process::id()), &out, None).expect("saves");
    assert_eq!(common::read_saved(&out)["w"].data, memory);

    let mut gone = std::process::Command::new("true").spawn().expect("true");
    let pid = gone.id();
    gone.wait().expect("waited");
    let out = tmp.path().join("gone");
    let err = save(&of(pid), &out, None).expect_err("refused").to_string();
    for want in [
        format!("/proc/{pid}/mem"),
        "the Python session's memory cannot be read".to_owned(),
        "ptrace_scope".to_owned(),
    ] {
        assert!(err.contains(&want), "{want:?} not in: {err}");
    }
    assert!(!out.exists(), "{err}");
}
