//! What Linux's `/proc` tells of this process and the machine: resident memory, the
//! page cache, available memory, whether a process still runs. Elsewhere each answer
//! is `None` ("cannot be told"), and callers show or do nothing.

/// Where this process's memory reads from: the live saver's tensors in RAM are read
/// at their addresses with positioned reads of this file (Linux only; elsewhere its
/// open fails and the error names it).
pub const PROCESS_MEMORY: &str = "/proc/self/mem";

/// `/proc/self`, or `/proc/PID` for another process than this one.
pub(crate) fn process_dir(pid: Option<u32>) -> std::path::PathBuf {
    match pid {
        Some(pid) if pid != std::process::id() => format!("/proc/{pid}").into(),
        _ => "/proc/self".into(),
    }
}

/// The memory of process `pid` (this one when `None`), as [`PROCESS_MEMORY`] is this
/// one's: reading another's needs the right to trace it (same user, and where Yama
/// restricts that, its consent).
pub fn memory_of(pid: Option<u32>) -> std::path::PathBuf {
    process_dir(pid).join("mem")
}

/// A field of `/proc/self/status` in bytes (`VmHWM:`, `VmRSS:`).
pub(crate) fn status_bytes(field: &str) -> Option<u64> {
    kib_field(&read("/proc/self/status")?, field)
}

/// A field of `/proc/meminfo` in bytes (`MemAvailable:`, `Cached:`).
pub(crate) fn meminfo_bytes(field: &str) -> Option<u64> {
    kib_field(&read("/proc/meminfo")?, field)
}

/// Whether process `pid` is still running; `None` where `/proc` cannot say. (The
/// remote mirrors' clean-up asks it.)
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
pub(crate) fn process_runs(pid: u32) -> Option<bool> {
    if !cfg!(target_os = "linux") || !std::path::Path::new("/proc/self").exists() {
        return None;
    }
    Some(std::path::Path::new(&format!("/proc/{pid}")).exists())
}

fn read(path: &str) -> Option<String> {
    if cfg!(target_os = "linux") {
        std::fs::read_to_string(path).ok()
    } else {
        None
    }
}

/// `field`'s value, given in KiB on its line (`VmRSS:   1234 kB`), in bytes.
fn kib_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_in_bytes_from_their_own_line() {
        let text = "VmPeak:\t  2048 kB\nVmHWM:\t  1024 kB\nVmRSS:\t   512 kB\n";
        assert_eq!(kib_field(text, "VmHWM:"), Some(1024 * 1024));
        assert_eq!(kib_field(text, "VmRSS:"), Some(512 * 1024));
        assert_eq!(kib_field(text, "VmSwap:"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_runs_and_has_memory() {
        assert_eq!(process_runs(std::process::id()), Some(true));
        assert!(status_bytes("VmRSS:").is_some_and(|b| b > 0));
        assert!(meminfo_bytes("MemAvailable:").is_some_and(|b| b > 0));
    }
}
