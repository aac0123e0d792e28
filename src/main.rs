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
    if let Some(message) = mistyped_subcommand() {
        eprintln!("error: {message}");
        return Ok(std::process::ExitCode::from(2));
    }
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

/// `devmap inspct DIR`: a first word that is no path and no subcommand but close to
/// one. clap would take it for the model and then refuse the model as a subcommand;
/// "did you mean" is what the user needs.
fn mistyped_subcommand() -> Option<String> {
    const COMMANDS: [&str; 4] = ["inspect", "save", "plan", "verify"];
    let word = std::env::args_os().nth(1)?.into_string().ok()?;
    if word.starts_with('-')
        || COMMANDS.contains(&word.as_str())
        || std::fs::symlink_metadata(&word).is_ok()
        || word.contains(['/', '.'])
    {
        return None;
    }
    let near = COMMANDS
        .iter()
        .find(|c| devmap::text::edit_distance(c, &word) <= 2)?;
    Some(format!(
        "`{word}` is not a devmap command or a folder; did you mean `{near}`? (devmap --help lists the commands)"
    ))
}
