//! Ties, device edits (`d`) and re-planning (`p`).

use super::{
    Action, App, DeviceMap, Effect, Mode, Placement, PlanDialog, Tone, covers, edit_text, is_edit,
};
use devmap_core::model::checkpoint::Checkpoint;

impl App {
    pub(super) fn jump_tie(&mut self) {
        let Some(node) = self.selected() else { return };
        let Some(tensor) = self.tree.nodes[node].tensor() else {
            self.say("t jumps between tied tensors: select a tensor", Tone::Info);
            return;
        };
        let Some(group) = self.ckpt.tie_group(tensor) else {
            self.say(
                format!("`{}` is not tied", self.ckpt.tensors()[tensor].name),
                Tone::Info,
            );
            return;
        };
        let pos = group.members.iter().position(|&m| m == tensor).unwrap_or(0);
        let partner = group.members[(pos + 1) % group.members.len()];
        let target = self.tree.node_of(partner);
        self.rows.reveal(&self.tree, target);
        // Replaces whatever was said before the jump ("select a tensor").
        self.say(
            format!(
                "`{}` is tied to `{}` (t jumps on)",
                self.ckpt.tensors()[partner].name,
                self.ckpt.tensors()[tensor].name
            ),
            Tone::Info,
        );
    }

    /// The devices `d` cycles through: every GPU known (the map as opened, the
    /// current map, detected GPUs, budgets; GPU 0 when none is), then cpu and disk.
    pub fn device_cycle(&self) -> Vec<Placement> {
        let mut gpus = self.known_gpus.clone();
        if let Some(map) = &self.ckpt.device_map {
            gpus.extend(map.devices().into_iter().filter_map(|p| match p {
                Placement::Gpu(i) => Some(i),
                _ => None,
            }));
        }
        gpus.extend(self.budgets.gpu_total.iter().map(|&(i, _)| i));
        if gpus.is_empty() {
            gpus.insert(0);
        }
        let mut cycle: Vec<Placement> = gpus.into_iter().map(Placement::Gpu).collect();
        cycle.extend([Placement::Cpu, Placement::Disk]);
        cycle
    }

    /// Puts `map` in place of the current one, remembering the current one for `u`.
    /// The totals follow off the UI thread (see `work`).
    pub(super) fn edit_map(&mut self, map: Option<DeviceMap>) -> Vec<Effect> {
        let stacks = self.undo_stacks();
        let before = self.ckpt.device_map.clone();
        self.undo.push(before);
        self.redo.clear();
        self.start_map_work(map, stacks)
    }

    /// The undo and redo stacks as they are, to put back if the edit fails.
    fn undo_stacks(&self) -> super::work::UndoStacks {
        (self.undo.clone(), self.redo.clone())
    }

    pub(super) fn undo_map(&mut self) -> Vec<Effect> {
        let stacks = self.undo_stacks();
        let Some(earlier) = self.undo.pop() else {
            self.say("nothing to undo", Tone::Info);
            return Vec::new();
        };
        self.redo.push(self.ckpt.device_map.clone());
        let undone = changed_key(self.ckpt.device_map.as_ref(), earlier.as_ref());
        match &undone {
            Some((key, placement)) => {
                self.say(
                    format!("undid: `{key}` is on {placement} again (Ctrl-R redoes it)"),
                    Tone::Info,
                );
                self.reveal_module(key);
            }
            None => self.say(
                "undid the last device-map edit (Ctrl-R redoes it)",
                Tone::Info,
            ),
        }
        self.start_map_work(earlier, stacks)
    }

    /// Selects the module (or tensor) named `key`, opening the tree down to it.
    fn reveal_module(&mut self, key: &str) {
        let dotted = format!("{key}.");
        let Some(tensor) = self
            .ckpt
            .tensors()
            .iter()
            .position(|t| *t.name == *key || t.name.starts_with(&dotted))
        else {
            return;
        };
        let mut node = self.tree.node_of(tensor);
        let depth = key.split('.').count();
        while usize::from(self.tree.nodes[node].depth) > depth {
            match self.tree.nodes[node].parent() {
                Some(parent) => node = parent,
                None => break,
            }
        }
        self.rows.reveal(&self.tree, node);
    }

