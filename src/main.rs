//! The `devmap` binary: parse the command line, install the error reporter, dispatch.

mod cli;

use std::io::Write;

use clap::Parser;

fn main() -> std::process::ExitCode {
    if let Err(report) = real_main() {
        // Output that cannot be written: nothing more can be said.
        if report.downcast_ref::<cli::OutputGone>().is_some() {
            return std::process::ExitCode::FAILURE;
        }
        // A user's mistake is a message, not a backtrace: print the chain of causes.
        // Written without panicking: stderr may be full too.
        let mut stderr = std::io::stderr().lock();
        let mut causes = report.chain();
        if let Some(top) = causes.next() {
            let _ = writeln!(stderr, "error: {top}");
        }
        for cause in causes {
            let _ = writeln!(stderr, "  caused by: {cause}");
        }
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}

fn real_main() -> color_eyre::Result<()> {
    color_eyre::config::HookBuilder::default()
        .display_env_section(false)
        .display_location_section(false)
        .install()?;
    let args = cli::Args::parse();
    let result = cli::run(args);
    // For benchmarks and the memory test: the peak resident set, measured by the
    // kernel, printed last.
    if std::env::var_os("DEVMAP_REPORT_PEAK_RSS").is_some()
        && let Some(peak) = devmap::monitor::peak_rss_bytes()
    {
        let _ = writeln!(std::io::stderr(), "devmap-peak-rss-bytes={peak}");
    }
    result
}
