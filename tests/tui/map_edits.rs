//! Editing the device map: `d`, undo and redo, plans, exports, re-totals off the UI
//! thread and the keys that wait for them, warnings, quitting with an unexported map.

use super::*;

#[test]
fn cycle_device_updates_totals_and_export_writes_the_map() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let disk_before = app
        .ckpt
        .device_totals()
        .into_iter()
        .find(|(p, _)| *p == Placement::Disk)
        .map_or(0, |x| x.1);
    // model.layers.4 is on cpu; d moves it to disk.
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("layers.4"));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert_eq!(selected_name(&app), "model.layers.4");
    press(&mut app, &[ch('D')]);
    let node = &app.tree.nodes[app.selected().expect("sel")];
    assert_eq!(node.single_placement(), Some(Placement::Disk));
    let disk_after = app
        .ckpt
        .device_totals()
        .into_iter()
        .find(|(p, _)| *p == Placement::Disk)
        .map_or(0, |x| x.1);
    assert_eq!(disk_after, disk_before + node.bytes());
    assert!(app.map_edited());
    assert!(
        app.warnings
            .iter()
            .map(ToString::to_string)
            .any(|w| w.contains("placed on disk") && w.contains("model.layers.4.")),
        "{:?}",
        app.warnings
    );
    // d again: disk → the first GPU.
    press(&mut app, &[ch('D')]);
    assert_eq!(
        app.tree.nodes[app.selected().expect("sel")].single_placement(),
        Some(Placement::Gpu(0))
    );

    // Export: the input map is refused, a new path is written.
    press(&mut app, &[ch('w')]);
    assert!(matches!(app.mode, Mode::Export(_)));
    press(&mut app, &[ctrl('u')]);
    let input_map = m.dir.join("device_map.json");
    let input_before = std::fs::read(&input_map).expect("read the input map");
    press(&mut app, &text(input_map.to_str().expect("p")));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert_eq!(
        std::fs::read(&input_map).expect("read the input map"),
        input_before,
        "the input map is never written"
    );
    let Mode::Export(d) = &app.mode else {
        panic!("still exporting")
    };
    assert!(
        d.error
            .as_deref()
            .unwrap_or("")
            .contains("input device map")
    );
    let target = m.tmp.path().join("edited.json");
    press(&mut app, &[ctrl('u')]);
    press(&mut app, &text(target.to_str().expect("p")));
    let written = press(&mut app, &[key(KeyCode::Enter)]);
    assert!(target.is_file(), "{written}");
    assert_eq!(app.mode, Mode::Browse);
    // Still unlike the map opened, but in a file now: nothing to lose on quitting.
    assert!(app.map_edited() && !app.map_unexported());
    assert!(written.contains("[map edited, exported]"), "{written}");
    // What was written is a device map devmap (and accelerate) reads back.
    let reread = devmap::formats::device_map::read_device_map(&target).expect("valid map");
    assert_eq!(reread.get("model.layers.4"), Some(Placement::Gpu(0)));
    // A second export to the same path asks first.
    press(&mut app, &[ch('w'), ctrl('u')]);
    press(&mut app, &text(target.to_str().expect("p")));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(matches!(
        app.mode,
        Mode::Confirm(Confirm::OverwriteExport(_))
    ));
    std::fs::write(&target, "{}").expect("spoil the export");
    press(&mut app, &[ch('y')]);
    let reread = devmap::formats::device_map::read_device_map(&target).expect("valid map");
    assert_eq!(
        reread.get("model.layers.4"),
        Some(Placement::Gpu(0)),
        "y wrote it again"
    );
}

