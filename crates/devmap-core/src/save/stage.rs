//! Sources whose bytes the caller copies into this process's memory on request: a live
//! model's GPU tensors, copied chunk by chunk into one pinned host buffer by torch. The
//! saver (and `verify --against`) ask for at most [`Stage::capacity`] bytes at a time,
//! then read them from the address returned, through `/proc/self/mem` as any memory
//! source; the buffer is reused for the next chunk, so host memory grows by the buffer
//! and GPU memory not at all.
//!
//! A staged tensor's source is `InputKind::Staged(KEY)` (named `devmap:staged/KEY` in
//! messages); its byte range counts from the start of that tensor.

use std::fs::File;
use std::sync::{Arc, Mutex};

use super::copy::CopyError;
use crate::sys::proc::PROCESS_MEMORY;

/// What copies staged bytes into memory. `fill(key, offset, len)` puts bytes
/// `offset..offset + len` of tensor `key` somewhere in this process and returns their
/// address, valid until the next call.
pub trait Stage: Send + Sync {
    /// The most bytes one `fill` takes.
    fn capacity(&self) -> u64;
    fn fill(&self, key: u64, offset: u64, len: u64) -> Result<u64, String>;
}

/// A shared [`Stage`], with the lock that keeps two writer threads from using its one
/// buffer at once.
#[derive(Clone)]
pub struct StageRef {
    stage: Arc<dyn Stage>,
    busy: Arc<Mutex<()>>,
}

impl StageRef {
    pub fn new(stage: Arc<dyn Stage>) -> StageRef {
        StageRef {
            stage,
            busy: Arc::new(Mutex::new(())),
        }
    }
}

impl std::fmt::Debug for StageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StageRef(capacity {})", self.stage.capacity())
    }
}

/// Two stages are the same when they are the same object.
impl PartialEq for StageRef {
    fn eq(&self, other: &StageRef) -> bool {
        Arc::ptr_eq(&self.busy, &other.busy)
    }
}

/// What [`through_stage`] does with each filled chunk: `((memory, address), done, n)`.
pub type ChunkOp<'a> = dyn FnMut((&File, u64), u64, u64) -> Result<(), CopyError> + 'a;

/// Runs `op` over bytes `offset..offset + len` of staged tensor `key`, one filled chunk
/// at a time: `op((memory, address), done, n)` gets the chunk's place in memory, how
/// many bytes came before it, and its length (a multiple of `align`, but the last).
pub fn through_stage(
    stage: Option<&StageRef>,
    key: u64,
    (offset, len): (u64, u64),
    align: u64,
    op: &mut ChunkOp<'_>,
) -> Result<(), CopyError> {
    let Some(stage) = stage else {
        return Err(CopyError::Io(std::io::Error::other(
            "a staged tensor (a GPU tensor of a live model) needs the Python session that staged it",
        )));
    };
    let memory = File::open(PROCESS_MEMORY).map_err(CopyError::Io)?;
    let align = align.max(1);
    let step = (stage.stage.capacity() / align * align).max(align);
    // One chunk in the buffer at a time, whichever thread asks.
    let _held = stage.busy.lock().map_err(|_| {
        CopyError::Io(std::io::Error::other(
            "the staging buffer's lock was poisoned",
        ))
    })?;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(step);
        let address = stage
            .stage
            .fill(key, offset + done, n)
            .map_err(|why| CopyError::Io(std::io::Error::other(why)))?;
        op((&memory, address), done, n)?;
        done += n;
    }
    Ok(())
}
