//! Writes a Llama-like model directory of about SIZE_MB for benchmarks:
//!
//!     cargo run --release --example gen_model -- OUT_DIR SIZE_MB [SHARDS] [bf16|f16|f32]
//!
//! Sharded safetensors (written by the `safetensors` crate), a device map that puts the
//! last quarter of the layers on disk, and an accelerate `.dat` offload folder for them
//! with values that differ from the checkpoint.

use std::path::PathBuf;

use devmap::fixtures::{
    FixtureTensor, LlamaShape, llama_config, llama_like, write_json, write_offload_dat,
    write_sharded,
};
use devmap::types::DType;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        || std::io::Error::other("usage: gen_model OUT_DIR SIZE_MB [SHARDS] [bf16|f16|f32]");
    let dir = PathBuf::from(args.first().ok_or_else(usage)?);
    let size_mb: u64 = args.get(1).and_then(|s| s.parse().ok()).ok_or_else(usage)?;
    let shards: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4);
    // f16 lets numpy-based peers read every tensor (numpy has no bfloat16).
    let dtype = match args.get(3).map(String::as_str) {
        Some("f16") => DType::F16,
        Some("f32") => DType::F32,
        _ => DType::BF16,
    };
    // A layer of hidden h, intermediate 2.75h is about size·(4h² + 3·2.75h²) bytes.
    let hidden = 1024u64;
    let per_layer = dtype.size() * (4 * hidden * hidden + 3 * 2816 * hidden);
    let layers = ((size_mb << 20) / per_layer).max(2) as usize;
    let shape = LlamaShape {
        layers,
        hidden,
        intermediate: 2816,
        vocab: 8192,
        dtype,
    };
    std::fs::create_dir_all(&dir)?;
    let tensors = llama_like(shape);
    write_sharded(&dir, &tensors, shards)?;
    write_json(&dir.join("config.json"), &llama_config(shape))?;
    let on_disk = layers - layers / 4;
    let mut map = serde_json::Map::new();
    map.insert("model.embed_tokens".into(), "cpu".into());
    for l in 0..layers {
        let device = if l >= on_disk { "disk" } else { "cpu" };
        map.insert(format!("model.layers.{l}"), device.into());
    }
    map.insert("model.norm".into(), "cpu".into());
    map.insert("lm_head".into(), "cpu".into());
    write_json(
        &dir.join("device_map.json"),
        &serde_json::Value::Object(map),
    )?;
    let offloaded: Vec<FixtureTensor> = tensors
        .iter()
        .filter(|t| {
            t.name
                .strip_prefix("model.layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|l| l.parse::<usize>().ok())
                .is_some_and(|l| l >= on_disk)
        })
        .map(|t| FixtureTensor::patterned(&t.name, t.dtype, &t.shape, 42 + t.data.len() as u64))
        .collect();
    write_offload_dat(&dir.join("offload"), &offloaded)?;
    let bytes: u64 = tensors.iter().map(|t| t.data.len() as u64).sum();
    println!(
        "{} tensors, {} layers, {} MiB in {}",
        tensors.len(),
        layers,
        bytes >> 20,
        dir.display()
    );
    Ok(())
}
