//! The local Hugging Face cache, laid out as huggingface_hub writes it:
//! `ROOT/models--ORG--NAME/refs/REVISION` holds a commit hash, and
//! `ROOT/models--ORG--NAME/snapshots/COMMIT/` holds the files, each a symlink into
//! `../../blobs/`. devmap reads such a snapshot like any model folder (it only reads).

use std::path::{Path, PathBuf};

/// A repo id as given on the command line: `org/name`, optionally `@revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoId {
    pub repo: String,
    /// A branch, tag or commit; `main` when not given.
    pub revision: String,
}

impl std::fmt::Display for RepoId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.revision == "main" {
            write!(f, "{}", self.repo)
        } else {
            write!(f, "{}@{}", self.repo, self.revision)
        }
    }
}

/// Reads `org/name[@revision]` as huggingface_hub validates repo ids (letters, digits,
/// `-`, `_`, `.`; no `--` or `..`; not starting or ending with `-` or `.`; at most 96
/// characters a part). Anything else is not a repo id.
pub fn parse_repo_id(text: &str) -> Option<RepoId> {
    let (repo, revision) = match text.split_once('@') {
        Some((r, rev)) => (r, rev),
        None => (text, "main"),
    };
    let (org, name) = repo.split_once('/')?;
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !p.contains("--")
            && !p.contains("..")
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
    };
    let revision_ok = !revision.is_empty()
        && !revision
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        && !revision.chars().any(|c| c.is_control() || c == '\\');
    (part_ok(org) && part_ok(name) && revision_ok).then(|| RepoId {
        repo: repo.to_owned(),
        revision: revision.to_owned(),
    })
}

/// Where huggingface_hub keeps its cache: `HF_HUB_CACHE`, else the older
/// `HUGGINGFACE_HUB_CACHE`, else `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`,
/// else `~/.cache/huggingface/hub`.
pub fn cache_root() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(p) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return Some(PathBuf::from(p));
    }
    Some(hf_home()?.join("hub"))
}

/// `HF_HOME`, else `XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub fn hf_home() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(p) = var("HF_HOME") {
        return Some(PathBuf::from(p));
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("huggingface"))
}

#[derive(Debug, thiserror::Error)]
pub enum HubCacheError {
    #[error("cannot find the Hugging Face cache: set HF_HUB_CACHE or HF_HOME (HOME is not set)")]
    NoRoot,
    #[error(
        "{repo} is not in the Hugging Face cache at {} ({}); download it first, e.g. `hf download {repo}`",
        crate::text::path(root),
        listing("the cache has", cached)
    )]
    NoRepo {
        repo: String,
        root: PathBuf,
        cached: Vec<String>,
    },
    #[error(
        "revision `{revision}` of {repo} is not in the cache at {} ({}; {})",
        crate::text::path(folder),
        listing("refs", refs),
        listing("snapshots", snapshots)
    )]
    NoRevision {
        repo: String,
        revision: String,
        folder: PathBuf,
        refs: Vec<String>,
        snapshots: Vec<String>,
    },
    #[error("{}: {message}", crate::text::path(path))]
    Unreadable { path: PathBuf, message: String },
}

fn listing(what: &str, items: &[String]) -> String {
    const SHOWN: usize = 12;
    if items.is_empty() {
        return format!("{what}: none");
    }
    let mut text = format!("{what}: {}", items[..items.len().min(SHOWN)].join(", "));
    if items.len() > SHOWN {
        text.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    text
}

/// The snapshot folder of `id` in the cache at `root`, as huggingface_hub resolves it:
/// a 40-hex revision names a snapshot directly; any other is read from `refs/`.
pub fn resolve(id: &RepoId, root: &Path) -> Result<PathBuf, HubCacheError> {
    let folder = root.join(format!("models--{}", id.repo.replace('/', "--")));
    if !folder.is_dir() {
        return Err(HubCacheError::NoRepo {
            repo: id.repo.clone(),
            root: root.to_path_buf(),
            cached: cached_repos(root),
        });
    }
    let is_commit = id.revision.len() == 40 && id.revision.chars().all(|c| c.is_ascii_hexdigit());
    let commit = if is_commit {
        Some(id.revision.clone())
    } else {
        let ref_path = folder.join("refs").join(&id.revision);
        if std::fs::symlink_metadata(&ref_path).is_err() {
            None
        } else {
            // A ref holds a 40-character commit: a FIFO, a device or a large file there
            // is refused rather than read.
            match super::input::read_small_text(&ref_path, 4096, "a ref holds one commit hash") {
                Ok(text) => Some(text.trim().to_owned()),
                Err(super::FormatError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    None
                }
                Err(e) => {
                    return Err(HubCacheError::Unreadable {
                        path: ref_path,
                        message: e.to_string(),
                    });
                }
            }
        }
    };
    let snapshot = commit
        .filter(|c| !c.is_empty() && !c.contains(['/', '\\']) && c != "..")
        .map(|c| folder.join("snapshots").join(c))
        .filter(|p| p.is_dir());
    snapshot.ok_or_else(|| HubCacheError::NoRevision {
        repo: id.repo.clone(),
        revision: id.revision.clone(),
        refs: names_under(&folder.join("refs")),
        snapshots: names_under(&folder.join("snapshots")),
        folder,
    })
}

/// `org/name` of every model repo in the cache, sorted.
fn cached_repos(root: &Path) -> Vec<String> {
    let Ok(read) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut repos: Vec<String> = read
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let rest = name.strip_prefix("models--")?;
            Some(rest.replacen("--", "/", 1))
        })
        .collect();
    repos.sort();
    repos
}

/// File names under `dir`, nested ones (`refs/pr/1`) with their path, sorted.
fn names_under(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, prefix)) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in read.filter_map(Result::ok) {
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let full = format!("{prefix}{name}");
            if e.file_type().is_ok_and(|t| t.is_dir())
                && prefix.len() < 256
                && d != dir.join("snapshots")
            {
                stack.push((e.path(), format!("{full}/")));
            }
            names.push(full);
        }
    }
    names.sort();
    names
}

/// Whether `dir` is a snapshot folder of a cache (its files are expected to be
/// symlinks into the repo's `blobs/`).
pub fn is_snapshot(dir: &Path) -> bool {
    dir.parent()
        .is_some_and(|p| p.file_name().is_some_and(|n| n == "snapshots"))
        && dir
            .parent()
            .and_then(Path::parent)
            .is_some_and(|repo| repo.join("blobs").is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_as_huggingface_hub_accepts_them() {
        let id = parse_repo_id("Qwen/Qwen2-7B").expect("valid");
        assert_eq!(
            (id.repo.as_str(), id.revision.as_str()),
            ("Qwen/Qwen2-7B", "main")
        );
        let id = parse_repo_id("meta-llama/Llama-3.1-8B@refs/pr/12").expect("valid");
        assert_eq!(id.revision, "refs/pr/12");
        for bad in [
            "Qwen2-7B",
            "a/b/c",
            "./model",
            "../x/y",
            "org/na--me",
            "org/-name",
            "org/name.",
            "org/na me",
            "org/name@",
            "org/name@../../etc",
            "/abs/path",
        ] {
            assert_eq!(parse_repo_id(bad), None, "{bad}");
        }
    }
}
