//! The save dialog, its live preview, and progress of the running save.

use std::sync::Arc;

use super::{
    Action, App, Confirm, Effect, Field, Mode, Outcome, Preview, SAVE_MEMORY, SHARD_PRESETS,
    SaveDialog, SaveEvent, SaveOptions, SaveProgress, ShardProgress, Tone, edit_text, is_edit,
    parse_size,
};
use devmap_core::save::{Refusal, SaveError};

/// Quiet time after the last edit before the save preview is recomputed.
pub const PREVIEW_DELAY: std::time::Duration = std::time::Duration::from_millis(150);

impl App {
    pub(super) fn open_save(&mut self) -> Vec<Effect> {
        if self.save_running() {
            self.say("a save is already running", Tone::Info);
            return Vec::new();
        }
        let out = self.beside_model("-saved").display().to_string();
        // The values of last time in this session, or the defaults.
        let mut dialog = self.last_save_dialog.clone().unwrap_or(SaveDialog {
            size: devmap_core::save::DEFAULT_MAX_SHARD_SIZE_TEXT.into(),
            out,
            field: Field::ShardSize,
            overwrite: None,
            dtype: devmap_core::save::shards::DtypeChoice::Auto,
            preview: Preview::default(),
            preview_due: None,
            preview_pending: None,
        });
        dialog.field = Field::ShardSize;
        dialog.preview = Preview::default();
        dialog.preview_due = Some(self.clock);
        self.mode = Mode::SaveDialog(Box::new(dialog));
        self.refresh_preview_if_due()
    }

    pub(super) fn save_dialog(&mut self, action: Action) -> Vec<Effect> {
        let Mode::SaveDialog(dialog) = &mut self.mode else {
            return Vec::new();
        };
        let field = match dialog.field {
            Field::ShardSize => &mut dialog.size,
            Field::Output | Field::Dtype => &mut dialog.out,
        };
        match action {
            Action::Close => {
                self.remember_dialog();
                self.mode = Mode::Browse;
                return Vec::new();
            }
            // Tab completes a path in the output field while it can (or names the
            // candidates and stays); then it moves on. Shift-Tab goes back.
            Action::NextField if dialog.field == Field::Output && self.cursor.is_none() => {
                let mut path = std::mem::take(field);
                let used = self.tab_complete(&mut path);
                let Mode::SaveDialog(dialog) = &mut self.mode else {
                    return Vec::new();
                };
                dialog.out = path;
                if used {
                    dialog.preview_due = Some(self.clock + PREVIEW_DELAY);
                } else {
                    dialog.field = Field::Dtype;
                    self.cursor = None;
                }
                return Vec::new();
            }
            Action::NextField | Action::PrevField => {
                let order = [Field::ShardSize, Field::Output, Field::Dtype];
                let at = order.iter().position(|f| *f == dialog.field).unwrap_or(0);
                let step = if action == Action::NextField { 1 } else { 2 };
                dialog.field = order[(at + step) % 3];
                self.cursor = None;
                return Vec::new();
            }
            // The dtype field is chosen, not typed.
            ref edit if is_edit(edit) && dialog.field == Field::Dtype => {}
            // ←/→ step presets in the size field and move the cursor in the path.
            Action::PrevPreset if dialog.field == Field::Output => {
                self.cursor = edit_text(field, self.cursor, &Action::CursorLeft);
                return Vec::new();
            }
            Action::NextPreset if dialog.field == Field::Output => {
                self.cursor = edit_text(field, self.cursor, &Action::CursorRight);
                return Vec::new();
            }
            ref edit if is_edit(edit) => {
                let moves_only = matches!(
                    edit,
                    Action::CursorLeft
                        | Action::CursorRight
                        | Action::CursorHome
                        | Action::CursorEnd
                );
                self.cursor = edit_text(field, self.cursor, edit);
                if moves_only {
                    return Vec::new();
                }
                // Another folder than the one consent was given for: ask again.
                if !dialog.overwrites() {
                    dialog.overwrite = None;
                }
            }
            Action::PrevPreset | Action::NextPreset if dialog.field == Field::Dtype => {
                dialog.dtype = step_dtype(dialog.dtype, action == Action::NextPreset);
            }
            Action::ToggleOverwrite => {
                dialog.overwrite = if dialog.overwrites() {
                    None
                } else {
                    Some(dialog.out.trim().to_owned())
                };
            }
            Action::PrevPreset | Action::NextPreset if dialog.field == Field::ShardSize => {
                dialog.size = step_preset(&dialog.size, action == Action::NextPreset);
                self.cursor = None;
            }
            Action::Submit => return self.start_save(),
            _ => return Vec::new(),
        }
        dialog.preview_due = Some(self.clock + PREVIEW_DELAY);
        Vec::new()
    }

