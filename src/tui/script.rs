//! A scripted [`EventSource`] for tests: the runtime's real loop, effects and worker
//! threads, fed with steps instead of a terminal, on a virtual clock that moves only
//! when the loop waits. Background work (re-totals, previews, saves, verifications)
//! runs on real threads; a plain step is delivered only once all of it has reported
//! back, so a journey is deterministic without sleeping.

use std::io;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use super::runtime::{Event, EventSource, Next};

/// How long (real time) the script waits for background work before it gives up.
const WORK_LIMIT: Duration = Duration::from_secs(120);

/// One step of a script.
#[derive(Debug)]
pub enum Step {
    /// An event, delivered once background work has reported back.
    Event(Event),
    /// An event delivered at once, while work may still be running (a key pressed
    /// while a re-total runs).
    Now(Event),
    /// Time passes with no input.
    Wait(Duration),
}

/// The steps, the virtual clock, and the channel the runtime's threads send to.
pub struct Script {
    steps: std::collections::VecDeque<Step>,
    now: Duration,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    /// Loop turns allowed after the last step for frames and deferred work still
    /// owed (a spinner could otherwise keep the loop going forever).
    settle: u32,
}

impl Script {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Script {
        let (tx, rx) = mpsc::channel();
        Script {
            steps: steps.into_iter().collect(),
            now: Duration::ZERO,
            tx,
            rx,
            settle: 200,
        }
    }

    /// The same script on a clock that starts at `now` (an App that already ran keeps
    /// its clock, so time never runs backwards for it).
    #[must_use]
    pub fn starting_at(mut self, now: Duration) -> Script {
        self.now = now;
        self
    }
}

impl EventSource for Script {
    fn now(&self) -> Duration {
        self.now
    }

    fn next(&mut self, wait: Duration, busy: bool) -> io::Result<Next> {
        if let Ok(event) = self.rx.try_recv() {
            return Ok(Next::Event(event));
        }
        if matches!(self.steps.front(), Some(Step::Now(_)))
            && let Some(Step::Now(event)) = self.steps.pop_front()
        {
            return Ok(Next::Event(event));
        }
        if busy {
            return match self.rx.recv_timeout(WORK_LIMIT) {
                Ok(event) => Ok(Next::Event(event)),
                Err(RecvTimeoutError::Timeout) => Err(io::Error::other(format!(
                    "background work did not report back within {WORK_LIMIT:?}"
                ))),
                Err(RecvTimeoutError::Disconnected) => {
                    Err(io::Error::other("event channel closed"))
                }
            };
        }
        match self.steps.pop_front() {
            Some(Step::Event(event) | Step::Now(event)) => Ok(Next::Event(event)),
            Some(Step::Wait(d)) => {
                if d > wait {
                    self.now += wait;
                    self.steps.push_front(Step::Wait(d.saturating_sub(wait)));
                } else {
                    self.now += d;
                }
                Ok(Next::Timeout)
            }
            None => {
                // A frame or deferred work still owed is let happen; then the end.
                if wait < Duration::from_secs(60) && self.settle > 0 {
                    self.settle -= 1;
                    self.now += wait;
                    Ok(Next::Timeout)
                } else {
                    Ok(Next::End)
                }
            }
        }
    }

    fn try_next(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    fn sender(&self) -> Sender<Event> {
        self.tx.clone()
    }
}
