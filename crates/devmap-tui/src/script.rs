//! A scripted [`EventSource`] for tests: the runtime's real loop, effects and worker
//! threads, fed with steps instead of a terminal, on a virtual clock that moves only
//! when the loop waits. Background work (re-totals, previews, saves, verifications)
//! runs on real threads; a plain step is delivered only once all of it has reported
//! back, so a journey is deterministic without sleeping. [`Step::Hold`] and
//! [`Step::Release`] pin down an order the threads would otherwise race for: what they
//! send meanwhile is kept back, and handed over at the release.

use std::io;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use super::runtime::{Event, EventSource, Next};

/// Loop turns allowed after the last step of a part, for frames and deferred work
/// still owed.
const SETTLE_TURNS: u32 = 200;

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
    /// From here on, what background work sends (results, save and verify events) is
    /// kept back, and the steps after this one go on without waiting for it.
    Hold,
    /// Hands over, in order, what was kept back since [`Step::Hold`]; from here on the
    /// steps wait for background work again.
    Release,
    /// Waits (real time, up to the work limit) until this many events are kept back:
    /// work started by the steps before has surely finished.
    AwaitHeld(usize),
    /// Hands over the first event kept back, and goes on holding the rest.
    ReleaseFirst,
    /// Hands over what was kept back so far, and goes on holding what comes next.
    HandOver,
    /// Ends this part of the script here, with no time passing for work that is owed
    /// later (the save preview's quiet time): the state right after the keys.
    Stop,
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
    /// Events kept back while held (`Some`), in the order they came.
    held: Option<std::collections::VecDeque<Event>>,
    /// Events released and not yet handed over.
    released: std::collections::VecDeque<Event>,
}

impl Script {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Script {
        let (tx, rx) = mpsc::channel();
        Script {
            steps: steps.into_iter().collect(),
            now: Duration::ZERO,
            tx,
            rx,
            settle: SETTLE_TURNS,
            held: None,
            released: std::collections::VecDeque::new(),
        }
    }

    /// More steps, after those not yet taken (a journey run in parts); the turns let
    /// for owed frames start afresh.
    pub fn push(&mut self, steps: impl IntoIterator<Item = Step>) {
        self.steps.extend(steps);
        self.settle = SETTLE_TURNS;
    }

    /// The events kept back so far, with whatever the threads have sent since (holding
    /// from now on, if it was not).
    fn keep_back(&mut self) -> &mut std::collections::VecDeque<Event> {
        let held = self.held.get_or_insert_with(Default::default);
        held.extend(self.rx.try_iter());
        held
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
        if let Some(event) = self.released.pop_front() {
            return Ok(Next::Event(event));
        }
        if self.held.is_some() {
            // Keep back whatever the threads sent; the steps go on regardless.
            self.keep_back();
        } else if let Ok(event) = self.rx.try_recv() {
            return Ok(Next::Event(event));
        }
        if matches!(self.steps.front(), Some(Step::Now(_)))
            && let Some(Step::Now(event)) = self.steps.pop_front()
        {
            return Ok(Next::Event(event));
        }
        if busy && self.held.is_none() {
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
            Some(Step::Hold) => {
                self.held.get_or_insert_with(Default::default);
                self.next(wait, busy)
            }
            Some(Step::AwaitHeld(count)) => {
                let held = self.held.get_or_insert_with(Default::default);
                let deadline = std::time::Instant::now() + WORK_LIMIT;
                while held.len() < count {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    match self.rx.recv_timeout(left) {
                        Ok(event) => held.push_back(event),
                        Err(_) => {
                            return Err(io::Error::other(format!(
                                "{count} events were not sent within {WORK_LIMIT:?}"
                            )));
                        }
                    }
                }
                self.next(wait, busy)
            }
            Some(Step::ReleaseFirst) => {
                if let Some(first) = self.keep_back().pop_front() {
                    self.released.push_back(first);
                }
                self.next(wait, busy)
            }
            Some(Step::Stop) => Ok(Next::End),
            Some(Step::HandOver) => {
                let held: Vec<Event> = self.keep_back().drain(..).collect();
                self.released.extend(held);
                self.next(wait, busy)
            }
            Some(Step::Release) => {
                let held: Vec<Event> = self.keep_back().drain(..).collect();
                self.held = None;
                self.released.extend(held);
                self.next(wait, busy)
            }
            None => {
                // A frame or deferred work still owed is let happen; then the end. While
                // events are held a spinner may run: a few turns draw what is owed.
                if self.held.is_some() {
                    self.settle = self.settle.min(8);
                }
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
        if let Some(event) = self.released.pop_front() {
            return Some(event);
        }
        if self.held.is_some() {
            return None;
        }
        self.rx.try_recv().ok()
    }

    fn sender(&self) -> Sender<Event> {
        self.tx.clone()
    }
}
