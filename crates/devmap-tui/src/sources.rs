//! The threads that feed the runtime's one channel in a real terminal: input,
//! termination signals, the memory and GPU samplers, and a verification's worker.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ratatui::crossterm::event;

use super::app::Action;
use super::runtime::{Event, EventSource, Next};
use devmap_core::model::Checkpoint;
use devmap_core::monitor::gpu::{GpuSource, Nvml};
use devmap_core::monitor::{MemorySource, SAMPLE_INTERVAL, SystemMemory};

/// The terminal's events and real time: input, the memory and GPU samplers and
/// termination signals feed one channel.
pub struct TerminalEvents {
    tx: Sender<Event>,
    rx: Receiver<Event>,
    start: Instant,
}

impl TerminalEvents {
    /// Starts the threads that read the terminal, sample memory and GPUs, and forward
    /// termination signals.
    pub fn start() -> TerminalEvents {
        let (tx, rx) = mpsc::channel::<Event>();
        spawn_input(tx.clone());
        spawn_memory(tx.clone(), SystemMemory::new());
        spawn_gpus(tx.clone());
        spawn_termination(tx.clone());
        TerminalEvents {
            tx,
            rx,
            start: Instant::now(),
        }
    }
}

impl EventSource for TerminalEvents {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn next(&mut self, wait: Duration, _busy: bool) -> io::Result<Next> {
        match self.rx.recv_timeout(wait) {
            Ok(e) => Ok(Next::Event(e)),
            Err(RecvTimeoutError::Timeout) => Ok(Next::Timeout),
            Err(RecvTimeoutError::Disconnected) => Err(io::Error::other("event channel closed")),
        }
    }

    fn try_next(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    fn sender(&self) -> Sender<Event> {
        self.tx.clone()
    }
}

/// Runs `devmap verify --against` of a finished save on a thread, sending its progress
/// every 100 ms and then its result, as Actions for the App.
pub(super) fn spawn_verify(
    tx: Sender<Event>,
    ckpt: Arc<Checkpoint>,
    plan: devmap_core::save::SavePlan,
    out: std::path::PathBuf,
    progress: Arc<devmap_core::verify::Progress>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("devmap-verify".into())
        .spawn(move || {
            let expected = devmap_core::verify::SaveReference::from_plan(&ckpt, plan);
            // A NaN the merges were allowed to carry is no surprise in the output.
            let allow_nonfinite = ckpt.merges_allow_nonfinite();
            let result = devmap_core::verify::verify_with_ticks(
                &out,
                Some(&expected),
                (allow_nonfinite, None),
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
    let Ok(mut signals) =
        signal_hook::iterator::Signals::new(devmap_core::sys::TERMINATION_SIGNALS)
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
