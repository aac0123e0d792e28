//! The interactive inspector. `App` (state, `handle(Action) -> Vec<Effect>`) and `ui`
//! (drawing over `&App`) know nothing of the terminal; this module owns it: set-up and
//! restore (also on panic), the one event channel, and carrying out effects.

pub mod app;
pub mod keys;
pub mod layout;
pub mod probe;
pub mod rows;
pub mod ui;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, DisableMouseCapture, Event as TermEvent, KeyEventKind};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};

use crate::model::Checkpoint;
use crate::monitor::gpu::{GpuInfo, GpuSource, Nvml};
use crate::monitor::{MemorySample, MemorySource, SAMPLE_INTERVAL, SystemMemory};
use crate::save::{SaveEvent, SaveJob};
use app::{Action, App, Budgets, Effect};

/// Everything the loop waits on, merged into one channel.
enum Event {
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

/// How often the screen may redraw for input, and for background progress alone.
const FRAME: Duration = Duration::from_millis(16);
const PROGRESS_FRAME: Duration = Duration::from_millis(250);
/// How long the loop sleeps when nothing moves on screen: it wakes for events (keys,
/// the memory sampler) or for a frame it owes, never to poll.
const IDLE_WAIT: Duration = Duration::from_secs(3600);

/// Whether colours are wanted: `NO_COLOR` set to anything non-empty turns them off.
pub fn color_wanted() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Budgets known from the system: free disk where offloaded weights live.
pub fn system_budgets(ckpt: &Checkpoint) -> Budgets {
    let place = ckpt.offload_dir.as_deref().unwrap_or(&ckpt.dir);
    Budgets {
        disk_free: crate::sys::free_space(place).ok(),
        gpu_total: Vec::new(),
    }
}

/// What [`run_loading`] ends with: the user's session, or the load's own error (the
/// terminal restored first, so it can be printed).
pub enum Loaded<E> {
    Ran,
    Failed(E),
}

/// A line the loading thread can put under the "opening …" spinner (a remote model's
/// fetch progress).
#[derive(Debug, Clone, Default)]
pub struct LoadingStatus(Arc<std::sync::Mutex<String>>);

impl LoadingStatus {
    pub fn set(&self, text: impl Into<String>) {
        if let Ok(mut line) = self.0.lock() {
            *line = text.into();
        }
    }

    pub fn get(&self) -> String {
        self.0.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

/// Enters the terminal at once, shows "opening …" with a spinner (and whatever `load`
/// says through its [`LoadingStatus`]) while `load` reads the model on a thread (a big
/// or remote model takes a while; the screen is never blank), then runs the inspector
/// on it. `q`, Esc or Ctrl-C while loading leave.
pub fn run_loading<E: Send + 'static>(
    what: &str,
    load: impl FnOnce(&LoadingStatus) -> Result<Checkpoint, E> + Send + 'static,
) -> io::Result<Loaded<E>> {
    install_panic_restore();
    let mut terminal = enter()?;
    let (tx, rx) = mpsc::channel();
    let status = LoadingStatus::default();
    let for_load = status.clone();
    std::thread::Builder::new()
        .name("devmap-open".into())
        .spawn(move || {
            let _ = tx.send(load(&for_load));
        })?;
    let started = Instant::now();
    let terminated = crate::sys::catch_termination();
    let outcome = loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(result) => break Some(result),
            Err(RecvTimeoutError::Disconnected) => {
                leave();
                return Err(io::Error::other(
                    "the model could not be opened (its thread stopped)",
                ));
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        let quit = terminated.load(Ordering::SeqCst)
            || (event::poll(Duration::ZERO)?
                && matches!(event::read()?, TermEvent::Key(k) if matches!(
                    k.code,
                    event::KeyCode::Char('q') | event::KeyCode::Esc
                ) || (k.code == event::KeyCode::Char('c')
                    && k.modifiers.contains(event::KeyModifiers::CONTROL))));
        if quit {
            break None;
        }
        let line = status.get();
        terminal.draw(|f| ui::loading(f, what, started.elapsed(), &line))?;
    };
    let result = match outcome {
        None => Ok(Loaded::Ran),
        Some(Err(e)) => Ok(Loaded::Failed(e)),
        Some(Ok(ckpt)) => event_loop(&mut terminal, ckpt).map(|()| Loaded::Ran),
    };
    leave();
    result
}

fn enter() -> io::Result<Terminal<CrosstermBackend<io::Stdout>>> {
    enable_raw_mode()?;
    let mut stdout = io::stdout();
    if let Err(e) = execute!(stdout, EnterAlternateScreen).and_then(|()| {
        // Clicks and the wheel only (X10 button tracking in SGR form), not every
        // motion: crossterm's EnableMouseCapture asks for all motion, which keeps the
        // terminal from selecting text with the mouse.
        io::Write::write_all(&mut stdout, b"\x1b[?1000h\x1b[?1006h")?;
        io::Write::flush(&mut stdout)
    }) {
        leave();
        return Err(e);
    }
    Terminal::new(CrosstermBackend::new(stdout))
}

/// Restores the terminal. Safe to call more than once, and from the panic hook.
fn leave() {
    let _ = disable_raw_mode();
    let _ = execute!(
        io::stdout(),
        LeaveAlternateScreen,
        DisableMouseCapture,
        ratatui::crossterm::cursor::Show
    );
}

/// The name of the threads that run `Effect::Compute` work.
const WORKER: &str = "devmap-work";

/// Restores the terminal before the panic report is printed, so it is readable. A
/// panic in a worker is caught there and shown in the inspector instead: the terminal
/// stays as it is and nothing is printed over the screen.
fn install_panic_restore() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(WORKER) {
                return;
            }
            leave();
            previous(info);
        }));
    });
}

