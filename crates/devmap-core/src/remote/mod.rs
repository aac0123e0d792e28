//! Models not downloaded yet: `hf://org/name[@rev]` on the Hub (or `HF_ENDPOINT`),
//! or an `https://…` safetensors file or index. devmap fetches `config.json`, the index
//! and only the header of each shard with HTTP range requests (8 bytes, then the
//! header), never tensor data, and lays them out in a *header mirror*: a temporary
//! folder whose shard files have the real length but hold only their header (the rest
//! is a hole, taking no disk). `model::load` reads the mirror like any folder, so tree,
//! totals, ties and plans are the same as for a local copy; the checkpoint is marked
//! remote, and saving it is refused.

pub mod http;

use crate::formats::Kind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub use http::Client;

use crate::formats::FormatError;
use crate::formats::hf_index::{INDEX_FILE, SINGLE_FILE, parse_index};
use crate::formats::safetensors::{MAX_HEADER_LEN, parse_header};

/// Header fetches in flight at once.
pub const PARALLEL_FETCHES: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("HTTP {status} for {url}{hint}")]
    Status {
        status: u16,
        url: String,
        hint: &'static str,
    },
    #[error("cannot fetch {url}: {message}")]
    Transport { url: String, message: String },
    #[error(
        "{url}: the server ignores Range requests (it answered with the whole file); devmap reads only headers and will not download the model"
    )]
    IgnoresRange { url: String },
    #[error("{url}: the header is cut short: {got} of {wanted} bytes")]
    Truncated { url: String, wanted: u64, got: u64 },
    #[error("{url} is larger than any config or index; not read")]
    TooLarge { url: String },
    #[error(
        "`{0}` is not a remote model: use hf://ORG/NAME[@REVISION] or an http(s) URL of a .safetensors file or model.safetensors.index.json"
    )]
    BadSpec(String),
    #[error(
        "{url} names {count} shards, over the {max} devmap reads by default (two requests each); pass --max-remote-shards {count} to read them all"
    )]
    TooManyShards {
        url: String,
        count: usize,
        max: usize,
    },
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("cannot write the header mirror {}: {source}", crate::text::path(path))]
    Mirror {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl RemoteError {
    fn status(status: u16, url: &str) -> RemoteError {
        let hint = match status {
            401 | 403 => {
                " (the repo is private or gated: set HF_TOKEN or log in with `hf auth login`)"
            }
            404 => " (no such repo, revision or file)",
            429 => " (rate limited; try again later)",
            _ => "",
        };
        RemoteError::Status {
            status,
            url: url.to_owned(),
            hint,
        }
    }
}

/// Where a remote model lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A Hub repo: files at `ENDPOINT/REPO/resolve/REVISION/FILE`.
    Hub {
        endpoint: String,
        repo: String,
        revision: String,
    },
    /// A plain URL of a safetensors file or an index; siblings are fetched beside it.
    Url { base: String, file: String },
}

impl Source {
    /// Reads `hf://org/name[@rev]` (with `HF_ENDPOINT`, default the public Hub) or an
    /// http(s) URL. `None`: the text is not meant as a remote model at all.
    pub fn parse(text: &str) -> Option<Result<Source, RemoteError>> {
        if let Some(rest) = text.strip_prefix("hf://") {
            let endpoint = hub_endpoint();
            return Some(
                crate::formats::hub_cache::parse_repo_id(rest.trim_end_matches('/'))
                    .map(|id| Source::Hub {
                        endpoint: endpoint.trim_end_matches('/').to_owned(),
                        repo: id.repo,
                        revision: id.revision,
                    })
                    .ok_or_else(|| RemoteError::BadSpec(text.to_owned())),
            );
        }
        if !(text.starts_with("https://") || text.starts_with("http://")) {
            return None;
        }
        let parsed = text.rsplit_once('/').and_then(|(base, file)| {
            let extension = Path::new(file).extension().and_then(|x| x.to_str());
            let ok = extension.is_some_and(|x| {
                x.eq_ignore_ascii_case("safetensors") || x.eq_ignore_ascii_case("json")
            });
            (ok && http::host_of(text).is_some_and(|h| !h.is_empty())).then(|| Source::Url {
                base: base.to_owned(),
                file: file.to_owned(),
            })
        });
        Some(parsed.ok_or_else(|| RemoteError::BadSpec(text.to_owned())))
    }