    /// Starts the save preview off the UI thread once the keys have stopped for
    /// [`PREVIEW_DELAY`]; the dialog shows the last preview, marked as being checked,
    /// until it lands.
    pub(super) fn refresh_preview_if_due(&mut self) -> Vec<Effect> {
        let Mode::SaveDialog(dialog) = &self.mode else {
            return Vec::new();
        };
        if dialog.preview_due.is_none_or(|due| self.clock < due) {
            return Vec::new();
        }
        let input = self.preview_input(dialog);
        self.preview_generation += 1;
        let generation = self.preview_generation;
        if let Mode::SaveDialog(dialog) = &mut self.mode {
            dialog.preview_due = None;
            dialog.preview_pending = Some(generation);
        }
        vec![Effect::Compute(super::Work::new("checking", move || {
            Action::PreviewReady {
                generation,
                preview: Box::new(input.compute()),
            }
        }))]
    }

    /// A preview landed: shown if it is for the latest edit of the open dialog.
    pub(super) fn on_preview_ready(&mut self, generation: u64, preview: Preview) {
        if let Mode::SaveDialog(dialog) = &mut self.mode
            && dialog.preview_pending == Some(generation)
        {
            dialog.preview = preview;
            dialog.preview_pending = None;
        }
    }

    /// Keeps the open dialog's values for the next time it opens.
    fn remember_dialog(&mut self) {
        if let Mode::SaveDialog(dialog) = &self.mode {
            let mut kept = (**dialog).clone();
            // Consent to overwrite is for this visit to the dialog only.
            kept.overwrite = None;
            kept.preview = Preview::default();
            kept.preview_due = None;
            kept.preview_pending = None;
            self.last_save_dialog = Some(kept);
        }
    }

    /// When the App next needs a tick to do deferred work (the save preview), if it
    /// has any. A message's end is no such work: the next tick takes it away (the
    /// memory sampler's readings tick every second).
    pub fn wake_at(&self) -> Option<std::time::Duration> {
        match &self.mode {
            Mode::SaveDialog(dialog) => dialog.preview_due,
            _ => None,
        }
    }

    pub(super) fn options_for(&self, dialog: &SaveDialog) -> Result<SaveOptions, String> {
        let max = parse_size(&dialog.size).map_err(|e| e.to_string())?;
        if dialog.out.trim().is_empty() {
            return Err("type an output folder".into());
        }
        Ok(SaveOptions {
            max_shard_size: max,
            dtype: dialog.dtype,
            force: dialog.overwrites(),
            available_ram: self.memory.back().map(|m| m.available),
            pause_file: self.save_pause.clone(),
            // A save paused for a test writes one shard at a time, so where it stands
            // at the pause is the same on every run.
            jobs: if self.save_pause.is_some() {
                1
            } else {
                devmap_core::save::shards::DEFAULT_JOBS
            },
            ..SaveOptions::new(dialog.out.trim())
        })
    }

    /// Plans the save for the dialog's values: what it would write, and every reason
    /// it would be refused (the same checks `devmap save` makes). On the calling
    /// thread: the dialog's own preview runs through `App::refresh_preview_if_due`.
    pub fn preview(&self, dialog: &SaveDialog) -> Preview {
        self.preview_input(dialog).compute()
    }

    /// Everything the preview reads, owned, so it can run on another thread.
    fn preview_input(&self, dialog: &SaveDialog) -> PreviewInput {
        PreviewInput {
            ckpt: Arc::clone(&self.ckpt),
            probe: Arc::clone(&self.probe),
            options: self.options_for(dialog),
            size_hint: devmap_core::formats::size::unit_hint(&dialog.size),
            overwrite: dialog.overwrites(),
            memory: self.memory.back().copied(),
        }
    }

