//! `devmap verify` and `devmap save --verify`: run the check on a thread, show its
//! progress, print the report, and turn it into an exit status (0 clean, 1
//! differences, 2 unusable input).

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Instant;

use color_eyre::eyre::{Result, WrapErr, eyre};
use devmap::human_bytes;
use devmap::save::SaveOptions;
use devmap::verify::{Progress, SaveReference, verify_with_ticks};

use super::args::{ModelArgs, VerifyArgs};
use super::output::{OutputGone, err_line, out, print_error};

/// `devmap verify OUT [--against DIR]`.
pub fn run(a: &VerifyArgs, model: &ModelArgs) -> ExitCode {
    let result = (|| -> Result<ExitCode> {
        let ckpt = match &a.against {
            Some(dir) => {
                super::refuse_remote(dir, "verify --against")?;
                Some(super::open(dir, model)?)
            }
            None => None,
        };
        let folder = super::local_model_dir(&a.out)?;
        let expected = match (&ckpt, &a.against) {
            (Some(ckpt), Some(dir)) => {
                let options = SaveOptions {
                    dtype: a.dtype,
                    keep_tied: a.keep_tied,
                    quantize_fp8: a.quantize == Some(super::args::QuantizeFormat::Fp8Block),
                    ..SaveOptions::new(&a.out)
                };
                let expected = SaveReference::new(ckpt, &options)
                    .map_err(|e| eyre!(e))
                    .wrap_err_with(|| {
                        format!(
                            "cannot work out what a save of {} writes",
                            devmap::text::path(dir)
                        )
                    })?;
                Some(expected)
            }
            _ => None,
        };
        let answer = super::ask_transformers(&folder, None, model, (a.quiet, true))?;
        let report = check(
            &folder,
            expected.as_ref(),
            (model.allow_nonfinite, answer.as_ref()),
            a.quiet,
        )?;
        if a.json {
            out(report.to_json())?;
        } else {
            out(report.to_text())?;
        }
        Ok(status(&report))
    })();
    match result {
        Ok(code) => code,
        Err(ref report) if let Some(gone) = report.downcast_ref::<OutputGone>() => {
            super::output::print_gone(gone);
            ExitCode::FAILURE
        }
        Err(report) => {
            print_error(&report);
            ExitCode::from(2)
        }
    }
}

/// `devmap save --verify`: the content check of what was just written, reported on
/// stderr like the rest of the save's messages.
pub fn after_save(
    out: &Path,
    expected: &SaveReference,
    how: (bool, Option<&devmap::oracle::Answer>),
    quiet: bool,
) -> Result<ExitCode> {
    let report = check(out, Some(expected), how, quiet)?;
    if !quiet || report.differences() > 0 {
        for line in report.to_text().lines() {
            err_line(format!("verify: {line}"))?;
        }
    }
    Ok(status(&report))
}

fn status(report: &devmap::verify::VerifyReport) -> ExitCode {
    if report.differences() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the verification on a thread and draws its progress on a terminal's stderr;
/// Ctrl-C cancels it.
fn check(
    out: &Path,
    expected: Option<&SaveReference>,
    how: (bool, Option<&devmap::oracle::Answer>),
    quiet: bool,
) -> Result<devmap::verify::VerifyReport> {
    let progress = Progress::default();
    let tty = !quiet && std::io::stderr().is_terminal();
    let terminated = devmap::sys::catch_termination();
    let started = Instant::now();
    let mut drawn = false;
    let result = verify_with_ticks(out, expected, how, &progress, &mut |progress| {
        if terminated.load(Ordering::SeqCst) {
            progress.cancel.store(true, Ordering::SeqCst);
        }
        if tty {
            let read = progress.read.load(Ordering::Relaxed);
            let total = progress.total.load(Ordering::Relaxed).max(1);
            let rate = read as f64 / started.elapsed().as_secs_f64().max(1e-3);
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r\x1b[2Kverifying {}: {:>5.1}%  {} / {}  {}/s",
                devmap::text::path(out),
                read as f64 * 100.0 / total as f64,
                human_bytes(read),
                human_bytes(total),
                human_bytes(rate as u64)
            );
            let _ = err.flush();
            drawn = true;
        }
    });
    if drawn {
        let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
    }
    result.wrap_err_with(|| format!("cannot verify {}", devmap::text::path(out)))
}
