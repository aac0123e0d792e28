//! The `devmap` binary: parse the command line, install the error reporter, dispatch.

mod cli;

use std::io::Write;

use clap::Parser;

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(code) => code,
        // Output that cannot be written: said on stderr where stderr still works.
        Err(ref report) if let Some(gone) = report.downcast_ref::<cli::OutputGone>() => {
            cli::print_gone(gone);
            std::process::ExitCode::FAILURE
        }
        Err(report) => {
            cli::print_error(&report);
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> color_eyre::Result<std::process::ExitCode> {
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
