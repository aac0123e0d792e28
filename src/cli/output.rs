//! Printing that cannot panic. `print!` panics when stdout is a closed pipe
//! (`devmap inspect | head`) or a full device, and a panic while stderr is full aborts;
//! devmap instead stops quietly with a non-zero status, cancelling a running save.

use std::fmt::Display;
use std::io::Write;

/// Stdout or stderr cannot be written (a closed pipe, a full disk). Nothing more can be
/// said, so `main` exits non-zero without a message.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to {0}")]
pub struct OutputGone(pub &'static str);

/// Writes `text` to stdout as it is.
pub fn out(text: impl Display) -> Result<(), OutputGone> {
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{text}")
        .and_then(|()| stdout.flush())
        .map_err(|_| OutputGone("stdout"))
}

/// Writes one line to stderr.
pub fn err_line(text: impl Display) -> Result<(), OutputGone> {
    let mut stderr = std::io::stderr().lock();
    writeln!(stderr, "{text}").map_err(|_| OutputGone("stderr"))
}

/// A user's mistake is a message, not a backtrace: prints the chain of causes.
/// Written without panicking: stderr may be full too.
pub fn print_error(report: &color_eyre::Report) {
    let mut stderr = std::io::stderr().lock();
    let mut causes = report.chain();
    if let Some(top) = causes.next() {
        let _ = writeln!(stderr, "error: {top}");
    }
    for cause in causes {
        let _ = writeln!(stderr, "  caused by: {cause}");
    }
}
