//! What the App takes in (Actions: keys, results of work, time) and what it asks of the
//! runtime (Effects: threads to start, files to write, quitting).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{MapApplied, Preview, Work};
use devmap_core::model::checkpoint::Checkpoint;
use devmap_core::monitor::MemorySample;
use devmap_core::monitor::gpu::GpuInfo;
use devmap_core::save::{SaveEvent, SaveOptions, SavePlan};

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
    /// The mouse wheel at a screen cell: scrolls the panel under the pointer (the tree
    /// moves its selection).
    Wheel {
        column: u16,
        row: u16,
        down: bool,
    },
    /// A left click at a screen cell: selects the tree row there; a click on the
    /// selected row opens or closes it.
    Click {
        column: u16,
        row: u16,
    },
    StartSearch,
    NextMatch,
    PrevMatch,
    JumpTie,
    /// Move the selected module to the next device at once (`D`).
    CycleDevice,
    /// Pick the device for the selected module from a list (`d`).
    PickDevice,
    /// Show every warning (`!`).
    ShowWarnings,
    /// Take back the last device-map edit (`u`), or do it again (`Ctrl-R`).
    Undo,
    Redo,
    StartExport,
    OpenSave,
    Help,
    /// `o`: list siblings by size, params, name, or back in module order.
    CycleSort,
    /// `f`: type a filter for the tree.
    StartFilter,
    /// `z`: the focused panel takes the screen, or gives it back.
    Zoom,
    /// `+` / `-`: every module open, or only the top level.
    ExpandAll,
    CollapseAll,
    Quit,
    /// Esc: close what is open, or ask to cancel a running save.
    Close,
    Submit,
    NextField,
    /// Shift-Tab: the field (or panel) before.
    PrevField,
    PrevPreset,
    NextPreset,
    Input(char),
    /// Text pasted into the terminal (bracketed paste): one edit of the focused text
    /// field, never keys that run as commands.
    Paste(String),
    Backspace,
    ClearField,
    /// Ctrl-W: delete back to the previous `/` or space (a path's last part).
    DeleteWord,
    /// ←/→ in a text field (in the save dialog's output field; the size and dtype
    /// fields step presets), Home/End.
    CursorLeft,
    CursorRight,
    CursorHome,
    CursorEnd,
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
    /// `v` on a finished save: read it back and compare with its source.
    Verify,
    /// A running verification's bytes read of its total.
    VerifyProgress {
        read: u64,
        total: u64,
    },
    /// The verification ended: its report, or why it could not run.
    Verified(Result<devmap_core::verify::VerifyReport, String>),
    /// Result of an `Effect::WriteFile`.
    Written {
        path: PathBuf,
        error: Option<String>,
    },
    /// A device map applied off the UI thread (after `d`, `u`, `Ctrl-R` or `p`).
    MapApplied(Arc<MapApplied>),
    /// The plan of `p` could not be made.
    PlanFailed(String),
    /// The work started as the inspector opened ([`super::App::opening_work`]) is done.
    WarmedUp,
    /// Work handed off the UI thread panicked (the message says what and why).
    WorkFailed(String),
    /// The save preview computed off the UI thread, for the edit numbered `generation`
    /// (an older one is dropped).
    PreviewReady {
        generation: u64,
        preview: Box<Preview>,
    },
}

#[derive(Debug)]
pub enum Effect {
    StartSave {
        ckpt: Arc<Checkpoint>,
        plan: SavePlan,
        options: SaveOptions,
    },
    CancelSave,
    /// Verify the finished save in `out` against the plan it was written from.
    StartVerify {
        ckpt: Arc<Checkpoint>,
        plan: SavePlan,
        out: PathBuf,
    },
    CancelVerify,
    WriteFile {
        path: PathBuf,
        contents: String,
    },
    /// Run this on another thread and hand its result back to the App.
    Compute(Work),
    Quit,
}
