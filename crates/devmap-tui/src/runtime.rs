//! The runtime: the one loop that turns events into Actions for the App, carries out
//! the Effects the App returns (threads for saves, verifications and work, files
//! written), and draws frames. It is generic over the terminal backend and over where
//! events and time come from ([`EventSource`]), so tests drive this very code with a
//! scripted source, injected time and ratatui's `TestBackend` — nothing a test does
//! by hand stands in for it.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::Duration;

use ratatui::Terminal;
use ratatui::backend::Backend;
use ratatui::crossterm::event::{Event as TermEvent, KeyEventKind};

use super::app::{Action, App, Effect};
pub use super::sources::TerminalEvents;
use super::sources::spawn_verify;
use super::{keys, ui};
use devmap_core::monitor::MemorySample;
use devmap_core::monitor::gpu::GpuInfo;
use devmap_core::save::{SaveEvent, SaveJob};

/// Everything the loop waits on, merged into one channel.
#[derive(Debug)]
pub enum Event {
    Terminal(TermEvent),
    Memory(MemorySample),
    Gpus(Vec<GpuInfo>, Option<String>),
    Save(SaveEvent),
    Verify(Action),
    /// The result of an `Effect::Compute`.
    Worked(Action),
    /// SIGTERM, SIGHUP or SIGINT arrived (the flag is set too): wakes the loop, which
    /// otherwise sleeps until input when nothing moves.
    Terminated,
}

/// What waiting for the next event gave.
#[derive(Debug)]
pub enum Next {
    Event(Event),
    /// Nothing came within the wait.
    Timeout,
    /// No event will ever come again (a script that ran out): the loop ends.
    End,
}

/// Where the loop's events and its clock come from: the terminal and real time, or a
/// test's script and virtual time.
pub trait EventSource {
    /// Time since the loop started, by this source's clock.
    fn now(&self) -> Duration;
    /// Waits up to `wait` (of this source's clock) for the next event. `busy` says that
    /// background work the runtime started has not reported back yet.
    fn next(&mut self, wait: Duration, busy: bool) -> io::Result<Next>;
    /// An event that is already waiting, without waiting.
    fn try_next(&mut self) -> Option<Event>;
    /// Where threads the runtime starts send their results.
    fn sender(&self) -> Sender<Event>;
}

/// How often the screen may redraw for input, and for background progress alone.
const FRAME: Duration = Duration::from_millis(16);
const PROGRESS_FRAME: Duration = Duration::from_millis(250);
/// How long the loop sleeps when nothing moves on screen: it wakes for events (keys,
/// the memory sampler) or for a frame it owes, never to poll.
const IDLE_WAIT: Duration = Duration::from_secs(3600);

/// The name of the threads that run `Effect::Compute` work.
pub const WORKER: &str = "devmap-work";

/// The text a panic was raised with.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Carries out Effects, and keeps what it started: the save's cancel flag and thread,
/// the verification, and how much work is still out.
struct Runtime {
    tx: Sender<Event>,
    cancel: Option<Arc<AtomicBool>>,
    save_thread: Option<JoinHandle<()>>,
    saving: bool,
    /// The running verification's progress (its cancel flag) and thread.
    verify: Option<(Arc<devmap_core::verify::Progress>, JoinHandle<()>)>,
    verifying: bool,
    /// `Effect::Compute` work started and not yet back.
    computing: usize,
    quit: bool,
}

impl Runtime {
    fn busy(&self) -> bool {
        self.saving || self.verifying || self.computing > 0
    }

