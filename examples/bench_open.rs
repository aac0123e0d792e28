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
        .map_or_else(|| PathBuf::from("target/bench/moe"), PathBuf::from);
    // Memory first, in a fresh process: what one loaded model and its tree hold.
    let rss_before = devmap::monitor::rss_bytes().unwrap_or(0);
    let ckpt = load(&dir, &LoadOptions::default()).map_err(std::io::Error::other)?;
    let rss_model = devmap::monitor::rss_bytes().unwrap_or(0);
    let tree = ModuleTree::build(&ckpt);
    let rss_tree = devmap::monitor::rss_bytes().unwrap_or(0);
    let names: usize = ckpt.tensors().iter().map(|t| t.name.len()).sum();
    let n = ckpt.tensors().len();
    let model_bytes = rss_model.saturating_sub(rss_before) as f64;
    println!(
        "resident: model {} ({:.0} bytes per tensor beyond its {:.0}-byte name), tree {} ({:.0} bytes per tensor)",
        devmap::human_bytes(rss_model.saturating_sub(rss_before)),
        (model_bytes - names as f64) / n as f64,
        names as f64 / n as f64,
        devmap::human_bytes(rss_tree.saturating_sub(rss_model)),
        rss_tree.saturating_sub(rss_model) as f64 / n as f64,
    );
    // What the structures themselves take, without the allocator's retained garbage
    // from parsing: the Tensor record, plus any shape too big to sit inline.
    let structural: usize = ckpt
        .tensors()
        .iter()
        .map(|t| {
            let heap = match &t.shape {
                devmap::model::shape::Shape::Heap(d) => d.len() * 8,
                devmap::model::shape::Shape::Inline { .. } => 0,
            };
            std::mem::size_of::<devmap::model::Tensor>() + heap
        })
        .sum();
    println!(
        "structural: {:.0} bytes per tensor beyond its name ({}-byte Tensor record, shapes inline)",
        structural as f64 / n as f64,
        std::mem::size_of::<devmap::model::Tensor>()
    );
    drop((ckpt, tree));
    let mut times: Vec<Duration> = Vec::new();
    let mut kept = None;
    for _ in 0..7 {
        let t = Instant::now();
        let ckpt = load(&dir, &LoadOptions::default()).map_err(std::io::Error::other)?;
        let load_time = t.elapsed();
        let tree = ModuleTree::build(&ckpt);
        times.push(t.elapsed());
        eprintln!(
            "load {:.1} ms, load+tree {:.1} ms",
            load_time.as_secs_f64() * 1e3,
            t.elapsed().as_secs_f64() * 1e3
        );
        kept = Some((ckpt, tree));
    }
    let (ckpt, tree) = kept.ok_or_else(|| std::io::Error::other("no run"))?;
    times.sort();
    println!(
        "{n} tensors in {} files: open + tree median {:.1} ms, worst {:.1} ms",
        ckpt.files.len(),
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3
    );
    std::hint::black_box((&ckpt, &tree));
    Ok(())
}
