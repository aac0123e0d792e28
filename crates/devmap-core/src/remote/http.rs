//! The HTTP side of remote models: whole small files (config, index) and byte ranges
//! of shards, with a token for the Hub, timeouts, retries, and errors that name the
//! status and the URL.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::RemoteError;

/// JSON files are small; anything bigger is not a config or an index.
const MAX_JSON: u64 = crate::formats::input::MAX_JSON_BYTES;
const ATTEMPTS: u32 = 3;

/// The most a request may take, retries and redirects included (docs/guide.md's "60 s
/// in all").
pub const REQUEST_LIMIT: Duration = Duration::from_secs(60);
const MAX_REDIRECTS: u32 = 10;

/// A blocking client shared by the fetching threads, counting what it moves.
pub struct Client {
    agent: ureq::Agent,
    token: Option<String>,
    /// The origin the token belongs to (`HF_ENDPOINT`'s): it is sent nowhere else.
    token_origin: Option<Origin>,
    limit: Duration,
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

/// Scheme, host and port of a URL, compared as browsers compare origins: the token
/// for `http://127.0.0.1:8080` is not sent to `http://127.0.0.1:9090`,
/// `http://localhost:8080` or `https://127.0.0.1:8080`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    scheme: &'static str,
    host: String,
    port: u16,
}

