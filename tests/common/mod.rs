//! Shared helpers for the integration tests: generated model directories, reading a
//! saved checkpoint back with the `safetensors` crate, running the binary.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use devmap::fixtures::{
    FixtureTensor, write_json, write_offload_dat, write_safetensors, write_sharded,
};
use devmap::types::DType;

pub mod hub_server;
pub mod journey;
pub mod zygote;

/// A tensor as read back from a saved checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Stored {
    pub fn of(t: &FixtureTensor) -> Stored {
        Stored {
            dtype: t.dtype.safetensors_name().to_owned(),
            shape: t.shape.iter().map(|&d| d as usize).collect(),
            data: t.data.clone(),
        }
    }
}

/// A generated model directory and the value every tensor should have after a save.
pub struct Model {
    pub tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub expected: BTreeMap<String, Stored>,
}

impl Model {
    pub fn out(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }
}

/// The mixed fixture of the core issue: three shards with names dealt out of order,
/// BF16/F16/F32/I64/BOOL/U8, a 0-dim and an empty tensor, an accelerate `.dat` offload
/// folder whose values differ from the checkpoint's, and a tied `lm_head` absent from
/// the weights but named by the device map.
pub fn mixed_model() -> Model {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("model");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut tensors = vec![FixtureTensor::patterned(
        "model.embed_tokens.weight",
        DType::BF16,
        &[64, 16],
        1,
    )];
    let mut seed = 10;
    for l in 0..12 {
        let mut add = |suffix: &str, dtype: DType, shape: &[u64]| {
            tensors.push(FixtureTensor::patterned(
                &format!("model.layers.{l}.{suffix}"),
                dtype,
                shape,
                seed,
            ));
            seed += 1;
        };
        add("proj.weight", DType::F16, &[16, 16]);
        add("norm.weight", DType::F32, &[16]);
        add("mask", DType::Bool, &[7]);
        add("position_ids", DType::I64, &[3]);
        add("codes", DType::U8, &[5]);
    }
    tensors.push(FixtureTensor::patterned(
        "model.scale",
        DType::F32,
        &[],
        500,
    ));
    tensors.push(FixtureTensor::patterned(
        "model.empty",
        DType::F32,
        &[0, 4],
        501,
    ));
    tensors.push(FixtureTensor::patterned(
        "model.norm.weight",
        DType::F32,
        &[16],
        502,
    ));
    write_sharded(&dir, &tensors, 3).expect("shards");
    write_json(
        &dir.join("config.json"),
        // Not a Llama (its layers hold masks, codes and ids): an architecture devmap's
        // tables lack, so verify checks no Llama names against it.
        &serde_json::json!({"architectures": ["ToyForCausalLM"], "model_type": "llama", "tie_word_embeddings": true}),
    )
    .expect("config");
    std::fs::write(dir.join("tokenizer.json"), b"{\"version\": \"1.0\"}").expect("tokenizer");
    // Stale weights of other frameworks beside the safetensors ones.
    std::fs::write(dir.join("pytorch_model.bin"), b"old pickle").expect("bin");
    std::fs::write(dir.join("flax_model.msgpack"), b"old flax").expect("msgpack");
    let mut map = serde_json::Map::new();
    map.insert("model.embed_tokens".into(), 0.into());
    for l in 0..12 {
        let device: serde_json::Value = match l {
            0..=3 => 0.into(),
            4..=7 => "cpu".into(),
            _ => "disk".into(),
        };
        map.insert(format!("model.layers.{l}"), device);
    }
    map.insert("model.scale".into(), "disk".into());
    map.insert("model.empty".into(), "cpu".into());
    map.insert("model.norm".into(), "disk".into());
    map.insert("lm_head".into(), 0.into());
    write_json(
        &dir.join("device_map.json"),
        &serde_json::Value::Object(map),
    )
    .expect("map");

    let offloaded: Vec<FixtureTensor> = tensors
        .iter()
        .filter(|t| {
            [
                "model.layers.8.",
                "model.layers.9.",
                "model.layers.10.",
                "model.layers.11.",
            ]
            .iter()
            .any(|p| t.name.starts_with(p))
                || t.name == "model.scale"
                || t.name == "model.norm.weight"
        })
        .map(|t| {
            FixtureTensor::patterned(
                &t.name,
                t.dtype,
                &t.shape,
                9000 + t.data.len() as u64 + t.name.len() as u64,
            )
        })
        .collect();
    write_offload_dat(&dir.join("offload"), &offloaded).expect("offload");

    let mut expected: BTreeMap<String, Stored> = tensors
        .iter()
        .map(|t| (t.name.clone(), Stored::of(t)))
        .collect();
    for t in &offloaded {
        assert_ne!(
            expected[&t.name].data, t.data,
            "fixture: offload values must differ"
        );
        expected.insert(t.name.clone(), Stored::of(t));
    }
    Model { tmp, dir, expected }
}

