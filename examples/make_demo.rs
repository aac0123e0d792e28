//! Regenerates the bundled demo model in `assets/demo`:
//!
//!     cargo run --example make_demo
//!
//! A small Llama-like model (6 layers, BF16 with F32 norms, tied `lm_head`) sharded in
//! two files, with a device map over two GPUs, cpu and disk, and an accelerate offload
//! folder (`.dat` form) for the disk part whose values differ from the checkpoint, as
//! after a merge.

use std::path::PathBuf;

use devmap::fixtures::{
    FixtureTensor, LlamaShape, llama_config, llama_like, write_json, write_offload_dat,
    write_sharded,
};
use devmap::model::DType;

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("assets")
        .join("demo");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    let shape = LlamaShape {
        layers: 6,
        hidden: 128,
        intermediate: 344,
        vocab: 1024,
        dtype: DType::BF16,
    };
    let tensors = llama_like(shape);
    write_sharded(&dir, &tensors, 2)?;
    write_json(&dir.join("config.json"), &llama_config(shape))?;
    write_json(
        &dir.join("generation_config.json"),
        &serde_json::json!({"bos_token_id": 1, "eos_token_id": 2}),
    )?;
    write_json(
        &dir.join("device_map.json"),
        &serde_json::json!({
            "model.embed_tokens": 0,
            "model.layers.0": 0,
            "model.layers.1": 0,
            "model.layers.2": 1,
            "model.layers.3": 1,
            "model.layers.4": "cpu",
            "model.layers.5.self_attn": "cpu",
            "model.layers.5.mlp": "disk",
            "model.layers.5.input_layernorm": "cpu",
            "model.layers.5.post_attention_layernorm": "disk",
            "model.norm": "disk",
            "lm_head": 0
        }),
    )?;
    // The disk part, with new values (seeds differ from the checkpoint's).
    let offloaded: Vec<FixtureTensor> = tensors
        .iter()
        .filter(|t| {
            t.name.starts_with("model.layers.5.mlp")
                || t.name.starts_with("model.layers.5.post")
                || t.name == "model.norm.weight"
        })
        .enumerate()
        .map(|(i, t)| FixtureTensor::patterned(&t.name, t.dtype, &t.shape, 1000 + i as u64))
        .collect();
    write_offload_dat(&dir.join("offload"), &offloaded)?;
    println!("wrote {}", dir.display());
    Ok(())
}
