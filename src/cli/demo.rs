//! The bundled demo model, carried inside the binary: `devmap` with no argument opens
//! it from the source tree when there is one (a checkout), and otherwise unpacks the
//! copy the binary carries into a fresh folder of the system's temporary folder,
//! removed when devmap exits (an installed devmap works anywhere, and leaves nothing).

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

/// The demo model's folder for as long as this lives: the source tree's, or the
/// built-in copy unpacked into a fresh folder of the temporary folder, removed again
/// when this is dropped (devmap leaves nothing in the temporary folder).
/// `DEVMAP_DEMO_EMBEDDED=1` uses the built-in copy even in a checkout (the test of an
/// installed devmap).
pub struct Demo {
    pub dir: PathBuf,
    unpacked: bool,
}

impl Drop for Demo {
    fn drop(&mut self) {
        if self.unpacked {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn demo_dir() -> Result<Demo> {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("assets")
        .join("demo");
    if source.is_dir() && std::env::var_os("DEVMAP_DEMO_EMBEDDED").is_none() {
        return Ok(Demo {
            dir: source,
            unpacked: false,
        });
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "devmap-demo-{}-{}-{nanos:08x}",
        env!("CARGO_PKG_VERSION"),
        std::process::id()
    ));
    // From here on the folder is removed when the demo is done, whatever happens.
    let demo = Demo {
        dir,
        unpacked: true,
    };
    unpack(&demo.dir).wrap_err_with(|| {
        format!(
            "cannot unpack the bundled demo model into {}",
            demo.dir.display()
        )
    })?;
    Ok(demo)
}

/// Writes the demo's files into `dir`, a folder no one else uses.
fn unpack(dir: &Path) -> std::io::Result<()> {
    for (name, bytes) in FILES {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::FILES;

    /// The built-in copy is assets/demo byte for byte, every file of it (a file added
    /// there and not to the built-in list fails).
    #[test]
    fn the_built_in_demo_is_assets_demo() {
        let bundled = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo");
        let mut names = Vec::new();
        for dir in [bundled.clone(), bundled.join("offload")] {
            for e in std::fs::read_dir(&dir).expect("ls") {
                let path = e.expect("entry").path();
                if path.is_file() {
                    let name = path.strip_prefix(&bundled).expect("inside");
                    names.push(name.to_string_lossy().into_owned());
                }
            }
        }
        names.sort();
        let mut built_in: Vec<String> = FILES.iter().map(|(n, _)| (*n).to_owned()).collect();
        built_in.sort();
        assert_eq!(names, built_in);
        for (name, bytes) in FILES {
            assert_eq!(
                std::fs::read(bundled.join(name)).expect("read"),
                *bytes,
                "{name}"
            );
        }
    }
}
