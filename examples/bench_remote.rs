//! Header fetch of a remote model over HTTP range requests, from the local Hub-like
//! server (the same one the tests use), on the giant sparse MoE of `bench_tui`:
//! 160 shards, 92,583 tensors describing 657 GiB.
//!
//!     cargo run --release --example bench_remote
//!
//! Prints the requests made, the bytes moved (against the model's size), the time,
//! and the time to read the fetched headers into a model.

// The tests' Hub-like server: test code, so it lives under tests/ and not in the
// library.
#[path = "../tests/common/hub_server.rs"]
#[allow(dead_code)]
mod hub_server;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Instant;

use devmap::fixtures::{MoeShape, write_sparse_moe};
use devmap::remote::{PARALLEL_FETCHES, Source, fetch};
use hub_server::ServerOptions;

fn main() -> std::io::Result<()> {
    let root = PathBuf::from("target/bench/hub");
    let repo = root.join("acme/giant/main");
    if !repo.join("model.safetensors.index.json").exists() {
        eprintln!("generating the sparse MoE in {} …", repo.display());
        write_sparse_moe(&repo, MoeShape::GIANT)?;
    }
    let server = hub_server::start(&root, ServerOptions::default())?;
    let source = Source::Hub {
        endpoint: server.endpoint(),
        repo: "acme/giant".into(),
        revision: "main".into(),
    };
    let mut best: Option<f64> = None;
    let mut last = None;
    for _ in 0..3 {
        let started = Instant::now();
        let mirror = fetch(&source, None, &|_, _| {}).map_err(std::io::Error::other)?;
        let secs = started.elapsed().as_secs_f64();
        best = Some(best.map_or(secs, |b: f64| b.min(secs)));
        last = Some(mirror);
    }
    let mirror = last.expect("three runs");
    let started = Instant::now();
    let ckpt = devmap::model::load(&mirror.dir, &devmap::model::LoadOptions::default())
        .map_err(std::io::Error::other)?;
    let load_secs = started.elapsed().as_secs_f64();
    let runs = 3;
    println!(
        "{} shards, {} tensors, model {} ({} bytes)",
        mirror.shards,
        ckpt.tensors().len(),
        devmap::human_bytes(mirror.model_bytes),
        mirror.model_bytes
    );
    println!(
        "per fetch: {} requests ({} in flight), {} received ({} bytes, {:.5}% of the model); server saw {} requests and sent {} body bytes over {runs} runs",
        mirror.requests,
        PARALLEL_FETCHES,
        devmap::human_bytes(mirror.bytes),
        mirror.bytes,
        mirror.bytes as f64 * 100.0 / mirror.model_bytes as f64,
        server.stats.requests.load(Ordering::Relaxed),
        server.stats.body_bytes.load(Ordering::Relaxed),
    );
    println!(
        "fetch time (best of {runs}, loopback): {:.2} s; reading the mirror into a model: {:.2} s",
        best.unwrap_or(0.0),
        load_secs
    );
    Ok(())
}
