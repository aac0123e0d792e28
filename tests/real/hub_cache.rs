//! huggingface_hub fills a cache from the local Hub-like server and devmap opens the
//! repo id where huggingface_hub finds it (tests/python/hub_cache.py). Ignored by a
//! bare `cargo test`; `.ci/run` runs it with the reference libraries installed.

use std::process::Command;

use crate::common::hub_server::{self, ServerOptions};
use devmap::fixtures::{LlamaShape, llama_config, llama_like, write_json, write_sharded};
use devmap::types::DType;

#[test]
#[ignore = "needs huggingface_hub (with torch, transformers): run .ci/run"]
fn devmap_reads_the_cache_huggingface_hub_writes() {
    let py = crate::common::hf_python().unwrap_or_else(|why| panic!("cannot run: {why}"));
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let shape = LlamaShape {
        layers: 2,
        hidden: 32,
        intermediate: 64,
        vocab: 128,
        dtype: DType::BF16,
    };
    write_sharded(&src, &llama_like(shape), 2).expect("shards");
    write_json(&src.join("config.json"), &llama_config(shape)).expect("config");
    let root = tmp.path().join("www");
    hub_server::publish(&root, "acme/cached", "main", &src).expect("publish");
    let server = hub_server::start(&root, ServerOptions::default()).expect("server");
    let mut files: Vec<String> = std::fs::read_dir(&src)
        .expect("src")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let cache = tmp.path().join("cache");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/hub_cache.py");
    let o = Command::new(py)
        .env("HF_HUB_DISABLE_XET", "1")
        .env_remove("HF_HUB_OFFLINE")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_devmap"))
        .arg(server.endpoint())
        .arg(&cache)
        .arg("acme/cached")
        .args(&files)
        .output()
        .expect("python");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("ok: devmap opens acme/cached"), "{out}");
}