    pub(super) fn redo_map(&mut self) -> Vec<Effect> {
        let stacks = self.undo_stacks();
        let Some(later) = self.redo.pop() else {
            self.say("nothing to redo", Tone::Info);
            return Vec::new();
        };
        self.undo.push(self.ckpt.device_map.clone());
        self.say("redid the device-map edit", Tone::Info);
        self.start_map_work(later, stacks)
    }

    pub(super) fn cycle_device(&mut self) -> Vec<Effect> {
        match self.selected() {
            Some(node) => self.cycle_device_of(node),
            None => Vec::new(),
        }
    }

    /// Moves `node`'s module to the next device in [`App::device_cycle`].
    pub(super) fn cycle_device_of(&mut self, node: super::NodeId) -> Vec<Effect> {
        let next = self.next_device(node);
        self.move_module(node, next)
    }

    /// The device after the one `node` is on, in [`App::device_cycle`] (for a module
    /// on several, the one holding most of it).
    fn next_device(&self, node: super::NodeId) -> Placement {
        let n = &self.tree.nodes[node];
        let current = n.split.iter().max_by_key(|(_, b)| *b).map(|(p, _)| *p);
        let cycle = self.device_cycle();
        match current.and_then(|c| cycle.iter().position(|&p| p == c)) {
            Some(i) if n.split.len() == 1 => cycle[(i + 1) % cycle.len()],
            Some(i) => cycle[i],
            None => cycle[0],
        }
    }

    /// `d`: the picker over every device, the next one in the cycle selected (so `d`
    /// then Enter does what `D` does).
    pub(super) fn open_device_picker(&mut self) {
        let Some(node) = self.selected() else { return };
        let n = &self.tree.nodes[node];
        let totals = self.device_totals();
        let next = self.next_device(node);
        let choices: Vec<super::DeviceChoice> = self
            .device_cycle()
            .into_iter()
            .map(|device| {
                let holds = totals
                    .iter()
                    .find(|(p, _)| *p == device)
                    .map_or(0, |(_, b)| *b);
                let here = n
                    .split
                    .iter()
                    .find(|(p, _)| *p == device)
                    .map_or(0, |(_, b)| *b);
                super::DeviceChoice {
                    device,
                    holds,
                    after: holds + n.bytes() - here,
                    budget: self.device_budget(device),
                    current: n.single_placement() == Some(device),
                }
            })
            .collect();
        let selected = choices.iter().position(|c| c.device == next).unwrap_or(0);
        self.mode = Mode::DevicePicker(super::DevicePicker {
            node,
            choices,
            selected,
        });
    }

    pub(super) fn device_picker(&mut self, action: Action) -> Vec<Effect> {
        let Mode::DevicePicker(picker) = &mut self.mode else {
            return Vec::new();
        };
        let n = picker.choices.len();
        match action {
            Action::Up => picker.selected = (picker.selected + n - 1) % n.max(1),
            Action::Down | Action::NextField => picker.selected = (picker.selected + 1) % n.max(1),
            Action::Close | Action::Quit => self.mode = Mode::Browse,
            // The picker opens only once no map edit is in flight (`d` waits for it),
            // and nothing starts one while it is open.
            Action::Submit if self.busy.is_none() => {
                let (node, device) = (picker.node, picker.choices[picker.selected].device);
                self.mode = Mode::Browse;
                return self.move_module(node, device);
            }
            _ => {}
        }
        Vec::new()
    }

    /// Moves `node`'s module to `next`: one device-map edit (an undo step).
    pub(super) fn move_module(&mut self, node: super::NodeId, next: Placement) -> Vec<Effect> {
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
        let effects = self.edit_map(Some(map));
        let shown = if key.is_empty() {
            "the whole model".to_owned()
        } else {
            format!("`{key}`")
        };
        self.say(
            format!("{shown} → {next}; w exports the edited map"),
            Tone::Info,
        );
        effects
    }

    // ----- planning -----