    pub(super) fn start_save(&mut self) -> Vec<Effect> {
        let Mode::SaveDialog(dialog) = &self.mode else {
            return Vec::new();
        };
        let dialog = (**dialog).clone();
        // Re-check now: the folder, or the inputs, may have changed since the preview.
        self.probe.forget_inputs();
        let preview = self.preview(&dialog);
        let (Ok(options), Some(plan)) = (self.options_for(&dialog), preview.plan.clone()) else {
            self.set_preview(preview);
            return Vec::new();
        };
        if !preview.errors.is_empty() {
            self.set_preview(preview);
            return Vec::new();
        }
        self.remember_dialog();
        self.mode = Mode::Browse;
        self.save = Some(SaveProgress {
            out: options.out.clone(),
            started: self.clock,
            ended: None,
            shards: plan
                .shards
                .iter()
                .map(|s| ShardProgress {
                    file_name: s.file_name.clone(),
                    bytes: s.data_bytes,
                    written: 0,
                    done: false,
                })
                .collect(),
            current: None,
            total: plan.total_size,
            written: 0,
            outcome: None,
            cancel_requested: false,
            plan: plan.clone(),
            verify: None,
        });
        self.say_while_running(format!(
            "saving to {}… (Esc cancels)",
            options.out.display()
        ));
        vec![Effect::StartSave {
            ckpt: Arc::clone(&self.ckpt),
            plan,
            options,
        }]
    }

    pub(super) fn set_preview(&mut self, preview: Preview) {
        if let Mode::SaveDialog(d) = &mut self.mode {
            d.preview = preview;
            d.preview_due = None;
        }
    }

    pub(super) fn on_save_event(&mut self, event: SaveEvent) {
        let Some(save) = &mut self.save else { return };
        if matches!(
            event,
            SaveEvent::Finished(_) | SaveEvent::Failed(_) | SaveEvent::Cancelled
        ) {
            save.ended = Some(self.clock);
            // A question about the running save has no subject any more.
            if matches!(
                self.mode,
                Mode::Confirm(Confirm::CancelSave | Confirm::QuitDuringSave)
            ) {
                self.mode = Mode::Browse;
            }
        }
        match event {
            SaveEvent::ShardStarted { index, .. } => save.current = Some(index),
            SaveEvent::Progress {
                index,
                shard_written,
                total_written,
            } => {
                if let Some(s) = save.shards.get_mut(index) {
                    s.written = shard_written;
                }
                save.written = total_written;
            }
            SaveEvent::ShardFinished { index } => {
                if let Some(s) = save.shards.get_mut(index) {
                    s.written = s.bytes;
                    s.done = true;
                }
            }
            SaveEvent::Finished(report) => {
                save.written = save.total;
                let text = format!(
                    "saved {} in {} to {}",
                    devmap_core::text::count(report.tensors, "tensor", "tensors"),
                    devmap_core::text::count(report.shard_files.len(), "shard", "shards"),
                    report.out.display()
                );
                save.outcome = Some(Outcome::Done(report));
                self.say(text, Tone::Good);
            }
            SaveEvent::Failed(why) => {
                save.outcome = Some(Outcome::Failed(why.clone()));
                self.say(
                    format!("save failed, nothing left behind: {why}"),
                    Tone::Bad,
                );
            }
            SaveEvent::Cancelled => {
                save.outcome = Some(Outcome::Cancelled);
                self.say(
                    "save cancelled; no shard was left in the output folder",
                    Tone::Info,
                );
            }
        }
    }

    /// Bytes per second and seconds left of the running save.
    pub fn save_rate(&self) -> Option<(f64, f64)> {
        let save = self.save.as_ref()?;
        let until = save.ended.unwrap_or(self.clock);
        let secs = until.saturating_sub(save.started).as_secs_f64();
        if secs <= 0.0 {
            return None;
        }
        let rate = save.written as f64 / secs;
        let eta = if rate > 0.0 {
            save.total.saturating_sub(save.written) as f64 / rate
        } else {
            f64::INFINITY
        };
        Some((rate, eta))
    }
}

/// The preset after (or before) `current`; from a typed value, the nearest one.
fn step_preset(current: &str, forward: bool) -> String {
    let sizes: Vec<u64> = SHARD_PRESETS
        .iter()
        .filter_map(|p| parse_size(p).ok())
        .collect();
    let value = parse_size(current).ok();
    let index = match value {
        Some(v) => {
            if forward {
                sizes.iter().position(|&s| s > v).unwrap_or(sizes.len() - 1)
            } else {
                sizes.iter().rposition(|&s| s < v).unwrap_or(0)
            }
        }
        None => 4,
    };
    SHARD_PRESETS[index].to_owned()
}

/// The dtypes the save dialog steps through, in order.
const DTYPE_CHOICES: [devmap_core::save::shards::DtypeChoice; 5] = {
    use devmap_core::save::shards::DtypeChoice;
    use devmap_core::types::DType;
    [
        DtypeChoice::Auto,
        DtypeChoice::Keep,
        DtypeChoice::To(DType::BF16),
        DtypeChoice::To(DType::F16),
        DtypeChoice::To(DType::F32),
    ]
};

