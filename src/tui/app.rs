//! The App: all TUI state, changed only by [`App::handle`]. It never touches the
//! terminal; work it cannot do itself (start a save, write a file, quit) comes back as
//! [`Effect`]s for the runtime, and results come in again as [`Action`]s.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::formats::device_map::encode_device_map;
use crate::formats::size::parse_size;
use crate::model::checkpoint::Checkpoint;
use crate::model::names::covers;
use crate::model::placement::{DeviceMap, Placement};
use crate::model::tree::{ModuleTree, NodeId};
use crate::monitor::MemorySample;
use crate::monitor::gpu::GpuInfo;
use crate::save::{SaveEvent, SaveOptions, SavePlan, SaveReport};

use super::rows::TreeRows;

/// Shard sizes `←/→` step through in the save dialog.
pub const SHARD_PRESETS: [&str; 7] = ["100MB", "500MB", "1GB", "2GB", "5GB", "10GB", "20GB"];
/// Memory samples kept for the sparkline: one minute at four a second.
pub const MEMORY_HISTORY: usize = 240;
/// What a save itself needs in memory: the copy buffer (see `save::copy`).
pub const SAVE_MEMORY: u64 = 8 << 20;

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    Expand,
    Collapse,
    ScrollUp,
    ScrollDown,
    StartSearch,
    NextMatch,
    PrevMatch,
    JumpTie,
    CycleDevice,
    StartExport,
    OpenSave,
    Help,
    Quit,
    /// Esc: close what is open, or ask to cancel a running save.
    Close,
    Submit,
    NextField,
    PrevPreset,
    NextPreset,
    Input(char),
    Backspace,
    ClearField,
    ToggleOverwrite,
    Yes,
    No,
    Resize {
        width: u16,
        height: u16,
    },
    /// Time since the app started (the runtime's clock; tests pass fixed values).
    Tick(Duration),
    Memory(MemorySample),
    /// GPUs as NVML (or a test double) reports them, and why there are none.
    Gpus(Vec<GpuInfo>, Option<String>),
    StartPlan,
    Save(SaveEvent),
    /// The runtime could not start the save thread.
    SaveNotStarted(String),
    /// Result of an `Effect::WriteFile`.
    Written {
        path: PathBuf,
        error: Option<String>,
    },
}

#[derive(Debug, Clone)]
pub enum Effect {
    StartSave {
        ckpt: Arc<Checkpoint>,
        plan: SavePlan,
        options: SaveOptions,
    },
    CancelSave,
    WriteFile {
        path: PathBuf,
        contents: String,
    },
    Quit,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Browse,
    Search(String),
    SaveDialog(Box<SaveDialog>),
    Export(ExportDialog),
    Help,
    Confirm(Confirm),
    Plan(PlanDialog),
    /// What the last plan changed, until closed.
    PlanResult(Vec<String>),
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
    CancelSave,
    OverwriteExport(PathBuf),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    ShardSize,
    Output,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SaveDialog {
    pub size: String,
    pub out: String,
    pub field: Field,
    pub overwrite: bool,
    pub preview: Preview,
}

/// What the save would do with the dialog's values, recomputed on every edit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Preview {
    pub shard_sizes: Vec<u64>,
    pub largest: Option<(String, u64)>,
    pub bytes: u64,
    pub tensors: usize,
    pub ties_once: Vec<(String, String)>,
    pub memory: u64,
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
    pub shards: Vec<ShardProgress>,
    pub current: Option<usize>,
    pub total: u64,
    pub written: u64,
    pub outcome: Option<Outcome>,
    pub cancel_requested: bool,
}

impl SaveProgress {
    pub fn running(&self) -> bool {
        self.outcome.is_none()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Info,
    Good,
    Bad,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub text: String,
    pub tone: Tone,
}

pub struct App {
    pub ckpt: Checkpoint,
    pub tree: ModuleTree,
    pub rows: TreeRows,
    pub mode: Mode,
    pub warnings: Vec<String>,
    pub memory: VecDeque<MemorySample>,
    pub save: Option<SaveProgress>,
    pub message: Option<Message>,
    pub last_search: String,
    pub matches: Vec<NodeId>,
    pub clock: Duration,
    pub size: (u16, u16),
    pub map_edited: bool,
    pub quitting: bool,
    pub color: bool,
    pub budgets: Budgets,
    pub gpus: Vec<GpuInfo>,
    pub gpu_note: Option<String>,
}

/// What each device can hold, where known. Filled by the runtime (free disk is a
/// system call, GPU memory comes from the driver); fixed in tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Budgets {
    /// Free bytes on the file system of the offload folder (or the model).
    pub disk_free: Option<u64>,
    /// Total memory per GPU index.
    pub gpu_total: Vec<(u32, u64)>,
}