    /// What each device may hold: the budget the user chose (`--max-memory`, the plan
    /// last applied), else what it has now: GPU free memory, available RAM, free disk
    /// (the defaults of the plan dialog and the budgets of the Devices panel).
    pub fn device_budget(&self, p: Placement) -> Option<u64> {
        if let Some(&(_, b)) = self.budgets.chosen.iter().find(|(d, _)| *d == p) {
            return Some(b);
        }
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

    pub(super) fn open_plan(&mut self) {
        let mut parts: Vec<String> = Vec::new();
        let mut gpus: Vec<u32> = self.gpus.iter().map(|g| g.index).collect();
        gpus.extend(self.budgets.gpu_total.iter().map(|(i, _)| *i));
        gpus.extend(self.budgets.chosen.iter().filter_map(|(d, _)| match d {
            Placement::Gpu(i) => Some(*i),
            _ => None,
        }));
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

    pub(super) fn plan_dialog(&mut self, action: Action) -> Vec<Effect> {
        let Mode::Plan(dialog) = &mut self.mode else {
            return Vec::new();
        };
        // One plan at a time; the dialog waits for it (Esc drops it).
        if self.busy.is_some() && action != Action::Close {
            return Vec::new();
        }
        match action {
            ref edit if is_edit(edit) => {
                self.cursor = edit_text(&mut dialog.budgets, self.cursor, edit);
            }
            Action::Close => self.mode = Mode::Browse,
            Action::Submit => {
                let spec = dialog.budgets.clone();
                match devmap_core::plan::parse_max_memory(&spec) {
                    Err(e) => dialog.error = Some(e.to_string()),
                    Ok(max_memory) => {
                        let options = plan_options(max_memory);
                        dialog.error = None;
                        return self.start_plan_work(options, spec);
                    }
                }
            }
            _ => {}
        }
        Vec::new()
    }

    /// What a plan would move, from the map in place now to the model `after` it:
    /// the preview's lines, and how many tensors change device.
    pub(super) fn plan_preview_lines(
        &self,
        after: &Checkpoint,
        planned: &devmap_core::plan::Planned,
        spec: &str,
    ) -> (Vec<String>, usize) {
        let before = &self.ckpt;
        let totals_before = before.device_totals();
        let moved = after
            .tensors()
            .iter()
            .zip(before.tensors())
            .filter(|(t, b)| t.placement != b.placement)
            .count();
        let mut lines = vec![format!(
            "from_pretrained's plan for {spec}: {moved} of {} would move",
            devmap_core::text::count(after.tensors().len(), "tensor", "tensors"),
        )];
        let totals_after = after.device_totals();
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
                "  {:<9} {:>11} → {:>11}",
                d.to_string(),
                devmap_core::human_bytes(get(&totals_before)),
                devmap_core::human_bytes(get(&totals_after))
            ));
        }
        lines.push("new map:".into());
        if let Some(map) = &after.device_map {
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
        lines.push("Enter applies this map (u undoes it); Esc discards it".into());
        (lines, moved)
    }
}

/// A budget as `--max-memory` takes it, rounded down to whole MiB or GiB.
fn short_size(bytes: u64) -> String {
    if bytes >= 10 << 30 {
        format!("{}GiB", bytes >> 30)
    } else {
        format!("{}MiB", (bytes >> 20).max(1))
    }
}

/// The options `p` plans with, for `max_memory`: the planner's defaults (the
/// architecture's no-split modules, the checkpoint's dtype, `from_pretrained`'s
/// `device_map="auto"`).
pub(super) fn plan_options(max_memory: Vec<(Placement, u64)>) -> devmap_core::plan::PlanOptions {
    devmap_core::plan::PlanOptions {
        max_memory,
        no_split: Vec::new(),
        dtype: None,
        mode: devmap_core::plan::PlanMode::default(),
    }
}

/// The first map key whose device differs between `now` and `then` (an edit undone or
/// redone), with its device in `then`.
fn changed_key(now: Option<&DeviceMap>, then: Option<&DeviceMap>) -> Option<(String, Placement)> {
    let then = then?;
    let differs = then
        .entries()
        .iter()
        .find(|(key, placement)| now.and_then(|m| m.get(key)) != Some(*placement))
        .map(|(key, placement)| (key.clone(), *placement));
    // Or a key the edit added: where `then` places that module.
    differs.or_else(|| {
        now?.entries()
            .iter()
            .find(|(key, _)| then.get(key).is_none())
            .and_then(|(key, _)| Some((key.clone(), then.locate(key)?.placement)))
    })
}
