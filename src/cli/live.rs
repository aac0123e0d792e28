//! `devmap --live-manifest FILE`: the inspector over a live model. `devmap.inspect`
//! (the Python package, which links no terminal code) describes the model in its
//! session as a manifest and starts this command in the same terminal; the manifest
//! names the session's process, whose memory a save from the inspector (`s`) reads.
//! Not for typing by hand: the flag is hidden from `--help`.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use color_eyre::eyre::{Result, WrapErr, eyre};
use devmap::formats::live::parse_manifest;
use devmap::inspect;
use devmap::model::load::load_live;

use super::output::out;

pub fn show(path: &Path) -> Result<ExitCode> {
    let text = std::fs::read_to_string(path)
        .wrap_err_with(|| format!("cannot read the live model's manifest {}", path.display()))?;
    let manifest = parse_manifest(&text, path)?;
    let title = manifest
        .title
        .clone()
        .unwrap_or_else(|| "the model in the Python session".to_owned());
    let origin = path.to_path_buf();
    if !std::io::stdout().is_terminal() || super::output::dumb_terminal() {
        let ckpt = load_live(&manifest, &origin)?;
        out(inspect::to_text(&ckpt, inspect::TextOptions::default()))?;
        return Ok(ExitCode::SUCCESS);
    }
    let loaded = devmap::tui::run_loading(
        &title,
        devmap::tui::InspectorOptions::default(),
        move |_| load_live(&manifest, &origin).map_err(|e| eyre!(e)),
    )
    .wrap_err("the terminal interface failed")?;
    match loaded {
        devmap::tui::Loaded::Failed(e) => Err(e),
        devmap::tui::Loaded::Ran => Ok(ExitCode::SUCCESS),
    }
}