    fn apply(&mut self, app: &mut App, effects: Vec<Effect>) {
        let mut queue: std::collections::VecDeque<Effect> = effects.into();
        while let Some(effect) = queue.pop_front() {
            let follow = match effect {
                Effect::StartSave {
                    ckpt,
                    plan,
                    options,
                } => match SaveJob::spawn(ckpt, plan, options) {
                    Ok(job) => {
                        self.cancel = Some(job.cancel_flag());
                        let tx = self.tx.clone();
                        self.saving = true;
                        self.save_thread = std::thread::Builder::new()
                            .name("devmap-save-events".into())
                            .spawn(move || {
                                for ev in &job.events {
                                    let last = matches!(
                                        ev,
                                        SaveEvent::Finished(_)
                                            | SaveEvent::Failed(_)
                                            | SaveEvent::Cancelled
                                    );
                                    if tx.send(Event::Save(ev)).is_err() || last {
                                        break;
                                    }
                                }
                                let _ = job.join();
                            })
                            .ok();
                        Vec::new()
                    }
                    Err(e) => app.handle(Action::SaveNotStarted(e.to_string())),
                },
                Effect::CancelSave => {
                    if let Some(c) = &self.cancel {
                        c.store(true, Ordering::Relaxed);
                    }
                    Vec::new()
                }
                Effect::StartVerify { ckpt, plan, out } => {
                    let progress = Arc::new(devmap_core::verify::Progress::default());
                    match spawn_verify(self.tx.clone(), ckpt, plan, out, Arc::clone(&progress)) {
                        Ok(thread) => {
                            self.verify = Some((progress, thread));
                            self.verifying = true;
                            Vec::new()
                        }
                        Err(e) => app.handle(Action::Verified(Err(e.to_string()))),
                    }
                }
                Effect::CancelVerify => {
                    if let Some((progress, _)) = &self.verify {
                        progress.cancel.store(true, Ordering::Relaxed);
                    }
                    Vec::new()
                }
                Effect::WriteFile { path, contents } => {
                    let error = std::fs::write(&path, contents).err().map(|e| e.to_string());
                    app.handle(Action::Written { path, error })
                }
                Effect::Compute(work) => match spawn_work(self.tx.clone(), work) {
                    Ok(()) => {
                        self.computing += 1;
                        Vec::new()
                    }
                    Err(e) => {
                        app.work_not_started(&e.to_string());
                        Vec::new()
                    }
                },
                Effect::Quit => {
                    self.quit = true;
                    Vec::new()
                }
            };
            queue.extend(follow);
        }
    }

    /// Hands `action` to the App and carries out every Effect it returns. Every
    /// Action goes through here (ticks included), so no Effect is ever dropped.
    fn handle(&mut self, app: &mut App, action: Action) {
        let effects = app.handle(action);
        self.apply(app, effects);
    }

    /// Keeps count of what background work has reported back.
    fn note_returned(&mut self, event: &Event) {
        match event {
            Event::Worked(_) => self.computing = self.computing.saturating_sub(1),
            Event::Save(SaveEvent::Finished(_) | SaveEvent::Failed(_) | SaveEvent::Cancelled) => {
                self.saving = false;
            }
            Event::Verify(Action::Verified(_)) => self.verifying = false,
            _ => {}
        }
    }
}

/// Runs `Effect::Compute` work on a thread of its own; a panic in it comes back as
/// `Action::WorkFailed`, so the App never waits forever (map keys wait for it, `q`
/// included).
fn spawn_work(tx: Sender<Event>, work: super::app::Work) -> io::Result<()> {
    std::thread::Builder::new()
        .name(WORKER.into())
        .spawn(move || {
            let what = work.what;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // For the test that a worker's panic is caught.
                assert!(
                    std::env::var_os("DEVMAP_DEBUG_PANIC_WORK").is_none(),
                    "DEVMAP_DEBUG_PANIC_WORK is set: panicking on purpose"
                );
                work.run()
            }));
            let action = result.unwrap_or_else(|payload| {
                Action::WorkFailed(format!(
                    "{what} failed: {}",
                    panic_message(payload.as_ref())
                ))
            });
            let _ = tx.send(Event::Worked(action));
        })
        .map(|_| ())
}

/// The inspector's loop on `app`, until the App quits, a termination signal arrives
/// or the source ends (a test then reads the App as it was left).
///
/// # Panics
/// With `DEVMAP_DEBUG_PANIC` set, after the first frame (the test that a panic
/// restores the terminal).
pub fn run<B: Backend, S: EventSource>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    source: &mut S,
    terminated: &AtomicBool,
) -> io::Result<()>
where
    B::Error: Send + Sync + 'static,
{
    let mut runner = Runner::start(terminal, app, source.sender())?;
    runner.run(terminal, app, source, terminated)?;
    runner.finish(terminal, app)
}