impl Origin {
    /// The origin of an `http://` or `https://` URL; `None` for anything else (or a
    /// port that is not a number).
    pub fn of(url: &str) -> Option<Origin> {
        let (scheme, default_port) = if url.len() >= 8 && url[..8].eq_ignore_ascii_case("https://")
        {
            ("https", 443)
        } else if url.len() >= 7 && url[..7].eq_ignore_ascii_case("http://") {
            ("http", 80)
        } else {
            return None;
        };
        let authority = host_of(url)?;
        // Credentials in the URL are not part of the origin.
        let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = match authority.rsplit_once(':') {
            // An IPv6 literal without a port: `[::1]`.
            Some((h, p)) if !p.contains(']') => (h, p.parse().ok()?),
            _ => (authority, default_port),
        };
        if host.is_empty() {
            return None;
        }
        Some(Origin {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

impl Client {
    /// A client that sends `token` only to URLs on `token_origin`.
    pub fn new(token: Option<String>, token_origin: Option<Origin>) -> Client {
        Client::with_limit(token, token_origin, REQUEST_LIMIT)
    }

    /// The same, with another limit on each request's total time.
    pub fn with_limit(
        token: Option<String>,
        token_origin: Option<Origin>,
        limit: Duration,
    ) -> Client {
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(15)))
            .http_status_as_error(false)
            // Redirects are followed here, not by ureq: its rule for keeping the token
            // compares host names only, and the token must stay on its origin.
            .max_redirects(0)
            .user_agent(concat!("devmap/", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            agent: config.into(),
            token,
            token_origin,
            limit,
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// Whether a request to `url` may carry the token: only on the token's origin.
    fn token_for(&self, url: &str) -> Option<&str> {
        let origin = self.token_origin.as_ref()?;
        (Origin::of(url).as_ref() == Some(origin))
            .then_some(self.token.as_deref())
            .flatten()
    }

    /// A whole JSON file; `None` when it does not exist (404) and `optional`.
    pub fn get_json(&self, url: &str, optional: bool) -> Result<Option<String>, RemoteError> {
        let response = self.get(url, None)?;
        let status = response.status().as_u16();
        if status == 404 && optional {
            return Ok(None);
        }
        if status != 200 {
            return Err(RemoteError::status(status, url));
        }
        let mut text = String::new();
        let read = response
            .into_body()
            .into_reader()
            .take(MAX_JSON + 1)
            .read_to_string(&mut text);
        read.map_err(|e| RemoteError::Transport {
            url: url.to_owned(),
            message: e.to_string(),
        })?;
        self.bytes.fetch_add(text.len() as u64, Ordering::Relaxed);
        if text.len() as u64 > MAX_JSON {
            return Err(RemoteError::TooLarge {
                url: url.to_owned(),
            });
        }
        Ok(Some(text))
    }

    /// `len` bytes at `start`, and the file's full length from `Content-Range`. A
    /// server that answers with the whole file (200) is refused at once, its body
    /// unread: devmap never downloads a model to read its headers.
    pub fn get_range(
        &self,
        url: &str,
        start: u64,
        len: u64,
    ) -> Result<(Vec<u8>, u64), RemoteError> {
        let mut body = Vec::with_capacity(len as usize);
        let total = self.get_range_into(url, start, len, &mut body)?;
        Ok((body, total))
    }

    /// [`Client::get_range`], appending the bytes to `body` (a shard header is read
    /// into the buffer that already holds its length prefix: one copy, not two).
    pub fn get_range_into(
        &self,
        url: &str,
        start: u64,
        len: u64,
        body: &mut Vec<u8>,
    ) -> Result<u64, RemoteError> {
        let end = start + len.max(1) - 1;
        let response = self.get(url, Some(format!("bytes={start}-{end}")))?;
        let status = response.status().as_u16();
        if status == 200 {
            return Err(RemoteError::IgnoresRange {
                url: url.to_owned(),
            });
        }
        if status != 206 {
            return Err(RemoteError::status(status, url));
        }
        let total = response
            .headers()
            .get("content-range")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit_once('/'))
            .and_then(|(_, total)| total.trim().parse::<u64>().ok())
            .ok_or_else(|| RemoteError::Transport {
                url: url.to_owned(),
                message: "a 206 answer without `Content-Range: bytes a-b/LENGTH`".into(),
            })?;
        body.reserve_exact(len as usize);
        let read = response
            .into_body()
            .into_reader()
            .take(len)
            .read_to_end(body)
            .map_err(|e| RemoteError::Transport {
                url: url.to_owned(),
                message: e.to_string(),
            })?;
        self.bytes.fetch_add(read as u64, Ordering::Relaxed);
        Ok(total)
    }

    /// One GET, retried on connection failures, timeouts and 429/5xx answers, with
    /// redirects followed; all of it within the client's limit. The token goes only to
    /// URLs on its origin, redirects included.
    fn get(
        &self,
        url: &str,
        range: Option<String>,
    ) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        let deadline = std::time::Instant::now() + self.limit;
        let timed_out = || RemoteError::Transport {
            url: url.to_owned(),
            message: format!(
                "no complete answer within {} s (retries included)",
                self.limit.as_secs()
            ),
        };
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                let pause = Duration::from_millis(250 << attempt);
                if std::time::Instant::now() + pause >= deadline {
                    break;
                }
                std::thread::sleep(pause);
            }
            match self.follow(url, range.as_deref(), deadline) {
                Ok(r) if matches!(r.status().as_u16(), 429 | 500 | 502 | 503 | 504) => {
                    last = Some(RemoteError::status(r.status().as_u16(), url));
                }
                Ok(r) => return Ok(r),
                Err(e) => last = Some(e),
            }
            if std::time::Instant::now() >= deadline {
                return Err(last.unwrap_or_else(timed_out));
            }
        }
        Err(last.unwrap_or_else(timed_out))
    }

    /// One attempt: the request and the redirects it leads to.
    fn follow(
        &self,
        url: &str,
        range: Option<&str>,
        deadline: std::time::Instant,
    ) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        let mut current = url.to_owned();
        for _ in 0..=MAX_REDIRECTS {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            self.requests.fetch_add(1, Ordering::Relaxed);
            let mut request = self
                .agent
                .get(&current)
                .config()
                .timeout_global(Some(left))
                .build();
            if let Some(r) = range {
                request = request.header("Range", r);
            }
            if let Some(token) = self.token_for(&current) {
                request = request.header("Authorization", &format!("Bearer {token}"));
            }
            let response = request.call().map_err(|e| RemoteError::Transport {
                url: current.clone(),
                message: e.to_string(),
            })?;
            let status = response.status().as_u16();
            if !matches!(status, 301 | 302 | 303 | 307 | 308) {
                return Ok(response);
            }
            let location = response
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| RemoteError::Transport {
                    url: current.clone(),
                    message: format!("a {status} answer without a Location"),
                })?;
            current =
                resolve_location(&current, location).ok_or_else(|| RemoteError::Transport {
                    url: current.clone(),
                    message: format!("a redirect to `{location}`, which is not an http(s) URL"),
                })?;
        }
        Err(RemoteError::Transport {
            url: url.to_owned(),
            message: format!(
                "more than {MAX_REDIRECTS} redirects, or no answer within {} s",
                self.limit.as_secs()
            ),
        })
    }
}

/// Where a redirect's `Location` points, from the URL that answered it: absolute
/// (`https://…`), scheme-relative (`//host/…`), host-relative (`/path`) or relative
/// to the answering URL's folder.
pub fn resolve_location(from: &str, location: &str) -> Option<String> {
    if Origin::of(location).is_some() {
        return Some(location.to_owned());
    }
    let scheme_end = from.find("://")? + 3;
    if let Some(rest) = location.strip_prefix("//") {
        return Some(format!("{}{rest}", &from[..scheme_end]));
    }
    let authority = host_of(from)?;
    let root = &from[..scheme_end + authority.len()];
    if location.starts_with('/') {
        return Some(format!("{root}{location}"));
    }
    let path = from[root.len()..].split(['?', '#']).next().unwrap_or("");
    let folder = path.rfind('/').map_or("/", |i| &path[..=i]);
    Some(format!("{root}{folder}{location}"))
}

/// `host[:port]` of an http(s) URL.
pub fn host_of(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    Some(rest.split(['/', '?', '#']).next().unwrap_or(rest))
}