#[test]
fn plan_key_replans_shows_the_diff_and_exports() {
    let m = mixed_model();
    let mut app = app_for(&m);
    sampled(&mut app, Event::Gpus(fixed_gpus(), None));
    press(&mut app, &[ch('p')]);
    let Mode::Plan(d) = &app.mode else {
        panic!("plan dialog")
    };
    assert_eq!(
        d.budgets, "0=20GiB,1=6144MiB,cpu=11GiB",
        "prefilled with what the devices have free"
    );
    // A budget string that does not parse is refused in place.
    press(&mut app, &[ctrl('u')]);
    press(&mut app, &text("0=lots"));
    press(&mut app, &[key(KeyCode::Enter)]);
    let Mode::Plan(d) = &app.mode else {
        panic!("still planning")
    };
    assert!(
        d.error.as_deref().unwrap_or("").contains("not a size"),
        "{:?}",
        d.error
    );
    // Tight budgets: the plan would move tensors, and says how many — a preview,
    // the map untouched until it is accepted.
    let loaded_map = app.ckpt.device_map.clone();
    press(&mut app, &[ctrl('u')]);
    press(&mut app, &text("0=3KB,cpu=3KB"));
    press(&mut app, &[key(KeyCode::Enter)]);
    let Mode::PlanPreview(preview) = &app.mode else {
        panic!("preview: {:?}", app.mode)
    };
    let lines = preview.lines.clone();
    assert!(lines[0].contains("tensors would move"), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("→ disk")), "{lines:?}");
    assert!(!app.map_edited(), "a preview changes nothing");
    assert_eq!(app.ckpt.device_map, loaded_map);
    assert!(frame(&app, 80, 24).contains("not applied"));
    // A long preview scrolls: its last line comes into view at 80x24.
    let last = lines.last().cloned().unwrap_or_default();
    let tail: String = last.chars().take(30).collect();
    if !frame(&app, 80, 24).contains(&tail) {
        for _ in 0..40 {
            press(&mut app, &[key(KeyCode::Down)]);
        }
        assert!(frame(&app, 80, 24).contains(&tail), "scrolled to `{tail}`");
    }
    let planned = devmap::plan::plan(
        &load(&m.dir, &LoadOptions::default()).expect("load"),
        &devmap::plan::PlanOptions {
            max_memory: devmap::plan::parse_max_memory("0=3KB,cpu=3KB").expect("spec"),
            no_split: vec![],
            dtype: None,
            mode: devmap::plan::PlanMode::default(),
        },
    )
    .expect("plan");
    // Esc discards it: the map is as it was.
    press(&mut app, &[key(KeyCode::Esc)]);
    assert_eq!(app.mode, Mode::Browse);
    assert_eq!(app.ckpt.device_map, loaded_map);
    assert!(!app.map_edited());
    assert!(frame(&app, 80, 24).contains("plan discarded"));
    // Planned again and accepted with Enter: the map is the plan's, one undo away.
    press(&mut app, &[ch('p'), ctrl('u')]);
    press(&mut app, &text("0=3KB,cpu=3KB"));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(matches!(app.mode, Mode::PlanPreview(_)), "{:?}", app.mode);
    press(&mut app, &[key(KeyCode::Enter)]);
    assert_eq!(app.mode, Mode::Browse);
    assert!(app.map_edited());
    assert_eq!(
        app.ckpt.device_map.as_ref(),
        Some(&planned.map),
        "the TUI applies the same plan as devmap plan"
    );
    assert!(frame(&app, 80, 24).contains("applied the plan"));
    press(&mut app, &[ch('u')]);
    assert_eq!(app.ckpt.device_map, loaded_map, "one undo step");
    assert!(!app.map_edited());
    press(&mut app, &[ctrl('r')]);
    assert_eq!(app.ckpt.device_map.as_ref(), Some(&planned.map));
    // w exports the planned map.
    let target = m.tmp.path().join("planned.json");
    press(&mut app, &[ch('w'), ctrl('u')]);
    press(&mut app, &text(target.to_str().expect("p")));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert_eq!(
        std::fs::read_to_string(&target).expect("the export was written"),
        devmap::formats::device_map::encode_device_map(&planned.map)
    );
}

