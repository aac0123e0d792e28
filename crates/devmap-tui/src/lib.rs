//! The interactive inspector. `App` (state, `handle(Action) -> Vec<Effect>`) and `ui`
//! (drawing over `&App`) know nothing of the terminal. `runtime` is the one loop that
//! feeds the App and carries out its effects (the same code under test, through a
//! scripted source); `terminal` sets the real terminal up and restores it.

pub mod app;
pub mod keys;
pub mod layout;
pub mod probe;
pub mod rows;
pub mod runtime;
#[cfg(feature = "fixtures")]
pub mod script;
mod sources;
pub mod terminal;
pub mod ui;

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event as TermEvent};

use app::{App, Budgets};
use devmap_core::model::Checkpoint;

/// Whether colours are wanted: `NO_COLOR` set to anything non-empty turns them off.
pub fn color_wanted() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Budgets known from the system: free disk where offloaded weights live.
pub fn system_budgets(ckpt: &Checkpoint) -> Budgets {
    let place = ckpt.offload_dir.as_deref().unwrap_or(&ckpt.dir);
    Budgets {
        disk_free: devmap_core::sys::free_space(place).ok(),
        ..Budgets::default()
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
    options: InspectorOptions,
    load: impl FnOnce(&LoadingStatus) -> Result<Checkpoint, E> + Send + 'static,
) -> io::Result<Loaded<E>> {
    terminal::install_panic_restore();
    let mut terminal = terminal::enter()?;
    let (tx, rx) = mpsc::channel();
    let status = LoadingStatus::default();
    let for_load = status.clone();
    std::thread::Builder::new()
        .name("devmap-open".into())
        .spawn(move || {
            let _ = tx.send(load(&for_load));
        })?;
    let started = Instant::now();
    let terminated = devmap_core::sys::catch_termination();
    let outcome = loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(result) => break Some(result),
            Err(RecvTimeoutError::Disconnected) => {
                terminal::leave();
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
        Some(Ok(ckpt)) => inspect(&mut terminal, ckpt, options).map(|()| Loaded::Ran),
    };
    terminal::leave();
    result
}

/// What the command line gives the inspector beside the model.
#[derive(Debug, Clone, Default)]
pub struct InspectorOptions {
    /// The Devices panel's budgets (`--max-memory`).
    pub max_memory: Vec<(devmap_core::types::placement::Placement, u64)>,
    /// `--context N --batch B`: the KV cache the Devices panel adds to each device.
    pub kv: Option<(u64, u64)>,
    /// `--tp/--ep/--pp`: the Devices panel names the largest GPU of that vLLM layout.
    pub parallel: Option<devmap_core::plan::parallel::Layout>,
}

/// The inspector on `ckpt` in the real terminal, with the real clock and samplers.
fn inspect(
    terminal: &mut terminal::Real,
    ckpt: Checkpoint,
    options: InspectorOptions,
) -> io::Result<()> {
    let mut budgets = system_budgets(&ckpt);
    if !options.max_memory.is_empty() {
        budgets.chosen = options.max_memory;
        budgets.chosen_from = Some("--max-memory");
    }
    let kv = options.kv.map(|(context, batch)| {
        let request = devmap_core::plan::kv::KvRequest {
            context,
            batch,
            dtype: devmap_core::plan::kv::compute_dtype(&ckpt, None),
        };
        devmap_core::plan::kv::KvOnDevices::new(&ckpt, request)
    });
    let parallel = options.parallel.map(|layout| {
        let cache = kv.as_ref().and_then(|k| k.as_ref().ok()).map(|k| &k.cache);
        devmap_core::plan::parallel::shard(&ckpt, layout, None, cache)
    });
    let mut app = App::new(ckpt);
    match kv {
        Some(Ok(kv)) => app.kv = Some(kv),
        Some(Err(why)) => app.say(
            format!("the KV cache is not counted: {why}"),
            app::Tone::Bad,
        ),
        None => {}
    }
    match parallel {
        Some(Ok(sharded)) => app.parallel = Some(sharded),
        Some(Err(why)) => app.say(format!("no parallel layout: {why}"), app::Tone::Bad),
        None => {}
    }
    app.color = color_wanted();
    app.budgets = budgets;
    let mut events = runtime::TerminalEvents::start();
    let terminated = devmap_core::sys::catch_termination();
    runtime::run(terminal, &mut app, &mut events, terminated)
}