impl App {
    pub fn new(ckpt: Checkpoint) -> App {
        let tree = ModuleTree::build(&ckpt);
        let mut rows = TreeRows::new(&tree);
        // A model with one top-level module (`model`) opens it, like the text report.
        let top = &tree.nodes[ModuleTree::ROOT].children;
        for &child in top {
            if top.len() == 1 || tree.nodes[child].children.len() > 1 {
                rows.set_expanded(child, true);
            }
        }
        let warnings = ckpt.all_warnings();
        App {
            ckpt,
            tree,
            rows,
            mode: Mode::Browse,
            warnings,
            memory: VecDeque::with_capacity(MEMORY_HISTORY),
            save: None,
            message: None,
            last_search: String::new(),
            matches: Vec::new(),
            clock: Duration::ZERO,
            size: (120, 40),
            map_edited: false,
            quitting: false,
            color: true,
            budgets: Budgets::default(),
            gpus: Vec::new(),
            gpu_note: None,
        }
    }

    pub fn selected(&self) -> Option<NodeId> {
        self.rows.selected_node()
    }

    pub fn save_running(&self) -> bool {
        self.save.as_ref().is_some_and(SaveProgress::running)
    }

    fn tree_height(&self) -> usize {
        super::ui::layout_for(self.size.0, self.size.1).tree_rows
    }

    fn say(&mut self, text: impl Into<String>, tone: Tone) {
        self.message = Some(Message {
            text: text.into(),
            tone,
        });
    }

