//! Printing that cannot panic. `print!` panics when stdout is a closed pipe
//! (`devmap inspect | head`) or a full device, and a panic while stderr is full aborts;
//! devmap instead stops quietly with a non-zero status, cancelling a running save.

use std::fmt::Display;
use std::io::Write;

/// Stdout or stderr cannot be written (a closed pipe, a full disk). `main` exits
/// non-zero, saying so on stderr when it is stdout that is gone.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to {0}")]
pub struct OutputGone(pub &'static str);

/// How long a write waits for a pipe that is full and non-blocking (set so by another
/// process sharing it: a test harness, a parent shell) before giving up.
const FULL_PIPE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// A writer that waits out `WouldBlock` and `Interrupted`: a non-blocking pipe that is
/// full for a moment is not a closed one, and a message written to it must not be
/// dropped (an exit status with nothing said).
struct Patient<W: Write>(W);

impl<W: Write> Write for Patient<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let start = std::time::Instant::now();
        loop {
            match self.0.write(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) && start.elapsed() < FULL_PIPE_PATIENCE =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                other => return other,
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let start = std::time::Instant::now();
        loop {
            match self.0.flush() {
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        && start.elapsed() < FULL_PIPE_PATIENCE =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                other => return other,
            }
        }
    }
}

/// Writes `text` to stdout as it is.
pub fn out(text: impl Display) -> Result<(), OutputGone> {
    let mut stdout = Patient(std::io::stdout().lock());
    write!(stdout, "{text}")
        .and_then(|()| stdout.flush())
        .map_err(|_| OutputGone("stdout"))
}

/// Writes to stdout through `write` as the text is made (a buffered, patient writer):
/// a long report never sits whole in memory.
pub fn out_with(
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), OutputGone> {
    let mut stdout = std::io::BufWriter::with_capacity(64 << 10, Patient(std::io::stdout().lock()));
    write(&mut stdout)
        .and_then(|()| stdout.flush())
        .map_err(|_| OutputGone("stdout"))
}

/// Writes one line to stderr.
pub fn err_line(text: impl Display) -> Result<(), OutputGone> {
    let mut stderr = Patient(std::io::stderr().lock());
    writeln!(stderr, "{text}").map_err(|_| OutputGone("stderr"))
}

/// Says on stderr which output could not be written, when stderr still can be: an exit
/// status is never the only word.
pub fn print_gone(gone: &OutputGone) {
    if gone.0 != "stderr" {
        let mut stderr = Patient(std::io::stderr().lock());
        let _ = writeln!(
            stderr,
            "error: {gone} (a closed pipe or a full disk); stopped"
        );
    }
}

/// A user's mistake is a message, not a backtrace: prints the chain of causes.
/// Written without panicking: stderr may be full too.
pub fn print_error(report: &color_eyre::Report) {
    let mut stderr = Patient(std::io::stderr().lock());
    let mut causes = report.chain();
    if let Some(top) = causes.next() {
        let _ = writeln!(stderr, "error: {top}");
    }
    for cause in causes {
        let _ = writeln!(stderr, "  caused by: {cause}");
    }
}

/// Whether the terminal says it cannot draw the inspector: TERM=dumb (Emacs' shell,
/// some CI logs) has no cursor addressing, colours or alternate screen.
pub fn dumb_terminal() -> bool {
    std::env::var_os("TERM").is_some_and(|t| t == "dumb")
}
