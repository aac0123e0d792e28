//! Work that can take longer than a frame on a big model — re-totalling the tree after
//! a device-map edit (`d`, `u`, `Ctrl-R`), planning (`p`), the save preview — runs off
//! the UI thread. The App hands it to the runtime as [`Effect::Compute`] and keeps
//! drawing and taking keys; the result comes back as an [`Action`].
//!
//! Map edits run one at a time, each on the map the previous one left: keys that read or
//! change the map while one runs wait in a queue and are replayed when it lands.
//! Navigation, search and scrolling never wait.

use std::fmt;
use std::sync::Arc;

use super::{Action, App, Effect, Mode, Tone};
use devmap_core::model::checkpoint::Checkpoint;
use devmap_core::model::tree::ModuleTree;
use devmap_core::model::warning::Warning;
use devmap_core::types::placement::DeviceMap;

/// A computation for another thread, and the Action its result comes back as.
pub struct Work {
    /// What the user is waiting for, in words ("re-totalling").
    pub what: &'static str,
    job: Box<dyn FnOnce() -> Action + Send>,
}

impl Work {
    pub fn new(what: &'static str, job: impl FnOnce() -> Action + Send + 'static) -> Work {
        Work {
            what,
            job: Box::new(job),
        }
    }

    /// Does the work (on whatever thread calls this) and returns its result.
    pub fn run(self) -> Action {
        (self.job)()
    }
}

impl fmt::Debug for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Work({})", self.what)
    }
}

/// A device map applied to a copy of the checkpoint, with the tree and warnings that go
/// with it: what the UI swaps in when the work lands.
#[derive(Debug, Clone)]
pub struct MapApplied {
    pub ckpt: Arc<Checkpoint>,
    pub tree: Arc<ModuleTree>,
    pub warnings: Vec<Warning>,
    /// The plan that made the map (`p`), for its summary.
    pub plan: Option<(devmap_core::plan::Planned, String)>,
}

/// The same result: the same checkpoint copy (the copy is never compared field by field).
impl PartialEq for MapApplied {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.ckpt, &other.ckpt) && Arc::ptr_eq(&self.tree, &other.tree)
    }
}

/// Applies `map` to a copy of `ckpt` and re-totals a copy of `tree` (no plan attached).
pub fn apply_map(ckpt: &Checkpoint, tree: &ModuleTree, map: Option<DeviceMap>) -> MapApplied {
    let mut ckpt = ckpt.clone();
    ckpt.apply_device_map(map);
    let mut tree = tree.clone();
    tree.recompute(&ckpt);
    let warnings = devmap_core::model::checks::all_warnings(&ckpt);
    MapApplied {
        ckpt: Arc::new(ckpt),
        tree: Arc::new(tree),
        warnings,
        plan: None,
    }
}

/// The undo and redo stacks of device maps.
pub type UndoStacks = (Vec<Option<DeviceMap>>, Vec<Option<DeviceMap>>);

/// Work in flight, shown in the status line.
#[derive(Debug, Clone, PartialEq)]
pub struct Busy {
    pub what: &'static str,
    /// The undo and redo stacks before the edit, put back if it fails.
    pub stacks_before: Option<UndoStacks>,
}

impl App {
    /// Whether `action` reads or changes the device map, and so must wait for a map
    /// edit that is still being applied.
    pub(super) fn waits_for_map(action: &Action) -> bool {
        matches!(
            action,
            Action::CycleDevice
                | Action::PickDevice
                | Action::Undo
                | Action::Redo
                | Action::StartExport
                | Action::StartPlan
                | Action::OpenSave
                | Action::Quit
        )
    }

    /// Starts applying `map` off the UI thread: the tree keeps its old totals, marked
    /// as being re-totalled, until the result lands.
    pub(super) fn start_map_work(
        &mut self,
        map: Option<DeviceMap>,
        stacks_before: UndoStacks,
    ) -> Vec<Effect> {
        let ckpt = Arc::clone(&self.ckpt);
        let tree = Arc::clone(&self.tree);
        self.busy = Some(Busy {
            what: "re-totalling",
            stacks_before: Some(stacks_before),
        });
        vec![Effect::Compute(Work::new("re-totalling", move || {
            Action::MapApplied(Arc::new(apply_map(&ckpt, &tree, map)))
        }))]
    }

    /// Plans for `spec` off the UI thread; the plan dialog stays open meanwhile.
    /// Work to start as the inspector opens, off the UI thread, that nothing waits for:
    /// what the first save preview and the first `p` would otherwise do on top of
    /// what later ones do (open every input file once; name each tensor as the loaded
    /// model does, which the save plan asks; build the planner's view of the model and
    /// its walk tree). All are kept (by the probe, in the checkpoint) and
    /// shared by the copies map edits make, so every preview and plan after it is
    /// quick. Nothing it finds is shown: the preview reports the same answers.
    pub fn opening_work(&self) -> Vec<Effect> {
        let ckpt = Arc::clone(&self.ckpt);
        let probe = Arc::clone(&self.probe);
        vec![Effect::Compute(Work::new("warming up", move || {
            probe.learn_inputs(&ckpt);
            // The loaded names are made for every tensor on the first question.
            let _ = ckpt.loaded_name(0);
            devmap_core::plan::warm_up(&ckpt, &super::devices::plan_options(Vec::new()));
            Action::WarmedUp
        }))]
    }

