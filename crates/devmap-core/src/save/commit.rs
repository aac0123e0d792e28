//! The output side of a save: the lock on OUT, the temporary files, and the commit
//! that puts them in place all or nothing.
//!
//! Every temporary name carries a nonce unique to this save and is created with
//! `O_EXCL`, so two saves can never write one file, and a failing save removes only
//! what it created. The commit moves earlier files that the save replaces aside
//! (renames, nothing deleted), renames the new files in (the index last), and only
//! then deletes what it moved aside; a failure at any rename puts everything back, so
//! OUT holds either the complete earlier content or the complete new save.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::SaveError;
use super::names::{BACKUP_SUFFIX, PARTIAL_SUFFIX, blocked_target, is_saved_weights_name};

/// Temporary files of one save, removed unless the save completes; holds the lock on
/// OUT for as long as it lives.
pub(super) struct TempFiles {
    out: PathBuf,
    /// Unique to this save: pid, time and a counter.
    nonce: String,
    /// `(temporary, final)` names, in the order they are renamed: the index last.
    files: Vec<(PathBuf, PathBuf)>,
    /// Temporary files this save created (only these are ever removed).
    created: Mutex<Vec<PathBuf>>,
    created_out: bool,
    committed: bool,
    /// An exclusive `flock` on OUT itself, released when this is dropped.
    _lock: File,
}

impl TempFiles {
    /// Creates OUT if needed, locks it against other saves, and starts an empty    /// temporary files in it.
    pub(super) fn begin(out: &Path) -> Result<TempFiles, SaveError> {
        let created_out = !out.exists();
        std::fs::create_dir_all(out).map_err(|e| SaveError::io(out, e))?;
        let lock = File::open(out).map_err(|e| SaveError::io(out, e))?;
        // A save holds the lock for seconds at least; a lock that goes within a few
        // milliseconds was only a copy of a closed descriptor in a process between
        // fork and exec (a flock belongs to the open file, which that copy shares).
        let mut tries = 0;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if tries < 20 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(TryLockError::WouldBlock) => return Err(SaveError::Busy(out.to_path_buf())),
                Err(TryLockError::Error(e)) => return Err(SaveError::io(out, e)),
            }
        }
        static SAVES: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let nonce = format!(
            "{}-{nanos:x}-{}",
            std::process::id(),
            SAVES.fetch_add(1, Ordering::Relaxed)
        );
        Ok(TempFiles {
            out: out.to_path_buf(),
            nonce,
            files: Vec::new(),
            created: Mutex::new(Vec::new()),
            created_out,
            committed: false,
            _lock: lock,
        })
    }

    /// The temporary name for `final_name` in OUT, registered to be renamed into place
    /// at the commit. Names are bytes: nothing is converted, so two names that differ
    /// only in non-UTF-8 bytes keep different temporary names.
    pub(super) fn add(&mut self, final_name: &OsStr) -> PathBuf {
        let tmp = self.out.join(self.aside_name(final_name, PARTIAL_SUFFIX));
        self.files.push((tmp.clone(), self.out.join(final_name)));
        tmp
    }

    fn aside_name(&self, name: &OsStr, suffix: &str) -> OsString {
        let mut aside = name.to_os_string();
        aside.push(".");
        aside.push(&self.nonce);
        aside.push(suffix);
        aside
    }

    /// Creates a temporary file exclusively (`O_EXCL`): it is this save's alone.
    pub(super) fn create(&self, tmp: &Path) -> Result<File, SaveError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(tmp)
            .map_err(|e| SaveError::io(tmp, e))?;
        self.created
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(tmp.to_path_buf());
        Ok(file)
    }

    /// Puts the finished file `from` (a part's shard) at the temporary name `tmp`: a
    /// hard link, so `from` stays whole if this save fails (a copy where the file
    /// system has no links).
    pub(super) fn link(&self, from: &Path, tmp: &Path) -> Result<(), SaveError> {
        if std::fs::hard_link(from, tmp).is_err() {
            std::fs::copy(from, tmp).map_err(|e| SaveError::io(tmp, e))?;
        }
        self.created
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(tmp.to_path_buf());
        Ok(())
    }

    /// Final names that already exist as something other than a regular file (a
    /// folder, a FIFO, a symlink): a rename onto them would fail or replace the wrong
    /// thing, so the save refuses before writing.
    pub(super) fn blocked_targets(&self) -> Vec<super::reasons::Refusal> {
        self.files
            .iter()
            .filter_map(|(_, dest)| blocked_target(dest))
            .collect()
    }

    /// Puts every staged file under its real name, the index last, replacing earlier
    /// files of the same names and removing the weights of an earlier save that this
    /// one does not overwrite (`keep` are this save's shard names). All or nothing: on
    /// a failure every rename is undone. Returns the names of removed earlier weights.
    pub(super) fn commit(
        mut self,
        keep: &[String],
        // A test's way to make the commit fail at a chosen rename, counted from 0 over
        // the moves aside and the moves in; `None` in every real save.
        fault: Option<usize>,
    ) -> Result<Vec<String>, SaveError> {
        let blocked = self.blocked_targets();
        if !blocked.is_empty() {
            return Err(SaveError::Refused(blocked));
        }
        let stale = stale_weights(&self.out, keep)?;
        let mut step = 0usize;
        let mut rename = |from: &Path, to: &Path| -> io::Result<()> {
            let this = step;
            step += 1;
            if fault == Some(this) {
                return Err(io::Error::other(format!(
                    "injected failure at rename {this}"
                )));
            }
            std::fs::rename(from, to)
        };

        // 1. Move aside what the new files replace, and the stale weights.
        let mut displaced: Vec<(PathBuf, PathBuf)> = Vec::new();
        let replaced: Vec<PathBuf> = self.files.iter().map(|(_, dest)| dest.clone()).collect();
        let stale_left = stale
            .iter()
            .map(|name| self.out.join(name))
            .filter(|path| !replaced.contains(path));
        let to_move: Vec<PathBuf> = replaced
            .iter()
            .filter(|dest| std::fs::symlink_metadata(dest).is_ok())
            .cloned()
            .chain(stale_left)
            .collect();
        for original in to_move {
            let Some(name) = original.file_name() else {
                continue;
            };
            let aside = self.out.join(self.aside_name(name, BACKUP_SUFFIX));
            if let Err(e) = rename(&original, &aside) {
                restore(&displaced);
                return Err(SaveError::io(&original, e));
            }
            displaced.push((aside, original));
        }

        // 2. Move the new files in, the index last.
        let mut placed: Vec<(PathBuf, PathBuf)> = Vec::new();
        for (tmp, dest) in &self.files {
            if let Err(e) = rename(tmp, dest) {
                // Back to their temporary names, which the drop then removes.
                restore(&placed);
                restore(&displaced);
                return Err(SaveError::io(dest, e));
            }
            placed.push((dest.clone(), tmp.clone()));
        }
        if let Ok(dir) = File::open(&self.out) {
            let _ = dir.sync_all();
        }
        self.committed = true;

        // 3. The new save is complete: what was moved aside can go.
        for (aside, _) in &displaced {
            let _ = std::fs::remove_file(aside);
        }
        Ok(stale)
    }
}

