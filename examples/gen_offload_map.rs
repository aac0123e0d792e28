//! Gives the sparse MoE of `bench_tui` the device map and offload folder of a real
//! four-device load, for the offload benchmarks (`scripts/bench_offload.sh`):
//!
//!     cargo run --release --example gen_offload_map -- MOE_DIR OUT_DIR
//!
//! Writes two model folders beside each other, both linking MOE_DIR's shards, index
//! and config: `OUT_DIR/mapped` (a `device_map.json` over gpu 0, gpu 1, cpu and disk,
//! a quarter of the layers each, and an empty `offload/`) and `OUT_DIR/offloaded`
//! (the same map, and an accelerate offload folder: `index.json` with an entry for
//! every tensor of the disk layers and a `.dat` of the right length for each, sparse).

use std::path::{Path, PathBuf};

use devmap::model::{LoadOptions, load};

fn link_model(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        let is_model_file = name.to_string_lossy().ends_with(".safetensors")
            || name == "model.safetensors.index.json"
            || name == "config.json";
        let target = to.join(&name);
        if is_model_file && !target.exists() {
            std::os::unix::fs::symlink(std::fs::canonicalize(entry.path())?, target)?;
        }
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || std::io::Error::other("usage: gen_offload_map MOE_DIR OUT_DIR");
    let moe = PathBuf::from(args.first().ok_or_else(usage)?);
    let out = PathBuf::from(args.get(1).ok_or_else(usage)?);
    let ckpt = load(&moe, &LoadOptions::default()).map_err(std::io::Error::other)?;
    let layers = ckpt
        .tensors()
        .iter()
        .filter_map(|t| t.name.strip_prefix("model.layers."))
        .filter_map(|rest| rest.split('.').next()?.parse::<usize>().ok())
        .max()
        .map_or(0, |l| l + 1);
    let device = |layer: usize| match layer * 4 / layers.max(1) {
        0 => serde_json::json!(0),
        1 => serde_json::json!(1),
        2 => serde_json::json!("cpu"),
        _ => serde_json::json!("disk"),
    };
    let mut map = serde_json::Map::new();
    map.insert("model.embed_tokens".into(), serde_json::json!(0));
    for l in 0..layers {
        map.insert(format!("model.layers.{l}"), device(l));
    }
    map.insert("model.norm".into(), serde_json::json!(1));
    map.insert("lm_head".into(), serde_json::json!(1));
    let map = serde_json::Value::Object(map);

    let mapped = out.join("mapped");
    let offloaded = out.join("offloaded");
    for dir in [&mapped, &offloaded] {
        link_model(&moe, dir)?;
        devmap::fixtures::write_json(&dir.join("device_map.json"), &map)?;
        std::fs::create_dir_all(dir.join("offload"))?;
    }
    let folder = offloaded.join("offload");
    // In the checkpoint's (module) order, as accelerate writes it from the state dict.
    let mut index = Vec::new();
    for t in ckpt.tensors() {
        let on_disk = t
            .name
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next()?.parse::<usize>().ok())
            .is_some_and(|l| device(l) == "disk");
        if !on_disk {
            continue;
        }
        let shape: Vec<u64> = t.shape.iter().collect();
        let entry = serde_json::json!({"dtype": t.dtype.torch_name(), "shape": shape});
        index.push(format!(
            "{}: {entry}",
            serde_json::Value::from(t.name.as_ref())
        ));
        let file = std::fs::File::create(folder.join(format!("{}.dat", t.name)))?;
        file.set_len(t.bytes())?;
    }
    let entries = index.len();
    std::fs::write(
        folder.join("index.json"),
        format!("{{\n  {}\n}}\n", index.join(",\n  ")),
    )?;
    println!(
        "{} tensors; {entries} offload entries in {}",
        ckpt.tensors().len(),
        folder.display()
    );
    Ok(())
}