    /// The URL of `file` beside the model's weights.
    pub fn url(&self, file: &str) -> String {
        match self {
            Source::Hub {
                endpoint,
                repo,
                revision,
            } => format!(
                "{endpoint}/{repo}/resolve/{}/{}",
                encode(revision, false),
                encode(file, true)
            ),
            Source::Url { base, .. } => format!("{base}/{}", encode(file, true)),
        }
    }

    /// How the model is named in reports: `hf://org/name@rev` or the URL.
    pub fn display(&self) -> String {
        match self {
            Source::Hub { repo, revision, .. } if revision == "main" => format!("hf://{repo}"),
            Source::Hub { repo, revision, .. } => format!("hf://{repo}@{revision}"),
            Source::Url { base, file } => format!("{base}/{file}"),
        }
    }

    /// What a file name is appended to, to name the file in reports.
    pub fn files_base(&self) -> String {
        match self {
            Source::Hub { .. } => format!("{}/", self.display()),
            Source::Url { base, .. } => format!("{base}/"),
        }
    }

    /// The checkpoint's description of this model.
    pub fn describe(&self) -> crate::model::checkpoint::RemoteModel {
        crate::model::checkpoint::RemoteModel {
            name: self.display(),
            files: self.files_base(),
        }
    }

    /// The origin the Hub token may go to: `HF_ENDPOINT`'s (default the Hub), for
    /// `hf://` sources and for URLs alike. A URL's own host never decides it: a token
    /// for the Hub is not sent to a server that a URL names.
    fn token_origin(&self) -> Option<http::Origin> {
        match self {
            Source::Hub { endpoint, .. } => http::Origin::of(endpoint),
            Source::Url { .. } => http::Origin::of(&hub_endpoint()),
        }
    }
}

/// `HF_ENDPOINT`, else the public Hub.
fn hub_endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".to_owned())
}

/// Percent-encodes all but unreserved characters (and `/` when `keep_slash`), as
/// huggingface_hub quotes revisions and file names.
fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The token for the Hub: `HF_TOKEN`, else the file huggingface_hub's login writes
/// (`HF_TOKEN_PATH`, else `HF_HOME/token`).
pub fn hub_token() -> Option<String> {
    if let Some(t) = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Some(t.trim().to_owned());
    }
    let path = std::env::var_os("HF_TOKEN_PATH")
        .map(PathBuf::from)
        .or_else(|| crate::formats::hub_cache::hf_home().map(|h| h.join("token")))?;
    let text =
        crate::formats::input::read_small_text(&path, 64 << 10, "a token is one line").ok()?;
    Some(text.trim().to_owned()).filter(|t| !t.is_empty())
}

