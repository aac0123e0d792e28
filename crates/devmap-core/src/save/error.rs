use std::io;
use std::path::PathBuf;

pub use super::reasons::{Mismatch, Refusal, Unsaveable};

#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// Tensors that cannot be written (no data, a source of the wrong size), found
    /// while planning. Each problem names a tensor.
    #[error("cannot save; nothing was written:{}", bullets(.0))]
    Unsaveable(Vec<Unsaveable>),
    /// Found before any byte was written.
    #[error("refusing to save; nothing was written:{}", bullets(.0))]
    Refused(Vec<Refusal>),
    /// Another save holds the lock on OUT.
    #[error("another devmap save is writing into {}; wait for it to finish (or cancel it), then save again", .0.display())]
    Busy(PathBuf),
    #[error("{}: {source}", crate::text::path(path))]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {}", crate::text::path(path), crate::text::escaped(message))]
    SourceChanged { path: PathBuf, message: String },
    #[error("the written checkpoint does not match the plan, so it was discarded:{}", bullets(.0))]
    Verify(Vec<Mismatch>),
    /// A bug: a save thread panicked. Its files were removed like any failed save's.
    #[error(
        "{0} stopped unexpectedly (a bug in devmap; please report it); nothing was left in the output folder"
    )]
    Panicked(String),
    #[error("cancelled; no shard was left in the output folder")]
    Cancelled,
}

impl SaveError {
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> SaveError {
        SaveError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Problems one per line, for messages that list several.
pub fn bullets<T: std::fmt::Display>(items: &[T]) -> String {
    // Each item is one line: whatever names it holds are escaped, so none can start
    // a line of its own.
    items
        .iter()
        .map(|i| format!("\n  - {}", crate::text::escaped(&i.to_string())))
        .collect()
}