#[test]
fn export_defaults_to_a_path_beside_the_model_not_inside_it() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('w')]);
    let Mode::Export(d) = &app.mode else {
        panic!("export dialog")
    };
    let path = std::path::PathBuf::from(&d.path);
    assert!(
        !path.starts_with(&m.dir),
        "{} is inside the model directory",
        path.display()
    );
    assert_eq!(path.parent(), m.dir.parent());
}

#[test]
fn d_cycles_through_every_known_gpu_and_edits_can_be_undone() {
    let m = mixed_model();
    let mut app = app_for(&m);
    // Four GPUs detected; the map uses only GPU 0.
    let gpus: Vec<devmap::monitor::gpu::GpuInfo> = (0..4)
        .map(|index| devmap::monitor::gpu::GpuInfo {
            index,
            name: "Test GPU".into(),
            total: 24 * GIB,
            free: 20 * GIB,
        })
        .collect();
    sampled(&mut app, Event::Gpus(gpus, None));
    select(&mut app, "model.layers.0");
    let device = |app: &App| {
        app.ckpt
            .tensor("model.layers.0.proj.weight")
            .expect("t")
            .placement
    };
    assert_eq!(device(&app), Placement::Gpu(0));
    let mut seen = Vec::new();
    for _ in 0..6 {
        press(&mut app, &[ch('D')]);
        seen.push(device(&app));
    }
    assert_eq!(
        seen,
        [
            Placement::Gpu(1),
            Placement::Gpu(2),
            Placement::Gpu(3),
            Placement::Cpu,
            Placement::Disk,
            Placement::Gpu(0),
        ],
        "every GPU stays in the cycle"
    );
    // Undo walks back one edit at a time; Ctrl-R walks forward again.
    press(&mut app, &[ch('u')]);
    assert_eq!(device(&app), Placement::Disk);
    press(&mut app, &[ch('u'), ch('u')]);
    assert_eq!(device(&app), Placement::Gpu(3));
    press(&mut app, &[ctrl('r')]);
    assert_eq!(device(&app), Placement::Cpu);
    for _ in 0..10 {
        press(&mut app, &[ch('u')]);
    }
    assert_eq!(device(&app), Placement::Gpu(0), "back to the map as opened");
    assert_eq!(app.tree.nodes[app.tree.node_of(0)].depth, 2);
}

/// Re-totalling after `d` and `u` runs off the UI thread: the key returns at once with
/// the work handed off, navigation goes on meanwhile, and map keys pressed meanwhile
/// wait and are replayed on the map the first edit left, each on its own row.
#[test]
fn map_edits_retotal_off_the_ui_thread_and_later_keys_wait_for_them() {
    let m = mixed_model();
    let mut app = app_for(&m);
    select(&mut app, "model.layers.0");
    let placement = |app: &App, name: &str| app.ckpt.tensor(name).expect("t").placement;
    let layer0 = "model.layers.0.proj.weight";
    let layer1 = "model.layers.1.proj.weight";
    let (before0, before1) = (placement(&app, layer0), placement(&app, layer1));
    let mut journey = Journey::start(&mut app);
    // The re-total's result is held back: the App is between the key and the result.
    let busy = journey.steps(&mut app, [Step::Hold, press_step(ch('D'))]);
    assert!(app.busy.is_some());
    assert_eq!(
        placement(&app, layer0),
        before0,
        "old totals until the work lands"
    );
    assert!(busy.contains("re-totalling…"), "{busy}");
    // Navigation does not wait; `d` on the next row and `u` do.
    let at = app.rows.selected;
    journey.press(&mut app, &[key(KeyCode::Down)]);
    assert_ne!(app.rows.selected, at, "the selection moved while busy");
    select_in(&mut journey, &mut app, "model.layers.1");
    journey.press(&mut app, &[ch('D')]);
    select_in(&mut journey, &mut app, "model.layers.0");
    assert_eq!(app.queued.len(), 1);
    assert_eq!(placement(&app, layer1), before1, "the second d waits");
    let landed = journey.steps(&mut app, [Step::Release]);
    assert!(app.busy.is_none() && app.queued.is_empty());
    assert!(!landed.contains("re-totalling"), "{landed}");
    let cycle = app.device_cycle();
    let next = |p: Placement| {
        cycle[(cycle.iter().position(|&c| c == p).expect("in cycle") + 1) % cycle.len()]
    };
    assert_eq!(placement(&app, layer0), next(before0));
    assert_eq!(
        placement(&app, layer1),
        next(before1),
        "the waiting `d` moved the row it was pressed on, not the one selected now"
    );
    // The tree's totals are those of the new map.
    let node = app.tree.node_of(app.ckpt.index_of(layer0).expect("id"));
    assert_eq!(app.tree.nodes[node].single_placement(), Some(next(before0)));
    // Two undos pressed together: the second waits for the first.
    journey.steps(
        &mut app,
        [Step::Hold, press_now(ch('u')), press_now(ch('u'))],
    );
    assert!(app.busy.is_some());
    assert_eq!(app.queued.len(), 1, "one edit at a time");
    journey.steps(&mut app, [Step::Release]);
    assert_eq!(
        (placement(&app, layer0), placement(&app, layer1)),
        (before0, before1)
    );
    journey.end(&app);
}

