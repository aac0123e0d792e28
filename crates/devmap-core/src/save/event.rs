//! What a running save tells its caller: typed events on a bounded channel.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};

/// What a running save reports.
#[derive(Debug, Clone, PartialEq)]
pub enum SaveEvent {
    ShardStarted {
        index: usize,
        count: usize,
        file_name: String,
        bytes: u64,
    },
    /// Cumulative bytes: within the current shard, and of all tensor data.
    Progress {
        index: usize,
        shard_written: u64,
        total_written: u64,
    },
    ShardFinished {
        index: usize,
    },
    Finished(SaveReport),
    Failed(String),
    Cancelled,
}

/// What a finished save wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveReport {
    pub out: PathBuf,
    pub shard_files: Vec<String>,
    pub tensors: usize,
    pub bytes: u64,
    pub copied_files: Vec<String>,
    pub removed_stale: Vec<String>,
    pub kernel_copy: bool,
    /// Whether copied input was dropped from the page cache.
    pub dropped_cache: bool,
}

/// Sends events without ever blocking the copy on a slow reader: progress is dropped
/// when the channel is full (the next one carries the totals), lifecycle events wait.
/// A dropped receiver cancels the save.
pub struct Reporter<'a> {
    tx: Option<&'a SyncSender<SaveEvent>>,
    cancel: &'a AtomicBool,
}

impl<'a> Reporter<'a> {
    pub fn new(tx: Option<&'a SyncSender<SaveEvent>>, cancel: &'a AtomicBool) -> Self {
        Reporter { tx, cancel }
    }

    pub(super) fn progress(&self, event: SaveEvent) {
        if let Some(tx) = self.tx
            && let Err(TrySendError::Disconnected(_)) = tx.try_send(event)
        {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }

    pub(super) fn lifecycle(&self, event: SaveEvent) {
        if let Some(tx) = self.tx
            && tx.send(event).is_err()
        {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }
}