    pub fn handle(&mut self, action: Action) -> Vec<Effect> {
        let effects = match action {
            Action::Tick(now) => {
                self.clock = now;
                Vec::new()
            }
            Action::Resize { width, height } => {
                self.size = (width, height);
                Vec::new()
            }
            Action::Memory(sample) => {
                if self.memory.len() == MEMORY_HISTORY {
                    self.memory.pop_front();
                }
                self.memory.push_back(sample);
                Vec::new()
            }
            Action::Gpus(gpus, note) => {
                self.gpus = gpus;
                self.gpu_note = note;
                Vec::new()
            }
            Action::Save(event) => {
                self.on_save_event(event);
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
                        self.map_edited = false;
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
            Mode::SaveDialog(_) => self.save_dialog(action),
            Mode::Export(_) => self.export_dialog(action),
            Mode::Help => {
                if matches!(action, Action::Close | Action::Help | Action::Quit) {
                    self.mode = Mode::Browse;
                }
                Vec::new()
            }
            Mode::Confirm(_) => self.confirm(action),
            Mode::Plan(_) => {
                self.plan_dialog(action);
                Vec::new()
            }
            Mode::PlanResult(_) => {
                if matches!(action, Action::Close | Action::Submit | Action::Quit) {
                    self.mode = Mode::Browse;
                }
                Vec::new()
            }
        }
    }

    fn browse(&mut self, action: Action) -> Vec<Effect> {
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
                    } else if let Some(parent) = self.tree.nodes[id].parent
                        && parent != ModuleTree::ROOT
                    {
                        self.rows.select_node(parent);
                    }
                }
            }
            Action::StartSearch => self.mode = Mode::Search(String::new()),
            Action::NextMatch => self.step_match(1),
            Action::PrevMatch => self.step_match(-1),
            Action::JumpTie => self.jump_tie(),
            Action::CycleDevice => self.cycle_device(),
            Action::StartExport => self.open_export(),
            Action::StartPlan => self.open_plan(),
            Action::OpenSave => self.open_save(),
            Action::Help => self.mode = Mode::Help,
            Action::Quit => {
                if self.save_running() {
                    self.mode = Mode::Confirm(Confirm::QuitDuringSave);
                } else {
                    self.quitting = true;
                    return vec![Effect::Quit];
                }
            }
            Action::Close => {
                if self.save_running() {
                    self.mode = Mode::Confirm(Confirm::CancelSave);
                } else {
                    self.message = None;
                }
            }
            _ => {}
        }
        Vec::new()
    }

    // ----- search -----

    fn search_input(&mut self, action: Action) {
        let Mode::Search(query) = &mut self.mode else {
            return;
        };
        match action {
            Action::Input(c) => query.push(c),
            Action::Backspace => {
                query.pop();
            }
            Action::ClearField => query.clear(),
            Action::Submit => {
                let q = std::mem::take(query);
                self.mode = Mode::Browse;
                if !q.is_empty() {
                    self.last_search = q;
                }
                let n = self.matches.len();
                if n > 0 {
                    self.say(
                        format!("{n} match(es) for `{}`: n / N to step", self.last_search),
                        Tone::Info,
                    );
                } else if !self.last_search.is_empty() {
                    self.say(
                        format!("no name contains `{}`", self.last_search),
                        Tone::Bad,
                    );
                }
                return;
            }
            Action::Close => {
                self.mode = Mode::Browse;
                return;
            }
            _ => return,
        }
        let q = query.clone();
        self.find_matches(&q);
        if let Some(&first) = self
            .matches
            .iter()
            .find(|&&m| Some(m) >= self.selected())
            .or(self.matches.first())
        {
            self.rows.reveal(&self.tree, first);
        }
    }

    /// Nodes whose dotted name contains `query` (case-insensitive), in tree order. A
    /// match inside a name selects the module that ends with the matched part
    /// (`layers.5.mlp` selects `model.layers.5.mlp`).
    fn find_matches(&mut self, query: &str) {
        self.matches.clear();
        if query.is_empty() {
            return;
        }
        let needle = query.as_bytes();
        for (id, t) in self.ckpt.tensors.iter().enumerate() {
            let name = t.name.as_str();
            // ASCII case-insensitive, without allocating per name: 100k names are
            // searched on every keystroke.
            let Some(at) = name
                .as_bytes()
                .windows(needle.len())
                .position(|w| w.eq_ignore_ascii_case(needle))
            else {
                continue;
            };
            let end = at + needle.len();
            // Components after the one the match ends in.
            let below = name[end..].matches('.').count();
            let mut node = self.tree.tensor_node[id];
            for _ in 0..below {
                node = self.tree.nodes[node].parent.unwrap_or(node);
            }
            self.matches.push(node);
        }
        self.matches.sort_unstable();
        self.matches.dedup();
    }

    fn step_match(&mut self, dir: isize) {
        if self.matches.is_empty() {
            if !self.last_search.is_empty() {
                let q = self.last_search.clone();
                self.find_matches(&q);
            }
            if self.matches.is_empty() {
                self.say("no search yet: press / to search", Tone::Info);
                return;
            }
        }
        let current = self.selected().unwrap_or(0);
        let next = if dir > 0 {
            self.matches
                .iter()
                .find(|&&m| m > current)
                .or(self.matches.first())
        } else {
            self.matches
                .iter()
                .rev()
                .find(|&&m| m < current)
                .or(self.matches.last())
        };
        if let Some(&n) = next {
            self.rows.reveal(&self.tree, n);
        }
    }

    // ----- ties and devices -----

    fn jump_tie(&mut self) {
        let Some(node) = self.selected() else { return };
        let Some(tensor) = self.tree.nodes[node].tensor else {
            self.say("t jumps between tied tensors: select a tensor", Tone::Info);
            return;
        };
        let Some(group) = self.ckpt.tie_group(tensor) else {
            self.say(
                format!("`{}` is not tied", self.ckpt.tensors[tensor].name),
                Tone::Info,
            );
            return;
        };
        let pos = group.members.iter().position(|&m| m == tensor).unwrap_or(0);
        let partner = group.members[(pos + 1) % group.members.len()];
        let target = self.tree.tensor_node[partner];
        self.rows.reveal(&self.tree, target);
    }

    /// The devices `d` cycles through: the GPUs the map uses (GPU 0 when it names
    /// none), then cpu and disk.
    pub fn device_cycle(&self) -> Vec<Placement> {
        let mut cycle: Vec<Placement> = self
            .ckpt
            .device_map
            .as_ref()
            .map(|m| {
                m.devices()
                    .into_iter()
                    .filter(|p| matches!(p, Placement::Gpu(_)))
                    .collect()
            })
            .unwrap_or_default();
        if cycle.is_empty() {
            cycle.push(Placement::Gpu(0));
        }
        cycle.extend([Placement::Cpu, Placement::Disk]);
        cycle
    }

    fn cycle_device(&mut self) {
        let Some(node) = self.selected() else { return };
        let n = &self.tree.nodes[node];
        let current = n.split.iter().max_by_key(|(_, b)| *b).map(|(p, _)| *p);
        let cycle = self.device_cycle();
        let next = match current.and_then(|c| cycle.iter().position(|&p| p == c)) {
            Some(i) if n.split.len() == 1 => cycle[(i + 1) % cycle.len()],
            Some(i) => cycle[i],
            None => cycle[0],
        };
        let key = self.tree.full_name(node);
        let mut map = self.ckpt.device_map.clone().unwrap_or_else(|| {
            // No map means everything on cpu; make that explicit before editing.
            DeviceMap::new(vec![(String::new(), Placement::Cpu)])
        });
        // The new entry moves the whole module: drop keys inside it.
        let kept: Vec<(String, Placement)> = map
            .entries()
            .iter()
            .filter(|(k, _)| k == &key || !covers(&key, k) || key.is_empty())
            .cloned()
            .collect();
        map = DeviceMap::new(kept);
        map.set(key.clone(), next);
        self.ckpt.apply_device_map(Some(map));
        self.tree.recompute(&self.ckpt);
        self.warnings = self.ckpt.all_warnings();
        self.map_edited = true;
        let shown = if key.is_empty() {
            "the whole model".to_owned()
        } else {
            format!("`{key}`")
        };
        self.say(
            format!("{shown} → {next}; w exports the edited map"),
            Tone::Info,
        );
    }

    // ----- planning -----

    /// What each device can hold now: GPU free memory, available RAM (the defaults of
    /// the plan dialog and the budgets of the Devices panel).
    pub fn device_budget(&self, p: Placement) -> Option<u64> {
        match p {
            Placement::Gpu(i) => self
                .gpus
                .iter()
                .find(|g| g.index == i)
                .map(|g| g.free)
                .or_else(|| {
                    self.budgets
                        .gpu_total
                        .iter()
                        .find(|(g, _)| *g == i)
                        .map(|(_, b)| *b)
                }),
            Placement::Cpu => self.memory.back().map(|s| s.available),
            Placement::Disk => self.budgets.disk_free,
            _ => None,
        }
    }

    fn open_plan(&mut self) {
        let mut parts: Vec<String> = Vec::new();
        let mut gpus: Vec<u32> = self.gpus.iter().map(|g| g.index).collect();
        gpus.extend(self.budgets.gpu_total.iter().map(|(i, _)| *i));
        gpus.sort_unstable();
        gpus.dedup();
        for i in gpus {
            if let Some(b) = self.device_budget(Placement::Gpu(i)) {
                parts.push(format!("{i}={}", short_size(b)));
            }
        }
        if let Some(b) = self.device_budget(Placement::Cpu) {
            parts.push(format!("cpu={}", short_size(b)));
        }
        self.mode = Mode::Plan(PlanDialog {
            budgets: parts.join(","),
            error: None,
        });
    }

    fn plan_dialog(&mut self, action: Action) {
        let Mode::Plan(dialog) = &mut self.mode else {
            return;
        };
        match action {
            Action::Input(c) => dialog.budgets.push(c),
            Action::Backspace => {
                dialog.budgets.pop();
            }
            Action::ClearField => dialog.budgets.clear(),
            Action::Close => self.mode = Mode::Browse,
            Action::Submit => {
                let spec = dialog.budgets.clone();
                match crate::plan::parse_max_memory(&spec) {
                    Err(e) => dialog.error = Some(e),
                    Ok(max_memory) => {
                        let options = crate::plan::PlanOptions {
                            max_memory,
                            no_split: Vec::new(),
                        };
                        match crate::plan::plan(&self.ckpt, &options) {
                            Err(e) => dialog.error = Some(e.to_string()),
                            Ok(planned) => self.apply_plan(planned, &spec),
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Replaces the map with a plan and lists what moved.
    fn apply_plan(&mut self, planned: crate::plan::Planned, spec: &str) {
        let before: Vec<Placement> = self.ckpt.tensors.iter().map(|t| t.placement).collect();
        let totals_before = self.ckpt.device_totals();
        self.ckpt.apply_device_map(Some(planned.map));
        self.tree.recompute(&self.ckpt);
        self.warnings = self.ckpt.all_warnings();
        self.map_edited = true;
        let moved = self
            .ckpt
            .tensors
            .iter()
            .zip(&before)
            .filter(|(t, b)| t.placement != **b)
            .count();
        let mut lines = vec![format!(
            "accelerate's plan for {spec}: {moved} of {} tensors move",
            self.ckpt.tensors.len()
        )];
        let totals_after = self.ckpt.device_totals();
        let mut devices: Vec<Placement> = totals_before
            .iter()
            .chain(&totals_after)
            .map(|(p, _)| *p)
            .collect();
        devices.sort();
        devices.dedup();
        for d in devices {
            let get =
                |v: &[(Placement, u64)]| v.iter().find(|(p, _)| *p == d).map_or(0, |(_, b)| *b);
            lines.push(format!(
                "  {d:<9} {:>11} → {:>11}",
                crate::human_bytes(get(&totals_before)),
                crate::human_bytes(get(&totals_after))
            ));
        }
        lines.push("new map:".into());
        if let Some(map) = &self.ckpt.device_map {
            for (k, p) in map.entries() {
                let k = if k.is_empty() {
                    "\"\" (everything)"
                } else {
                    k.as_str()
                };
                lines.push(format!("  {k} → {p}"));
            }
        }
        lines.extend(planned.explain.iter().take(12).map(|e| format!("· {e}")));
        lines.push("w exports this map; Esc closes".into());
        self.mode = Mode::PlanResult(lines);
    }

    // ----- export -----

    fn open_export(&mut self) {
        // Beside the model directory, not in it: devmap adds nothing to its inputs
        // (and a later save would copy a stray map into the output).
        let dir = self.ckpt.dir.display().to_string();
        let path = PathBuf::from(format!("{}-device_map.json", dir.trim_end_matches('/')));
        self.mode = Mode::Export(ExportDialog {
            path: path.display().to_string(),
            error: None,
        });
    }

    fn export_dialog(&mut self, action: Action) -> Vec<Effect> {
        let Mode::Export(dialog) = &mut self.mode else {
            return Vec::new();
        };
        match action {
            Action::Input(c) => dialog.path.push(c),
            Action::Backspace => {
                dialog.path.pop();
            }
            Action::ClearField => dialog.path.clear(),
            Action::Close => self.mode = Mode::Browse,
            Action::Submit => {
                let path = PathBuf::from(dialog.path.trim());
                let problem = if path.as_os_str().is_empty() {
                    Some("type a file path")
                } else if path.is_dir() {
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
                } else if path.exists() {
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

    fn is_input_map(&self, path: &Path) -> bool {
        let Some(input) = &self.ckpt.device_map_path else {
            return false;
        };
        let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        canon(path) == canon(input)
    }

    fn export_effect(&self, path: PathBuf) -> Effect {
        let contents = self
            .ckpt
            .device_map
            .as_ref()
            .map(encode_device_map)
            .unwrap_or_else(|| "{\n  \"\": \"cpu\"\n}\n".to_owned());
        Effect::WriteFile { path, contents }
    }

    fn confirm(&mut self, action: Action) -> Vec<Effect> {
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
                if let Some(s) = &mut self.save {
                    s.cancel_requested = true;
                }
                self.say("cancelling the save…", Tone::Info);
                vec![Effect::CancelSave]
            }
            Confirm::OverwriteExport(path) => vec![self.export_effect(path)],
        }
    }

    // ----- save -----

    fn open_save(&mut self) {
        if self.save_running() {
            self.say("a save is already running", Tone::Info);
            return;
        }
        let dir = self.ckpt.dir.display().to_string();
        let out = format!("{}-saved", dir.trim_end_matches('/'));
        let mut dialog = SaveDialog {
            size: "5GB".into(),
            out,
            field: Field::ShardSize,
            overwrite: false,
            preview: Preview::default(),
        };
        dialog.preview = self.preview(&dialog);
        self.mode = Mode::SaveDialog(Box::new(dialog));
    }

    fn save_dialog(&mut self, action: Action) -> Vec<Effect> {
        let Mode::SaveDialog(dialog) = &mut self.mode else {
            return Vec::new();
        };
        let field = match dialog.field {
            Field::ShardSize => &mut dialog.size,
            Field::Output => &mut dialog.out,
        };
        match action {
            Action::Close => {
                self.mode = Mode::Browse;
                return Vec::new();
            }
            Action::NextField => {
                dialog.field = match dialog.field {
                    Field::ShardSize => Field::Output,
                    Field::Output => Field::ShardSize,
                };
                return Vec::new();
            }
            Action::Input(c) => field.push(c),
            Action::Backspace => {
                field.pop();
            }
            Action::ClearField => field.clear(),
            Action::ToggleOverwrite => dialog.overwrite = !dialog.overwrite,
            Action::PrevPreset | Action::NextPreset if dialog.field == Field::ShardSize => {
                dialog.size = step_preset(&dialog.size, action == Action::NextPreset);
            }
            Action::Submit => return self.start_save(),
            _ => return Vec::new(),
        }
        let snapshot = (**dialog).clone();
        let preview = self.preview(&snapshot);
        if let Mode::SaveDialog(dialog) = &mut self.mode {
            dialog.preview = preview;
        }
        Vec::new()
    }

    fn options_for(&self, dialog: &SaveDialog) -> Result<SaveOptions, String> {
        let max = parse_size(&dialog.size)?;
        if dialog.out.trim().is_empty() {
            return Err("type an output folder".into());
        }
        Ok(SaveOptions {
            max_shard_size: max,
            force: dialog.overwrite,
            ..SaveOptions::new(dialog.out.trim())
        })
    }

    /// Plans the save for the dialog's values: what it would write, and every reason
    /// it would be refused (the same checks `devmap save` makes).
    pub fn preview(&self, dialog: &SaveDialog) -> Preview {
        let mut preview = Preview {
            memory: SAVE_MEMORY,
            ..Preview::default()
        };
        let options = match self.options_for(dialog) {
            Ok(o) => o,
            Err(e) => {
                preview.errors.push(e);
                return preview;
            }
        };
        let plan = match crate::save::plan(&self.ckpt, &options) {
            Ok(p) => p,
            Err(e) => {
                preview.errors = e.problems;
                return preview;
            }
        };
        preview.errors = crate::save::preflight::check(&self.ckpt, &plan, &options);
        preview.offer_overwrite = !dialog.overwrite
            && std::fs::read_dir(&options.out).is_ok_and(|mut r| r.next().is_some());
        preview.shard_sizes = plan.shards.iter().map(|s| s.file_bytes()).collect();
        preview.largest = plan.largest_tensor.clone();
        preview.bytes = plan.file_bytes();
        preview.tensors = plan.tensor_count();
        preview.ties_once = plan.dropped_ties.clone();
        if let Some(sample) = self.memory.back()
            && sample.available < SAVE_MEMORY * 4
        {
            preview.warnings.push(format!(
                "only {} of RAM is free; the save needs about {}",
                crate::human_bytes(sample.available),
                crate::human_bytes(SAVE_MEMORY)
            ));
        }
        if let Some(&largest) = preview.shard_sizes.iter().max()
            && let Some(sample) = self.memory.back()
            && sample.available < largest
        {
            preview.warnings.push(format!(
                "a shard-at-a-time save (transformers) would need {} of RAM, more than the {} free; devmap streams and does not",
                crate::human_bytes(largest),
                crate::human_bytes(sample.available)
            ));
        }
        preview.plan = Some(plan);
        preview
    }

    fn start_save(&mut self) -> Vec<Effect> {
        let Mode::SaveDialog(dialog) = &self.mode else {
            return Vec::new();
        };
        let dialog = (**dialog).clone();
        // Re-check now: the folder may have changed since the last keystroke.
        let preview = self.preview(&dialog);
        let (Ok(options), Some(plan)) = (self.options_for(&dialog), preview.plan.clone()) else {
            self.set_preview(preview);
            return Vec::new();
        };
        if !preview.errors.is_empty() {
            self.set_preview(preview);
            return Vec::new();
        }
        self.mode = Mode::Browse;
        self.save = Some(SaveProgress {
            out: options.out.clone(),
            started: self.clock,
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
        });
        self.say(
            format!("saving to {}… (Esc cancels)", options.out.display()),
            Tone::Info,
        );
        vec![Effect::StartSave {
            ckpt: Arc::new(self.ckpt.clone()),
            plan,
            options,
        }]
    }

    fn set_preview(&mut self, preview: Preview) {
        if let Mode::SaveDialog(d) = &mut self.mode {
            d.preview = preview;
        }
    }

    fn on_save_event(&mut self, event: SaveEvent) {
        let Some(save) = &mut self.save else { return };
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
                    "saved {} tensors in {} shard(s) to {}",
                    report.tensors,
                    report.shard_files.len(),
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
        let secs = self.clock.saturating_sub(save.started).as_secs_f64();
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

/// A budget as `--max-memory` takes it, rounded down to whole MiB or GiB.
fn short_size(bytes: u64) -> String {
    if bytes >= 10 << 30 {
        format!("{}GiB", bytes >> 30)
    } else {
        format!("{}MiB", (bytes >> 20).max(1))
    }
}