/// A model of `files` x `per_file` F32 tensors of `mib` MiB each.
pub fn big_model(dir: &Path, files: usize, per_file: usize, mib: usize) {
    std::fs::create_dir_all(dir).expect("mkdir");
    for f in 0..files {
        let tensors: Vec<FixtureTensor> = (0..per_file)
            .map(|i| {
                let mut data = vec![0u8; mib << 20];
                data[..8].copy_from_slice(&((f * 1000 + i) as u64).to_le_bytes());
                FixtureTensor {
                    name: format!("model.layers.{f}.w{i}"),
                    dtype: DType::F32,
                    shape: vec![(mib as u64) << 18],
                    data,
                }
            })
            .collect();
        let refs: Vec<&FixtureTensor> = tensors.iter().collect();
        write_safetensors(&dir.join(format!("part{f}.safetensors")), &refs).expect("write");
    }
}

/// Reads every tensor of a saved checkpoint with the `safetensors` crate, through its
/// index when there is one. Also checks the index's `weight_map` against the shards.
pub fn read_saved(out: &Path) -> BTreeMap<String, Stored> {
    let index = out.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if index.exists() {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&index).expect("index")).expect("json");
        let map = v["weight_map"].as_object().expect("weight_map");
        let mut files: Vec<String> = map
            .values()
            .map(|f| f.as_str().expect("file").to_owned())
            .collect();
        files.sort();
        files.dedup();
        files.into_iter().map(|f| out.join(f)).collect()
    } else {
        vec![out.join("model.safetensors")]
    };
    let mut all = BTreeMap::new();
    for f in files {
        let bytes = std::fs::read(&f).expect("shard");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("meta");
        assert_eq!(
            meta.metadata()
                .as_ref()
                .and_then(|m| m.get("format"))
                .map(String::as_str),
            Some("pt"),
            "{} lacks format=pt",
            f.display()
        );
        for (name, view) in st.tensors() {
            let prev = all.insert(
                name.clone(),
                Stored {
                    dtype: view.dtype().to_string(),
                    shape: view.shape().to_vec(),
                    data: view.data().to_vec(),
                },
            );
            assert!(prev.is_none(), "{name} written twice");
        }
    }
    all
}

/// Runs the devmap binary. Its answers come from devmap's table, never from a
/// transformers it might find on this machine (`DEVMAP_PYTHON` empty), so the tests
/// read the same everywhere; tests/oracle.rs and the reference-library tests ask one.
pub fn devmap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_devmap"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env("DEVMAP_PYTHON", "")
        .output()
        .expect("run devmap")
}

/// A test path as a command-line argument (every path a test makes is UTF-8).
pub fn arg(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 test path")
}

/// `devmap save DIR --out OUT --quiet EXTRA...`, its output as it came.
pub fn save(dir: &Path, out: &Path, extra: &[&str]) -> Output {
    save_command(dir, out, extra).output().expect("run devmap")
}

/// The command [`save`] runs, for a test that starts it and waits later.
pub fn save_command(dir: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_devmap"));
    command
        .args(["save", arg(dir), "--out", arg(out), "--quiet"])
        .args(extra)
        .env_remove("RUST_BACKTRACE")
        .env("DEVMAP_PYTHON", "");
    command
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every file under `dir` with its length and modification time, to prove a run did
/// not touch its inputs.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, std::time::SystemTime, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let m = std::fs::metadata(&p).expect("meta");
                out.insert(
                    p.clone(),
                    (
                        m.len(),
                        m.modified().expect("mtime"),
                        std::fs::read(&p).expect("read"),
                    ),
                );
            }
        }
    }
    out
}

/// The Python interpreter with the `safetensors` library: `DEVMAP_PYTHON`, the repo's
/// `.venv`, or `python3`.
pub fn python_with(module: &str) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = std::env::var_os("DEVMAP_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"),
            PathBuf::from("python3"),
        ])
        .collect();
    for py in candidates {
        let ok = Command::new(&py)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(py);
        }
    }
    Err(format!(
        "no Python with `{module}` (set DEVMAP_PYTHON or run .ci/run to make .venv)"
    ))
}

/// A Python with torch, transformers and accelerate: `DEVMAP_HF_PYTHON`, the venv
/// `.ci/run` makes (`~/.cache/devmap/venv-hf`), the repo's `.venv-hf`, or `python3`.
/// Found once a test binary: the check imports torch and transformers (about 4 s of a
/// core), and the real-library tests ask for it some fifty times.
pub fn hf_python() -> Result<PathBuf, String> {
    static FOUND: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    FOUND.get_or_init(find_hf_python).clone()
}

fn find_hf_python() -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = std::env::var_os("DEVMAP_HF_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default()
                .join(".cache/devmap/venv-hf/bin/python"),
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-hf/bin/python"),
            PathBuf::from("python3"),
        ])
        .collect();
    for py in candidates {
        let ok = Command::new(&py)
            .args(["-c", "import torch, transformers, accelerate, safetensors"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(py);
        }
    }
    Err("torch, transformers and accelerate are not importable (pip install torch transformers accelerate into .venv-hf to run it)".into())
}

/// Runs one of the tests/python scripts with the devmap binary as its argument;
/// returns whether it succeeded, its stdout and its stderr. The tests that call it
/// are `#[ignore]`d for a bare `cargo test`; run with `--include-ignored` they need
/// the reference libraries and fail without them, never pass by skipping.
pub fn run_hf_script(script: &str) -> (bool, String, String) {
    run_hf_script_with(script, &[])
}