/// The text a panic was raised with.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

struct Runtime {
    tx: Sender<Event>,
    cancel: Option<Arc<AtomicBool>>,
    save_thread: Option<JoinHandle<()>>,
    /// The running verification's progress (its cancel flag) and thread.
    verify: Option<(Arc<crate::verify::Progress>, JoinHandle<()>)>,
    quit: bool,
}

impl Runtime {
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
                    let progress = Arc::new(crate::verify::Progress::default());
                    match spawn_verify(self.tx.clone(), ckpt, plan, out, Arc::clone(&progress)) {
                        Ok(thread) => {
                            self.verify = Some((progress, thread));
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
                Effect::Compute(work) => {
                    let tx = self.tx.clone();
                    let spawned =
                        std::thread::Builder::new()
                            .name(WORKER.into())
                            .spawn(move || {
                                // A panic in the work must not leave the App waiting for a
                                // result forever (map keys wait for it, `q` included).
                                let what = work.what;
                                let result =
                                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
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
                            });
                    match spawned {
                        Ok(_) => Vec::new(),
                        Err(e) => {
                            app.work_not_started(&e.to_string());
                            Vec::new()
                        }
                    }
                }
                Effect::Quit => {
                    self.quit = true;
                    Vec::new()
                }
            };
            queue.extend(follow);
        }
    }
}

fn event_loop(
    terminal: &mut Terminal<CrosstermBackend<io::Stdout>>,
    ckpt: Checkpoint,
) -> io::Result<()> {
    let (tx, rx) = mpsc::channel::<Event>();
    spawn_input(tx.clone());
    spawn_memory(tx.clone(), SystemMemory::new());
    spawn_gpus(tx.clone());
    let budgets = system_budgets(&ckpt);
    let mut app = App::new(ckpt);
    app.color = color_wanted();
    app.budgets = budgets;
    let size = terminal.size()?;
    app.handle(Action::Resize {
        width: size.width,
        height: size.height,
    });
    let mut runtime = Runtime {
        tx,
        cancel: None,
        save_thread: None,
        verify: None,
        quit: false,
    };
    let start = Instant::now();
    let mut last_draw: Option<Instant> = None;
    let terminated = crate::sys::catch_termination();
    spawn_termination(runtime.tx.clone());
    terminal.draw(|f| ui::draw(&app, f))?;
    // A deliberate panic, for the test that the terminal is restored on panic.
    assert!(
        std::env::var_os("DEVMAP_DEBUG_PANIC").is_none(),
        "DEVMAP_DEBUG_PANIC is set: panicking on purpose after the first frame"
    );
    // Whether something changed since the last frame, and whether it was input (drawn
    // within one frame interval) or only progress (drawn at a slower rate).
    let mut dirty = false;
    let mut urgent = false;
    loop {
        // Wake for whichever comes first: the frame a pending change is due in (so the
        // state after the last key is always drawn, even when it came inside the
        // throttle), the App's deferred work, or the slow tick.
        let mut wait = if app.animating() {
            PROGRESS_FRAME
        } else {
            IDLE_WAIT
        };
        if dirty {
            let interval = if urgent { FRAME } else { PROGRESS_FRAME };
            let since = last_draw.map_or(interval, |t| t.elapsed());
            wait = wait.min(interval.saturating_sub(since));
        }
        if let Some(at) = app.wake_at() {
            wait = wait.min(at.saturating_sub(start.elapsed()));
        }
        let (input, any) = drain(&rx, &mut app, &mut runtime, start, wait)?;
        dirty |= any;
        urgent |= input;
        if terminated.load(Ordering::SeqCst) {
            // SIGTERM / SIGHUP: cancel a running save (its files are removed when its
            // thread ends, awaited below) and leave through the normal restore path.
            if let Some(s) = &mut app.save {
                s.cancel_requested = true;
            }
            runtime.apply(&mut app, vec![Effect::CancelSave, Effect::Quit]);
        }
        if runtime.quit {
            break;
        }
        let interval = if urgent { FRAME } else { PROGRESS_FRAME };
        if dirty && last_draw.is_none_or(|t| t.elapsed() >= interval) {
            terminal.draw(|f| ui::draw(&app, f))?;
            last_draw = Some(Instant::now());
            dirty = false;
            urgent = false;
        }
    }
    // A cancelled save removes its files before its thread ends: wait for that.
    if let Some(t) = runtime.save_thread.take() {
        let _ = t.join();
    }
    // A verification only reads: stop it and let it end.
    if let Some((progress, thread)) = runtime.verify.take() {
        progress.cancel.store(true, Ordering::Relaxed);
        let _ = thread.join();
    }
    Ok(())
}