/// Work that panicked on its thread comes back as `WorkFailed` (what the runtime's
/// worker sends when it catches the panic; the panic itself is the tmux test's): the
/// App stops waiting, says why, and the keys that waited go on — `q` is never stuck
/// behind it.
#[test]
fn failed_work_is_reported_and_the_waiting_keys_go_on() {
    let m = mixed_model();
    let mut app = app_for(&m);
    select(&mut app, "model.layers.0");
    let map_before = app.ckpt.device_map.clone();
    let mut journey = Journey::start(&mut app);
    journey.steps(
        &mut app,
        [Step::Hold, press_now(ch('D')), press_now(ch('q'))],
    );
    assert!(!journey.quit(), "q waits");
    let failed = Event::Worked(Action::WorkFailed("re-totalling failed: boom".into()));
    journey.steps(&mut app, [Step::Now(failed)]);
    assert!(app.busy.is_none());
    assert_eq!(app.ckpt.device_map, map_before, "nothing changed");
    assert!(
        app.undo.is_empty(),
        "no undo entry for an edit that never landed"
    );
    assert!(
        journey.quit(),
        "the waiting q quits (the edit never landed)"
    );
    assert!(frame(&app, 120, 40).contains("re-totalling failed: boom"));
    journey.end(&app);
}

/// `p` plans off the UI thread; Esc while it runs drops the plan.
#[test]
fn planning_runs_off_the_ui_thread_and_esc_drops_it() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let map_before = app.ckpt.device_map.clone();
    press(&mut app, &[ch('p'), ctrl('u')]);
    press(&mut app, &text("0=3KB,cpu=3KB"));
    let mut journey = Journey::start(&mut app);
    let planning = journey.steps(&mut app, [Step::Hold, press_now(key(KeyCode::Enter))]);
    assert!(matches!(app.mode, Mode::Plan(_)), "the dialog waits");
    assert!(planning.contains("planning…"), "{planning}");
    journey.steps(&mut app, [press_now(key(KeyCode::Esc)), Step::Release]);
    assert_eq!(app.mode, Mode::Browse);
    assert_eq!(
        app.ckpt.device_map, map_before,
        "a dropped plan changes nothing"
    );
    assert!(app.busy.is_none() && app.undo.is_empty());
    journey.end(&app);
}

#[test]
fn quitting_with_an_unexported_map_asks() {
    let m = mixed_model();
    let mut app = app_for(&m);
    select(&mut app, "model.layers.0");
    let mut journey = Journey::start(&mut app);
    journey.press(&mut app, &[ch('D')]);
    let asked = journey.press(&mut app, &[ch('q')]);
    assert!(!journey.quit());
    assert_eq!(app.mode, Mode::Confirm(Confirm::QuitUnexported));
    assert!(asked.contains("not exported"), "{asked}");
    journey.press(&mut app, &[ch('n')]);
    assert!(!journey.quit());
    assert_eq!(app.mode, Mode::Browse);
    journey.press(&mut app, &[ch('q'), ch('y')]);
    assert!(journey.quit());
    journey.end(&app);
}