/// [`run_hf_script`] with more environment variables.
pub fn run_hf_script_with(
    script: &str,
    env: &[(&'static str, std::ffi::OsString)],
) -> (bool, String, String) {
    let py = hf_python().unwrap_or_else(|why| panic!("{script} cannot run: {why}"));
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let ran = zygote::run_script(&py, &path, &[env!("CARGO_BIN_EXE_devmap").into()], env);
    eprintln!("{}", ran.stdout);
    (ran.ok, ran.stdout, ran.stderr)
}

/// [`run_hf_script`] with the devmap Python package importable (built here, or the
/// installed one under `.ci/run`).
pub fn run_package_script(script: &str) -> (bool, String, String) {
    let package = python_package();
    run_hf_script_with(script, &package.env())
}

/// Every warning of `ckpt` as the reports print it, one per line.
pub fn warning_text(ckpt: &devmap::model::Checkpoint) -> String {
    devmap::model::checks::all_warnings(ckpt)
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The peak resident set devmap printed on exit (`DEVMAP_REPORT_PEAK_RSS=1`), in bytes.
pub fn peak_rss(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("devmap-peak-rss-bytes="))
        .and_then(|v| v.parse().ok())
        .expect("peak RSS line")
}

/// The devmap Python package for a test. `.ci/run` has installed it with
/// `pip install ./python` into the reference venv and sets
/// `DEVMAP_TEST_INSTALLED_PACKAGE=1`: the installed copy is used as it is. Elsewhere
/// cargo builds the binding (the crate pip builds) and the package is laid out in a
/// temporary folder put on `PYTHONPATH`: `devmap/*.py` from python/devmap,
/// `devmap/_devmap.abi3.so` from the build.
pub struct PythonPackage {
    dir: Option<tempfile::TempDir>,
}

impl PythonPackage {
    /// The environment a Python process needs to import this package.
    pub fn env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        self.dir
            .iter()
            .map(|d| ("PYTHONPATH", d.path().as_os_str().to_owned()))
            .collect()
    }
}

pub fn python_package() -> PythonPackage {
    if std::env::var_os("DEVMAP_TEST_INSTALLED_PACKAGE").is_some_and(|v| v == "1") {
        return PythonPackage { dir: None };
    }
    PythonPackage {
        dir: Some(built_python_package()),
    }
}

fn built_python_package() -> tempfile::TempDir {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let build = Command::new(cargo)
        .args([
            "build",
            "--locked",
            "-p",
            "devmap-python",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(root)
        .output()
        .expect("cargo build");
    let stdout = String::from_utf8_lossy(&build.stdout);
    assert!(
        build.status.success(),
        "building the binding failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let library: PathBuf = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "_devmap")
        .find_map(|m| m["filenames"][0].as_str().map(PathBuf::from))
        .expect("cargo names the built library");
    let tmp = tempfile::tempdir().expect("tempdir");
    let package = tmp.path().join("devmap");
    std::fs::create_dir(&package).expect("mkdir");
    for entry in std::fs::read_dir(root.join("python/devmap")).expect("python/devmap") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "py") {
            std::fs::copy(&path, package.join(path.file_name().expect("name"))).expect("copy");
        }
    }
    std::fs::copy(&library, package.join("_devmap.abi3.so")).expect("copy library");
    tmp
}

/// The bundled demo model's folder (two shards, an index, a map, an offload folder).
pub fn demo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo")
}

/// A copy of the demo's files (not its offload folder) in `tmp/demo`, to damage.
pub fn demo_copy(tmp: &Path) -> PathBuf {
    let dir = tmp.join("demo");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for entry in std::fs::read_dir(demo_dir()).expect("demo").flatten() {
        if entry.path().is_file() {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy");
        }
    }
    dir
}

/// `out` holds exactly `want`, each tensor byte for byte with its shape (read back with
/// the `safetensors` crate); `case` names the case in failures.
pub fn assert_saved_exactly(out: &Path, want: &[FixtureTensor], case: &str) {
    let saved = read_saved(out);
    assert_eq!(saved.len(), want.len(), "{case}: {:?}", saved.keys());
    for t in want {
        let s = &saved[&t.name];
        assert_eq!(s.data, t.data, "{case}: {}", t.name);
        assert_eq!(
            s.shape,
            t.shape.iter().map(|&d| d as usize).collect::<Vec<_>>(),
            "{case}: {}",
            t.name
        );
    }
}

/// A save that must be refused: it failed, named each of `needles` on stderr, and
/// wrote nothing to `out`.
pub fn assert_refused(o: &Output, out: &Path, label: &str, needles: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "{label}: refused");
    for n in needles {
        assert!(err.contains(n), "{label}: the refusal names {n}: {err}");
    }
    assert!(!out.exists(), "{label}: nothing written");
}

/// Cuts `file` to `len` bytes, as a download that stopped leaves it.
pub fn cut(file: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .and_then(|f| f.set_len(len))
        .expect("cut");
}
