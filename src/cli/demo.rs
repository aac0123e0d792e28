//! The bundled demo model, carried inside the binary: `devmap` with no argument opens
//! it from the source tree when there is one (a checkout), and otherwise unpacks the
//! copy the binary carries into the system's temporary folder (an installed devmap
//! works anywhere).

use std::path::{Path, PathBuf};

use color_eyre::eyre::{Result, WrapErr};

/// Every file of `assets/demo`, as built in.
const FILES: &[(&str, &[u8])] = &[
    (
        "config.json",
        include_bytes!("../../assets/demo/config.json"),
    ),
    (
        "device_map.json",
        include_bytes!("../../assets/demo/device_map.json"),
    ),
    (
        "generation_config.json",
        include_bytes!("../../assets/demo/generation_config.json"),
    ),
    (
        "model-00001-of-00002.safetensors",
        include_bytes!("../../assets/demo/model-00001-of-00002.safetensors"),
    ),
    (
        "model-00002-of-00002.safetensors",
        include_bytes!("../../assets/demo/model-00002-of-00002.safetensors"),
    ),
    (
        "model.safetensors.index.json",
        include_bytes!("../../assets/demo/model.safetensors.index.json"),
    ),
    (
        "offload/index.json",
        include_bytes!("../../assets/demo/offload/index.json"),
    ),
    (
        "offload/model.layers.5.mlp.down_proj.weight.dat",
        include_bytes!("../../assets/demo/offload/model.layers.5.mlp.down_proj.weight.dat"),
    ),
    (
        "offload/model.layers.5.mlp.gate_proj.weight.dat",
        include_bytes!("../../assets/demo/offload/model.layers.5.mlp.gate_proj.weight.dat"),
    ),
    (
        "offload/model.layers.5.mlp.up_proj.weight.dat",
        include_bytes!("../../assets/demo/offload/model.layers.5.mlp.up_proj.weight.dat"),
    ),
    (
        "offload/model.layers.5.post_attention_layernorm.weight.dat",
        include_bytes!(
            "../../assets/demo/offload/model.layers.5.post_attention_layernorm.weight.dat"
        ),
    ),
    (
        "offload/model.norm.weight.dat",
        include_bytes!("../../assets/demo/offload/model.norm.weight.dat"),
    ),
];

/// The demo's folder: the source tree's, or the built-in copy unpacked (once per
/// version) into the temporary folder. `DEVMAP_DEMO_EMBEDDED=1` uses the built-in
/// copy even in a checkout (the test of an installed devmap).
pub fn demo_dir() -> Result<PathBuf> {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("assets")
        .join("demo");
    if source.is_dir() && std::env::var_os("DEVMAP_DEMO_EMBEDDED").is_none() {
        return Ok(source);
    }
    let dir = std::env::temp_dir().join(format!("devmap-demo-{}", env!("CARGO_PKG_VERSION")));
    if !unpacked(&dir) {
        unpack(&dir).wrap_err_with(|| {
            format!(
                "cannot unpack the bundled demo model into {}",
                dir.display()
            )
        })?;
    }
    Ok(dir)
}

/// Whether `dir` holds every demo file, each the built-in one's size.
fn unpacked(dir: &Path) -> bool {
    FILES.iter().all(|(name, bytes)| {
        std::fs::symlink_metadata(dir.join(name))
            .is_ok_and(|m| m.is_file() && m.len() == bytes.len() as u64)
    })
}

/// Writes the files into a fresh folder beside `dir`, then renames it into place, so a
/// half-written demo is never opened.
fn unpack(dir: &Path) -> std::io::Result<()> {
    let staging = dir.with_file_name(format!(
        "{}.partial-{}",
        dir.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&staging);
    for (name, bytes) in FILES {
        let path = staging.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes)?;
    }
    // Another devmap may have unpacked it meanwhile: theirs is as good.
    if std::fs::rename(&staging, dir).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
        if !unpacked(dir) {
            let _ = std::fs::remove_dir_all(dir);
            return Err(std::io::Error::other("a partial demo folder is in the way"));
        }
    }
    Ok(())
}
