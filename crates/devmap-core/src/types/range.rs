//! Byte ranges in source files: the unit every reader and the saver speak in.

/// Index of a file in a checkpoint's list of source files.
pub type FileId = usize;

/// A run of bytes in one source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub file: FileId,
    pub offset: u64,
    pub len: u64,
}
