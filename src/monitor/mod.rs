//! Memory readings: the process's own resident set, and (with the TUI) system RAM.

/// A field of `/proc/self/status` in bytes (`VmHWM`, `VmRSS`), on Linux.
fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Peak resident set size of this process so far (`VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_bytes("VmHWM:")
}

/// Current resident set size of this process (`VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    proc_status_bytes("VmRSS:")
}
