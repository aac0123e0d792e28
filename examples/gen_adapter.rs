//! Writes a peft-style LoRA adapter for a model folder, for benchmarks: rank R on every
//! linear projection (`*_proj.weight`), float32, patterned non-zero values.
//!
//!     cargo run --release --example gen_adapter -- MODEL_DIR OUT_DIR [RANK]

use std::path::PathBuf;

use devmap::fixtures::{FixtureTensor, write_json, write_safetensors};
use devmap::model::{LoadOptions, load};
use devmap::types::DType;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || std::io::Error::other("usage: gen_adapter MODEL_DIR OUT_DIR [RANK]");
    let model = PathBuf::from(args.first().ok_or_else(usage)?);
    let out = PathBuf::from(args.get(1).ok_or_else(usage)?);
    let rank: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(16);
    let ckpt = load(&model, &LoadOptions::default()).map_err(std::io::Error::other)?;
    let mut tensors = Vec::new();
    let mut targets = std::collections::BTreeSet::new();
    for (i, t) in ckpt.tensors().iter().enumerate() {
        let Some(module) = t.name.strip_suffix(".weight") else {
            continue;
        };
        let dims: Vec<u64> = t.shape.iter().collect();
        if !module.ends_with("_proj") || dims.len() != 2 {
            continue;
        }
        targets.insert(module.rsplit('.').next().unwrap_or(module).to_owned());
        let key = format!("base_model.model.{module}");
        let mut a = FixtureTensor::patterned(
            &format!("{key}.lora_A.weight"),
            DType::F32,
            &[rank, dims[1]],
            2 * i as u64,
        );
        let mut b = FixtureTensor::patterned(
            &format!("{key}.lora_B.weight"),
            DType::F32,
            &[dims[0], rank],
            2 * i as u64 + 1,
        );
        // Small finite values, as trained adapters hold.
        for t in [&mut a, &mut b] {
            for (k, chunk) in t.data.chunks_exact_mut(4).enumerate() {
                let v = ((k * 7919 + i) % 2001) as f32 / 1000.0 - 1.0;
                chunk.copy_from_slice(&(v * 0.01).to_le_bytes());
            }
        }
        tensors.push(a);
        tensors.push(b);
    }
    std::fs::create_dir_all(&out)?;
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    write_safetensors(&out.join("adapter_model.safetensors"), &refs)?;
    write_json(
        &out.join("adapter_config.json"),
        &serde_json::json!({
            "peft_type": "LORA",
            "r": rank,
            "lora_alpha": 2 * rank,
            "target_modules": targets.into_iter().collect::<Vec<_>>(),
            "task_type": "CAUSAL_LM",
        }),
    )?;
    eprintln!(
        "{} LoRA pairs of rank {rank} in {}",
        tensors.len() / 2,
        out.display()
    );
    Ok(())
}
