//! The end of a save: temporary files, and the renames that put them in place.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::error::SaveError;
use super::preflight::{PARTIAL_SUFFIX, is_saved_weights_name};

/// Temporary files of one save, removed unless the save completes.
pub(super) struct Staging {
    /// `(temporary, final)` names, in the order they are renamed: the index last.
    files: Vec<(PathBuf, PathBuf)>,
    created_out: bool,
    out: PathBuf,
    committed: bool,
}

impl Staging {
    /// Creates OUT if needed and starts an empty staging area in it.
    pub(super) fn begin(out: &Path) -> Result<Staging, SaveError> {
        let created_out = !out.exists();
        std::fs::create_dir_all(out).map_err(|e| SaveError::io(out, e))?;
        Ok(Staging {
            files: Vec::new(),
            created_out,
            out: out.to_path_buf(),
            committed: false,
        })
    }

    /// The temporary name for `final_name` in OUT, registered so a failure removes it.
    pub(super) fn add(&mut self, final_name: &std::ffi::OsStr) -> PathBuf {
        let mut tmp_name = final_name.to_os_string();
        tmp_name.push(PARTIAL_SUFFIX);
        let tmp = self.out.join(tmp_name);
        self.files.push((tmp.clone(), self.out.join(final_name)));
        tmp
    }

    /// Puts every staged file under its real name, the index last, after removing the
    /// weights of an earlier save that this one does not overwrite. Returns the names
    /// of the removed files.
    pub(super) fn commit(mut self, shard_files: &[String]) -> Result<Vec<String>, SaveError> {
        let removed_stale = remove_stale_weights(&self.out, shard_files)?;
        for (tmp, dest) in &self.files {
            std::fs::rename(tmp, dest).map_err(|e| SaveError::io(dest, e))?;
        }
        if let Ok(dir) = File::open(&self.out) {
            let _ = dir.sync_all();
        }
        self.committed = true;
        Ok(removed_stale)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for (tmp, _) in &self.files {
            let _ = std::fs::remove_file(tmp);
        }
        if self.created_out {
            // Only removes the folder if it is still empty.
            let _ = std::fs::remove_dir(&self.out);
        }
    }
}

pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), SaveError> {
    use std::io::Write;
    let mut f = File::create(path).map_err(|e| SaveError::io(path, e))?;
    f.write_all(bytes).map_err(|e| SaveError::io(path, e))?;
    f.sync_all().map_err(|e| SaveError::io(path, e))
}

/// Weight files of an earlier save in the output folder that this save does not
/// overwrite (a different shard count, or a stale index), so the loader never mixes
/// them in.
fn remove_stale_weights(out: &Path, keep: &[String]) -> Result<Vec<String>, SaveError> {
    let mut removed = Vec::new();
    let entries = std::fs::read_dir(out).map_err(|e| SaveError::io(out, e))?;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(PARTIAL_SUFFIX) || keep.contains(&name) || !entry.path().is_file() {
            continue;
        }
        if is_saved_weights_name(&name) {
            std::fs::remove_file(entry.path()).map_err(|e| SaveError::io(entry.path(), e))?;
            removed.push(name);
        }
    }
    removed.sort();
    Ok(removed)
}
