//! Memory readings: system RAM and this process's resident set, sampled a few times a
//! second for the TUI's gauge; and the peak resident set for benchmarks.
//!
//! The TUI gets readings through [`MemorySource`], so tests feed it fixed numbers.

pub mod gpu;

use std::time::Duration;

/// One reading, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemorySample {
    pub total: u64,
    pub used: u64,
    pub available: u64,
    /// devmap's own resident set.
    pub rss: u64,
    /// The page cache (`Cached` in /proc/meminfo): what a save's copying fills unless
    /// copied input is dropped.
    pub cached: u64,
}

/// Something that can be asked for memory readings.
pub trait MemorySource: Send {
    fn sample(&mut self) -> MemorySample;
}

/// The real machine, through sysinfo (system RAM) and `/proc/self/status` (RSS).
pub struct SystemMemory {
    system: sysinfo::System,
}

impl SystemMemory {
    pub fn new() -> SystemMemory {
        SystemMemory {
            system: sysinfo::System::new(),
        }
    }
}

impl Default for SystemMemory {
    fn default() -> Self {
        SystemMemory::new()
    }
}

impl MemorySource for SystemMemory {
    fn sample(&mut self) -> MemorySample {
        self.system
            .refresh_memory_specifics(sysinfo::MemoryRefreshKind::nothing().with_ram());
        MemorySample {
            total: self.system.total_memory(),
            used: self.system.used_memory(),
            available: self.system.available_memory(),
            rss: rss_bytes().unwrap_or(0),
            cached: page_cache().unwrap_or(0),
        }
    }
}

/// How often the TUI samples memory.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// `MemAvailable` from `/proc/meminfo`: what can be had without swapping.
pub fn available_ram() -> Option<u64> {
    crate::sys::proc::meminfo_bytes("MemAvailable:")
}

/// `Cached` from `/proc/meminfo`: the page cache.
pub fn page_cache() -> Option<u64> {
    crate::sys::proc::meminfo_bytes("Cached:")
}

/// The budgets accelerate would detect: each GPU's free memory (none without a
/// driver) and the available RAM.
pub fn detected_budgets() -> Vec<(crate::model::Placement, u64)> {
    let mut out: Vec<(crate::model::Placement, u64)> = gpu::detect()
        .into_iter()
        .map(|g| (crate::model::Placement::Gpu(g.index), g.free))
        .collect();
    out.push((crate::model::Placement::Cpu, available_ram().unwrap_or(0)));
    out
}

/// Peak resident set size of this process so far (`VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    crate::sys::proc::status_bytes("VmHWM:")
}

/// Current resident set size of this process (`VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    crate::sys::proc::status_bytes("VmRSS:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_readings_are_plausible() {
        let s = SystemMemory::new().sample();
        assert!(s.total > 0 && s.used <= s.total && s.available <= s.total);
        assert!(s.rss > 0 && s.rss < s.total);
        assert!(peak_rss_bytes().unwrap_or(0) >= s.rss / 2);
    }
}
