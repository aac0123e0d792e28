//! Time to open a model directory (headers, placements, ties) and build its module
//! tree, and the memory the loaded model takes:
//!
//!     cargo run --release --example bench_open [-- DIR]
//!
//! DIR defaults to the sparse MoE that `bench_tui` generates.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use devmap::model::{LoadOptions, ModuleTree, load};

fn main() -> std::io::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/bench/moe"));
    let rss_before = devmap::monitor::rss_bytes().unwrap_or(0);
    let mut times: Vec<Duration> = Vec::new();
    let mut kept = None;
    for _ in 0..7 {
        let t = Instant::now();
        let ckpt = load(&dir, &LoadOptions::default()).map_err(std::io::Error::other)?;
        let load_time = t.elapsed();
        let tree = ModuleTree::build(&ckpt);
        times.push(t.elapsed());
        eprintln!("load {:.1} ms, load+tree {:.1} ms", load_time.as_secs_f64() * 1e3, t.elapsed().as_secs_f64() * 1e3);
        kept = Some((ckpt, tree));
    }
    let (ckpt, tree) = kept.ok_or_else(|| std::io::Error::other("no run"))?;
    times.sort();
    let rss_after = devmap::monitor::rss_bytes().unwrap_or(0);
    let names: usize = ckpt.tensors.iter().map(|t| t.name.len()).sum();
    let n = ckpt.tensors.len();
    println!(
        "{n} tensors in {} files: open + tree median {:.1} ms, worst {:.1} ms",
        ckpt.files.len(),
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3
    );
    let held = rss_after.saturating_sub(rss_before);
    println!(
        "resident after loading: {} for the model and its tree; names {}; {:.0} bytes per tensor beyond its name",
        devmap::human_bytes(held),
        devmap::human_bytes(names as u64),
        (held as f64 - names as f64) / n as f64
    );
    std::hint::black_box((&ckpt, &tree));
    Ok(())
}