/// Renames each `(from, to)` back, newest first. Best effort: it runs after a failure
/// and must not hide it.
fn restore(moves: &[(PathBuf, PathBuf)]) {
    for (from, to) in moves.iter().rev() {
        let _ = std::fs::rename(from, to);
    }
}

impl Drop for TempFiles {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        let created = self
            .created
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for tmp in created.iter() {
            let _ = std::fs::remove_file(tmp);
        }
        if self.created_out {
            // Only removes the folder if it is still empty.
            let _ = std::fs::remove_dir(&self.out);
        }
    }
}

pub(super) fn write_synced(
    temp_files: &TempFiles,
    path: &Path,
    bytes: &[u8],
) -> Result<(), SaveError> {
    use std::io::Write;
    let mut f = temp_files.create(path)?;
    f.write_all(bytes).map_err(|e| SaveError::io(path, e))?;
    f.sync_all().map_err(|e| SaveError::io(path, e))
}

/// Weight files of an earlier save in the output folder that this save does not
/// overwrite (a different shard count, or a stale index), so the loader never mixes
/// them in. Only regular files with UTF-8 names of devmap's own kind qualify.
fn stale_weights(out: &Path, keep: &[String]) -> Result<Vec<String>, SaveError> {
    let entries = std::fs::read_dir(out).map_err(|e| SaveError::io(out, e))?;
    let mut stale: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|name| !keep.contains(name) && is_saved_weights_name(name))
        .collect();
    stale.sort();
    Ok(stale)
}
