//! The few system calls std does not offer: positioned `copy_file_range`, `statvfs`
//! and `posix_fadvise`, through rustix's safe bindings (devmap has no `unsafe` code:
//! the crate forbids it). `copy_file_range` and `posix_fadvise` are Linux's; elsewhere
//! the copy falls back to reads and writes through a buffer and the cache advice is
//! skipped.

pub(crate) mod files;
pub mod mapped;
pub mod proc;

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

/// Copies up to `len` bytes from `src` at `src_offset` to `dst` at `dst_offset` in the
/// kernel, without moving either file's cursor. Returns the bytes copied (0 at the
/// source's end), or the OS error (`EXDEV`, `ENOSYS`, `EINVAL` mean "use a buffer").
#[cfg(target_os = "linux")]
pub(crate) fn copy_file_range(
    src: &File,
    src_offset: u64,
    dst: &File,
    dst_offset: u64,
    len: usize,
) -> io::Result<usize> {
    let (mut off_in, mut off_out) = (src_offset, dst_offset);
    rustix::fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), len)
        .map_err(io::Error::from)
}

/// Elsewhere there is no `copy_file_range`: the copier's buffered path does the work.
#[cfg(not(target_os = "linux"))]
pub(crate) fn copy_file_range(
    _src: &File,
    _src_offset: u64,
    _dst: &File,
    _dst_offset: u64,
    _len: usize,
) -> io::Result<usize> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// A folder opened once, whose files are looked at by name relative to it: one path
/// component resolved per file instead of the whole path again (an offload folder
/// holds tens of thousands of files).
pub(crate) struct Folder(std::os::fd::OwnedFd);

/// What [`Folder::stat`] says of a file.
pub(crate) struct FileStat {
    pub is_file: bool,
    pub len: u64,
    pub modified: Option<std::time::SystemTime>,
}

impl Folder {
    pub(crate) fn open(path: &Path) -> io::Result<Folder> {
        use rustix::fs::{Mode, OFlags};
        rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map(Folder)
        .map_err(io::Error::from)
    }

    /// The file `name` in this folder, links followed (as `std::fs::metadata`).
    pub(crate) fn stat(&self, name: &str) -> io::Result<FileStat> {
        let st = rustix::fs::statat(&self.0, name, rustix::fs::AtFlags::empty())
            .map_err(io::Error::from)?;
        let modified = u64::try_from(st.st_mtime).ok().map(|secs| {
            std::time::UNIX_EPOCH
                + std::time::Duration::new(secs, u32::try_from(st.st_mtime_nsec).unwrap_or(0))
        });
        Ok(FileStat {
            is_file: rustix::fs::FileType::from_raw_mode(st.st_mode)
                == rustix::fs::FileType::RegularFile,
            len: u64::try_from(st.st_size).unwrap_or(0),
            modified,
        })
    }
}

/// What makes an open file the file it is (its device and inode): two handles of one
/// file answer the same, whatever path opened them.
pub(crate) fn file_identity(file: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    file.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// How many threads look at many files at once: the file system answers several
/// questions at a time (and a cold one waits on the disk for each).
const FILE_THREADS: usize = 4;

/// `look` applied to every item on a few threads ([`FILE_THREADS`]), the answers in
/// the items' order; `None` when a thread panicked. For asking the file system about
/// tens of thousands of files (an offload folder's), one question each.
pub(crate) fn look_in_parallel<T: Sync, R: Send>(
    items: &[T],
    look: impl Fn(&T) -> R + Sync,
) -> Option<Vec<R>> {
    let chunk = items.len().div_ceil(FILE_THREADS).max(1);
    let look = &look;
    std::thread::scope(|scope| {
        let workers: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(look).collect::<Vec<R>>()))
            .collect();
        let mut all = Vec::with_capacity(items.len());
        for w in workers {
            all.extend(w.join().ok()?);
        }
        Some(all)
    })
}

/// Bytes available to an unprivileged user on the file system holding `path`.
pub fn free_space(path: &Path) -> io::Result<u64> {
    let stat = rustix::fs::statvfs(path).map_err(io::Error::from)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Tells the kernel a range of `file` will not be read again, so copied input does not
/// crowd the page cache. Advice only: errors are ignored.
#[cfg(target_os = "linux")]
pub(crate) fn drop_from_cache(file: &File, offset: u64, len: u64) {
    let _ = rustix::fs::fadvise(
        file,
        offset,
        std::num::NonZeroU64::new(len),
        rustix::fs::Advice::DontNeed,
    );
}

/// No `posix_fadvise` here: the page cache is left to the kernel, as `cp` leaves it.
#[cfg(not(target_os = "linux"))]
pub(crate) fn drop_from_cache(_file: &File, _offset: u64, _len: u64) {}

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