/// A fetched header mirror; the folder is removed when this is dropped.
#[derive(Debug)]
pub struct Mirror {
    pub dir: PathBuf,
    pub origin: String,
    pub shards: usize,
    /// HTTP requests made (retries included) and body bytes received.
    pub requests: u64,
    pub bytes: u64,
    /// Bytes the shards hold in all (what a download would move).
    pub model_bytes: u64,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Fetches the config, index and every shard's header of `source` into a new mirror
/// folder under `parent` (the system's temporary folder by default). `progress(done,
/// total)` is called as shard headers arrive.
pub fn fetch(
    source: &Source,
    parent: Option<&Path>,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Mirror, RemoteError> {
    fetch_with(source, parent, progress, DEFAULT_MAX_SHARDS)
}

/// The most shards a remote index may name before devmap asks for
/// `--max-remote-shards`: the largest models on the Hub have a few hundred, and each
/// shard costs two requests.
pub const DEFAULT_MAX_SHARDS: usize = 4096;

/// [`fetch`], reading at most `max_shards` shard headers (an index naming more is
/// refused before any of them is requested).
pub fn fetch_with(
    source: &Source,
    parent: Option<&Path>,
    progress: &(dyn Fn(usize, usize) + Sync),
    max_shards: usize,
) -> Result<Mirror, RemoteError> {
    let client = Client::new(hub_token(), source.token_origin());
    let dir = mirror_dir(parent)?;
    // Dropped on every error path: the folder goes with it.
    let mut mirror = Mirror {
        dir,
        origin: source.display(),
        shards: 0,
        requests: 0,
        bytes: 0,
        model_bytes: 0,
    };
    let write = |name: &str, bytes: &[u8]| -> Result<(), RemoteError> {
        let path = mirror.dir.join(name);
        std::fs::write(&path, bytes).map_err(|source| RemoteError::Mirror { path, source })
    };
    if let Some(config) = client.get_json(&source.url("config.json"), true)? {
        write("config.json", config.as_bytes())?;
    }
    let index_name = match source {
        Source::Url { file, .. }
            if Path::new(file)
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("safetensors")) =>
        {
            None
        }
        Source::Url { file, .. } => Some(file.clone()),
        Source::Hub { .. } => Some(INDEX_FILE.to_owned()),
    };
    let optional_index = matches!(source, Source::Hub { .. });
    let index_text = match &index_name {
        Some(name) => client.get_json(&source.url(name), optional_index)?,
        None => None,
    };
    let shards: Vec<String> = match &index_text {
        Some(text) => {
            let url = source.url(index_name.as_deref().unwrap_or(INDEX_FILE));
            let index = parse_index(Path::new(&url), text)?;
            write(INDEX_FILE, text.as_bytes())?;
            let mut names: Vec<String> = Vec::new();
            let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
            for (tensor, file) in &index.weight_map {
                if !crate::formats::hf_index::is_shard_file_name(file) {
                    return Err(FormatError::tensor_as(
                        Kind::Unsafe,
                        Path::new(&url),
                        tensor.as_ref(),
                        format!("shard `{file}` is not a file name beside the index"),
                    )
                    .into());
                }
                if seen.insert(file.as_ref()) {
                    names.push(file.to_string());
                }
            }
            if names.len() > max_shards {
                return Err(RemoteError::TooManyShards {
                    url,
                    count: names.len(),
                    max: max_shards,
                });
            }
            names
        }
        None => vec![match source {
            Source::Url { file, .. } => file.clone(),
            Source::Hub { .. } => SINGLE_FILE.to_owned(),
        }],
    };

    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Vec<Result<u64, RemoteError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..PARALLEL_FETCHES.min(shards.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(name) = shards.get(i) else { break };
                        let result = fetch_header(&client, source, name, &mirror.dir);
                        let failed = result.is_err();
                        out.push(result);
                        progress(done.fetch_add(1, Ordering::Relaxed) + 1, shards.len());
                        if failed {
                            // Stop the others early: one error is enough to report.
                            next.store(shards.len(), Ordering::Relaxed);
                            break;
                        }
                    }
                    out
                })
            })
            .collect();
        // A fetch thread that panicked is an error like any other, never a shard
        // silently missing from the mirror.
        workers
            .into_iter()
            .flat_map(|w| {
                w.join().unwrap_or_else(|_| {
                    vec![Err(RemoteError::Transport {
                        url: source.display(),
                        message: "a header-fetching thread stopped unexpectedly".into(),
                    })]
                })
            })
            .collect()
    });
    for r in results {
        mirror.model_bytes += r?;
    }
    mirror.shards = shards.len();
    mirror.requests = client.requests.load(Ordering::Relaxed);
    mirror.bytes = client.bytes.load(Ordering::Relaxed);
    Ok(mirror)
}

