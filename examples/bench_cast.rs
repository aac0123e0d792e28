//! Cast throughput for all six pairs of float32, bfloat16 and float16 (a benchmark, not
//! a test):
//!
//!     cargo run --release --example bench_cast
//!
//! Casts 64 M elements in the saver's 8 MiB blocks, five times each, and reports the
//! median time, the output rate, and the time of a plain copy of the same output bytes
//! (`copy_from_slice`, what a page-cache write costs at best) for scale.

use std::time::{Duration, Instant};

use devmap::save::cast::cast;
use devmap::types::DType;

const ELEMENTS: usize = 64 << 20;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let pairs = [
        (DType::F32, DType::BF16),
        (DType::F32, DType::F16),
        (DType::BF16, DType::F32),
        (DType::F16, DType::F32),
        (DType::BF16, DType::F16),
        (DType::F16, DType::BF16),
    ];
    println!("| cast | median | output rate | plain copy of the output | ratio |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (from, to) in pairs {
        let (fs, ts) = (from.size() as usize, to.size() as usize);
        // Values spread over the normal range, a few NaNs and infinities among them.
        let src: Vec<u8> = (0..ELEMENTS)
            .flat_map(|i| {
                let x = ((i % 10_007) as f32 - 5_000.0) * 0.013;
                let bits = x.to_bits();
                match fs {
                    4 => bits.to_le_bytes().to_vec(),
                    _ => ((bits >> 16) as u16).to_le_bytes().to_vec(),
                }
            })
            .collect();
        let mut dst = vec![0u8; ELEMENTS * ts];
        let block = (8 << 20) / fs;
        let mut casts = Vec::new();
        let mut copies = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for (i, o) in src.chunks(block * fs).zip(dst.chunks_mut(block * ts)) {
                cast(from, to, i, o);
            }
            casts.push(t.elapsed());
            let same = vec![7u8; dst.len()];
            let t = Instant::now();
            dst.copy_from_slice(&same);
            copies.push(t.elapsed());
        }
        let (c, p) = (median(casts), median(copies));
        println!(
            "| {from} → {to} | {:.1} ms | {:.2} GB/s | {:.1} ms | {:.2}× |",
            c.as_secs_f64() * 1e3,
            dst.len() as f64 / c.as_secs_f64() / 1e9,
            p.as_secs_f64() * 1e3,
            c.as_secs_f64() / p.as_secs_f64()
        );
    }
}
