//! The App: all TUI state, changed only by [`App::handle`]. It never touches the
//! terminal; work it cannot do itself (start a save, write a file, quit) comes back as
//! [`Effect`]s for the runtime, and results come in again as [`Action`]s.

mod action;
mod devices;
mod edit;
mod export;
mod filter;
mod save;

pub use action::{Action, Effect};
use edit::{edit_text, is_edit};

pub use save::{PREVIEW_DELAY, dtype_label};
mod search;
mod verify;
mod work;

pub use work::{Busy, MapApplied, Work};

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::formats::device_map::encode_device_map;
use crate::formats::size::parse_size;
use crate::model::checkpoint::Checkpoint;
use crate::model::names::covers;
use crate::model::tree::{ModuleTree, NodeId};
use crate::monitor::MemorySample;
use crate::monitor::gpu::GpuInfo;
use crate::save::{SaveEvent, SaveOptions, SavePlan, SaveReport};
use crate::types::placement::{DeviceMap, Placement};

use super::probe::{PathKind, Probe, SystemProbe};
use super::rows::TreeRows;

/// Shard sizes `←/→` step through in the save dialog.
pub const SHARD_PRESETS: [&str; 8] = [
    "100MB", "500MB", "1GB", "2GB", "5GB", "10GB", "20GB", "50GB",
];
/// Memory samples kept for the sparkline: one minute at four a second.
pub const MEMORY_HISTORY: usize = 240;
/// What a save itself needs in memory: the copy buffer (see `save::copy`).
pub const SAVE_MEMORY: u64 = 8 << 20;

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Browse,
    Search(String),
    /// `f`: the filter being typed (the tree follows as it changes).
    Filter(String),
    SaveDialog(Box<SaveDialog>),
    Export(ExportDialog),
    Help,
    /// Every warning, in full (`!`).
    Warnings,
    Confirm(Confirm),
    Plan(PlanDialog),
    /// What a plan would change, not applied until accepted.
    PlanPreview(Box<PlanPreview>),
    /// The devices the selected module can go to (`d`).
    DevicePicker(DevicePicker),
}