#[test]
fn bang_lists_every_warning_in_full() {
    let m = mixed_model();
    let mut app = app_for(&m);
    select(&mut app, "model.layers.4");
    // cpu -> disk: layer 4 has no offload entry, which is worth a warning.
    press(&mut app, &[ch('D')]);
    assert!(!app.warnings.is_empty());
    press(&mut app, &[ch('!')]);
    assert_eq!(app.mode, Mode::Warnings);
    let screen = frame(&app, 160, 50);
    assert!(
        screen.contains(&format!("Warnings ({})", app.warnings.len())),
        "{screen}"
    );
    assert!(screen.contains("placed on disk"), "{screen}");
    press(&mut app, &[key(KeyCode::Esc)]);
    assert_eq!(app.mode, Mode::Browse);
}

/// Undoing back to the map as opened is no edit (issue 40): the header drops
/// "[map edited]" and `q` quits without asking, also after an export in between.
#[test]
fn undoing_back_to_the_opened_map_is_no_edit() {
    let m = mixed_model();
    let mut app = app_for(&m);
    select(&mut app, "model.layers.0");
    let mut journey = Journey::start(&mut app);
    let edited = journey.press(&mut app, &[ch('D')]);
    assert!(edited.contains("[map edited]"), "{edited}");
    // Export it, then undo back to the map as opened.
    let target = m.tmp.path().join("edited.json");
    journey.press(&mut app, &[ch('w'), ctrl('u')]);
    journey.steps(
        &mut app,
        text(target.to_str().expect("p"))
            .into_iter()
            .map(press_step),
    );
    journey.press(&mut app, &[key(KeyCode::Enter)]);
    assert!(target.is_file());
    let undone = journey.press(&mut app, &[ch('u')]);
    assert!(!app.map_edited() && !app.map_unexported());
    assert!(!undone.contains("map edited"), "{undone}");
    journey.press(&mut app, &[ch('q')]);
    assert!(journey.quit(), "q quits without asking: {:?}", app.mode);
    journey.end(&app);
}

/// `u` says which module went back to which device, and selects it (issue 40).
#[test]
fn undo_names_the_module_and_its_device_and_selects_it() {
    let m = mixed_model();
    let mut app = app_for(&m);
    select(&mut app, "model.layers.4");
    let before = app.tree.nodes[app.selected().expect("sel")].single_placement();
    press(&mut app, &[ch('D')]);
    select(&mut app, "lm_head");
    let said = press(&mut app, &[ch('u')]);
    let device = before.expect("one device").to_string();
    assert!(
        said.contains(&format!("undid: `model.layers.4` is on {device} again")),
        "{said}"
    );
    assert_eq!(selected_name(&app), "model.layers.4");
}

/// The export dialog opens at the path of the last export (issue 40).
#[test]
fn the_export_dialog_remembers_its_last_path() {
    let m = mixed_model();
    let mut app = app_for(&m);
    select(&mut app, "model.layers.0");
    press(&mut app, &[ch('D'), ch('w'), ctrl('u')]);
    let target = m.tmp.path().join("mine.json");
    press(&mut app, &text(target.to_str().expect("p")));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(target.is_file());
    press(&mut app, &[ch('w')]);
    let Mode::Export(d) = &app.mode else {
        panic!("exporting")
    };
    assert_eq!(d.path, target.to_str().expect("p"));
}

