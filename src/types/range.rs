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

impl ByteRange {
    /// The same file, `skip` bytes further in and `len` long: a contiguous piece of
    /// this range (a per-expert tensor inside a fused one, say).
    #[must_use]
    pub fn sub_range(self, skip: u64, len: u64) -> Option<ByteRange> {
        (skip.checked_add(len)? <= self.len).then(|| ByteRange {
            file: self.file,
            offset: self.offset + skip,
            len,
        })
    }
}
