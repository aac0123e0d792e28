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
    /// NVML from the driver's library, found as the system finds it.
    pub fn open() -> Nvml {
        Nvml::from_init(nvml_wrapper::Nvml::init())
    }

    /// NVML from the library at `path` (for a driver installed out of the way).
    pub fn open_library(path: &std::ffi::OsStr) -> Nvml {
        Nvml::from_init(nvml_wrapper::Nvml::builder().lib_path(path).init())
    }

    fn from_init(init: Result<nvml_wrapper::Nvml, nvml_wrapper::error::NvmlError>) -> Nvml {
        match init {
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
        match &self.nvml {
            None => self.why_not.clone(),
            Some(nvml) if nvml.device_count().unwrap_or(0) == 0 => {
                Some("no GPU gauges: the NVIDIA driver reports no GPU".into())
            }
            Some(_) => None,
        }
    }
}

/// The GPUs present now, through NVML.
pub fn detect() -> Vec<GpuInfo> {
    Nvml::open().gpus()
}

/// A fixed list, for tests of the gauges and budgets (real hardware is tested on a
/// GPU machine; see docs/guide.md).
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
    fn a_missing_driver_library_means_no_gpus_and_a_note() {
        let mut nvml = Nvml::open_library(std::ffi::OsStr::new(
            "/nonexistent/devmap-test/libnvidia-ml.so.1",
        ));
        assert!(nvml.gpus().is_empty());
        assert_eq!(
            nvml.note().as_deref(),
            Some("no GPU gauges: no NVIDIA driver found")
        );
    }
}
