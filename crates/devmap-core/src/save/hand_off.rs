//! Several threads' writes into one file, made one at a time with no thread waiting
//! for another's. The kernel holds a file's inode lock for each buffered write, and a
//! thread whose write finds it taken spins on it while the other copies
//! (`rwsem_spin_on_owner`: 12% of an AWQ save's samples, two threads on the AMD EPYC
//! VM) — time it could have spent making its next rows. Here a thread hands its
//! finished block over instead: when no other thread is writing, it writes it (then
//! whatever others queued); when one is, it queues the block, takes a free buffer in
//! its place and goes on, and the writing thread writes the block too. A thread waits
//! only when every spare buffer is queued.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// Blocks handed over by threads writing into `dst`, and the spare buffers.
pub(crate) struct HandOff<'f> {
    dst: &'f File,
    /// Held by the thread that writes.
    writing: Mutex<()>,
    /// Blocks made and not yet written, in the order they were handed over.
    queued: Mutex<VecDeque<Block>>,
    /// Buffers a thread may take in place of the one it queues.
    free: Mutex<Vec<Vec<u8>>>,
}

/// `buffer[range]`, to be written at `offset`.
struct Block {
    offset: u64,
    buffer: Vec<u8>,
    range: Range<usize>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<'f> HandOff<'f> {
    /// Writes into `dst`, with `spares` to take in place of queued buffers: how many
    /// blocks the threads that make rows may run ahead of the one writing (one a thread
    /// lets each make a block while another writes; GPTQ's and AWQ's callers bring six
    /// a thread, as a sub-band starts with rows-free work: `gptq::shared`).
    pub(crate) fn new(dst: &'f File, spares: Vec<Vec<u8>>) -> Self {
        HandOff {
            dst,
            writing: Mutex::new(()),
            queued: Mutex::new(VecDeque::new()),
            free: Mutex::new(spares),
        }
    }

    /// Hands over `buffer[range]`, to be written at `offset`: written now when no
    /// other thread is writing (first, while the cache holds it, then what others
    /// queued); else queued, and `buffer` replaced by a spare (waiting for the writer
    /// only when none is free). An error is the write's, of this block or of one
    /// another thread queued.
    pub(crate) fn hand(
        &self,
        offset: u64,
        buffer: &mut Vec<u8>,
        range: Range<usize>,
    ) -> io::Result<()> {
        let writing = match self.writing.try_lock() {
            Ok(writing) => Some(writing),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        if let Some(_writing) = writing {
            self.dst.write_all_at(&buffer[range], offset)?;
            return self.write_queued();
        }
        let spare = lock(&self.free).pop();
        let Some(spare) = spare else {
            // Every spare is queued: write them, and this block, in turn.
            let _writing = lock(&self.writing);
            self.write_queued()?;
            return self.dst.write_all_at(&buffer[range], offset);
        };
        // The writing thread writes it (or the next hand-over or flush does, if it
        // had just looked at the queue).
        let buffer = std::mem::replace(buffer, spare);
        lock(&self.queued).push_back(Block {
            offset,
            buffer,
            range,
        });
        Ok(())
    }

    /// Writes every queued block, waiting for the thread that is writing: each thread
    /// calls it when it has handed over its last block.
    pub(crate) fn flush(&self) -> io::Result<()> {
        let _writing = lock(&self.writing);
        self.write_queued()
    }

    /// The buffers, for the next weight (those still queued after an error too).
    pub(crate) fn into_buffers(self) -> Vec<Vec<u8>> {
        let mut buffers = self
            .free
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        let queued = self
            .queued
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        buffers.extend(queued.into_iter().map(|block| block.buffer));
        buffers
    }

    /// Writes the queued blocks in order, each buffer freed as it is written. Called
    /// holding `writing`.
    fn write_queued(&self) -> io::Result<()> {
        loop {
            let next = lock(&self.queued).pop_front();
            let Some(block) = next else {
                return Ok(());
            };
            let written = self
                .dst
                .write_all_at(&block.buffer[block.range.clone()], block.offset);
            lock(&self.free).push(block.buffer);
            written?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HandOff;
    use std::os::unix::fs::FileExt;

    /// Two threads hand over blocks of distinct bytes, each in a buffer it then
    /// overwrites (as a kernel reuses its output): every block lands at its offset
    /// whole, whoever wrote it, with one spare or none.
    #[test]
    fn every_block_lands_at_its_place_whoever_writes_it() {
        const BLOCK: usize = 4096;
        const BLOCKS: usize = 64;
        for spares in [0, 1, 2] {
            let dir = tempfile::tempdir().expect("dir");
            let path = dir.path().join("out");
            let file = std::fs::File::create(&path).expect("create");
            let hand_off = HandOff::new(&file, vec![Vec::new(); spares]);
            std::thread::scope(|scope| {
                for t in 0..2usize {
                    let hand_off = &hand_off;
                    scope.spawn(move || {
                        let mut buffer = Vec::new();
                        for k in (t..BLOCKS).step_by(2) {
                            // A block starting 7 bytes into its buffer, as a kernel's
                            // line-aligned output does.
                            buffer.clear();
                            buffer.resize(7 + BLOCK, 0);
                            buffer[7..].fill(k as u8 + 1);
                            let at = (k * BLOCK) as u64;
                            hand_off.hand(at, &mut buffer, 7..7 + BLOCK).expect("hand");
                        }
                        hand_off.flush().expect("flush");
                    });
                }
            });
            assert_eq!(hand_off.into_buffers().len(), spares, "every spare back");
            let written = std::fs::read(&path).expect("read");
            assert_eq!(written.len(), BLOCK * BLOCKS);
            for (k, block) in written.chunks(BLOCK).enumerate() {
                assert!(
                    block.iter().all(|&b| b == k as u8 + 1),
                    "block {k} with {spares} spares"
                );
            }
            drop(file);
        }
    }

    /// A block handed over while another thread writes is queued, its buffer swapped
    /// for a spare; with no spare left the next one waits for the writer, then writes
    /// the queued block and its own.
    #[test]
    fn a_block_handed_over_during_a_write_is_queued_then_written() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("out");
        let file = std::fs::File::create(&path).expect("create");
        let hand_off = HandOff::new(&file, vec![Vec::with_capacity(3)]);
        let writing = hand_off.writing.lock().expect("the writer's turn");
        let mut buffer = vec![7u8; 8];
        hand_off.hand(8, &mut buffer, 0..8).expect("queued");
        assert_eq!(buffer.capacity(), 3, "the spare in its place");
        assert_eq!(
            std::fs::read(&path).expect("read").len(),
            0,
            "nothing written yet"
        );
        std::thread::scope(|scope| {
            let second = scope.spawn(|| {
                let mut second = vec![9u8; 8];
                hand_off.hand(0, &mut second, 0..8)
            });
            // (Released once the second hand-over is likely waiting; if it is not yet,
            // it finds no writer and writes both blocks all the same.)
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(writing);
            second.join().expect("joined").expect("written");
        });
        assert_eq!(
            std::fs::read(&path).expect("read"),
            [[9u8; 8], [7; 8]].concat()
        );
        assert_eq!(hand_off.into_buffers().len(), 1, "the queued buffer freed");
    }

    /// A write that fails is reported by the thread that wrote it, and the buffers
    /// come back.
    #[test]
    fn a_failed_write_is_an_error_and_keeps_the_buffers() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("out");
        std::fs::write(&path, b"x").expect("write");
        // Opened read-only: every write fails.
        let file = std::fs::File::open(&path).expect("open");
        assert!(file.write_at(b"y", 0).is_err(), "a read-only file");
        let hand_off = HandOff::new(&file, vec![Vec::new()]);
        let mut buffer = vec![1u8; 16];
        assert!(hand_off.hand(0, &mut buffer, 0..16).is_err());
        assert!(hand_off.flush().is_ok(), "nothing left queued");
        assert_eq!(hand_off.into_buffers().len(), 1);
    }
}
