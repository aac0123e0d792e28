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

/// A blocking client shared by the fetching threads, counting what it moves.
pub struct Client {
    agent: ureq::Agent,
    token: Option<String>,
    /// The host the token belongs to: it is sent nowhere else.
    token_host: Option<String>,
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

impl Client {
    pub fn new(token: Option<String>, token_host: Option<String>) -> Client {
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_global(Some(Duration::from_secs(60)))
            .http_status_as_error(false)
            .max_redirects(10)
            // The Hub redirects resolve URLs within its host (keep the token) and LFS
            // files to its CDN with signed URLs (do not send it there).
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .user_agent(concat!("devmap/", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            agent: config.into(),
            token,
            token_host,
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
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
        let mut body = Vec::with_capacity(len as usize);
        response
            .into_body()
            .into_reader()
            .take(len)
            .read_to_end(&mut body)
            .map_err(|e| RemoteError::Transport {
                url: url.to_owned(),
                message: e.to_string(),
            })?;
        self.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        Ok((body, total))
    }

    /// One GET, retried on connection failures, timeouts and 429/5xx answers.
    fn get(
        &self,
        url: &str,
        range: Option<String>,
    ) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(250 << attempt));
            }
            self.requests.fetch_add(1, Ordering::Relaxed);
            let mut request = self.agent.get(url);
            if let Some(r) = &range {
                request = request.header("Range", r);
            }
            if let Some(token) = &self.token
                && self.token_host.as_deref() == host_of(url)
            {
                request = request.header("Authorization", &format!("Bearer {token}"));
            }
            match request.call() {
                Ok(r) if matches!(r.status().as_u16(), 429 | 500 | 502 | 503 | 504) => {
                    last = Some(RemoteError::status(r.status().as_u16(), url));
                }
                Ok(r) => return Ok(r),
                Err(e) => {
                    last = Some(RemoteError::Transport {
                        url: url.to_owned(),
                        message: e.to_string(),
                    });
                }
            }
        }
        Err(last.unwrap_or_else(|| RemoteError::Transport {
            url: url.to_owned(),
            message: "no attempt made".into(),
        }))
    }
}

/// `host[:port]` of an http(s) URL.
pub fn host_of(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    Some(rest.split(['/', '?', '#']).next().unwrap_or(rest))
}
