//! The App: all TUI state, changed only by [`App::handle`]. It never touches the
//! terminal; work it cannot do itself (start a save, write a file, quit) comes back as
//! [`Effect`]s for the runtime, and results come in again as [`Action`]s.

mod action;
mod devices;
mod edit;
mod export;
mod filter;
mod geometry;
mod pointer;
mod save;

pub use action::{Action, Effect};
use edit::{edit_text, is_edit};

pub use save::{PREVIEW_DELAY, dtype_label};
mod search;
mod state;
mod verify;
mod work;

pub use state::*;

pub use work::{Busy, MapApplied, Work};

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use devmap_core::formats::device_map::encode_device_map;
use devmap_core::formats::size::parse_size;
use devmap_core::model::checkpoint::Checkpoint;
use devmap_core::model::names::covers;
use devmap_core::model::tree::{ModuleTree, NodeId};
use devmap_core::monitor::MemorySample;
use devmap_core::monitor::gpu::GpuInfo;
use devmap_core::save::{SaveEvent, SaveOptions};
use devmap_core::types::placement::{DeviceMap, Placement};

use super::probe::{PathKind, Probe, SystemProbe};
use super::rows::TreeRows;

pub struct App {
    /// Shared with a running save, which reads it on its own thread; an edit while
    /// a save runs copies it once (`Arc::make_mut`).
    pub ckpt: Arc<Checkpoint>,
    /// Shared with work that re-totals it off the UI thread.
    pub tree: Arc<ModuleTree>,
    pub rows: TreeRows,
    pub mode: Mode,
    pub warnings: Vec<devmap_core::model::warning::Warning>,
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
    pub kv: Option<devmap_core::plan::kv::KvOnDevices>,
    /// Each GPU's share under a vLLM layout (`--tp/--ep/--pp`): the Devices panel's
    /// last line names the largest.
    pub parallel: Option<devmap_core::plan::parallel::Sharded>,
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
        let warnings = devmap_core::model::checks::all_warnings(&ckpt);
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
