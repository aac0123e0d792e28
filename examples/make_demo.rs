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
use devmap::types::DType;

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
    write_lora(&dir.with_file_name("demo-lora"), shape)?;
    Ok(())
}

/// A peft LoRA adapter for the demo (`q_proj` and `v_proj` of every layer, r = 4,
/// alpha = 8, float32), so `--merge-lora assets/demo-lora` can be tried as written.
fn write_lora(dir: &std::path::Path, shape: LlamaShape) -> std::io::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let (r, h) = (4u64, shape.hidden);
    let mut tensors = Vec::new();
    for layer in 0..shape.layers {
        for (k, module) in ["q_proj", "v_proj"].iter().enumerate() {
            let key = format!("base_model.model.model.layers.{layer}.self_attn.{module}");
            for (part, dims) in [("lora_A", [r, h]), ("lora_B", [h, r])] {
                // Small finite values, different per layer, module and part.
                let n = (dims[0] * dims[1]) as usize;
                let seed = layer * 7 + k * 3 + usize::from(part == "lora_B");
                let data: Vec<u8> = (0..n)
                    .flat_map(|i| {
                        let v = (((i * 37 + seed * 101) % 29) as f32 - 14.0) / 400.0;
                        v.to_le_bytes()
                    })
                    .collect();
                tensors.push(FixtureTensor {
                    name: format!("{key}.{part}.weight"),
                    dtype: DType::F32,
                    shape: dims.to_vec(),
                    data,
                });
            }
        }
    }
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    devmap::fixtures::write_safetensors(&dir.join("adapter_model.safetensors"), &refs)?;
    write_json(
        &dir.join("adapter_config.json"),
        &serde_json::json!({
            "peft_type": "LORA",
            "r": r,
            "lora_alpha": 8,
            "target_modules": ["q_proj", "v_proj"],
            "base_model_name_or_path": "assets/demo"
        }),
    )?;
    println!("wrote {}", dir.display());
    Ok(())
}
