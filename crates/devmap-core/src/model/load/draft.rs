//! The checkpoint while it is being put together from the files of a model folder.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::LoadError;
use crate::formats::safetensors::Header;
use crate::model::checkpoint::{ByteRange, FileId, Source, SourceFile, Tensor};

/// Where each tensor comes from while the checkpoint is being put together.
pub(super) struct Draft {
    /// Checkpoint entries replaced by offload values: `(name, range, dtype)`.
    pub(super) replaced: Vec<(String, ByteRange, crate::types::DType)>,
    /// Kept in module order once the weights are read, so names are found by binary
    /// search and merged with sorted offload entries in one pass: no name map, no
    /// copy of every name.
    pub(super) tensors: Vec<Tensor>,
    pub(super) files: Vec<SourceFile>,
    pub(super) file_ids: HashMap<PathBuf, FileId>,
    /// The blocks of tensors stored in pieces, by their `Source::Pieces` index.
    pub(super) pieces: Vec<Box<[crate::types::pieces::Piece]>>,
}

impl Draft {
    pub(super) fn find(&self, name: &str) -> Option<usize> {
        crate::model::checkpoint::search(&self.tensors, name).ok()
    }

    /// Restores module order after tensors were appended, and refuses a name that
    /// now appears twice.
    pub(super) fn resort(&mut self) -> Result<(), LoadError> {
        crate::model::checkpoint::sort_in_module_order(&mut self.tensors);
        if let Some(w) = self.tensors.windows(2).find(|w| w[0].name == w[1].name) {
            let file = |t: &Tensor| match t.source {
                Source::Offload(r) | Source::Checkpoint(r) | Source::Adapter(r) => {
                    self.files[r.file].path.clone()
                }
                Source::Pieces(p) => self.pieces[p as usize]
                    .first()
                    .map(|piece| self.files[piece.range.file].path.clone())
                    .unwrap_or_default(),
                _ => PathBuf::new(),
            };
            return Err(LoadError::Conflict {
                path: file(&w[1]),
                message: format!(
                    "tensor `{}` is also in {}; which one is meant is unclear",
                    w[0].name,
                    file(&w[0]).display()
                ),
            });
        }
        Ok(())
    }

    pub(super) fn file_id(&mut self, path: &Path, header: &Header) -> FileId {
        if let Some(&id) = self.file_ids.get(path) {
            return id;
        }
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let id = self.push_file(path, header.file_len, modified);
        self.file_ids.insert(path.to_path_buf(), id);
        id
    }

    pub(super) fn plain_file_id(&mut self, path: &Path) -> FileId {
        if let Some(&id) = self.file_ids.get(path) {
            return id;
        }
        let meta = std::fs::metadata(path).ok();
        let len = meta.as_ref().map_or(0, std::fs::Metadata::len);
        let id = self.push_file(path, len, meta.and_then(|m| m.modified().ok()));
        self.file_ids.insert(path.to_path_buf(), id);
        id
    }

    /// Adds a source file whose length and time are known. Called directly for a file no
    /// other tensor reads (an offload `.dat`): added without looking it up.
    pub(super) fn push_file(
        &mut self,
        path: &Path,
        len: u64,
        modified: Option<std::time::SystemTime>,
    ) -> FileId {
        self.files.push(SourceFile {
            path: path.to_path_buf(),
            len,
            modified,
            kind: crate::model::checkpoint::InputKind::File,
        });
        self.files.len() - 1
    }
}