fn step_dtype(
    current: devmap_core::save::shards::DtypeChoice,
    forward: bool,
) -> devmap_core::save::shards::DtypeChoice {
    let n = DTYPE_CHOICES.len();
    let at = DTYPE_CHOICES
        .iter()
        .position(|&d| d == current)
        .unwrap_or(0);
    DTYPE_CHOICES[if forward {
        (at + 1) % n
    } else {
        (at + n - 1) % n
    }]
}

/// How the dialog names a dtype choice (the words of `--dtype`).
pub fn dtype_label(choice: devmap_core::save::shards::DtypeChoice) -> &'static str {
    use devmap_core::save::shards::DtypeChoice;
    match choice {
        DtypeChoice::Auto => "auto",
        DtypeChoice::Keep => "keep",
        DtypeChoice::AsLoaded => "as held",
        DtypeChoice::To(d) => d.torch_name(),
    }
}

/// A refusal as the dialog should say it: the keys of the TUI, not the CLI's flags.
fn in_tui_words(refusal: &Refusal) -> String {
    match refusal {
        Refusal::NotEmpty { out, entries } => format!(
            "the output folder {} is not empty ({}); press Ctrl-O to write into it (earlier weight files there are replaced)",
            out.display(),
            devmap_core::text::count(*entries, "entry", "entries")
        ),
        other => other.to_string(),
    }
}

/// The save preview's inputs: a snapshot of the App taken when the keys stopped.
struct PreviewInput {
    ckpt: Arc<devmap_core::model::checkpoint::Checkpoint>,
    probe: Arc<dyn crate::probe::Probe>,
    options: Result<SaveOptions, String>,
    /// What a bare small number typed as the shard size probably meant.
    size_hint: Option<String>,
    overwrite: bool,
    memory: Option<devmap_core::monitor::MemorySample>,
}

impl PreviewInput {
    fn compute(self) -> Preview {
        let mut preview = Preview {
            memory: SAVE_MEMORY,
            ..Preview::default()
        };
        let options = match self.options {
            Ok(o) => o,
            Err(e) => {
                preview.errors.push(e);
                return preview;
            }
        };
        let plan = match devmap_core::save::plan(&self.ckpt, &options) {
            Ok(p) => p,
            Err(SaveError::Unsaveable(problems)) => {
                preview.errors = problems.iter().map(ToString::to_string).collect();
                return preview;
            }
            Err(e) => {
                preview.errors = vec![e.to_string()];
                return preview;
            }
        };
        preview.errors = self
            .probe
            .save_problems(&self.ckpt, &plan, &options)
            .iter()
            .map(in_tui_words)
            .collect();
        preview.offer_overwrite = !self.overwrite && self.probe.has_entries(&options.out);
        preview.shard_sizes = plan
            .shards
            .iter()
            .map(devmap_core::save::shards::ShardPlan::file_bytes)
            .collect();
        preview.largest.clone_from(&plan.largest_tensor);
        preview.bytes = plan.file_bytes();
        preview.tensors = plan.tensor_count();
        preview.ties_once = plan
            .dropped_ties
            .iter()
            .map(|(dropped, kept)| {
                let evidence = self
                    .ckpt
                    .tie_evidence(dropped)
                    .map_or("tied", devmap_core::model::TieEvidence::label);
                (dropped.clone(), kept.clone(), evidence)
            })
            .collect();
        preview.cast_to = plan.cast_to;
        let need = plan.memory_need(&self.ckpt, options.jobs);
        preview.memory = need.bytes;
        preview.memory_parts = need.parts.join(", ");
        let merged = plan.merged_count();
        if merged > 0 {
            let mut adapters: Vec<String> = self
                .ckpt
                .merges
                .values()
                .flatten()
                .map(|m| m.adapter.to_string())
                .collect();
            adapters.sort();
            adapters.dedup();
            preview.lora = Some((adapters, merged));
        }
        if let Some(hint) = &self.size_hint {
            preview.warnings.push(hint.clone());
        }
        if let Some(sample) = self.memory.as_ref()
            && sample.available < preview.memory * 4
        {
            preview.warnings.push(format!(
                "only {} of RAM is free; the save needs about {}",
                devmap_core::human_bytes(sample.available),
                devmap_core::human_bytes(preview.memory)
            ));
        }
        if let Some(&largest) = preview.shard_sizes.iter().max()
            && let Some(sample) = self.memory.as_ref()
            && sample.available < largest
        {
            preview.warnings.push(format!(
                "a shard-at-a-time save (transformers) would need {} of RAM, more than the {} free; devmap streams and does not",
                devmap_core::human_bytes(largest),
                devmap_core::human_bytes(sample.available)
            ));
        }
        preview.plan = Some(plan);
        preview
    }
}
