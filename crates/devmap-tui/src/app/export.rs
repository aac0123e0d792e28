//! Exporting the edited device map (`w`), never over the input map.

use std::path::{Path, PathBuf};

use super::{
    Action, App, Confirm, Effect, ExportDialog, Mode, PathKind, Tone, edit_text, encode_device_map,
    is_edit,
};

impl App {
    pub(super) fn open_export(&mut self) {
        // Beside the model directory, not in it: devmap adds nothing to its inputs
        // (and a later save would copy a stray map into the output).
        // The path of the last export in this session, else one beside the model.
        let path = self
            .last_export_path
            .clone()
            .unwrap_or_else(|| self.beside_model("-device_map.json").display().to_string());
        self.mode = Mode::Export(ExportDialog { path, error: None });
    }

    pub(super) fn export_dialog(&mut self, action: Action) -> Vec<Effect> {
        let Mode::Export(dialog) = &mut self.mode else {
            return Vec::new();
        };
        match action {
            ref edit if is_edit(edit) => {
                self.cursor = edit_text(&mut dialog.path, self.cursor, edit);
            }
            Action::NextField => {
                let mut path = std::mem::take(&mut dialog.path);
                self.tab_complete(&mut path);
                if let Mode::Export(dialog) = &mut self.mode {
                    dialog.path = path;
                }
            }
            Action::Close => self.mode = Mode::Browse,
            Action::Submit => {
                let path = PathBuf::from(dialog.path.trim());
                let problem = if path.as_os_str().is_empty() {
                    Some("type a file path")
                } else if self.probe.kind(&path) == PathKind::Dir {
                    Some("that is a folder; type a file path")
                } else {
                    None
                };
                if let Some(p) = problem {
                    dialog.error = Some(p.into());
                    return Vec::new();
                }
                if self.is_input_map(&path) {
                    if let Mode::Export(dialog) = &mut self.mode {
                        dialog.error = Some(
                            "that is the input device map; devmap never writes its inputs: choose another path".into(),
                        );
                    }
                } else if self.probe.kind(&path) != PathKind::Missing {
                    self.mode = Mode::Confirm(Confirm::OverwriteExport(path));
                } else {
                    self.mode = Mode::Browse;
                    return vec![self.export_effect(path)];
                }
            }
            _ => {}
        }
        Vec::new()
    }

    /// A default output path: the model directory's name plus `suffix`, beside it,
    /// or beside the git checkout it lies in, so that nothing devmap writes lands in
    /// someone's repository by default.
    pub(super) fn beside_model(&self, suffix: &str) -> PathBuf {
        if let Some(remote) = &self.ckpt.remote {
            // A remote model has no folder here: the current one, named after it.
            let name = remote
                .name
                .trim_end_matches(".json")
                .rsplit(['/', '@'])
                .next()
                .unwrap_or("model");
            return PathBuf::from(format!("{name}{suffix}"));
        }
        let dir = &self.ckpt.dir;
        let mut name = dir.file_name().unwrap_or(dir.as_os_str()).to_os_string();
        name.push(suffix);
        let beside = match self.probe.git_root(dir) {
            Some(root) => root.parent().map_or(root.clone(), Path::to_path_buf),
            None => dir.parent().map_or_else(PathBuf::new, Path::to_path_buf),
        };
        beside.join(name)
    }

    pub(super) fn is_input_map(&self, path: &Path) -> bool {
        let Some(input) = &self.ckpt.device_map_path else {
            return false;
        };
        self.probe.same_file(path, input)
    }

    pub(super) fn export_effect(&self, path: PathBuf) -> Effect {
        let contents = self
            .ckpt
            .device_map
            .as_ref()
            .map_or_else(|| "{\n  \"\": \"cpu\"\n}\n".to_owned(), encode_device_map);
        Effect::WriteFile { path, contents }
    }

    pub(super) fn confirm(&mut self, action: Action) -> Vec<Effect> {
        let Mode::Confirm(question) = self.mode.clone() else {
            return Vec::new();
        };
        let yes = match action {
            Action::Yes => true,
            Action::No | Action::Close => false,
            _ => return Vec::new(),
        };
        self.mode = Mode::Browse;
        if !yes {
            return Vec::new();
        }
        match question {
            Confirm::QuitDuringSave => {
                self.quitting = true;
                if let Some(s) = &mut self.save {
                    s.cancel_requested = true;
                }
                vec![Effect::CancelSave, Effect::Quit]
            }
            Confirm::CancelSave => {
                // The save may have ended while the question was open.
                if !self.save_running() {
                    return Vec::new();
                }
                if let Some(s) = &mut self.save {
                    s.cancel_requested = true;
                }
                self.say("cancelling the save…", Tone::Info);
                vec![Effect::CancelSave]
            }
            Confirm::QuitUnexported => {
                self.quitting = true;
                vec![Effect::Quit]
            }
            Confirm::OverwriteExport(path) => vec![self.export_effect(path)],
        }
    }
}
