//! The Rust side of asking transformers (`--transformers PYTHON`), with a stand-in
//! Python that answers the protocol (the real one: tests/real/oracle.rs): its answer
//! replaces devmap's table in verify and in the save's report, the report names the
//! source, the answer is cached per config and version, `--transformers none` and an
//! unusable Python fall back to the table, and a `--transformers` that cannot import
//! transformers is an error naming it.

mod common;

use std::path::Path;

use common::{arg, devmap, stderr, stdout};
use devmap::fixtures::{LlamaShape, llama_config, llama_like, write_json, write_safetensors};
use devmap::types::DType;

const SHAPE: LlamaShape = LlamaShape {
    layers: 1,
    hidden: 8,
    intermediate: 12,
    vocab: 16,
    dtype: DType::BF16,
};

/// A stand-in for a Python with transformers: it reports version 5.99.0, and answers
/// that the model holds what `names` says (each `[name, dtype, shape]`), counting how
/// often it was asked in `asked`.
fn fake_python(dir: &Path, saved: &serde_json::Value) -> std::path::PathBuf {
    let answer = serde_json::json!({
        "transformers": "5.99.0", "torch": "2.99.0", "architecture": "LlamaForCausalLM",
        "dtype": "bfloat16", "saved": saved, "runtime": null, "buffers": [],
        "no_split": ["LlamaDecoderLayer"], "kept_fp32": [], "tied": ["lm_head.weight"],
        "empty_modules": ["model.mystery"],
    });
    let path = dir.join("python");
    let script = format!(
        "#!/bin/sh\ncase \"$2\" in\n  *importlib.metadata*) echo 5.99.0 ;;\n  *) echo asked >> '{}'; echo 'a logger line'; echo 'devmap-answer: {}' ;;\nesac\n",
        dir.join("asked").display(),
        answer
    );
    std::fs::write(&path, script).expect("script");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

fn model(dir: &Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let ts = llama_like(SHAPE);
    write_safetensors(
        &dir.join("model.safetensors"),
        &ts.iter().collect::<Vec<_>>(),
    )
    .expect("write");
    write_json(&dir.join("config.json"), &llama_config(SHAPE)).expect("config");
}

/// The model's tensors as transformers' answer lists them.
fn entries() -> Vec<serde_json::Value> {
    llama_like(SHAPE)
        .iter()
        .map(|t| serde_json::json!([t.name, t.dtype.torch_name(), t.shape]))
        .collect()
}

#[test]
fn the_answer_replaces_the_table_names_its_source_and_is_cached() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    model(&src);
    // transformers says there is one more tensor than the checkpoint holds.
    let mut saved = entries();
    saved.push(serde_json::json!([
        "model.extra.weight",
        "bfloat16",
        [8, 8]
    ]));
    let python = fake_python(tmp.path(), &serde_json::Value::Array(saved));
    let cache = tmp.path().join("cache");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_devmap"))
            .args(args)
            .env("XDG_CACHE_HOME", &cache)
            .output()
            .expect("run")
    };
    let o = run(&["verify", arg(&src), "--transformers", arg(&python)]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("model.extra.weight: MISSING")
            && stdout(&o).contains("(LlamaForCausalLM, transformers 5.99.0, asked): 1 problem"),
        "{}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("expectations from transformers 5.99.0 (--transformers: "),
        "{}",
        stderr(&o)
    );
    // Asked once: the second run reads the cache.
    let o = run(&["verify", arg(&src), "--transformers", arg(&python)]);
    assert_eq!(o.status.code(), Some(1));
    let asked = std::fs::read_to_string(tmp.path().join("asked")).expect("asked");
    assert_eq!(asked.lines().count(), 1, "cached");
    // The save's report before writing says what transformers would say.
    let o = run(&[
        "save",
        arg(&src),
        "--out",
        arg(&tmp.path().join("out")),
        "--transformers",
        arg(&python),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("warning: model.extra.weight: MISSING"),
        "{}",
        stderr(&o)
    );
    // The table alone: devmap's Llama has no such tensor.
    let o = run(&["verify", arg(&src), "--transformers", "none"]);
    assert!(o.status.success(), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("devmap's table of transformers"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_python_without_transformers_is_an_error_when_named_and_ignored_otherwise() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    model(&src);
    let missing = tmp.path().join("no-such-python");
    let o = devmap(&["verify", arg(&src), "--transformers", arg(&missing)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no-such-python") && stderr(&o).contains("--transformers"),
        "{}",
        stderr(&o)
    );
    // From the environment: not an error, the table answers.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_devmap"))
        .args(["verify", arg(&src)])
        .env("DEVMAP_PYTHON", &missing)
        .output()
        .expect("run");
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("devmap's table"), "{}", stdout(&o));
}

#[test]
fn a_map_key_for_a_module_transformers_says_holds_no_tensors_is_accepted() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    model(&src);
    // `hf_device_map` names every module, parameter-less ones too.
    write_json(
        &src.join("device_map.json"),
        &serde_json::json!({"model": "cpu", "model.mystery": "cpu"}),
    )
    .expect("map");
    let python = fake_python(tmp.path(), &serde_json::Value::Array(entries()));
    let cache = tmp.path().join("cache");
    let save = |out: &str, with: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_devmap"))
            .args(["save", arg(&src), "--out", arg(&tmp.path().join(out))])
            .args(["--transformers", with])
            .env("XDG_CACHE_HOME", &cache)
            .output()
            .expect("run")
    };
    // The table knows no such module: a key that covers nothing is refused.
    let o = save("table", "none");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("`model.mystery`"), "{}", stderr(&o));
    let o = save("with-answer", arg(&python));
    assert!(o.status.success(), "{}", stderr(&o));
}