    pub(super) fn start_plan_work(
        &mut self,
        options: devmap_core::plan::PlanOptions,
        spec: String,
    ) -> Vec<Effect> {
        let ckpt = Arc::clone(&self.ckpt);
        let tree = Arc::clone(&self.tree);
        // The plan's undo entry is made when it lands.
        self.busy = Some(Busy {
            what: "planning",
            stacks_before: None,
        });
        vec![Effect::Compute(Work::new(
            "planning",
            move || match devmap_core::plan::plan(&ckpt, &options) {
                Err(e) => Action::PlanFailed(e.to_string()),
                Ok(planned) => {
                    let applied = apply_map(&ckpt, &tree, Some(planned.map.clone()));
                    Action::MapApplied(Arc::new(MapApplied {
                        plan: Some((planned, spec)),
                        ..applied
                    }))
                }
            },
        ))]
    }

    /// A map edit landed: swap it in, then replay the keys that waited for it.
    pub(super) fn on_map_applied(&mut self, applied: Arc<MapApplied>) -> Vec<Effect> {
        self.busy = None;
        let applied = Arc::unwrap_or_clone(applied);
        if let Some((planned, spec)) = &applied.plan {
            // Shown, not applied, until accepted. The plan dialog was closed while
            // planning: the plan is dropped.
            if matches!(self.mode, Mode::Plan(_)) {
                let (lines, moved) = self.plan_preview_lines(&applied.ckpt, planned, spec);
                let budgets = devmap_core::plan::parse_max_memory(spec).unwrap_or_default();
                self.result_scroll = 0;
                self.mode = Mode::PlanPreview(Box::new(super::PlanPreview {
                    lines,
                    applied,
                    moved,
                    budgets,
                }));
            }
        } else {
            self.swap_in(applied.ckpt, applied.tree, applied.warnings);
        }
        self.replay_queued()
    }

    /// Enter on a plan preview: its map goes in place, one undo step.
    pub(super) fn accept_plan(&mut self) -> Vec<Effect> {
        let Mode::PlanPreview(preview) = std::mem::replace(&mut self.mode, Mode::Browse) else {
            return Vec::new();
        };
        let super::PlanPreview {
            applied,
            moved,
            budgets,
            ..
        } = *preview;
        // The budgets planned for are the panel's from now on.
        if !budgets.is_empty() {
            self.budgets.chosen = budgets;
            self.budgets.chosen_from = Some("plan");
        }
        self.undo.push(self.ckpt.device_map.clone());
        self.redo.clear();
        self.swap_in(applied.ckpt, applied.tree, applied.warnings);
        self.say(
            format!(
                "applied the plan: {} moved (u undoes it, w exports it)",
                devmap_core::text::count(moved, "tensor", "tensors")
            ),
            Tone::Good,
        );
        Vec::new()
    }

    pub(super) fn on_plan_failed(&mut self, why: String) -> Vec<Effect> {
        self.busy = None;
        if let Mode::Plan(dialog) = &mut self.mode {
            dialog.error = Some(why);
        } else {
            self.say(format!("plan failed: {why}"), Tone::Bad);
        }
        self.replay_queued()
    }

    /// The work panicked on its thread: nothing changed. Say so, stop waiting, and let
    /// the keys that waited go on (on the map as it was).
    pub(super) fn on_work_failed(&mut self, why: &str) -> Vec<Effect> {
        if let Some((undo, redo)) = self.busy.take().and_then(|b| b.stacks_before) {
            self.undo = undo;
            self.redo = redo;
        }
        match &mut self.mode {
            Mode::SaveDialog(dialog) => dialog.preview_pending = None,
            Mode::Plan(dialog) => dialog.error = Some(why.to_owned()),
            _ => {}
        }
        self.say(why.to_owned(), Tone::Bad);
        self.replay_queued()
    }

    /// The runtime could not start a thread for the work: nothing will land, so stop
    /// waiting for it (the keys that waited are dropped with it).
    pub fn work_not_started(&mut self, why: &str) {
        if let Some((undo, redo)) = self.busy.take().and_then(|b| b.stacks_before) {
            self.undo = undo;
            self.redo = redo;
        }
        self.queued.clear();
        if let Mode::SaveDialog(dialog) = &mut self.mode {
            dialog.preview_pending = None;
        }
        self.say(format!("could not start a worker thread: {why}"), Tone::Bad);
    }

    fn swap_in(&mut self, ckpt: Arc<Checkpoint>, tree: Arc<ModuleTree>, warnings: Vec<Warning>) {
        let old = (
            std::mem::replace(&mut self.ckpt, ckpt),
            std::mem::replace(&mut self.tree, tree),
        );
        // Freeing a big model's copy takes milliseconds: not on the UI thread (where no
        // thread can be had, it is freed here).
        let _ = std::thread::Builder::new()
            .name("devmap-free".into())
            .spawn(move || drop(old));
        self.warnings = warnings;
        self.mark_edited_rows();
        // A filter by device follows the new map.
        if let Some(filter) = self.filter.clone() {
            self.apply_filter(&filter);
        }
    }

    /// Whether something on screen moves by itself (a save's progress, a spinner), so
    /// the runtime redraws now and then without input.
    pub fn animating(&self) -> bool {
        self.save_running()
            || self.verify_running()
            || self.busy.is_some()
            || matches!(&self.mode, Mode::SaveDialog(d) if d.preview_pending.is_some() || d.preview_due.is_some())
    }

    /// Keeps a key that must wait for the map, with the row it was pressed on (`d`
    /// moves that row's module even if the selection has moved on since).
    pub(super) fn queue(&mut self, action: Action) {
        let node = self.selected();
        self.queued.push_back((action, node));
    }

    /// Handles the keys that waited, in order, until one starts another map edit.
    fn replay_queued(&mut self) -> Vec<Effect> {
        let mut effects = Vec::new();
        while self.busy.is_none()
            && let Some((action, node)) = self.queued.pop_front()
        {
            effects.extend(match (action, node) {
                (Action::CycleDevice, Some(node)) => self.cycle_device_of(node),
                (action, _) => self.handle(action),
            });
        }
        effects
    }
}