/// Reads one shard's length prefix and header with two range requests and writes them
/// into a sparse file of the shard's length. Returns that length.
fn fetch_header(
    client: &Client,
    source: &Source,
    name: &str,
    dir: &Path,
) -> Result<u64, RemoteError> {
    let url = source.url(name);
    let (prefix, total) = client.get_range(&url, 0, 8)?;
    if prefix.len() < 8 {
        return Err(RemoteError::Truncated {
            url,
            wanted: 8,
            got: prefix.len() as u64,
        });
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&prefix);
    let header_len = u64::from_le_bytes(n);
    if header_len > MAX_HEADER_LEN || header_len + 8 > total {
        // The same validation as a local file gives the message.
        return Err(parse_header(Path::new(&url), &prefix, total)
            .err()
            .map_or_else(
                || RemoteError::Truncated {
                    url: url.clone(),
                    wanted: header_len,
                    got: total.saturating_sub(8),
                },
                RemoteError::from,
            ));
    }
    // The header goes straight behind its length prefix: one buffer, no second copy.
    let mut bytes = prefix;
    client.get_range_into(&url, 8, header_len, &mut bytes)?;
    if (bytes.len() as u64) < 8 + header_len {
        return Err(RemoteError::Truncated {
            url,
            wanted: header_len,
            got: bytes.len() as u64 - 8,
        });
    }
    // Validated here so errors name the URL, not the mirror.
    parse_header(Path::new(&url), &bytes, total)?;
    let path = dir.join(name);
    let result = std::fs::write(&path, &bytes).and_then(|()| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)?
            .set_len(total)
    });
    result.map_err(|source| RemoteError::Mirror { path, source })?;
    Ok(total)
}

/// Mirror folders are `devmap-remote-PID-NANOS`.
const MIRROR_PREFIX: &str = "devmap-remote-";

/// A new, empty folder for a mirror. Mirrors left behind by a devmap that was killed
/// (its process is gone) are removed first.
fn mirror_dir(parent: Option<&Path>) -> Result<PathBuf, RemoteError> {
    let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
    remove_orphaned_mirrors(&parent);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = parent.join(format!("{MIRROR_PREFIX}{}-{nanos:08x}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|source| RemoteError::Mirror {
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// Removes the mirror folders in `parent` whose devmap is no longer running (a fetch
/// killed before its `Mirror` was dropped). Only folders named as mirrors are touched,
/// and only where `/proc` says the process is gone; elsewhere nothing is removed.
fn remove_orphaned_mirrors(parent: &Path) {
    if crate::sys::proc::process_runs(std::process::id()).is_none() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(MIRROR_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(_, nanos)| nanos.len() == 8 && nanos.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && crate::sys::proc::process_runs(pid) == Some(false) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_urls_quote_revisions_and_file_names() {
        let s = Source::Hub {
            endpoint: "https://huggingface.co".into(),
            repo: "org/name".into(),
            revision: "refs/pr/1".into(),
        };
        assert_eq!(
            s.url("model-00001-of-00002.safetensors"),
            "https://huggingface.co/org/name/resolve/refs%2Fpr%2F1/model-00001-of-00002.safetensors"
        );
        assert_eq!(s.display(), "hf://org/name@refs/pr/1");
    }

    #[test]
    fn what_counts_as_remote() {
        assert!(Source::parse("./model").is_none());
        assert!(Source::parse("org/name").is_none());
        assert!(matches!(
            Source::parse("hf://org/name"),
            Some(Ok(Source::Hub { .. }))
        ));
        assert!(matches!(Source::parse("hf://not a repo"), Some(Err(_))));
        assert!(matches!(
            Source::parse("https://host/x/model.safetensors"),
            Some(Ok(Source::Url { .. }))
        ));
        assert!(matches!(
            Source::parse("https://host/x/readme.md"),
            Some(Err(_))
        ));
    }
}
