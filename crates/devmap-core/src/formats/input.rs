//! Opening inputs safely. Every file devmap reads is untrusted: it may be a FIFO that
//! never answers, a device, a folder, or a JSON file of a gigabyte. Inputs are opened
//! non-blocking and checked to be regular files before a byte is read, and JSON
//! inputs are read only up to a size cap.

use super::Kind;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use super::FormatError;

/// The largest JSON input devmap reads (config, indexes, device maps). The largest
/// real ones (the index of a 160-shard MoE) are a few MB.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// What a path is, in words, when it is not a regular file.
fn not_a_file(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a folder")
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_block_device() || t.is_char_device() {
        Some("a device")
    } else {
        Some("not a regular file")
    }
}

/// Opens `path` for reading if it is a regular file (symlinks followed). The open is
/// non-blocking, so a FIFO is refused instead of waiting for a writer forever.
pub fn open_regular(path: &Path) -> Result<File, FormatError> {
    let file = crate::sys::files::open_for_reading(path).map_err(|e| FormatError::io(path, e))?;
    let meta = file.metadata().map_err(|e| FormatError::io(path, e))?;
    if let Some(what) = not_a_file(&meta) {
        return Err(FormatError::invalid_as(
            Kind::Unsafe,
            path,
            format!("is {what}, not a file; devmap reads only regular files"),
        ));
    }
    Ok(file)
}

/// Checks, without opening it, that `path` is a regular file (symlinks followed).
pub fn check_regular(path: &Path) -> Result<std::fs::Metadata, FormatError> {
    let meta = std::fs::metadata(path).map_err(|e| FormatError::io(path, e))?;
    match not_a_file(&meta) {
        None => Ok(meta),
        Some(what) => Err(FormatError::invalid_as(
            Kind::Unsafe,
            path,
            format!("is {what}, not a file; devmap reads only regular files"),
        )),
    }
}

/// Whether both paths name one file: the same device and inode, so a hard link or a
/// symlink to an input is recognised as that input. False when either is missing.
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Whether `len` bytes at two places hold the same bytes, read a chunk at a time
/// until the first difference (two different tensors usually differ in their first
/// chunk, so this reads little unless they are equal).
pub fn ranges_equal(a: (&Path, u64), b: (&Path, u64), len: u64) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    const CHUNK: usize = 1 << 20;
    let open = |p: &Path| open_regular(p).map_err(std::io::Error::other);
    let (fa, fb) = (open(a.0)?, open(b.0)?);
    let (mut ba, mut bb) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        fa.read_exact_at(&mut ba[..n], a.1 + done)?;
        fb.read_exact_at(&mut bb[..n], b.1 + done)?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
        done += n as u64;
    }
    Ok(true)
}

/// The `*.safetensors` entries of `dir`, sorted. Every one counts: one that is a
/// folder or a FIFO is refused when it is opened, not skipped.
pub fn safetensors_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, FormatError> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| FormatError::io(dir, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

/// Reads a JSON input as text, refusing special files and files over
/// [`MAX_JSON_BYTES`].
pub fn read_json_text(path: &Path) -> Result<String, FormatError> {
    read_small_text(
        path,
        MAX_JSON_BYTES,
        "no config, index or device map is that large",
    )
}

/// The one reader for small metadata files (configs, indexes, device maps, adapter
/// configs, cache refs, the token file): special files are refused before a byte is
/// read, a file whose size is over `cap` is refused from its size alone (a sparse
/// gigabyte costs nothing), and the read itself stops at `cap` in case the file grows.
/// `why` says why nothing that large is expected.
pub fn read_small_text(path: &Path, cap: u64, why: &str) -> Result<String, FormatError> {
    let file = open_regular(path)?;
    let too_large = |size: u64| {
        FormatError::invalid_as(
            Kind::TooLarge,
            path,
            format!(
                "is {} ({size} bytes), over the {} this file may be ({why}); it is not read",
                crate::human_bytes(size),
                crate::human_bytes(cap)
            ),
        )
    };
    let size = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    if size > cap {
        return Err(too_large(size));
    }
    let mut text = String::with_capacity(size as usize);
    file.take(cap + 1)
        .read_to_string(&mut text)
        .map_err(|e| FormatError::io(path, e))?;
    if text.len() as u64 > cap {
        return Err(too_large(text.len() as u64));
    }
    Ok(text)
}
