//! The real terminal: entering raw mode and the alternate screen, leaving them again
//! (also from the panic hook), so nothing else in `tui` touches terminal state.

use std::io;
use std::sync::Once;

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{DisableBracketedPaste, DisableMouseCapture, EnableBracketedPaste};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};

use super::runtime::WORKER;

pub type Real = Terminal<CrosstermBackend<io::Stdout>>;

/// Raw mode, the alternate screen, clicks and the wheel, and bracketed paste (a paste
/// arrives as one event, never as keys that would run as commands).
pub fn enter() -> io::Result<Real> {
    enable_raw_mode()?;
    let mut stdout = io::stdout();
    if let Err(e) = execute!(stdout, EnterAlternateScreen, EnableBracketedPaste).and_then(|()| {
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
pub fn leave() {
    let _ = disable_raw_mode();
    let _ = execute!(
        io::stdout(),
        DisableBracketedPaste,
        LeaveAlternateScreen,
        DisableMouseCapture,
        ratatui::crossterm::cursor::Show
    );
}

/// Restores the terminal before the panic report is printed, so it is readable. A
/// panic in a worker is caught there and shown in the inspector instead: the terminal
/// stays as it is and nothing is printed over the screen.
pub fn install_panic_restore() {
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