/// Budgets the user chose stand before what the devices have free: `--max-memory`
/// (here set as the runtime sets it) measures every device and shows OVER; the
/// budgets of an applied plan become the panel's; the percentages are each device's
/// share of the model whatever the budget (they add up to 100%).
#[test]
fn chosen_budgets_measure_the_devices_and_an_applied_plan_carries_its_own() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    // cpu holds 2.39 KiB of this model; a 2 KB budget is too small for it.
    app.budgets.chosen = devmap::plan::parse_max_memory("0=20GiB,cpu=2KB").expect("spec");
    app.budgets.chosen_from = Some("--max-memory");
    assert_eq!(app.device_budget(Placement::Cpu), Some(2000));
    let screen = frame(&app, 100, 30);
    assert!(
        screen.contains("Devices · ≤ --max-memory budgets"),
        "{screen}"
    );
    let row = |screen: &str, device: &str| {
        screen
            .lines()
            .find(|l| l.contains(&format!("│{device} ")))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let cpu = row(&screen, "cpu");
    assert!(cpu.contains("OVER 1.95 KiB"), "{cpu}");
    assert!(row(&screen, "gpu:0").contains("≤ 20 GiB"), "{screen}");
    // Shares of the model, whatever the budgets: 48 + 26 + 27 (rounded).
    for (device, share) in [("gpu:0", "48%"), ("cpu", "26%"), ("disk", "27%")] {
        assert!(row(&screen, device).contains(share), "{device}: {screen}");
    }
    // `p` starts from the chosen budgets.
    press(&mut app, &[ch('p')]);
    let Mode::Plan(dialog) = &app.mode else {
        panic!("plan dialog: {:?}", app.mode)
    };
    assert!(dialog.budgets.contains("0=20GiB"), "{}", dialog.budgets);
    // A plan for other budgets, applied: they are the panel's now, and nothing is over.
    press(&mut app, &[ctrl('u')]);
    press(&mut app, &text("0=1MB,cpu=1MB"));
    press(&mut app, &[key(KeyCode::Enter), key(KeyCode::Enter)]);
    assert_eq!(app.mode, Mode::Browse);
    assert_eq!(app.budgets.chosen_from, Some("plan"));
    assert_eq!(app.device_budget(Placement::Cpu), Some(1_000_000));
    let screen = frame(&app, 100, 30);
    assert!(screen.contains("Devices · ≤ plan budgets"), "{screen}");
    assert!(!screen.contains("OVER"), "{screen}");
}

/// `d` opens a picker of every device with what it holds now and would hold with the
/// module, against its budget (OVER where it would not fit); the next device in the
/// cycle is selected, so `d` Enter does what `D` does; ↑↓ choose; Esc changes nothing.
#[test]
fn the_device_picker_shows_budgets_and_moves_the_module_where_chosen() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    // cpu can take 3 KB: model.layers.4 (612 B) fits there, the embedding (2 KiB) not.
    app.budgets.chosen = devmap::plan::parse_max_memory("0=20GiB,cpu=3KB").expect("spec");
    app.budgets.chosen_from = Some("--max-memory");
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("layers.4"));
    press(&mut app, &[key(KeyCode::Enter)]);
    let node = app.selected().expect("layers.4");
    assert_eq!(
        app.tree.nodes[node].single_placement(),
        Some(Placement::Cpu)
    );
    press(&mut app, &[ch('d')]);
    let Mode::DevicePicker(picker) = &app.mode else {
        panic!("picker: {:?}", app.mode)
    };
    let devices: Vec<Placement> = picker.choices.iter().map(|c| c.device).collect();
    assert_eq!(
        devices,
        app.device_cycle(),
        "every device, in the cycle's order"
    );
    assert_eq!(
        picker.choices[picker.selected].device,
        Placement::Disk,
        "the next device after cpu"
    );
    let screen = frame(&app, 120, 40);
    assert!(
        screen.contains("Move model.layers.4 (612 B) to"),
        "{screen}"
    );
    let row = |device: &str| {
        screen
            .lines()
            .find(|l| l.contains(&format!(" {device} ")) && l.contains('→'))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    assert!(row("cpu").contains("(here)"), "{screen}");
    assert!(row("gpu:0").contains("≤ 20 GiB"), "{screen}");
    // Esc: nothing moved.
    press(&mut app, &[key(KeyCode::Esc)]);
    assert_eq!(app.mode, Mode::Browse);
    assert!(!app.map_edited());
    // ↑ from disk to cpu's neighbour above it (gpu:0), Enter: moved there.
    press(&mut app, &[ch('d'), key(KeyCode::Up), key(KeyCode::Up)]);
    let Mode::DevicePicker(picker) = &app.mode else {
        panic!("picker")
    };
    assert_eq!(picker.choices[picker.selected].device, Placement::Gpu(0));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert_eq!(app.mode, Mode::Browse);
    assert_eq!(
        app.tree.nodes[node].single_placement(),
        Some(Placement::Gpu(0))
    );
    assert!(app.map_edited());
    // The embedding to cpu would not fit its 3 KB with what cpu holds: OVER.
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("embed_tokens"));
    press(&mut app, &[key(KeyCode::Enter), ch('d')]);
    let screen = frame(&app, 120, 40);
    let cpu = screen
        .lines()
        .find(|l| l.contains(" cpu ") && l.contains('→'))
        .unwrap_or_default();
    assert!(cpu.contains("OVER 2.93 KiB"), "{screen}");
}