/// `d`: every device the module can go to, with what it would hold there against its
/// budget; Enter moves the module to the one selected.
#[derive(Debug, Clone, PartialEq)]
pub struct DevicePicker {
    /// The module (or tensor) being placed.
    pub node: NodeId,
    pub choices: Vec<DeviceChoice>,
    pub selected: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceChoice {
    pub device: Placement,
    /// What the device holds now.
    pub holds: u64,
    /// What it would hold with the module moved there.
    pub after: u64,
    /// Its budget (chosen or free), if known.
    pub budget: Option<u64>,
    /// Whether the whole module is on this device now.
    pub current: bool,
}

/// A plan (`p`) shown before it is applied: Enter puts its map in place (one undo
/// step), Esc leaves the map as it was.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanPreview {
    /// What moves, device totals before → after, the new map, why.
    pub lines: Vec<String>,
    /// The planned map applied to a copy of the model: swapped in when accepted.
    pub applied: MapApplied,
    /// How many tensors change device.
    pub moved: usize,
    /// The budgets planned for: the Devices panel's once the plan is applied.
    pub budgets: Vec<(Placement, u64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlanDialog {
    /// `--max-memory` syntax: `0=22GiB,cpu=64GiB`.
    pub budgets: String,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Confirm {
    QuitDuringSave,
    /// `q` with an edited map that was not exported.
    QuitUnexported,
    CancelSave,
    OverwriteExport(PathBuf),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    ShardSize,
    Output,
    Dtype,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SaveDialog {
    pub size: String,
    pub out: String,
    pub field: Field,
    /// The output folder the user allowed to be written into though not empty
    /// (Ctrl-O): consent for that path alone, gone when the path changes or the
    /// dialog closes, so it never carries over to another folder.
    pub overwrite: Option<String>,
    /// `--dtype` of the save, stepped with ←/→ on its field.
    pub dtype: crate::save::shards::DtypeChoice,
    pub preview: Preview,
    /// When the preview is recomputed after the last edit: typing waits for nothing,
    /// and the plan and file checks run once the keys stop (or on Enter).
    pub preview_due: Option<Duration>,
    /// The preview being computed off the UI thread (its generation), if one is.
    pub preview_pending: Option<u64>,
}

impl SaveDialog {
    /// Whether the save may write into a non-empty output folder: the user pressed
    /// Ctrl-O for the folder the dialog names now.
    pub fn overwrites(&self) -> bool {
        self.overwrite.as_deref() == Some(self.out.trim())
    }
}

/// What the save would do with the dialog's values, recomputed on every edit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Preview {
    pub shard_sizes: Vec<u64>,
    pub largest: Option<(String, u64)>,
    pub bytes: u64,
    pub tensors: usize,
    /// Tied names written once: (dropped, kept, what says they are tied).
    pub ties_once: Vec<(String, String, &'static str)>,
    /// What floating-point tensors are cast to, when the save casts.
    pub cast_to: Option<crate::types::DType>,
    /// `--merge-lora`: the adapters applied and the tensors they merge into.
    pub lora: Option<(Vec<String>, usize)>,
    pub memory: u64,
    /// What that memory is, in words.
    pub memory_parts: String,
    pub warnings: Vec<String>,
    /// Reasons the save cannot start; empty when it can.
    pub errors: Vec<String>,
    /// The output folder is not empty, so Ctrl-O would help.
    pub offer_overwrite: bool,
    pub plan: Option<SavePlan>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExportDialog {
    pub path: String,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ShardProgress {
    pub file_name: String,
    pub bytes: u64,
    pub written: u64,
    pub done: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Done(SaveReport),
    Failed(String),
    Cancelled,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SaveProgress {
    pub out: PathBuf,
    pub started: Duration,
    /// When the save ended: the rate shown after it is the final average.
    pub ended: Option<Duration>,
    pub shards: Vec<ShardProgress>,
    pub current: Option<usize>,
    pub total: u64,
    pub written: u64,
    pub outcome: Option<Outcome>,
    pub cancel_requested: bool,
    /// The plan written, kept for `v` (verify compares against it).
    pub plan: SavePlan,
    pub verify: Option<VerifyProgress>,
}

/// A verification of the finished save, running or done.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyProgress {
    pub read: u64,
    pub total: u64,
    pub outcome: Option<Result<crate::verify::VerifyReport, String>>,
}

impl SaveProgress {
    pub fn running(&self) -> bool {
        self.outcome.is_none()
    }
}

/// The panel that ↑/↓ and PgUp/PgDn move in (`Tab` cycles, as in lazygit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Focus {
    #[default]
    Tree,
    Details,
    Devices,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Info,
    Good,
    Bad,
}

/// A short-lived line in place of the key bar: it goes at `until` (see
/// [`Message::LASTS`]), and the key bar comes back.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub text: String,
    pub tone: Tone,
    /// When it goes, on the App's clock.
    pub until: Duration,
}

impl Message {
    /// How long a message stays: long enough to read a line, an error twice that.
    pub const LASTS: Duration = Duration::from_secs(4);
}

pub struct App {
    /// Shared with a running save, which reads it on its own thread; an edit while
    /// a save runs copies it once (`Arc::make_mut`).
    pub ckpt: Arc<Checkpoint>,
    /// Shared with work that re-totals it off the UI thread.
    pub tree: Arc<ModuleTree>,
    pub rows: TreeRows,
    pub mode: Mode,
    pub warnings: Vec<crate::model::warning::Warning>,
    pub memory: VecDeque<MemorySample>,
    pub save: Option<SaveProgress>,
    pub message: Option<Message>,
    pub last_search: String,
    /// The cursor in the active text field, in characters (`None`: at its end). Reset
    /// whenever a field opens or another takes the keys.
    pub cursor: Option<usize>,
    /// Which panel the movement keys scroll, and how far each scrolled panel is.
    pub focus: Focus,
    /// The filter in place (`f`): the tree shows only what it keeps.
    pub filter: Option<String>,
    /// What the weights were read from (`safetensors + offload`), for the header:
    /// found once, as the model opens.
    pub source_kind: String,
    /// `z`: the focused panel takes the screen.
    pub zoomed: bool,
    pub details_scroll: u16,
    pub devices_scroll: u16,
    /// The KV cache the Devices panel adds to each device's weights (`--context`).
    pub kv: Option<crate::plan::kv::KvOnDevices>,
    /// Each GPU's share under a vLLM layout (`--tp/--ep/--pp`): the Devices panel's
    /// last line names the largest.
    pub parallel: Option<crate::plan::parallel::Sharded>,
    /// Lines scrolled in the plan result.
    pub result_scroll: u16,
    /// Lines scrolled in the help or warnings overlay (when it is taller than the
    /// screen; the drawing clamps it).
    pub overlay_scroll: u16,
    pub matches: Vec<NodeId>,
    pub clock: Duration,
    pub size: (u16, u16),
    /// The map as opened: "edited" means different from it.
    pub unedited_map: Option<DeviceMap>,
    /// The map last exported (`w`), if any: quitting loses nothing while the map is
    /// this one or the one opened.
    pub exported_map: Option<Option<DeviceMap>>,
    /// Where the last export went: the export dialog opens there again.
    pub last_export_path: Option<String>,
    /// Earlier maps, newest last, for `u`; maps undone, for `Ctrl-R`.
    pub undo: Vec<Option<DeviceMap>>,
    pub redo: Vec<Option<DeviceMap>>,
    /// GPUs anyone has named: the map as opened, detected GPUs, budgets. `d` cycles
    /// through all of them, so none vanishes once the map stops using it.
    pub known_gpus: std::collections::BTreeSet<u32>,
    /// The save dialog's values when it last closed: it opens with them again.
    pub last_save_dialog: Option<SaveDialog>,
    /// The tree rows as they were when `/` was pressed, for Esc.
    pub search_origin: Option<TreeRows>,
    pub quitting: bool,
    pub color: bool,
    pub budgets: Budgets,
    pub gpus: Vec<GpuInfo>,
    pub gpu_note: Option<String>,
    /// Every file-system question the App asks goes through here (also from the
    /// preview's thread).
    probe: Arc<dyn Probe>,
    /// Work running off the UI thread that the map waits for.
    pub busy: Option<Busy>,
    /// Keys that read or change the map, waiting for `busy` to end, each with the row
    /// selected when it was pressed.
    pub queued: VecDeque<(Action, Option<NodeId>)>,
    /// Numbers save previews, so a late one for an older edit is dropped.
    pub preview_generation: u64,
    /// The devices that held weights when the model opened.
    pub opened_devices: Vec<Placement>,
    /// Each tensor's device as the model opened (the `*` of an edited row compares
    /// with it).
    opened_placements: Vec<Placement>,
    /// Rows whose tensors are, some of them, on another device than when the model
    /// opened: by node, kept current as the map changes.
    pub edited_nodes: Vec<bool>,
    /// For tests: the [`SaveOptions::pause_file`] of the saves this App starts, so a
    /// journey can cancel or quit a save that is surely still running.
    #[doc(hidden)]
    pub save_pause: Option<std::path::PathBuf>,
}

/// What each device can hold, where known. Filled by the runtime (free disk is a
/// system call, GPU memory comes from the driver); fixed in tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Budgets {
    /// Free bytes on the file system of the offload folder (or the model).
    pub disk_free: Option<u64>,
    /// Total memory per GPU index.
    pub gpu_total: Vec<(u32, u64)>,
    /// Budgets the user chose (`--max-memory`, or those of the plan last applied):
    /// they stand before what the devices have free.
    pub chosen: Vec<(Placement, u64)>,
    /// Where [`Budgets::chosen`] came from, for the Devices panel's title.
    pub chosen_from: Option<&'static str>,
}

impl App {
    /// An App over `ckpt` that asks the real file system.
    pub fn new(ckpt: Checkpoint) -> App {
        App::with_probe(ckpt, Box::new(SystemProbe::default()))
    }

    /// An App whose file-system questions go to `probe`.
    pub fn with_probe(ckpt: Checkpoint, probe: Box<dyn Probe>) -> App {
        let tree = ModuleTree::build(&ckpt);
        let mut rows = TreeRows::new(&tree);
        // A model with one top-level module (`model`) opens it, like the text report.
        let top: Vec<NodeId> = tree.children(ModuleTree::ROOT).collect();
        for &child in &top {
            if top.len() == 1 || tree.children(child).nth(1).is_some() {
                rows.set_expanded(child, true);
            }
        }
        let known_gpus = ckpt
            .device_map
            .as_ref()
            .map(|m| {
                m.devices()
                    .into_iter()
                    .filter_map(|p| match p {
                        Placement::Gpu(i) => Some(i),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let warnings = crate::model::checks::all_warnings(&ckpt);
        let unedited_map = ckpt.device_map.clone();
        let opened_placements = ckpt.tensors().iter().map(|t| t.placement).collect();
        let source_kind = ckpt.source_kind();
        let opened_devices = tree.nodes[ModuleTree::ROOT]
            .split
            .iter()
            .map(|&(p, _)| p)
            .collect();
        App {
            ckpt: Arc::new(ckpt),
            tree: Arc::new(tree),
            rows,
            mode: Mode::Browse,
            warnings,
            memory: VecDeque::with_capacity(MEMORY_HISTORY),
            save: None,
            message: None,
            last_search: String::new(),
            cursor: None,
            focus: Focus::Tree,
            filter: None,
            source_kind,
            zoomed: false,
            details_scroll: 0,
            devices_scroll: 0,
            kv: None,
            parallel: None,
            result_scroll: 0,
            overlay_scroll: 0,
            matches: Vec::new(),
            clock: Duration::ZERO,
            size: (120, 40),
            unedited_map,
            exported_map: None,
            last_export_path: None,
            undo: Vec::new(),
            redo: Vec::new(),
            known_gpus,
            last_save_dialog: None,
            search_origin: None,
            quitting: false,
            save_pause: None,
            color: true,
            budgets: Budgets::default(),
            gpus: Vec::new(),
            gpu_note: None,
            probe: Arc::from(probe),
            busy: None,
            queued: VecDeque::new(),
            preview_generation: 0,
            opened_devices,
            opened_placements,
            edited_nodes: Vec::new(),
        }
    }

    /// A paste goes into the open text field as one edit (line breaks and other
    /// control characters dropped, so a pasted line never submits); outside a field it
    /// is ignored, with a word why.
    fn paste(&mut self, text: &str) -> Vec<Effect> {
        let clean: String = text.chars().filter(|c| !c.is_control()).collect();
        let in_field = match &self.mode {
            Mode::Search(_) | Mode::Filter(_) | Mode::Export(_) | Mode::Plan(_) => true,
            Mode::SaveDialog(d) => d.field != Field::Dtype,
            _ => false,
        };
        if !in_field {
            self.say(
                "paste ignored: open a text field first (/ search, s save, w export, p plan)",
                Tone::Info,
            );
            return Vec::new();
        }
        if clean.is_empty() {
            return Vec::new();
        }
        self.handle_in_mode(Action::Paste(clean))
    }

    /// Whether the map differs from the one opened or last exported (`d` then `u` is
    /// no edit).
    pub fn map_edited(&self) -> bool {
        self.ckpt.device_map != self.unedited_map
    }

    /// Whether the map holds edits that are in no file: it differs from the one
    /// opened and from the one last exported.
    pub fn map_unexported(&self) -> bool {
        self.map_edited() && self.exported_map.as_ref() != Some(&self.ckpt.device_map)
    }

    pub fn selected(&self) -> Option<NodeId> {
        self.rows.selected_node()
    }

    pub fn save_running(&self) -> bool {
        self.save.as_ref().is_some_and(SaveProgress::running)
    }

    /// The wheel over Details or Devices scrolls that panel; anywhere else it moves the
    /// tree's selection, three rows a notch.
    fn wheel(&mut self, column: u16, row: u16, down: bool) {
        let screen = ratatui::layout::Rect::new(0, 0, self.size.0, self.size.1);
        let areas = self.layout(screen);
        let at = ratatui::layout::Position::new(column, row);
        let notch = |v: u16| {
            if down {
                v.saturating_add(3)
            } else {
                v.saturating_sub(3)
            }
        };
        if areas.details.contains(at) {
            self.details_scroll = notch(self.details_scroll);
        } else if areas.devices.contains(at) {
            self.devices_scroll = notch(self.devices_scroll);
        } else {
            let before = self.rows.selected;
            self.rows.move_by(if down { 3 } else { -3 });
            if self.rows.selected != before {
                self.details_scroll = 0;
            }
        }
    }

    /// A click in the tree: the row under it is selected; clicking the selected row
    /// opens or closes it.
    fn click(&mut self, column: u16, row: u16) {
        let screen = ratatui::layout::Rect::new(0, 0, self.size.0, self.size.1);
        let tree = self.layout(screen).tree;
        // Inside the border, below the header line.
        let first = tree.y + 2;
        if column <= tree.x
            || column + 1 >= tree.x + tree.width
            || row < first
            || row + 1 >= tree.y + tree.height
        {
            return;
        }
        let index = self.rows.offset + usize::from(row - first);
        let Some(&id) = self.rows.visible().get(index) else {
            return;
        };
        if index == self.rows.selected {
            if self.rows.has_children(id) {
                let open = self.rows.is_expanded(id);
                self.rows.set_expanded(id, !open);
            }
        } else {
            self.rows.selected = index;
        }
    }

    /// Lines the save panel would like: the heading, the overall bar and one per shard
    /// (or the outcome lines); 0 when there is no save to show.
    pub fn progress_rows(&self) -> usize {
        self.save.as_ref().map_or(0, |s| 2 + s.shards.len().max(2))
    }

    /// Lines the Devices panel shows: one per device.
    pub fn device_rows(&self) -> usize {
        self.device_totals().len()
    }

    /// Bytes per device, for every device that holds weights now or did when the model
    /// opened (a device emptied by edits keeps its row, at 0 B: rows never jump).
    pub fn device_totals(&self) -> Vec<(Placement, u64)> {
        let mut totals: std::collections::BTreeMap<Placement, u64> =
            self.opened_devices.iter().map(|&p| (p, 0)).collect();
        for &(p, bytes) in &self.tree.nodes[ModuleTree::ROOT].split {
            totals.insert(p, bytes);
        }
        totals.into_iter().collect()
    }

    /// Where the panels are on `screen`, with the zoom (`z`) applied.
    pub fn layout(&self, screen: ratatui::layout::Rect) -> super::layout::Areas {
        use super::layout::Zoomed;
        let zoomed = self.zoomed.then_some(match self.focus {
            Focus::Tree => Zoomed::Tree,
            Focus::Details => Zoomed::Details,
            Focus::Devices => Zoomed::Devices,
        });
        super::layout::areas_zoomed(screen, self.progress_rows(), self.device_rows(), zoomed)
    }

    /// Marks the rows whose tensors moved since the model opened (and the modules
    /// above them).
    pub(super) fn mark_edited_rows(&mut self) {
        let tensors = self.ckpt.tensors();
        let moved = |t: usize| self.opened_placements.get(t) != Some(&tensors[t].placement);
        let edited = self.tree.marked_with_ancestors(moved);
        // No move: no list at all (the usual case after an undo back to the start).
        self.edited_nodes = if edited.contains(&true) {
            edited
        } else {
            Vec::new()
        };
    }

    /// Whether row `id` holds tensors moved since the model opened.
    pub fn row_edited(&self, id: NodeId) -> bool {
        self.edited_nodes.get(id).copied().unwrap_or(false)
    }

    fn tree_height(&self) -> usize {
        let screen = ratatui::layout::Rect::new(0, 0, self.size.0, self.size.1);
        self.layout(screen).tree_rows
    }

    /// A message that stays while the work it names runs (a save, a verification):
    /// the message that work ends with replaces it.
    fn say_while_running(&mut self, text: impl Into<String>) {
        self.message = Some(Message {
            text: text.into(),
            tone: Tone::Info,
            until: Duration::MAX,
        });
    }

    pub(crate) fn say(&mut self, text: impl Into<String>, tone: Tone) {
        let lasts = match tone {
            Tone::Bad => Message::LASTS * 2,
            Tone::Info | Tone::Good => Message::LASTS,
        };
        self.message = Some(Message {
            text: text.into(),
            tone,
            until: self.clock + lasts,
        });
    }

    pub fn handle(&mut self, action: Action) -> Vec<Effect> {
        let mode_before = std::mem::discriminant(&self.mode);
        let effects = self.handle_action(action);
        // A field that opens starts with its cursor at the end.
        if std::mem::discriminant(&self.mode) != mode_before {
            self.cursor = None;
        }
        effects
    }

    fn handle_action(&mut self, action: Action) -> Vec<Effect> {
        let effects = match action {
            Action::Tick(now) => {
                self.clock = now;
                if self.message.as_ref().is_some_and(|m| now >= m.until) {
                    self.message = None;
                }
                self.refresh_preview_if_due()
            }
            Action::MapApplied(applied) => self.on_map_applied(applied),
            Action::PlanFailed(why) => self.on_plan_failed(why),
            Action::WorkFailed(why) => self.on_work_failed(&why),
            Action::WarmedUp => Vec::new(),
            Action::PreviewReady {
                generation,
                preview,
            } => {
                self.on_preview_ready(generation, *preview);
                Vec::new()
            }
            Action::Resize { width, height } => {
                self.size = (width, height);
                Vec::new()
            }
            Action::Paste(text) => self.paste(&text),
            Action::Memory(sample) => {
                if self.memory.len() == MEMORY_HISTORY {
                    self.memory.pop_front();
                }
                self.memory.push_back(sample);
                Vec::new()
            }
            Action::Gpus(gpus, note) => {
                self.known_gpus.extend(gpus.iter().map(|g| g.index));
                self.gpus = gpus;
                self.gpu_note = note;
                Vec::new()
            }
            Action::Save(event) => {
                self.on_save_event(event);
                Vec::new()
            }
            Action::Verify => self.start_verify(),
            Action::VerifyProgress { read, total } => {
                self.on_verify_progress(read, total);
                Vec::new()
            }
            Action::Verified(result) => {
                self.on_verified(result);
                Vec::new()
            }
            Action::SaveNotStarted(why) => {
                self.save = None;
                self.say(format!("could not start the save: {why}"), Tone::Bad);
                Vec::new()
            }
            Action::Written { path, error } => {
                match error {
                    None => {
                        self.exported_map = Some(self.ckpt.device_map.clone());
                        self.last_export_path = Some(path.display().to_string());
                        self.say(
                            format!("device map written to {}", path.display()),
                            Tone::Good,
                        );
                    }
                    Some(e) => self.say(
                        format!("could not write {}: {e}", path.display()),
                        Tone::Bad,
                    ),
                }
                Vec::new()
            }
            other => self.handle_in_mode(other),
        };
        let height = self.tree_height();
        self.rows.scroll_into_view(height);
        effects
    }

    fn handle_in_mode(&mut self, action: Action) -> Vec<Effect> {
        match &self.mode {
            Mode::Browse => self.browse(action),
            Mode::Search(_) => {
                self.search_input(action);
                Vec::new()
            }
            Mode::Filter(_) => {
                self.filter_input(action);
                Vec::new()
            }
            Mode::SaveDialog(_) => self.save_dialog(action),
            Mode::Export(_) => self.export_dialog(action),
            Mode::Help | Mode::Warnings => {
                let scroll = &mut self.overlay_scroll;
                match action {
                    Action::Close | Action::Help | Action::Quit | Action::ShowWarnings => {
                        self.mode = Mode::Browse;
                        *scroll = 0;
                    }
                    Action::Up | Action::ScrollUp => *scroll = scroll.saturating_sub(1),
                    Action::Down | Action::ScrollDown => *scroll = scroll.saturating_add(1),
                    Action::PageUp => *scroll = scroll.saturating_sub(10),
                    Action::PageDown => *scroll = scroll.saturating_add(10),
                    Action::Wheel { down, .. } => {
                        *scroll = if down {
                            scroll.saturating_add(3)
                        } else {
                            scroll.saturating_sub(3)
                        };
                    }
                    _ => {}
                }
                Vec::new()
            }
            Mode::Confirm(_) => self.confirm(action),
            Mode::Plan(_) => self.plan_dialog(action),
            Mode::DevicePicker(_) => self.device_picker(action),
            Mode::PlanPreview(_) => {
                match action {
                    Action::Submit => {
                        self.result_scroll = 0;
                        return self.accept_plan();
                    }
                    Action::Close | Action::Quit => {
                        self.mode = Mode::Browse;
                        self.result_scroll = 0;
                        self.say("plan discarded: the map is as it was", Tone::Info);
                    }
                    Action::Up | Action::ScrollUp => {
                        self.result_scroll = self.result_scroll.saturating_sub(1);
                    }
                    Action::Down | Action::ScrollDown => {
                        self.result_scroll = self.result_scroll.saturating_add(1);
                    }
                    Action::Wheel { down, .. } => {
                        self.result_scroll = if down {
                            self.result_scroll.saturating_add(3)
                        } else {
                            self.result_scroll.saturating_sub(3)
                        };
                    }
                    Action::PageUp => self.result_scroll = self.result_scroll.saturating_sub(10),
                    Action::PageDown => self.result_scroll = self.result_scroll.saturating_add(10),
                    _ => {}
                }
                Vec::new()
            }
        }
    }

    fn browse(&mut self, action: Action) -> Vec<Effect> {
        if let Action::Wheel { column, row, down } = action {
            self.wheel(column, row, down);
            return Vec::new();
        }
        if matches!(action, Action::NextField | Action::PrevField) {
            let order = [Focus::Tree, Focus::Details, Focus::Devices];
            let at = order.iter().position(|f| *f == self.focus).unwrap_or(0);
            let step = if action == Action::NextField { 1 } else { 2 };
            self.focus = order[(at + step) % 3];
            return Vec::new();
        }
        // Movement scrolls the focused panel when it is not the tree.
        let step: Option<i32> = match action {
            Action::Up | Action::ScrollUp => Some(-1),
            Action::Down | Action::ScrollDown => Some(1),
            Action::PageUp => Some(-10),
            Action::PageDown => Some(10),
            Action::Top => Some(-10_000),
            _ => None,
        };
        if let Some(step) = step {
            let scroll = match self.focus {
                Focus::Tree => None,
                Focus::Details => Some(&mut self.details_scroll),
                Focus::Devices => Some(&mut self.devices_scroll),
            };
            if let Some(scroll) = scroll {
                *scroll = (i32::from(*scroll) + step).clamp(0, i32::from(u16::MAX)) as u16;
                return Vec::new();
            }
        }
        let before = self.rows.selected;
        let effects = self.browse_tree(action);
        if self.rows.selected != before {
            // A new selection's details start at their top.
            self.details_scroll = 0;
        }
        effects
    }

    fn browse_tree(&mut self, action: Action) -> Vec<Effect> {
        if self.busy.is_some() && Self::waits_for_map(&action) {
            self.queue(action);
            return Vec::new();
        }
        let page = self.tree_height().max(1) as isize;
        match action {
            Action::Up => self.rows.move_by(-1),
            Action::Down => self.rows.move_by(1),
            Action::ScrollUp => self.rows.move_by(-3),
            Action::ScrollDown => self.rows.move_by(3),
            Action::PageUp => self.rows.move_by(-page),
            Action::PageDown => self.rows.move_by(page),
            Action::Top => self.rows.selected = 0,
            Action::Bottom => self.rows.select_last(),
            Action::Expand => {
                if let Some(id) = self.selected()
                    && self.rows.has_children(id)
                {
                    if self.rows.is_expanded(id) {
                        self.rows.move_by(1);
                    } else {
                        self.rows.set_expanded(id, true);
                    }
                }
            }
            Action::Collapse => {
                if let Some(id) = self.selected() {
                    if self.rows.is_expanded(id) && self.rows.has_children(id) {
                        self.rows.set_expanded(id, false);
                    } else if let Some(parent) = self.tree.nodes[id].parent()
                        && parent != ModuleTree::ROOT
                    {
                        self.rows.select_node(parent);
                    }
                }
            }
            Action::StartSearch => {
                // Esc puts the tree back as it was: selection, scroll and expansion.
                self.search_origin = Some(self.rows.clone());
                self.mode = Mode::Search(String::new());
            }
            Action::NextMatch => self.step_match(1),
            Action::PrevMatch => self.step_match(-1),
            Action::JumpTie => self.jump_tie(),
            Action::CycleDevice => return self.cycle_device(),
            Action::PickDevice => self.open_device_picker(),
            Action::StartExport => self.open_export(),
            Action::StartPlan => self.open_plan(),
            Action::OpenSave => return self.open_save(),
            Action::Help => self.mode = Mode::Help,
            Action::StartFilter => self.open_filter(),
            Action::CycleSort => {
                let next = self.rows.sort().next();
                self.rows.set_sort(&self.tree, next);
                self.say(
                    format!("sorted by {} (o for the next order)", next.label()),
                    Tone::Info,
                );
            }
            Action::Zoom => {
                self.zoomed = !self.zoomed;
                self.rows.scroll_into_view(self.tree_height());
            }
            Action::ExpandAll => self.rows.expand_all(),
            Action::CollapseAll => self.rows.collapse_all(&self.tree),
            Action::ShowWarnings => self.mode = Mode::Warnings,
            Action::Quit => {
                if self.save_running() {
                    self.mode = Mode::Confirm(Confirm::QuitDuringSave);
                } else if self.map_unexported() {
                    self.mode = Mode::Confirm(Confirm::QuitUnexported);
                } else {
                    self.quitting = true;
                    return vec![Effect::Quit];
                }
            }
            Action::Close => {
                if self.filter.is_some() && !self.save_running() {
                    // Esc first takes the filter away.
                    self.clear_filter();
                    self.say("filter cleared", Tone::Info);
                } else if self.save_running() {
                    self.mode = Mode::Confirm(Confirm::CancelSave);
                } else if self.verify_running() {
                    return vec![Effect::CancelVerify];
                } else if self.save.is_some() {
                    // The finished save's panel: Esc dismisses it.
                    self.save = None;
                    self.message = None;
                } else {
                    self.message = None;
                }
            }
            Action::Undo => return self.undo_map(),
            Action::Redo => return self.redo_map(),
            Action::Click { column, row } => self.click(column, row),
            _ => {}
        }
        Vec::new()
    }
}
