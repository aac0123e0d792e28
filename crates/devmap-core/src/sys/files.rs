//! File calls beyond std's, and what their errors mean: reserving a file's blocks,
//! one read into many buffers, a non-blocking open, and the error numbers devmap acts
//! on. Linux gets the real calls; elsewhere the fallback is said at each.

use std::fs::File;
use std::io;
use std::path::Path;

/// Gives `dst` its first `len` bytes' blocks before a byte is written (`fallocate`).
/// On ext4 a file written without them reserves and accounts each 4 KiB block as it is
/// written (delayed allocation), under the lock every write to the file takes: a 1 GB
/// shard took 1.3× as long as `cp` of the same bytes, and the writers of one big
/// shard waited on each other; with the blocks reserved up front it takes as long as
/// `cp` (CHANGELOG.md, Performance history: Saving). A full disk is an error, before
/// anything is copied; a file system that cannot reserve blocks (some network ones),
/// or a system without `fallocate`, is written as before.
pub(crate) fn reserve_blocks(dst: &File, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::fs::fallocate(dst, rustix::fs::FallocateFlags::empty(), 0, len) {
        let e = io::Error::from(e);
        if is_disk_full(&e) {
            return Err(e);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (dst, len);
    Ok(())
}

/// Fills `bufs` from `src` at `offset` on, in order (`preadv`, calls interrupted by a
/// signal retried). An end of file before they are full is `UnexpectedEof`.
pub(crate) fn read_exact_vectored_at(
    src: &File,
    mut bufs: &mut [io::IoSliceMut<'_>],
    mut offset: u64,
) -> io::Result<()> {
    while !bufs.is_empty() {
        let read = read_vectored_at(src, bufs, offset)?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        offset += read as u64;
        io::IoSliceMut::advance_slices(&mut bufs, read);
    }
    Ok(())
}

#[cfg(target_os = "linux")]
fn read_vectored_at(src: &File, bufs: &mut [io::IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
    loop {
        match rustix::io::preadv(src, bufs, offset) {
            Err(rustix::io::Errno::INTR) => {}
            done => return done.map_err(io::Error::from),
        }
    }
}

/// Elsewhere one positioned read a buffer.
#[cfg(not(target_os = "linux"))]
fn read_vectored_at(src: &File, bufs: &mut [io::IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let Some(first) = bufs.iter_mut().find(|b| !b.is_empty()) else {
        return Ok(0);
    };
    src.read_at(first, offset)
}

/// One positioned read into `buf` at `offset` (`pread`; a call interrupted by a signal
/// is retried). On Linux the system call itself: glibc's `pread` wrapper is a thread
/// cancellation point, whose bookkeeping took 3.5% of a save making hundreds of
/// thousands of short reads (GPTQ/AWQ's bands).
#[cfg(target_os = "linux")]
pub(crate) fn read_at(src: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    loop {
        match rustix::io::pread(src, &mut *buf, offset) {
            Err(rustix::io::Errno::INTR) => {}
            done => return done.map_err(io::Error::from),
        }
    }
}

/// Elsewhere std's positioned read.
#[cfg(not(target_os = "linux"))]
pub(crate) fn read_at(src: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    src.read_at(buf, offset)
}

/// Opens `path` for reading without blocking in the open, so a FIFO is not waited on
/// forever (the caller then refuses what is not a regular file).
pub(crate) fn open_for_reading(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// Whether `e` says the output is full (no space, a quota, a file-size limit): then
/// it is about the file being written, not the one being read.
pub(crate) fn is_disk_full(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EFBIG | libc::EDQUOT)
    )
}

/// Whether `e` from `copy_file_range` means "this kernel or file-system pair cannot
/// copy in the kernel" (copy through a buffer instead), not "the copy failed".
pub(crate) fn copy_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EXDEV
                | libc::ENOSYS
                | libc::EINVAL
                | libc::EOPNOTSUPP
                | libc::EPERM
                | libc::EBADF
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_vectored_read_fills_every_buffer_and_stops_at_the_end() {
        let mut f = tempfile::tempfile().expect("tmp");
        f.write_all(b"abcdefghij").expect("write");
        let (mut a, mut b) = ([0u8; 3], [0u8; 4]);
        let mut bufs = [io::IoSliceMut::new(&mut a), io::IoSliceMut::new(&mut b)];
        read_exact_vectored_at(&f, &mut bufs, 2).expect("read");
        assert_eq!((&a, &b), (b"cde", b"fghi"));
        let mut c = [0u8; 4];
        let err = read_exact_vectored_at(&f, &mut [io::IoSliceMut::new(&mut c)], 8)
            .expect_err("past the end");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn reserving_blocks_makes_room_without_writing() {
        let f = tempfile::tempfile().expect("tmp");
        reserve_blocks(&f, 1 << 16).expect("reserved");
        // fallocate extends the file to the reserved length, reading as zeros.
        if cfg!(target_os = "linux") {
            assert_eq!(f.metadata().expect("meta").len(), 1 << 16);
        }
        assert!(is_disk_full(&io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(!is_disk_full(&io::Error::from_raw_os_error(libc::EIO)));
    }
}
