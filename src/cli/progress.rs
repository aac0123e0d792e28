//! The save progress line on stderr: redrawn at most ten times a second on a terminal,
//! one line per shard otherwise.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use devmap::human_bytes;
use devmap::save::SaveEvent;

pub struct Progress {
    total: u64,
    tty: bool,
    started: Instant,
    last_draw: Option<Instant>,
    /// Shards being written, by index: with several writers, events of different
    /// shards interleave, so each line names the shard its own event is about.
    running: HashMap<usize, String>,
    finished: usize,
    shard_count: usize,
}

impl Progress {
    pub fn new(total: u64) -> Progress {
        Progress {
            total,
            tty: std::io::stderr().is_terminal(),
            started: Instant::now(),
            last_draw: None,
            running: HashMap::new(),
            finished: 0,
            shard_count: 0,
        }
    }

    /// Draws what `event` changes. An error means stderr is gone (a closed pipe, a
    /// full disk): the caller stops the save.
    pub fn handle(&mut self, event: &SaveEvent) -> std::io::Result<()> {
        let mut err = std::io::stderr().lock();
        match event {
            SaveEvent::ShardStarted {
                index,
                count,
                file_name,
                ..
            } => {
                self.running.insert(*index, file_name.clone());
                self.shard_count = *count;
            }
            SaveEvent::Progress { total_written, .. } if self.tty => {
                let due = self
                    .last_draw
                    .is_none_or(|t| t.elapsed() >= Duration::from_millis(100));
                if due {
                    self.last_draw = Some(Instant::now());
                    write!(err, "\r\x1b[2K{}", self.line(*total_written))?;
                    err.flush()?;
                }
            }
            SaveEvent::ShardFinished { index } => {
                self.finished += 1;
                if self.tty {
                    write!(err, "\r\x1b[2K")?;
                }
                let name = self.running.remove(index).unwrap_or_default();
                writeln!(
                    err,
                    "  wrote {} ({}/{})",
                    devmap::text::escaped(&name),
                    index + 1,
                    self.shard_count
                )?;
            }
            _ => {}
        }
        Ok(())
    }

    fn line(&self, written: u64) -> String {
        const WIDTH: usize = 30;
        let fraction = if self.total == 0 {
            1.0
        } else {
            written as f64 / self.total as f64
        };
        let filled = ((fraction * WIDTH as f64) as usize).min(WIDTH);
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = written as f64 / secs;
        let eta = if rate > 0.0 {
            (self.total.saturating_sub(written)) as f64 / rate
        } else {
            0.0
        };
        format!(
            "[{}{}] {:>5.1}%  {} / {}  {}/s  ETA {:.0}s  {}/{} shards written",
            "#".repeat(filled),
            "-".repeat(WIDTH - filled),
            fraction * 100.0,
            human_bytes(written),
            human_bytes(self.total),
            human_bytes(rate as u64),
            eta,
            self.finished,
            self.shard_count
        )
    }
}
