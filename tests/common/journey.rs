//! Journeys through the inspector's real runtime: the same loop, tick handling,
//! effects and worker threads as in a terminal, fed by a script on a virtual clock and
//! drawn on ratatui's `TestBackend`. Nothing here carries out an App's effects: the
//! runtime does.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use devmap::tui::app::App;
use devmap::tui::runtime::{self, Event, EventSource};
use devmap::tui::script::{Script, Step};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{Event as TermEvent, KeyCode, KeyEvent, KeyModifiers};

pub fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

pub fn ch(c: char) -> KeyEvent {
    key(KeyCode::Char(c))
}

pub fn ctrl(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
}

pub fn text(s: &str) -> Vec<KeyEvent> {
    s.chars().map(ch).collect()
}

/// A key pressed once the background work before it has reported back.
pub fn press_step(k: KeyEvent) -> Step {
    Step::Event(Event::Terminal(TermEvent::Key(k)))
}

/// A key pressed at once, while background work may still run.
pub fn press_now(k: KeyEvent) -> Step {
    Step::Now(Event::Terminal(TermEvent::Key(k)))
}

/// Text pasted into the terminal (one bracketed-paste event).
pub fn paste(s: &str) -> Step {
    Step::Event(Event::Terminal(TermEvent::Paste(s.to_owned())))
}

/// Runs the runtime on `app` through `steps` (then lets owed frames and deferred work
/// happen), on a terminal of the App's size. Returns the last frame drawn.
pub fn drive(app: &mut App, steps: impl IntoIterator<Item = Step>) -> Buffer {
    let mut journey = Journey::start(app);
    journey.steps(app, steps);
    journey.end(app)
}

/// One run of the runtime taken in parts: the same loop, terminal and clock across
/// calls, so a save started in one part is still running (and cancellable) in the
/// next, and the test looks at the App between parts.
pub struct Journey {
    terminal: Terminal<TestBackend>,
    script: Script,
    runner: Option<runtime::Runner>,
}

impl Journey {
    pub fn start(app: &mut App) -> Journey {
        let (width, height) = app.size;
        let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("terminal");
        let script = Script::new([]).starting_at(app.clock);
        let runner =
            runtime::Runner::start(&mut terminal, app, script.sender()).expect("the first frame");
        Journey {
            terminal,
            script,
            runner: Some(runner),
        }
    }

    /// Takes `steps` (and the frames and deferred work they owe). Returns the screen.
    pub fn steps(&mut self, app: &mut App, steps: impl IntoIterator<Item = Step>) -> String {
        self.script.push(steps);
        let terminated = AtomicBool::new(false);
        let runner = self.runner.as_mut().expect("the journey has not ended");
        if !runner.quit() {
            runner
                .run(&mut self.terminal, app, &mut self.script, &terminated)
                .expect("the runtime ran");
        }
        screen(self.terminal.backend().buffer())
    }

    /// Presses keys, each once the work before it has landed.
    pub fn press(&mut self, app: &mut App, keys: &[KeyEvent]) -> String {
        self.steps(app, keys.iter().map(|&k| press_step(k)))
    }

    /// Whether the App quit.
    pub fn quit(&self) -> bool {
        self.runner.as_ref().is_some_and(runtime::Runner::quit)
    }

    /// Ends the loop as the terminal's does (a save still running is cancelled and
    /// awaited; a journey dropped half way does the same). Returns the last frame.
    pub fn end(mut self, app: &App) -> Buffer {
        if let Some(runner) = self.runner.take() {
            runner
                .finish(&mut self.terminal, app)
                .expect("the runtime ended");
        }
        self.terminal.backend().buffer().clone()
    }
}

/// Presses `keys` one after another through the runtime (each once the work of the
/// one before has landed, as a user who waits for the screen). Returns the screen.
pub fn press(app: &mut App, keys: &[KeyEvent]) -> String {
    screen(&drive(app, keys.iter().map(|&k| press_step(k))))
}

/// Presses `keys` and stops right after them: no time passes for work owed later (the
/// save preview's quiet time), so the screen is the one while the user still types.
pub fn type_keys(app: &mut App, keys: &[KeyEvent]) -> String {
    let steps: Vec<Step> = keys.iter().map(|&k| press_step(k)).collect();
    screen(&drive(app, steps.into_iter().chain([Step::Stop])))
}

/// Lets `time` pass with no input (the save preview's quiet time, say).
pub fn wait(app: &mut App, time: Duration) -> String {
    screen(&drive(app, [Step::Wait(time)]))
}

/// A buffer's text, one line per row, trailing spaces cut.
pub fn screen(buffer: &Buffer) -> String {
    let area = buffer.area;
    let mut out = String::new();
    for y in 0..area.height {
        let line: String = (0..area.width)
            .map(|x| buffer[(x, y)].symbol().to_owned())
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