/// Runs `devmap verify --against` of a finished save on a thread, sending its progress
/// every 100 ms and then its result, as Actions for the App.
fn spawn_verify(
    tx: Sender<Event>,
    ckpt: Arc<Checkpoint>,
    plan: crate::save::SavePlan,
    out: std::path::PathBuf,
    progress: Arc<crate::verify::Progress>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("devmap-verify".into())
        .spawn(move || {
            let expected = crate::verify::Expected::from_plan(&ckpt, plan);
            let result = crate::verify::verify_with_ticks(
                &out,
                Some(&expected),
                &progress,
                &mut |progress| {
                    let read = progress.read.load(Ordering::Relaxed);
                    let total = progress.total.load(Ordering::Relaxed);
                    if tx
                        .send(Event::Verify(Action::VerifyProgress { read, total }))
                        .is_err()
                    {
                        progress.cancel.store(true, Ordering::Relaxed);
                    }
                },
            );
            let _ = tx.send(Event::Verify(Action::Verified(
                result.map_err(|e| e.to_string()),
            )));
        })
}

/// Waits up to `wait` for the next event, then takes every pending one. Returns
/// whether any was input (redraw within a frame) and whether anything changed at all.
fn drain(
    rx: &Receiver<Event>,
    app: &mut App,
    runtime: &mut Runtime,
    start: Instant,
    wait: Duration,
) -> io::Result<(bool, bool)> {
    let first = match rx.recv_timeout(wait) {
        Ok(e) => Some(e),
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => {
            return Err(io::Error::other("event channel closed"));
        }
    };
    let mut urgent = false;
    let deferred_due = app.wake_at().is_some_and(|at| start.elapsed() >= at);
    let mut any = first.is_some() || app.animating() || deferred_due;
    app.handle(Action::Tick(start.elapsed()));
    for event in first.into_iter().chain(rx.try_iter()) {
        let action = match event {
            Event::Terminal(TermEvent::Key(k)) if k.kind != KeyEventKind::Release => {
                urgent = true;
                keys::key_action(&app.mode, k)
            }
            Event::Terminal(TermEvent::Mouse(m)) => {
                urgent = true;
                keys::mouse_action(m)
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
            let effects = app.handle(action);
            runtime.apply(app, effects);
        }
    }
    Ok((urgent, any))
}

fn spawn_input(tx: Sender<Event>) {
    let _ = std::thread::Builder::new()
        .name("devmap-input".into())
        .spawn(move || {
            while let Ok(ev) = event::read() {
                if tx.send(Event::Terminal(ev)).is_err() {
                    break;
                }
            }
        });
}

/// Forwards termination signals to the loop as events, so a sleeping loop wakes for
/// them (the handlers `sys::catch_termination` installs only set a flag).
fn spawn_termination(tx: Sender<Event>) {
    let Ok(mut signals) = signal_hook::iterator::Signals::new(crate::sys::TERMINATION_SIGNALS)
    else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("devmap-signals".into())
        .spawn(move || {
            for _ in signals.forever() {
                if tx.send(Event::Terminated).is_err() {
                    break;
                }
            }
        });
}

/// Whether the samplers keep ticking. `DEVMAP_DEBUG_NO_TICKS` makes each send one
/// reading and stop, so only input wakes the screen: the tmux test uses it to check
/// that the last key's frame is drawn without a later tick to carry it.
fn ticks_wanted() -> bool {
    std::env::var_os("DEVMAP_DEBUG_NO_TICKS").is_none()
}

fn spawn_memory(tx: Sender<Event>, mut source: impl MemorySource + 'static) {
    let _ = std::thread::Builder::new()
        .name("devmap-memory".into())
        .spawn(move || {
            loop {
                if tx.send(Event::Memory(source.sample())).is_err() || !ticks_wanted() {
                    break;
                }
                std::thread::sleep(SAMPLE_INTERVAL);
            }
        });
}

/// GPU memory once a second. NVML is opened on this thread, so a slow or missing
/// driver never delays the first frame.
fn spawn_gpus(tx: Sender<Event>) {
    let _ = std::thread::Builder::new()
        .name("devmap-gpus".into())
        .spawn(move || {
            let mut source = Nvml::open();
            loop {
                let gpus = source.gpus();
                let note = source.note();
                if tx.send(Event::Gpus(gpus, note)).is_err() || !ticks_wanted() {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
}
