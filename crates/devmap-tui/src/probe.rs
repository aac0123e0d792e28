//! The file-system questions the inspector asks, behind a trait so that
//! `App::handle` does no I/O of its own: the runtime gives the App a [`SystemProbe`],
//! tests may give it a double.

use std::path::Path;

use devmap_core::model::Checkpoint;
use devmap_core::save::{SaveOptions, SavePlan};

/// What is at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    Missing,
    Dir,
    /// A file or anything else that is not a folder.
    Other,
}

pub trait Probe: Send + Sync {
    /// Every reason `devmap save` would refuse `plan` with `options` before writing.
    fn save_problems(
        &self,
        ckpt: &Checkpoint,
        plan: &SavePlan,
        options: &SaveOptions,
    ) -> Vec<devmap_core::save::Refusal>;
    /// Learn now what [`Probe::save_problems`] will want to know about the model's
    /// input files (the inspector asks as it opens, off the UI thread, so the first
    /// save preview is as quick as later ones).
    fn learn_inputs(&self, _ckpt: &Checkpoint) {}
    /// Forget what [`Probe::save_problems`] remembered about the model's input files,
    /// so the next call opens them again (before a save starts).
    fn forget_inputs(&self) {}
    /// Whether `dir` is a folder that holds anything.
    fn has_entries(&self, dir: &Path) -> bool;
    fn kind(&self, path: &Path) -> PathKind;
    /// Whether both paths name one file (same device and inode: hard links and
    /// symlinks included).
    fn same_file(&self, a: &Path, b: &Path) -> bool;
    /// The root of the git work tree `path` is in, if it is in one.
    fn git_root(&self, _path: &Path) -> Option<std::path::PathBuf> {
        None
    }
    /// The entries of folder `dir` (name, whether it is a folder), for Tab completion;
    /// empty when it cannot be read.
    fn entries(&self, _dir: &Path) -> Vec<(String, bool)> {
        Vec::new()
    }
}

/// The real file system.
#[derive(Debug, Default)]
pub struct SystemProbe {
    /// Which of the model's input files could not be opened, by the model's list of
    /// source files: a map edit copies the checkpoint but not its files, so the
    /// preview after each edit reuses the answer (opening 23,145 offload files took
    /// 75 ms of a 133 ms preview). Starting a save forgets it and checks again.
    inputs: std::sync::Mutex<Option<(u64, Vec<devmap_core::save::Refusal>)>>,
}

impl SystemProbe {
    /// The model's input files that cannot be opened: remembered, or found now.
    fn unreadable_inputs(&self, ckpt: &Checkpoint) -> Vec<devmap_core::save::Refusal> {
        let key = files_key(ckpt);
        let known = self.inputs.lock().ok().and_then(|cached| {
            cached
                .as_ref()
                .filter(|(k, _)| *k == key)
                .map(|(_, p)| p.clone())
        });
        known.unwrap_or_else(|| {
            let found = devmap_core::save::preflight::unreadable_inputs(ckpt);
            if let Ok(mut cached) = self.inputs.lock() {
                *cached = Some((key, found.clone()));
            }
            found
        })
    }
}

impl Probe for SystemProbe {
    fn save_problems(
        &self,
        ckpt: &Checkpoint,
        plan: &SavePlan,
        options: &SaveOptions,
    ) -> Vec<devmap_core::save::Refusal> {
        let mut problems = devmap_core::save::preflight::check_all_but_inputs(ckpt, plan, options);
        problems.extend(self.unreadable_inputs(ckpt));
        problems
    }

    fn learn_inputs(&self, ckpt: &Checkpoint) {
        self.unreadable_inputs(ckpt);
    }

    fn forget_inputs(&self) {
        if let Ok(mut cached) = self.inputs.lock() {
            *cached = None;
        }
    }

    fn has_entries(&self, dir: &Path) -> bool {
        std::fs::read_dir(dir).is_ok_and(|mut r| r.next().is_some())
    }

    fn kind(&self, path: &Path) -> PathKind {
        match std::fs::metadata(path) {
            Err(_) => PathKind::Missing,
            Ok(m) if m.is_dir() => PathKind::Dir,
            Ok(_) => PathKind::Other,
        }
    }

    fn same_file(&self, a: &Path, b: &Path) -> bool {
        devmap_core::formats::input::same_file(a, b)
    }

    fn entries(&self, dir: &Path) -> Vec<(String, bool)> {
        let Ok(read) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        // A folder of a million files is not listed whole for a completion.
        read.filter_map(Result::ok)
            .take(10_000)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let dir = e.path().is_dir();
                Some((name, dir))
            })
            .collect()
    }

    fn git_root(&self, path: &Path) -> Option<std::path::PathBuf> {
        let absolute = std::path::absolute(path).ok()?;
        absolute
            .ancestors()
            .find(|dir| dir.join(".git").exists())
            .map(Path::to_path_buf)
    }
}

/// A fingerprint of the model's source files (paths, sizes, times): equal for the
/// copies a map edit makes, different once a file is added, grown or rewritten.
fn files_key(ckpt: &Checkpoint) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for file in &ckpt.files {
        file.path.hash(&mut hasher);
        file.len.hash(&mut hasher);
        file.modified.hash(&mut hasher);
    }
    hasher.finish()
}
