//! The App's parts that are plain data: its modes and dialogs, the progress of a save
//! and a verification, the focus, messages, and the constants the dialogs use.

use std::path::PathBuf;
use std::time::Duration;

use super::MapApplied;
use devmap_core::model::tree::NodeId;
use devmap_core::save::{SavePlan, SaveReport};
use devmap_core::types::placement::Placement;

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
    pub dtype: devmap_core::save::shards::DtypeChoice,
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
    pub cast_to: Option<devmap_core::types::DType>,
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
    pub outcome: Option<Result<devmap_core::verify::VerifyReport, String>>,
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