/// The loop's state between events: what the runtime started and what the screen
/// owes. [`run`] drives it from start to finish; a test journey may run it in parts,
/// looking at the App between them, with a save still running across them.
pub struct Runner {
    runtime: Runtime,
    last_draw: Option<Duration>,
    /// Whether something changed since the last frame, and whether it was input
    /// (drawn within one frame interval) or only progress (drawn at a slower rate).
    dirty: bool,
    urgent: bool,
}

impl Runner {
    /// Sizes the App to the terminal and draws the first frame. The threads the
    /// runtime starts send to `tx`.
    ///
    /// # Panics
    /// With `DEVMAP_DEBUG_PANIC` set, after the first frame.
    pub fn start<B: Backend>(
        terminal: &mut Terminal<B>,
        app: &mut App,
        tx: Sender<Event>,
    ) -> io::Result<Runner>
    where
        B::Error: Send + Sync + 'static,
    {
        let size = terminal.size().map_err(io::Error::other)?;
        app.handle(Action::Resize {
            width: size.width,
            height: size.height,
        });
        draw(terminal, app)?;
        // A deliberate panic, for the test that the terminal is restored on panic.
        assert!(
            std::env::var_os("DEVMAP_DEBUG_PANIC").is_none(),
            "DEVMAP_DEBUG_PANIC is set: panicking on purpose after the first frame"
        );
        let mut runner = Runner {
            runtime: Runtime {
                tx,
                cancel: None,
                save_thread: None,
                saving: false,
                verify: None,
                verifying: false,
                computing: 0,
                quit: false,
            },
            last_draw: None,
            dirty: false,
            urgent: false,
        };
        // After the first frame, so the screen is up before any of it runs.
        let opening = app.opening_work();
        runner.runtime.apply(app, opening);
        Ok(runner)
    }

    /// Whether the App asked to quit (or a termination signal made it).
    pub fn quit(&self) -> bool {
        self.runtime.quit
    }

    /// Takes events until the App quits, a termination signal arrives or the source
    /// ends.
    pub fn run<B: Backend, S: EventSource>(
        &mut self,
        terminal: &mut Terminal<B>,
        app: &mut App,
        source: &mut S,
        terminated: &AtomicBool,
    ) -> io::Result<()>
    where
        B::Error: Send + Sync + 'static,
    {
        while !self.runtime.quit {
            // Wake for whichever comes first: the frame a pending change is due in (so
            // the state after the last key is always drawn, even when it came inside
            // the throttle), the App's deferred work, or the slow tick.
            let now = source.now();
            let mut wait = if app.animating() {
                PROGRESS_FRAME
            } else {
                IDLE_WAIT
            };
            if self.dirty {
                let interval = if self.urgent { FRAME } else { PROGRESS_FRAME };
                let since = self.last_draw.map_or(interval, |t| now.saturating_sub(t));
                wait = wait.min(interval.saturating_sub(since));
            }
            if let Some(at) = app.wake_at() {
                wait = wait.min(at.saturating_sub(now));
            }
            let Some((input, any)) = drain(source, app, &mut self.runtime, wait)? else {
                break;
            };
            self.dirty |= any;
            self.urgent |= input;
            if terminated.load(Ordering::SeqCst) {
                // SIGTERM / SIGHUP: cancel a running save (its files are removed when
                // its thread ends, awaited in `finish`) and leave through the normal
                // restore path.
                if let Some(s) = &mut app.save {
                    s.cancel_requested = true;
                }
                self.runtime
                    .apply(app, vec![Effect::CancelSave, Effect::Quit]);
            }
            if self.runtime.quit {
                break;
            }
            let interval = if self.urgent { FRAME } else { PROGRESS_FRAME };
            let now = source.now();
            if self.dirty
                && self
                    .last_draw
                    .is_none_or(|t| now.saturating_sub(t) >= interval)
            {
                draw(terminal, app)?;
                self.last_draw = Some(now);
                self.dirty = false;
                self.urgent = false;
            }
        }
        if self.dirty {
            draw(terminal, app)?;
            self.dirty = false;
            self.urgent = false;
        }
        Ok(())
    }

