//! GPU memory through NVML, found at run time: nvml-wrapper loads the driver's
//! `libnvidia-ml.so` when asked, so building and testing need no GPU or CUDA. No
//! driver, no GPU, or an NVML error all mean "no GPUs": no gauge, a one-line note,
//! never an error.

/// One GPU's memory, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub total: u64,
    pub free: u64,
}

/// Something that reports GPUs: NVML on a real machine, a fixed list in tests.
pub trait GpuSource: Send {
    fn gpus(&mut self) -> Vec<GpuInfo>;
    /// Why there are no GPUs, when there are none (for the one-line note).
    fn note(&self) -> Option<String>;
}

/// NVML, opened once and asked again on each sample.
pub struct Nvml {
    nvml: Option<nvml_wrapper::Nvml>,
    why_not: Option<String>,
}

impl Nvml {
    pub fn open() -> Nvml {
        match nvml_wrapper::Nvml::init() {
            Ok(nvml) => Nvml {
                nvml: Some(nvml),
                why_not: None,
            },
            Err(nvml_wrapper::error::NvmlError::LibloadingError(_)) => Nvml {
                nvml: None,
                why_not: Some("no GPU gauges: no NVIDIA driver found".into()),
            },
            Err(e) => Nvml {
                nvml: None,
                why_not: Some(format!("no GPU gauges: NVML says {e}")),
            },
        }
    }
}

impl GpuSource for Nvml {
    fn gpus(&mut self) -> Vec<GpuInfo> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|index| {
                let device = nvml.device_by_index(index).ok()?;
                let memory = device.memory_info().ok()?;
                Some(GpuInfo {
                    index,
                    name: device.name().unwrap_or_else(|_| format!("GPU {index}")),
                    total: memory.total,
                    free: memory.free,
                })
            })
            .collect()
    }

    fn note(&self) -> Option<String> {
        if self.nvml.is_none() {
            return self.why_not.clone();
        }
        None
    }
}

/// The GPUs present now, through NVML.
pub fn detect() -> Vec<GpuInfo> {
    Nvml::open().gpus()
}

/// A fixed list, for tests of the gauges and budgets (real hardware is tested on a
/// GPU machine; see the README).
#[derive(Debug, Clone, Default)]
pub struct FixedGpus(pub Vec<GpuInfo>);

impl GpuSource for FixedGpus {
    fn gpus(&mut self) -> Vec<GpuInfo> {
        self.0.clone()
    }

    fn note(&self) -> Option<String> {
        self.0
            .is_empty()
            .then(|| "no GPUs (test double)".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_a_driver_has_no_gpus_and_says_why() {
        // This machine may or may not have a GPU; either answer is no panic, and no
        // GPUs always comes with a note.
        let mut nvml = Nvml::open();
        let gpus = nvml.gpus();
        if gpus.is_empty() {
            assert!(nvml.note().is_some());
        } else {
            assert!(gpus.iter().all(|g| g.free <= g.total && g.total > 0));
        }
    }
}