/// A row moved since the model opened is marked `*` (the modules above it too), until
/// an undo puts it back; the header names what the weights were read from.
#[test]
fn edited_rows_are_marked_and_the_header_names_the_source() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    let screen = frame(&app, 120, 40);
    assert!(screen.contains("· safetensors + offload ·"), "{screen}");
    assert!(!screen.contains('*'), "{screen}");
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("layers.4"));
    press(&mut app, &[key(KeyCode::Enter), ch('D')]);
    let screen = frame(&app, 120, 40);
    let row = |screen: &str, name: &str| {
        screen
            .lines()
            .find(|l| l.contains(&format!(" {name} ")))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    assert!(row(&screen, "4").contains("disk*"), "{screen}");
    assert!(row(&screen, "layers").contains("mixed*"), "{screen}");
    assert!(!row(&screen, "3").contains('*'), "{screen}");
    press(&mut app, &[ch('u')]);
    let screen = frame(&app, 120, 40);
    assert!(
        !screen.contains("disk*") && !screen.contains("mixed*"),
        "{screen}"
    );
}

/// `--context`: the Devices panel adds to each device's weights the KV cache of the
/// layers it holds (`plan::kv`; an offloaded layer's on the execution device) and one
/// forward's activations where layers compute, against its budget, and the cache
/// follows a layer the user moves.
#[test]
fn the_devices_panel_adds_the_kv_cache_of_the_layers_each_device_holds() {
    use devmap::plan::kv::{KvOnDevices, KvRequest, compute_dtype};
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo");
    let ckpt = load(&demo, &LoadOptions::default()).expect("the demo");
    let request = KvRequest {
        context: 4096,
        batch: 1,
        dtype: compute_dtype(&ckpt, None),
    };
    let kv = KvOnDevices::new(&ckpt, request).expect("the demo's cache");
    // The demo's layers are alike: every one keeps the same bytes.
    let per_layer = kv.cache.layers[0].bytes;
    assert!(kv.cache.layers.iter().all(|l| l.bytes == per_layer));
    let mut app = App::new(ckpt);
    app.color = false;
    app.kv = Some(kv);
    app.budgets.chosen = devmap::plan::parse_max_memory("0=40MiB,1=18MiB,cpu=1GiB").expect("spec");
    app.budgets.chosen_from = Some("--max-memory");
    let weights = |app: &App, p: Placement| {
        app.device_totals()
            .into_iter()
            .find(|(d, _)| *d == p)
            .map_or(0, |x| x.1)
    };
    let row = |screen: &str, device: &str| {
        screen
            .lines()
            .find(|l| l.contains(&format!("│{device} ")))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let screen = frame(&app, 110, 30);
    assert!(
        screen.contains("Devices + KV + act. at 4096 tokens · ≤ --max-memory"),
        "{screen}"
    );
    // One forward's activations where layers compute (and the logits with the head).
    let act = |app: &App, p: Placement| {
        app.kv
            .as_ref()
            .map_or(0, |kv| kv.activations_on(&app.ckpt, p))
    };
    let per_forward = app
        .kv
        .as_ref()
        .and_then(|kv| kv.act.clone())
        .expect("estimated");
    assert_eq!(act(&app, Placement::Gpu(1)), per_forward.per_layer);
    assert_eq!(
        act(&app, Placement::Cpu),
        0,
        "offloaded layers compute on gpu:0"
    );
    // gpu:0 holds layers 0 and 1, and the cache of layers 4 and 5, which are offloaded
    // to cpu and disk and compute on the execution device (gpu:0); gpu:1 layers 2 and 3.
    let gpu0 = weights(&app, Placement::Gpu(0)) + 4 * per_layer + act(&app, Placement::Gpu(0));
    assert!(
        row(&screen, "gpu:0").contains(&devmap::human_bytes(gpu0)),
        "{gpu0}: {screen}"
    );
    assert!(row(&screen, "gpu:1").contains("≤ 18 MiB"), "{screen}");
    // Layer 1 moved to gpu:1: its cache goes with it, and gpu:1 is over its 18 MiB.
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("layers.1"));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert_eq!(selected_name(&app), "model.layers.1");
    press(&mut app, &[ch('D')]);
    let screen = frame(&app, 110, 30);
    let gpu1 = weights(&app, Placement::Gpu(1)) + 3 * per_layer + act(&app, Placement::Gpu(1));
    let line = row(&screen, "gpu:1");
    assert!(
        line.contains(&devmap::human_bytes(gpu1)),
        "{gpu1}: {screen}"
    );
    assert!(
        gpu1 > 18 << 20 && line.contains("OVER 18 MiB"),
        "{gpu1}: {screen}"
    );
}