    /// Draws what is still owed, then ends what the loop started (see the `Drop`).
    pub fn finish<B: Backend>(self, terminal: &mut Terminal<B>, app: &App) -> io::Result<()>
    where
        B::Error: Send + Sync + 'static,
    {
        if self.dirty {
            draw(terminal, app)?;
        }
        Ok(())
    }
}

impl Drop for Runner {
    /// Ends what the loop started, however it ended: a save still running is
    /// cancelled (it was asked before quitting; a cancelled save removes its files
    /// before its thread ends, so that is awaited), a verification only reads and is
    /// stopped.
    fn drop(&mut self) {
        if let Some(t) = self.runtime.save_thread.take() {
            if let Some(cancel) = &self.runtime.cancel
                && !t.is_finished()
            {
                cancel.store(true, Ordering::Relaxed);
            }
            let _ = t.join();
        }
        if let Some((progress, thread)) = self.runtime.verify.take() {
            progress.cancel.store(true, Ordering::Relaxed);
            let _ = thread.join();
        }
    }
}

fn draw<B: Backend>(terminal: &mut Terminal<B>, app: &App) -> io::Result<()>
where
    B::Error: Send + Sync + 'static,
{
    terminal
        .draw(|f| ui::draw(app, f))
        .map(|_| ())
        .map_err(io::Error::other)
}

/// Waits up to `wait` for the next event, ticks the App, then takes every pending
/// event. Returns whether any was input (redraw within a frame) and whether anything
/// changed at all; `None` when the source has ended.
fn drain<S: EventSource>(
    source: &mut S,
    app: &mut App,
    runtime: &mut Runtime,
    wait: Duration,
) -> io::Result<Option<(bool, bool)>> {
    let first = match source.next(wait, runtime.busy())? {
        Next::Event(e) => Some(e),
        Next::Timeout => None,
        Next::End => return Ok(None),
    };
    let mut urgent = false;
    let now = source.now();
    let deferred_due = app.wake_at().is_some_and(|at| now >= at);
    let mut any = first.is_some() || app.animating() || deferred_due;
    // The tick's effects are carried out like any other's: the save preview's
    // debounced work starts from here. A message whose time is up goes with it, and the
    // key bar it stood in for is drawn again.
    let had_message = app.message.is_some();
    runtime.handle(app, Action::Tick(now));
    any |= had_message && app.message.is_none();
    let mut next = first;
    while let Some(event) = next.take().or_else(|| source.try_next()) {
        runtime.note_returned(&event);
        let action = match event {
            Event::Terminal(TermEvent::Key(k)) if k.kind != KeyEventKind::Release => {
                urgent = true;
                keys::key_action(&app.mode, k)
            }
            Event::Terminal(TermEvent::Mouse(m)) => {
                urgent = true;
                keys::mouse_action(m)
            }
            Event::Terminal(TermEvent::Paste(text)) => {
                urgent = true;
                Some(Action::Paste(text))
            }
            Event::Terminal(TermEvent::Resize(width, height)) => {
                urgent = true;
                Some(Action::Resize { width, height })
            }
            // A signal only wakes the loop: the flag it set is read after the drain.
            Event::Terminal(_) | Event::Terminated => None,
            Event::Memory(s) => Some(Action::Memory(s)),
            Event::Gpus(g, note) => Some(Action::Gpus(g, note)),
            Event::Worked(action) => {
                urgent = true;
                Some(action)
            }
            Event::Verify(action) => {
                urgent |= matches!(action, Action::Verified(_));
                Some(action)
            }
            Event::Save(e) => {
                urgent |= matches!(
                    e,
                    SaveEvent::Finished(_) | SaveEvent::Failed(_) | SaveEvent::Cancelled
                );
                Some(Action::Save(e))
            }
        };
        if let Some(action) = action {
            any = true;
            runtime.handle(app, action);
        }
    }
    Ok(Some((urgent, any)))
}
