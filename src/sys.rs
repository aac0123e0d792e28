//! The few system calls std does not offer: positioned `copy_file_range`, `statvfs`
//! and `posix_fadvise`. This is the only module of devmap with `unsafe` code: the
//! crate denies it everywhere else.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

/// Copies up to `len` bytes from `src` at `src_offset` to `dst` at `dst_offset` in the
/// kernel, without moving either file's cursor. Returns the bytes copied (0 at the
/// source's end), or the OS error (`EXDEV`, `ENOSYS`, `EINVAL` mean "use a buffer").
pub(crate) fn copy_file_range(
    src: &File,
    src_offset: u64,
    dst: &File,
    dst_offset: u64,
    len: usize,
) -> io::Result<usize> {
    let mut off_in = libc::off64_t::try_from(src_offset)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut off_out = libc::off64_t::try_from(dst_offset)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: both descriptors are open for the lifetime of the borrows; the offset
    // pointers point at live stack variables the kernel updates; no memory of ours is
    // read or written besides them.
    let n = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &raw mut off_in,
            dst.as_raw_fd(),
            &raw mut off_out,
            len,
            0,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        // Non-negative and at most `len`.
        Ok(n as usize)
    }
}

/// Bytes available to an unprivileged user on the file system holding `path`.
pub(crate) fn free_space(path: &Path) -> io::Result<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call and `stat`
    // is a valid, writable statvfs.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &raw mut stat) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // The field types are u32 on some 32-bit targets, u64 here.
    #[allow(clippy::useless_conversion)]
    Ok(u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}

/// Tells the kernel a range of `file` will not be read again, so copied input does not
/// crowd the page cache. Advice only: errors are ignored.
pub(crate) fn drop_from_cache(file: &File, offset: u64, len: u64) {
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return;
    };
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), off, len, libc::POSIX_FADV_DONTNEED);
    }
}

/// The signals that end devmap cleanly (a running save cancelled, the terminal restored).
pub const TERMINATION_SIGNALS: [i32; 3] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGINT,
];

/// Set when SIGTERM, SIGHUP or SIGINT arrives, once [`catch_termination`] ran.
static TERMINATION: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Turns SIGTERM, SIGHUP and SIGINT into a flag the program polls, so a save can be
/// cancelled cleanly (temporary files removed) and the terminal restored instead of
/// the process dying mid-write. The handlers (signal-hook's) only store to the flag.
pub fn catch_termination() -> &'static AtomicBool {
    TERMINATION.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        for signal in TERMINATION_SIGNALS {
            // Fails only for signals that cannot be caught (SIGKILL, SIGSTOP); without
            // the handler the default action (exit) still stops devmap.
            let _ = signal_hook::flag::register(signal, Arc::clone(&flag));
        }
        flag
    })
}