/// `--tp 2 --context N`: the Devices panel's last line names the largest GPU of a
/// vLLM server with two tensor ranks, its weights and KV share against that GPU's
/// budget (as `devmap plan --tp 2` counts them).
#[test]
fn the_devices_panel_names_the_largest_rank_of_a_parallel_layout() {
    use devmap::plan::kv::{KvRequest, compute_dtype, kv_cache};
    use devmap::plan::parallel::{Layout, shard};
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo");
    let ckpt = load(&demo, &LoadOptions::default()).expect("the demo");
    let request = KvRequest {
        context: 4096,
        batch: 1,
        dtype: compute_dtype(&ckpt, None),
    };
    let cache = kv_cache(&ckpt.config.raw, request).expect("cache");
    let layout = Layout {
        tp: 2,
        ep: 1,
        pp: 1,
    };
    let sharded = shard(&ckpt, layout, None, Some(&cache)).expect("shardable");
    let largest = sharded.largest().expect("a rank").clone();
    let mut app = App::new(ckpt);
    app.color = false;
    app.parallel = Some(sharded);
    app.budgets.chosen = devmap::plan::parse_max_memory("0=10MiB,1=6MiB,cpu=1GiB").expect("spec");
    app.budgets.chosen_from = Some("--max-memory");
    let screen = frame(&app, 110, 30);
    let line = screen
        .lines()
        .find(|l| l.contains("vLLM tp 2: largest GPU rank"))
        .unwrap_or_else(|| panic!("no rank line: {screen}"));
    let total = largest.weights + largest.kv;
    assert!(line.contains(&devmap::human_bytes(total)), "{line}");
    // Rank 1's budget is gpu:1's, 6 MiB: the demo's 1.26 MiB + 6 MiB of KV is over it.
    assert_eq!(largest.rank, 1);
    assert!(total > 6 << 20 && line.contains("OVER 6 MiB"), "{line}");
}
