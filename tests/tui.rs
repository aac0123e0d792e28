//! Journeys through the inspector: keys go through the real runtime (event loop, ticks,
//! effects, worker and save threads) from a script on a virtual clock, frames are drawn
//! on ratatui's `TestBackend` and snapshotted with insta. Readings the terminal's
//! samplers would send (memory, GPUs) and the size are handed to the App as the
//! runtime hands them; nothing the App asks for is carried out here — the runtime does
//! it. Orders the threads would race for (a key while a re-total runs, a preview that
//! lands late) are pinned with the script's `Hold` and `Release`.

mod common;

use std::time::Duration;

use common::journey::{
    Journey, ch, ctrl, drive, key, press, press_now, press_step, screen, text, type_keys, wait,
};
use common::{mixed_model, read_saved};
use devmap::model::{LoadOptions, Placement, load};
use devmap::monitor::MemorySample;
use devmap::tui::app::{Action, App, Budgets, Confirm, Field, Mode, Outcome, PREVIEW_DELAY};
use devmap::tui::runtime::Event;
use devmap::tui::script::Step;
use devmap::tui::ui;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyModifiers, MouseEvent, MouseEventKind};

const GIB: u64 = 1 << 30;

fn sample(used_gib: f64, available_gib: f64) -> MemorySample {
    MemorySample {
        total: 16 * GIB,
        used: (used_gib * GIB as f64) as u64,
        available: (available_gib * GIB as f64) as u64,
        rss: 12 << 20,
        cached: 2 * GIB,
    }
}

/// An App over the mixed fixture with fixed readings.
fn app_for(model: &common::Model) -> App {
    let ckpt = load(&model.dir, &LoadOptions::default()).expect("load");
    let mut app = App::new(ckpt);
    app.budgets = Budgets {
        disk_free: Some(100 * GIB),
        gpu_total: vec![(0, 24 * GIB)],
    };
    app.size = (120, 40);
    drive(
        &mut app,
        (0..40).map(|i| Step::Event(Event::Memory(sample(4.0 + f64::from(i % 7) * 0.1, 11.0)))),
    );
    app
}

/// Lets the clock run past the save preview's quiet time, as a user who stopped
/// typing does; the runtime's tick starts the preview and its result lands.
fn settle(app: &mut App) {
    wait(app, PREVIEW_DELAY + Duration::from_millis(1));
}

/// The App's screen at another size: a resize as the terminal sends it, through the
/// runtime.
fn resized(app: &mut App, width: u16, height: u16) -> String {
    app.size = (width, height);
    screen(&drive(
        app,
        [press_event(ratatui::crossterm::event::Event::Resize(
            width, height,
        ))],
    ))
}

fn press_event(event: ratatui::crossterm::event::Event) -> Step {
    Step::Event(Event::Terminal(event))
}

/// A reading the terminal's samplers send (memory, GPUs), through the runtime.
fn sampled(app: &mut App, event: Event) {
    drive(app, [Step::Event(event)]);
}

fn mouse(event: MouseEvent) -> Step {
    press_event(ratatui::crossterm::event::Event::Mouse(event))
}

fn selected_name(app: &App) -> String {
    app.tree.full_name(app.selected().expect("a selection"))
}

fn frame(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("terminal");
    terminal.draw(|f| ui::draw(app, f)).expect("draw");
    let buffer = terminal.backend().buffer().clone();
    let mut out = String::new();
    for y in 0..height {
        let line: String = (0..width)
            .map(|x| buffer[(x, y)].symbol().to_owned())
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[test]
fn navigation_keys() {
    let m = mixed_model();
    let mut app = app_for(&m);
    assert_eq!(selected_name(&app), "lm_head");
    press(&mut app, &[ch('j')]);
    assert_eq!(selected_name(&app), "model");
    press(&mut app, &[key(KeyCode::Down), key(KeyCode::Down)]);
    assert_eq!(
        selected_name(&app),
        "model.empty",
        "named children sort by name"
    );
    press(&mut app, &[key(KeyCode::Down)]);
    assert_eq!(selected_name(&app), "model.layers");
    press(&mut app, &[key(KeyCode::Right)]);
    assert!(app.rows.is_expanded(app.selected().expect("sel")));
    press(&mut app, &[ch('l')]);
    assert_eq!(
        selected_name(&app),
        "model.layers.0",
        "→ on an open module steps into it"
    );
    press(&mut app, &[ch('G')]);
    assert_eq!(selected_name(&app), "model.scale");
    press(&mut app, &[ch('g')]);
    assert_eq!(selected_name(&app), "lm_head");
    press(&mut app, &[key(KeyCode::PageDown)]);
    let after_page = app.rows.selected;
    assert!(after_page > 3, "a page moves many rows: {after_page}");
    press(&mut app, &[key(KeyCode::PageUp)]);
    assert_eq!(app.rows.selected, 0);
    // ← on a closed node goes to its parent; on an open one it closes.
    press(&mut app, &[ch('j'), ch('j'), ch('j'), ch('j'), ch('j')]);
    assert_eq!(selected_name(&app), "model.layers.0");
    press(&mut app, &[ch('h')]);
    assert_eq!(selected_name(&app), "model.layers");
    press(&mut app, &[key(KeyCode::Left)]);
    assert!(!app.rows.is_expanded(app.selected().expect("sel")));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(
        app.rows.is_expanded(app.selected().expect("sel")),
        "Enter expands"
    );
    // Mouse wheel.
    let wheel = |kind| MouseEvent {
        kind,
        column: 0,
        row: 0,
        modifiers: KeyModifiers::NONE,
    };
    let before = app.rows.selected;
    drive(&mut app, [mouse(wheel(MouseEventKind::ScrollDown))]);
    assert_eq!(app.rows.selected, before + 3);
    drive(&mut app, [mouse(wheel(MouseEventKind::ScrollUp))]);
    assert_eq!(app.rows.selected, before);
}

#[test]
fn search_and_step_through_matches() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('/')]);
    assert!(matches!(app.mode, Mode::Search(_)));
    press(&mut app, &text("layers.5.mask"));
    assert_eq!(
        selected_name(&app),
        "model.layers.5.mask",
        "incremental search selects as you type"
    );
    press(&mut app, &[key(KeyCode::Enter)]);
    assert_eq!(app.mode, Mode::Browse);
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("norm.weight"));
    press(&mut app, &[key(KeyCode::Enter)]);
    let first = selected_name(&app);
    assert!(first.ends_with("norm.weight"), "{first}");
    let count = app.matches.len();
    assert_eq!(count, 13, "12 layer norms and the final norm");
    press(&mut app, &[ch('n')]);
    let second = selected_name(&app);
    assert_ne!(first, second);
    press(&mut app, &[ch('N')]);
    assert_eq!(selected_name(&app), first);
    // Esc leaves search without moving.
    press(&mut app, &[ch('/'), ch('x'), key(KeyCode::Esc)]);
    assert_eq!(app.mode, Mode::Browse);
}

#[test]
fn jump_to_tie_partner() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[key(KeyCode::Right), ch('j')]);
    assert_eq!(selected_name(&app), "lm_head.weight");
    press(&mut app, &[ch('t')]);
    assert_eq!(selected_name(&app), "model.embed_tokens.weight");
    press(&mut app, &[ch('t')]);
    assert_eq!(selected_name(&app), "lm_head.weight");
}

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
    press(&mut app, &[ch('d')]);
    let node = &app.tree.nodes[app.selected().expect("sel")];
    assert_eq!(node.single_placement(), Some(Placement::Disk));
    let disk_after = app
        .ckpt
        .device_totals()
        .into_iter()
        .find(|(p, _)| *p == Placement::Disk)
        .map_or(0, |x| x.1);
    assert_eq!(disk_after, disk_before + node.bytes);
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
    press(&mut app, &[ch('d')]);
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
    assert!(!app.map_edited());
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
fn save_dialog_preview_and_a_real_save() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('s')]);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert_eq!(d.size, "50GB", "transformers 5's default");
    assert!(d.out.ends_with("model-saved"), "{}", d.out);
    assert_eq!(d.preview.shard_sizes.len(), 1);
    assert!(d.preview.errors.is_empty(), "{:?}", d.preview.errors);
    assert_eq!(
        d.preview.ties_once,
        vec![(
            "lm_head.weight".to_owned(),
            "model.embed_tokens.weight".to_owned()
        )]
    );
    // Presets: none past the largest; 5GB (transformers 4's default) one step left.
    press(&mut app, &[key(KeyCode::Right)]);
    assert!(matches!(&app.mode, Mode::SaveDialog(d) if d.size == "50GB"));
    press(
        &mut app,
        &[key(KeyCode::Left), key(KeyCode::Left), key(KeyCode::Left)],
    );
    assert!(matches!(&app.mode, Mode::SaveDialog(d) if d.size == "5GB"));
    // Typing an invalid size refuses; a small one makes several shards.
    press(&mut app, &[ctrl('u')]);
    press(&mut app, &text("12XB"));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(app.save.is_none(), "invalid size must not start");
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog stays")
    };
    assert!(
        d.preview
            .errors
            .iter()
            .any(|e| e.contains("`12XB` is not a size")),
        "{:?}",
        d.preview.errors
    );
    let mut keys = vec![key(KeyCode::Backspace); 3];
    keys.extend(text("KB"));
    type_keys(&mut app, &keys);
    // Typing shows at once; the preview waits until the keys stop.
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert_eq!(d.size, "1KB");
    assert_eq!(
        d.preview.shard_sizes.len(),
        0,
        "still the refused size's preview"
    );
    assert!(d.preview_due.is_some());
    settle(&mut app);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    let shards = d.preview.shard_sizes.len();
    assert!(shards > 3, "{shards}");
    // The output folder: a non-empty one is refused until Ctrl-O.
    let out = m.out("tui-out");
    std::fs::create_dir(&out).expect("mkdir");
    std::fs::write(out.join("notes.txt"), "x").expect("w");
    press(&mut app, &[key(KeyCode::Tab)]);
    assert!(matches!(&app.mode, Mode::SaveDialog(d) if d.field == Field::Output));
    press(&mut app, &[ctrl('u')]);
    press(&mut app, &text(out.to_str().expect("p")));
    settle(&mut app);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(
        d.preview.errors.iter().any(|e| e.contains("not empty")),
        "{:?}",
        d.preview.errors
    );
    assert!(d.preview.offer_overwrite);
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(app.save.is_none(), "a non-empty folder is refused");
    press(&mut app, &[ctrl('o')]);
    settle(&mut app);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(d.preview.errors.is_empty(), "{:?}", d.preview.errors);
    // Navigation keeps working while the save runs: `j` lands while its events are
    // held back.
    let mut journey = Journey::start(&mut app);
    journey.steps(
        &mut app,
        [
            Step::Hold,
            press_step(key(KeyCode::Enter)),
            press_step(ch('j')),
        ],
    );
    assert_eq!(app.mode, Mode::Browse);
    assert!(app.save_running());
    assert_eq!(selected_name(&app), "model");
    journey.steps(&mut app, [Step::Release]);
    journey.end(&app);
    let save = app.save.as_ref().expect("progress");
    assert!(
        matches!(save.outcome, Some(Outcome::Done(_))),
        "{:?}",
        save.outcome
    );
    assert_eq!(save.written, save.total);
    assert!(save.shards.iter().all(|s| s.done));
    assert_eq!(read_saved(&out), m.expected);
    assert!(out.join("notes.txt").exists(), "unrelated files stay");
    // Esc closes the dialog without starting anything.
    press(&mut app, &[ch('s')]);
    let files = std::fs::read_dir(&out).expect("out").count();
    press(&mut app, &[key(KeyCode::Esc)]);
    assert_eq!(app.mode, Mode::Browse);
    assert_eq!(std::fs::read_dir(&out).expect("out").count(), files);
}

/// Starts a save of 2 KB shards into `out` that stops after its first tensor and stays
/// running (the saver's test pause) until it is cancelled or the pause file goes; its
/// events are held back until a `Step::Release`. Returns the journey it runs in and
/// the pause file.
fn start_paused_save(app: &mut App, out: &std::path::Path) -> (Journey, std::path::PathBuf) {
    let pause = out.with_extension("pause");
    std::fs::write(&pause, b"").expect("pause file");
    app.save_pause = Some(pause.clone());
    let mut journey = Journey::start(app);
    let mut keys = vec![ch('s'), ctrl('u')];
    keys.extend(text("2KB"));
    keys.extend([key(KeyCode::Tab), ctrl('u')]);
    keys.extend(text(out.to_str().expect("p")));
    journey.press(app, &keys);
    // Enter, its events held back (the steps go on without waiting for a save that
    // waits), then wait (real time) until the save has reached its pause.
    journey.steps(app, [Step::Hold, press_now(key(KeyCode::Enter))]);
    let reached = pause.with_extension("pause.reached");
    for _ in 0..2000 {
        if reached.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(reached.exists(), "the save reached its pause");
    assert!(app.save_running(), "{:?}", app.mode);
    (journey, pause)
}

#[test]
fn cancel_and_quit_ask_while_a_save_runs() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let out = m.out("x");
    let (mut journey, _pause) = start_paused_save(&mut app, &out);
    // Esc asks to cancel; n keeps it running.
    journey.steps(&mut app, [press_now(key(KeyCode::Esc))]);
    assert_eq!(app.mode, Mode::Confirm(Confirm::CancelSave));
    journey.steps(&mut app, [press_now(ch('n'))]);
    assert_eq!(app.mode, Mode::Browse);
    assert!(app.save_running());
    // Esc, y: the save stops, its files go.
    journey.steps(
        &mut app,
        [
            press_now(key(KeyCode::Esc)),
            press_now(ch('y')),
            Step::Release,
            Step::Wait(Duration::from_secs(3)),
        ],
    );
    assert!(matches!(
        app.save.as_ref().and_then(|s| s.outcome.clone()),
        Some(Outcome::Cancelled)
    ));
    assert!(!app.save_running());
    assert!(
        !out.exists() || std::fs::read_dir(&out).expect("out").next().is_none(),
        "a cancelled save leaves nothing"
    );
    // A cancelled save's panel keeps no rate or ETA: they would be stale.
    let screen = frame(&app, 120, 40);
    assert!(screen.contains("Save — cancelled"), "{screen}");
    assert!(
        !screen.contains("ETA") && !screen.contains("/s "),
        "{screen}"
    );
    journey.end(&app);

    // q while a save runs asks; y cancels it and quits.
    let out = m.out("y");
    let (mut journey, _pause) = start_paused_save(&mut app, &out);
    journey.steps(&mut app, [press_now(ch('q'))]);
    assert_eq!(app.mode, Mode::Confirm(Confirm::QuitDuringSave));
    journey.steps(&mut app, [press_now(ch('y'))]);
    assert!(journey.quit());
    journey.end(&app);
    assert!(
        !out.join("model.safetensors.index.json").exists(),
        "the quit cancelled the save"
    );
}

#[test]
fn quit_help_and_ctrl_c() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('?')]);
    assert_eq!(app.mode, Mode::Help);
    press(&mut app, &[key(KeyCode::Esc)]);
    assert_eq!(app.mode, Mode::Browse);
    let mut journey = Journey::start(&mut app);
    journey.press(&mut app, &[ch('q')]);
    assert!(journey.quit());
    let mut app = app_for(&m);
    let mut journey = Journey::start(&mut app);
    journey.press(&mut app, &[ctrl('c')]);
    assert!(journey.quit());
}

#[test]
fn main_screen_at_three_sizes() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    press(
        &mut app,
        &[
            ch('j'),
            ch('j'),
            ch('j'),
            ch('j'),
            key(KeyCode::Right),
            ch('j'),
        ],
    );
    for (w, h) in [(80, 24), (120, 40), (160, 50)] {
        resized(&mut app, w, h);
        insta::assert_snapshot!(format!("main_{w}x{h}"), frame(&app, w, h));
    }
    resized(&mut app, 50, 12);
    let small = frame(&app, 50, 12);
    assert!(small.contains("needs at least 60×16"), "{small}");
}

#[test]
fn save_dialog_with_preview_and_warning_snapshot() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    // Little free RAM: the preview warns.
    sampled(&mut app, Event::Memory(sample(15.99, 0.01)));
    press(&mut app, &[ch('s'), ctrl('u')]);
    press(&mut app, &text("1KB"));
    press(&mut app, &[key(KeyCode::Tab), ctrl('u')]);
    press(&mut app, &text("saved-model"));
    settle(&mut app);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(!d.preview.warnings.is_empty());
    insta::assert_snapshot!("save_dialog", frame(&app, 120, 40));
}

#[test]
fn progress_panel_snapshot() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    let out = m.out("saved-model");
    let (mut journey, _pause) = start_paused_save(&mut app, &out);
    // The events of the first tensor land; two seconds pass.
    journey.steps(
        &mut app,
        [Step::HandOver, Step::Wait(Duration::from_secs(2))],
    );
    let save = app.save.as_ref().expect("a save runs");
    assert!(save.written > 0 && save.written < save.total, "{save:?}");
    let (rate, eta) = app.save_rate().expect("rate");
    assert!(rate > 0.0 && eta > 0.0);
    // The temporary folder's random name, as a name of the same length.
    let tmp_name = m
        .tmp
        .path()
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let screen = frame(&app, 120, 40).replace(&tmp_name, &"X".repeat(tmp_name.len()));
    insta::assert_snapshot!("progress", screen);
    journey.end(&app);
}

#[test]
fn help_overlay_snapshot() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    press(&mut app, &[ch('?')]);
    insta::assert_snapshot!("help", frame(&app, 100, 30));
}

fn fixed_gpus() -> Vec<devmap::monitor::gpu::GpuInfo> {
    use devmap::monitor::gpu::{FixedGpus, GpuInfo, GpuSource};
    let mut source = FixedGpus(vec![
        GpuInfo {
            index: 0,
            name: "Test GPU".into(),
            total: 24 * GIB,
            free: 20 * GIB,
        },
        GpuInfo {
            index: 1,
            name: "Test GPU".into(),
            total: 24 * GIB,
            free: 6 * GIB,
        },
    ]);
    source.gpus()
}

#[test]
fn gpu_gauges_and_budgets_come_from_the_gpu_source() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    app.budgets.gpu_total.clear();
    sampled(&mut app, Event::Gpus(fixed_gpus(), None));
    // GPU budgets are the free memory; cpu's is the available RAM.
    assert_eq!(app.device_budget(Placement::Gpu(1)), Some(6 * GIB));
    assert_eq!(app.device_budget(Placement::Cpu), Some(11 * GIB));
    let screen = frame(&app, 120, 40);
    assert!(
        screen.contains("GPU0") && screen.contains("4 GiB/24 GiB"),
        "{screen}"
    );
    assert!(
        screen.contains("GPU1") && screen.contains("18 GiB/24 GiB"),
        "{screen}"
    );
    assert!(
        screen.contains("of 20 GiB"),
        "gpu:0 measured against its free memory: {screen}"
    );
    insta::assert_snapshot!("gpus", screen);
    // No GPU: what the real NVML source reports without a driver library shows as
    // one line, no gauge, no error.
    use devmap::monitor::gpu::{GpuSource, Nvml};
    let mut no_driver = Nvml::open_library(std::ffi::OsStr::new("/nonexistent/libnvidia-ml.so.1"));
    sampled(&mut app, Event::Gpus(no_driver.gpus(), no_driver.note()));
    let screen = frame(&app, 120, 40);
    assert!(
        screen.contains("no GPU gauges: no NVIDIA driver found") && !screen.contains("GPU0"),
        "{screen}"
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
    // Tight budgets: the plan moves tensors, and says how many.
    press(&mut app, &[ctrl('u')]);
    press(&mut app, &text("0=3KB,cpu=3KB"));
    press(&mut app, &[key(KeyCode::Enter)]);
    let Mode::PlanResult(lines) = &app.mode else {
        panic!("result: {:?}", app.mode)
    };
    assert!(lines[0].contains("tensors move"), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("→ disk")), "{lines:?}");
    assert!(app.map_edited());
    // A long result scrolls: its last line comes into view at 80x24.
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
        },
    )
    .expect("plan");
    assert_eq!(
        app.ckpt.device_map.as_ref(),
        Some(&planned.map),
        "the TUI applies the same plan as devmap plan"
    );
    press(&mut app, &[key(KeyCode::Esc)]);
    assert_eq!(app.mode, Mode::Browse);
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

/// A file system that exists only in the test: every question the App asks is
/// answered (and counted) here, so the App's decisions are checked without touching
/// the disk.
struct FakeProbe {
    nonempty: std::path::PathBuf,
    folder: std::path::PathBuf,
    checks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl devmap::tui::probe::Probe for FakeProbe {
    fn save_problems(
        &self,
        _: &devmap::model::Checkpoint,
        _: &devmap::save::SavePlan,
        options: &devmap::save::SaveOptions,
    ) -> Vec<String> {
        self.checks
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if options.out == self.nonempty && !options.force {
            vec!["not empty (fake)".into()]
        } else {
            Vec::new()
        }
    }
    fn has_entries(&self, dir: &std::path::Path) -> bool {
        dir == self.nonempty
    }
    fn kind(&self, path: &std::path::Path) -> devmap::tui::probe::PathKind {
        if path == self.folder {
            devmap::tui::probe::PathKind::Dir
        } else {
            devmap::tui::probe::PathKind::Missing
        }
    }
    fn same_file(&self, a: &std::path::Path, b: &std::path::Path) -> bool {
        a == b
    }
}

#[test]
fn the_app_asks_its_probe_and_checks_once_the_keys_stop() {
    let m = mixed_model();
    let checks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ckpt = load(&m.dir, &LoadOptions::default()).expect("load");
    // Paths that do not exist on disk: only the probe knows them.
    let nonempty = std::path::PathBuf::from("/nonexistent/devmap-test/full");
    let folder = std::path::PathBuf::from("/nonexistent/devmap-test/a-folder");
    let mut app = App::with_probe(
        ckpt,
        Box::new(FakeProbe {
            nonempty: nonempty.clone(),
            folder: folder.clone(),
            checks: checks.clone(),
        }),
    );
    press(&mut app, &[ch('s')]);
    let opened = checks.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(opened, 1, "opening the dialog checks once");
    let mut keys = vec![key(KeyCode::Tab), ctrl('u')];
    keys.extend(text(nonempty.to_str().expect("p")));
    type_keys(&mut app, &keys);
    assert_eq!(
        checks.load(std::sync::atomic::Ordering::SeqCst),
        opened,
        "no file check per keystroke"
    );
    settle(&mut app);
    assert_eq!(checks.load(std::sync::atomic::Ordering::SeqCst), opened + 1);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert_eq!(d.preview.errors, vec!["not empty (fake)".to_owned()]);
    assert!(d.preview.offer_overwrite);
    // Enter re-checks at once, and refuses.
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(app.save.is_none() && matches!(app.mode, Mode::SaveDialog(_)));
    assert_eq!(checks.load(std::sync::atomic::Ordering::SeqCst), opened + 2);
    press(&mut app, &[key(KeyCode::Esc)]);
    // Export: the probe says the path is a folder.
    press(&mut app, &[ch('w'), ctrl('u')]);
    press(&mut app, &text(folder.to_str().expect("p")));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(
        matches!(&app.mode, Mode::Export(d) if d.error.as_deref() == Some("that is a folder; type a file path")),
        "{:?}",
        app.mode
    );
}

#[test]
fn names_with_control_characters_are_drawn_escaped() {
    use devmap::fixtures::{FixtureTensor, write_safetensors};
    let tmp = tempfile::tempdir().expect("tmp");
    let evil = "model.\x1b]0;pwned\x07.\u{202e}w";
    let t = FixtureTensor::patterned(evil, devmap::model::DType::F32, &[2], 1);
    write_safetensors(&tmp.path().join("model.safetensors"), &[&t]).expect("w");
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    let mut app = App::new(ckpt);
    resized(&mut app, 120, 40);
    // Open the last module and select the tensor, so the tree and details show it.
    press(&mut app, &[ch('G'), ch('l'), ch('G')]);
    let screen = frame(&app, 120, 40);
    for raw in ['\x1b', '\x07', '\u{202e}'] {
        assert!(!screen.contains(raw), "raw {raw:?} drawn:\n{screen}");
    }
    assert!(screen.contains("\\x1b]0;pwned\\x07"), "{screen}");
    assert!(screen.contains("\\u{202e}w"), "{screen}");
}

/// Selects the module `name` by pressing keys, as a user would: from the top, down,
/// opening the modules on its path.
fn select(app: &mut App, name: &str) {
    let mut journey = Journey::start(app);
    select_in(&mut journey, app, name);
    journey.end(app);
}

/// [`select`] within a journey (while work it started may be running).
fn select_in(journey: &mut Journey, app: &mut App, name: &str) {
    journey.press(app, &[ch('g')]);
    for _ in 0..200 {
        let at = selected_name(app);
        if at == name {
            return;
        }
        if name.starts_with(&format!("{at}.")) {
            // Opens the module, or (open already) steps onto its first child.
            journey.press(app, &[ch('l')]);
            continue;
        }
        journey.press(app, &[ch('j')]);
    }
    panic!("{name} is not in the visible tree");
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
        press(&mut app, &[ch('d')]);
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
    assert_eq!(app.tree.nodes[app.tree.tensor_node[0]].depth, 2);
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
    let busy = journey.steps(&mut app, [Step::Hold, press_step(ch('d'))]);
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
    journey.press(&mut app, &[ch('d')]);
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
    let node = app.tree.tensor_node[app.ckpt.index_of(layer0).expect("id")];
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
        [Step::Hold, press_now(ch('d')), press_now(ch('q'))],
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

/// The save preview is computed off the UI thread; one for an older edit that lands
/// after a newer one started is dropped.
#[test]
fn the_save_preview_runs_off_the_ui_thread_and_late_results_are_dropped() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let mut journey = Journey::start(&mut app);
    // The first preview finishes and is held back.
    let opened = journey.steps(
        &mut app,
        [Step::Hold, press_now(ch('s')), Step::AwaitHeld(1)],
    );
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(d.preview.plan.is_none() && d.preview_pending.is_some());
    assert!(opened.contains("checking…"), "{opened}");
    // A new size, and the quiet time passes: a second preview starts, and finishes.
    let mut steps = vec![press_now(ctrl('u'))];
    steps.extend(text("1KB").into_iter().map(press_now));
    steps.push(Step::Wait(PREVIEW_DELAY + Duration::from_millis(1)));
    steps.push(Step::AwaitHeld(2));
    journey.steps(&mut app, steps);
    // The first (the old size's) lands now, after the second started: dropped.
    let late = journey.steps(&mut app, [Step::ReleaseFirst]);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(
        d.preview.plan.is_none() && d.preview_pending.is_some(),
        "the preview of the old size is dropped"
    );
    assert!(late.contains("checking…"), "{late}");
    let landed = journey.steps(&mut app, [Step::Release]);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(d.preview_pending.is_none());
    assert!(
        d.preview.shard_sizes.len() > 1,
        "{:?}",
        d.preview.shard_sizes
    );
    assert!(!landed.contains("checking…"), "{landed}");
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
    journey.press(&mut app, &[ch('d')]);
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
fn a_save_that_ends_while_cancel_is_asked_closes_the_question() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let out = m.out("ends");
    let (mut journey, pause) = start_paused_save(&mut app, &out);
    // Esc asks whether to cancel; meanwhile the save finishes.
    journey.steps(&mut app, [press_now(key(KeyCode::Esc))]);
    assert_eq!(app.mode, Mode::Confirm(Confirm::CancelSave));
    std::fs::remove_file(&pause).expect("unpause");
    journey.steps(
        &mut app,
        [Step::Wait(Duration::from_secs(2)), Step::Release],
    );
    assert!(matches!(
        app.save.as_ref().and_then(|s| s.outcome.clone()),
        Some(Outcome::Done(_))
    ));
    assert_eq!(app.mode, Mode::Browse, "the question closes with the save");
    assert_eq!(read_saved(&out), m.expected);
    // A late `y` cancels nothing and says nothing about cancelling.
    let screen = journey.press(&mut app, &[ch('y')]);
    assert!(!screen.contains("cancelling"), "{screen}");
    assert!(matches!(
        app.save.as_ref().and_then(|s| s.outcome.clone()),
        Some(Outcome::Done(_))
    ));
    // The rate is the final average: it does not fall as time passes.
    let rate = app.save_rate().expect("rate").0;
    journey.steps(&mut app, [Step::Wait(Duration::from_secs(600))]);
    assert!((app.save_rate().expect("rate").0 - rate).abs() < 1e-9);
    // Esc dismisses the finished save's panel.
    journey.press(&mut app, &[key(KeyCode::Esc)]);
    assert!(app.save.is_none());
    journey.end(&app);
}

#[test]
fn the_save_dialog_offers_the_dtype_and_previews_the_output_size() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('s')]);
    let bytes_as_stored = match &app.mode {
        Mode::SaveDialog(d) => d.preview.bytes,
        other => panic!("{other:?}"),
    };
    // Tab twice reaches the dtype; → steps auto, keep, bfloat16, float16, float32.
    press(&mut app, &[key(KeyCode::Tab), key(KeyCode::Tab)]);
    assert!(matches!(&app.mode, Mode::SaveDialog(d) if d.field == Field::Dtype));
    press(&mut app, &text("x"));
    press(&mut app, &[key(KeyCode::Right); 4]);
    settle(&mut app);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(
        !d.out.ends_with('x'),
        "typing does not edit the dtype or the path"
    );
    assert_eq!(devmap::tui::app::dtype_label(d.dtype), "float32");
    assert_eq!(d.preview.cast_to, Some(devmap::model::DType::F32));
    assert!(
        d.preview.bytes > bytes_as_stored,
        "float32 output is larger: {} vs {bytes_as_stored}",
        d.preview.bytes
    );
    let screen = frame(&app, 120, 40);
    assert!(
        screen.contains("dtype") && screen.contains("written as float32"),
        "{screen}"
    );
    // ← back to keep: the stored size again.
    press(&mut app, &[key(KeyCode::Left); 3]);
    settle(&mut app);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert_eq!(devmap::tui::app::dtype_label(d.dtype), "keep");
    assert_eq!(d.preview.bytes, bytes_as_stored);
}

#[test]
fn the_ram_graph_says_what_its_height_spans() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    // A 100 MB swing on 16 GiB: the graph magnifies it, and says so.
    sampled(&mut app, Event::Memory(sample(4.0, 11.0)));
    sampled(&mut app, Event::Memory(sample(4.1, 10.9)));
    let screen = frame(&app, 160, 50);
    assert!(
        screen.contains("used 4 GiB – 4.60 GiB in 10 s; graph from"),
        "{screen}"
    );
}

#[test]
fn the_save_dialog_remembers_its_values_and_speaks_in_keys() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let out = m.out("full-folder");
    std::fs::create_dir(&out).expect("mkdir");
    std::fs::write(out.join("notes.txt"), "x").expect("w");
    press(&mut app, &[ch('s'), ctrl('u')]);
    press(&mut app, &text("1KB"));
    press(&mut app, &[key(KeyCode::Tab), ctrl('u')]);
    press(&mut app, &text(out.to_str().expect("p")));
    press(
        &mut app,
        &[key(KeyCode::Tab), key(KeyCode::Right), key(KeyCode::Right)],
    );
    settle(&mut app);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    let refusal = d
        .preview
        .errors
        .iter()
        .find(|e| e.contains("not empty"))
        .expect("refused");
    assert!(
        refusal.contains("Ctrl-O") && !refusal.contains("--force"),
        "{refusal}"
    );
    // Esc, then s again: the same values.
    press(&mut app, &[key(KeyCode::Esc), ch('s')]);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert_eq!(d.size, "1KB");
    assert_eq!(d.out, out.to_str().expect("p"));
    assert_eq!(devmap::tui::app::dtype_label(d.dtype), "bfloat16");
    assert_eq!(d.field, Field::ShardSize);
}

#[test]
fn default_outputs_go_beside_the_model_but_never_into_a_git_checkout() {
    use devmap::fixtures::{FixtureTensor, write_safetensors};
    let tmp = tempfile::tempdir().expect("tmp");
    let repo = tmp.path().join("repo");
    let dir = repo.join("models").join("tiny");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::create_dir(repo.join(".git")).expect("a checkout");
    let t = FixtureTensor::patterned("w", devmap::model::DType::F32, &[2], 1);
    write_safetensors(&dir.join("model.safetensors"), &[&t]).expect("w");
    let mut app = App::new(load(&dir, &LoadOptions::default()).expect("load"));
    press(&mut app, &[ch('s')]);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert_eq!(d.out, tmp.path().join("tiny-saved").display().to_string());
    press(&mut app, &[key(KeyCode::Esc), ch('w')]);
    let Mode::Export(e) = &app.mode else {
        panic!("export")
    };
    assert_eq!(
        e.path,
        tmp.path()
            .join("tiny-device_map.json")
            .display()
            .to_string()
    );
}

#[test]
fn search_counts_its_matches_and_esc_puts_the_tree_back() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let before = app.rows.clone();
    let start = selected_name(&app);
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("norm.weight"));
    // Thirteen norms: twelve layers' and the final one. The first is selected: 1/13.
    assert_eq!(app.match_position(), Some((1, 13)));
    assert!(frame(&app, 120, 40).contains("1/13"));
    // Esc: the selection, scroll and expansion of before the search.
    press(&mut app, &[key(KeyCode::Esc)]);
    assert_eq!(app.rows, before);
    assert_eq!(selected_name(&app), start);
    // Enter keeps the place; n steps and says where it is.
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("norm.weight"));
    press(&mut app, &[key(KeyCode::Enter), ch('n')]);
    assert_eq!(app.match_position(), Some((2, 13)));
    assert!(
        app.message
            .as_ref()
            .is_some_and(|m| m.text == "match 2/13 for `norm.weight`"),
        "{:?}",
        app.message
    );
    // A search that finds nothing: `n` repeats it and says it still finds nothing.
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("no-such-name"));
    press(&mut app, &[key(KeyCode::Enter), ch('n')]);
    assert_eq!(
        app.message.as_ref().map(|m| m.text.as_str()),
        Some("still no name contains `no-such-name`")
    );
}

#[test]
fn bang_lists_every_warning_in_full() {
    let m = mixed_model();
    let mut app = app_for(&m);
    select(&mut app, "model.layers.4");
    // cpu -> disk: layer 4 has no offload entry, which is worth a warning.
    press(&mut app, &[ch('d')]);
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

/// Saves the model into `out` through the dialog (the runtime runs it to the end).
fn save_through_the_dialog(app: &mut App, out: &std::path::Path) {
    press(app, &[ch('s'), key(KeyCode::Tab), ctrl('u')]);
    press(app, &text(out.to_str().expect("p")));
    settle(app);
    press(app, &[key(KeyCode::Enter)]);
    assert!(
        matches!(
            app.save.as_ref().and_then(|s| s.outcome.clone()),
            Some(Outcome::Done(_))
        ),
        "{:?}",
        app.save.as_ref().map(|s| &s.outcome)
    );
}

#[test]
fn v_verifies_a_finished_save_and_shows_the_verdict() {
    let m = mixed_model();
    let mut app = app_for(&m);
    // Nothing to verify yet.
    let nothing = press(&mut app, &[ch('v')]);
    assert!(nothing.contains("save first"), "{nothing}");
    assert!(app.save.is_none());
    let out = m.out("verified");
    save_through_the_dialog(&mut app, &out);
    assert!(
        frame(&app, 120, 40).contains("v verify"),
        "the panel offers v"
    );

    // v, and v again while it runs (its result held back): one verification.
    let mut journey = Journey::start(&mut app);
    journey.steps(&mut app, [Step::Hold, press_now(ch('v'))]);
    assert!(app.verify_running());
    let message = app.message.clone();
    journey.steps(&mut app, [press_now(ch('v'))]);
    assert!(app.verify_running());
    assert_eq!(app.message, message, "a second v starts nothing");
    let screen = journey.steps(&mut app, [Step::Release]);
    journey.end(&app);
    assert!(!app.verify_running());
    assert!(screen.contains("Save — done · verified"), "{screen}");
    assert!(screen.contains("no differences"), "{screen}");

    // The same save with one byte changed: v again names the tensor.
    let file = out.join("model.safetensors");
    let header = devmap::formats::safetensors::read_header(&file).expect("header");
    let t = header
        .tensors
        .iter()
        .find(|t| t.name == "model.layers.2.proj.weight")
        .expect("tensor");
    let mut bytes = std::fs::read(&file).expect("read");
    bytes[t.offset as usize] ^= 0xff;
    std::fs::write(&file, bytes).expect("write");
    let screen = press(&mut app, &[ch('v')]);
    assert!(screen.contains("verify found problems"), "{screen}");
    assert!(
        screen.contains("1 difference: model.layers.2.proj.weight"),
        "{screen}"
    );
    // Esc closes the finished panel.
    press(&mut app, &[key(KeyCode::Esc)]);
    assert!(app.save.is_none());
}

/// Esc while a verification runs asks it to stop; what the stopped verification
/// sends back (given here as its thread would send it, the real result held back so
/// a fast machine cannot finish first) is shown as such.
#[test]
fn esc_stops_a_running_verification() {
    let m = mixed_model();
    let mut app = app_for(&m);
    save_through_the_dialog(&mut app, &m.out("stopped"));
    let mut journey = Journey::start(&mut app);
    journey.steps(
        &mut app,
        [Step::Hold, press_now(ch('v')), press_now(key(KeyCode::Esc))],
    );
    assert!(app.verify_running(), "it runs until it says it stopped");
    let stopped = Event::Verify(Action::Verified(Err("verification cancelled".into())));
    let screen = journey.steps(&mut app, [Step::Now(stopped)]);
    assert!(!app.verify_running());
    assert!(
        screen.contains("could not verify: verification cancelled"),
        "{screen}"
    );
    journey.end(&app);
}

/// The buffer of one frame, for tests that look at styles, not only symbols.
fn buffer(app: &App, width: u16, height: u16) -> ratatui::buffer::Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("terminal");
    terminal.draw(|f| ui::draw(app, f)).expect("draw");
    terminal.backend().buffer().clone()
}

#[test]
fn the_selection_bar_covers_the_whole_row_in_colour_and_without() {
    use ratatui::style::Modifier;
    let m = mixed_model();
    for color in [true, false] {
        let mut app = app_for(&m);
        app.color = color;
        press(&mut app, &[key(KeyCode::Down), key(KeyCode::Down)]);
        let areas = devmap::tui::layout::areas(
            ratatui::layout::Rect::new(0, 0, 120, 40),
            app.progress_rows(),
            app.device_rows(),
        );
        let buf = buffer(&app, 120, 40);
        let inner = (areas.tree.x + 1)..(areas.tree.x + areas.tree.width - 1);
        let reversed = |y: u16| {
            inner
                .clone()
                .filter(|&x| buf[(x, y)].modifier.contains(Modifier::REVERSED))
                .count()
        };
        let rows: Vec<u16> = (areas.tree.y..areas.tree.y + areas.tree.height)
            .filter(|&y| reversed(y) > 0)
            .collect();
        assert_eq!(rows.len(), 1, "one selected row (color {color})");
        assert_eq!(
            reversed(rows[0]),
            inner.len(),
            "every cell of the row, the coloured bar and badge included (color {color})"
        );
    }
}

#[test]
fn search_matches_are_highlighted_in_the_tree() {
    use ratatui::style::Modifier;
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("scale"));
    press(&mut app, &[key(KeyCode::Enter)]);
    let buf = buffer(&app, 120, 40);
    let screen = frame(&app, 120, 40);
    let (y, line) = screen
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(" scale "))
        .expect("the matching row");
    let x = line.find("scale").expect("name") as u16;
    let x = line[..x as usize].chars().count() as u16;
    assert!(
        buf[(x, y as u16)].modifier.contains(Modifier::UNDERLINED),
        "the match is underlined (visible without colour)"
    );
    let (y2, line2) = screen
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(" norm "))
        .expect("another row");
    let x2 = line2[..line2.find("norm").expect("n")].chars().count() as u16;
    assert!(!buf[(x2, y2 as u16)].modifier.contains(Modifier::UNDERLINED));
}

#[test]
fn a_click_selects_a_row_and_a_second_click_opens_it() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let row_of = |app: &App, name: &str| -> u16 {
        frame(app, 120, 40)
            .lines()
            .position(|l| l.contains(&format!("▸ {name} ")) || l.contains(&format!("▾ {name} ")))
            .expect("row on screen") as u16
    };
    let click = |app: &mut App, row: u16| {
        drive(
            app,
            [mouse(MouseEvent {
                kind: MouseEventKind::Down(ratatui::crossterm::event::MouseButton::Left),
                column: 6,
                row,
                modifiers: KeyModifiers::NONE,
            })],
        );
    };
    let y = row_of(&app, "layers");
    click(&mut app, y);
    let selected = app.selected().map(|id| app.tree.full_name(id));
    assert_eq!(selected.as_deref(), Some("model.layers"));
    assert!(
        frame(&app, 120, 40).contains("▸ layers"),
        "one click only selects"
    );
    click(&mut app, y);
    assert!(
        frame(&app, 120, 40).contains("▾ layers"),
        "a second click opens it"
    );
    click(&mut app, y);
    assert!(
        frame(&app, 120, 40).contains("▸ layers"),
        "and a third closes it"
    );
    // Clicks outside the tree's rows change nothing.
    let before = app.rows.selected;
    click(&mut app, 0);
    click(&mut app, 39);
    assert_eq!(app.rows.selected, before);
}

#[test]
fn narrow_screens_drop_share_and_params_before_names_and_devices() {
    let m = mixed_model();
    let mut app = app_for(&m);
    for (w, h) in [(60, 16), (80, 24), (120, 40), (160, 50)] {
        resized(&mut app, w, h);
        let screen = frame(&app, w, h);
        let header = screen
            .lines()
            .find(|l| l.contains("name") && l.contains("size"))
            .expect("the header");
        assert!(
            header.contains("device"),
            "{w}x{h}: the device column stays:\n{screen}"
        );
        if w >= 80 {
            assert!(
                screen.contains("embed_tokens ") && screen.contains("lm_head "),
                "{w}x{h}: names are whole:\n{screen}"
            );
        } else {
            // At 60 columns the name is what shrinks, after share and params.
            assert!(screen.contains("embed_to"), "{w}x{h}:\n{screen}");
        }
        assert!(screen.contains("gpu:0"), "{w}x{h}:\n{screen}");
        if w >= 120 {
            // The split note of a mixed module (what a map is debugged by) comes whole
            // before the params and share columns.
            assert!(
                screen.contains("gpu:0 48% cpu 26% disk 27%"),
                "{w}x{h}: the split note is cut:\n{screen}"
            );
        }
        if w == 60 {
            assert!(
                !header.contains("share"),
                "share gives way first at {w}x{h}"
            );
        }
        if w >= 160 {
            assert!(
                header.contains("share") && header.contains("params"),
                "{w}x{h}"
            );
        }
    }
}

#[test]
fn text_fields_edit_at_the_cursor() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('s'), key(KeyCode::Tab), ctrl('u')]);
    press(&mut app, &text("/data/models/out"));
    // ← twice, then type: the character goes before "ut".
    press(&mut app, &[key(KeyCode::Left), key(KeyCode::Left), ch('X')]);
    let out = |app: &App| match &app.mode {
        Mode::SaveDialog(d) => d.out.clone(),
        _ => panic!("dialog"),
    };
    assert_eq!(out(&app), "/data/models/oXut");
    assert!(
        frame(&app, 120, 40).contains("/data/models/oX▏ut"),
        "the cursor shows where it is"
    );
    // Home, then type at the start; End, then Backspace at the end.
    press(
        &mut app,
        &[
            key(KeyCode::Home),
            ch('.'),
            key(KeyCode::End),
            key(KeyCode::Backspace),
        ],
    );
    assert_eq!(out(&app), "./data/models/oXu");
    // Ctrl-W deletes the last path part, then the one before with its slash.
    press(&mut app, &[ctrl('w')]);
    assert_eq!(out(&app), "./data/models/");
    press(&mut app, &[ctrl('w')]);
    assert_eq!(out(&app), "./data/");
    // Ctrl-U deletes to the start from the cursor.
    press(&mut app, &[key(KeyCode::Left), ctrl('u')]);
    assert_eq!(out(&app), "/");
    // In the size field ←/→ still step the presets.
    press(&mut app, &[key(KeyCode::BackTab)]);
    let size = |app: &App| match &app.mode {
        Mode::SaveDialog(d) => d.size.clone(),
        _ => panic!("dialog"),
    };
    assert_eq!(size(&app), "50GB");
    press(&mut app, &[key(KeyCode::Left)]);
    assert_eq!(size(&app), "20GB");
    // The export dialog's path edits the same way, its cursor starting at the end.
    press(&mut app, &[key(KeyCode::Esc), ch('w'), ctrl('u')]);
    press(&mut app, &text("map.json"));
    press(
        &mut app,
        &[key(KeyCode::Home), ch('x'), key(KeyCode::Right), ch('y')],
    );
    let Mode::Export(d) = &app.mode else {
        panic!("export")
    };
    assert_eq!(d.path, "xmyap.json");
}

/// The mixed fixture spread over eight GPUs, cpu and disk, with cpu and disk over
/// their budgets.
fn ten_devices(m: &common::Model) -> App {
    let mut map = serde_json::Map::new();
    map.insert("lm_head".into(), 0.into());
    map.insert("model.embed_tokens".into(), 0.into());
    for l in 0..12 {
        let device: serde_json::Value = match l {
            0..=7 => l.into(),
            8 | 9 => "cpu".into(),
            _ => "disk".into(),
        };
        map.insert(format!("model.layers.{l}"), device);
    }
    for (k, v) in [
        ("model.norm", "disk"),
        ("model.scale", "disk"),
        ("model.empty", "cpu"),
    ] {
        map.insert(k.into(), v.into());
    }
    let path = m.out("ten-devices.json");
    devmap::fixtures::write_json(&path, &serde_json::Value::Object(map)).expect("map");
    let options = LoadOptions {
        device_map: Some(path),
        ..LoadOptions::default()
    };
    let ckpt = load(&m.dir, &options).expect("load");
    let mut app = App::new(ckpt);
    app.budgets = Budgets {
        disk_free: Some(100),
        gpu_total: (0..8).map(|i| (i, 24 * GIB)).collect(),
    };
    // About 200 bytes of RAM available: cpu is over its budget too.
    sampled(&mut app, Event::Memory(sample(4.0, 2e-7)));
    app
}

#[test]
fn the_devices_panel_grows_to_ten_devices_and_keeps_over_budget_rows() {
    let m = mixed_model();
    let mut app = ten_devices(&m);
    resized(&mut app, 200, 60);
    let screen = frame(&app, 200, 60);
    for d in 0..8 {
        assert!(
            screen.contains(&format!("│gpu:{d} ")),
            "gpu:{d} shows:\n{screen}"
        );
    }
    let over: Vec<&str> = screen.lines().filter(|l| l.contains(" OVER")).collect();
    assert_eq!(over.len(), 2, "cpu and disk are over:\n{screen}");
    insta::assert_snapshot!("main_200x60_ten_devices", screen);
    // On a small screen not every device fits; those over budget still show.
    resized(&mut app, 80, 24);
    let screen = frame(&app, 80, 24);
    assert!(
        screen.contains("│cpu ") && screen.contains("│disk "),
        "{screen}"
    );
    assert_eq!(
        screen.lines().filter(|l| l.contains(" OVER")).count(),
        2,
        "{screen}"
    );
    assert!(
        screen.contains("more devices, all within budget"),
        "{screen}"
    );
}

#[test]
fn tab_focuses_details_and_devices_which_then_scroll() {
    let m = mixed_model();
    let mut app = ten_devices(&m);
    resized(&mut app, 80, 24);
    // A tensor with a long Details text: the embedding (tied, with its source).
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("embed_tokens.weight"));
    press(&mut app, &[key(KeyCode::Enter)]);
    let selected = app.selected();
    let details_top = |app: &App| {
        frame(app, 80, 24)
            .lines()
            .nth(2)
            .map(|l| l.chars().skip(50).collect::<String>())
            .unwrap_or_default()
    };
    let before = details_top(&app);
    press(&mut app, &[key(KeyCode::Tab)]);
    assert!(
        frame(&app, 80, 24).contains("Details · ↑↓ scroll"),
        "the focus shows"
    );
    press(&mut app, &[key(KeyCode::Down), key(KeyCode::Down)]);
    assert_ne!(details_top(&app), before, "Details scrolled");
    assert_eq!(app.selected(), selected, "the tree selection did not move");
    // Devices: ten rows in a panel of fewer; scrolling shows the later ones.
    press(&mut app, &[key(KeyCode::Tab)]);
    let screen = frame(&app, 80, 24);
    assert!(screen.contains("Devices · ↑↓ scroll"), "{screen}");
    // The focused panel's border is thick.
    let gpu7 = |screen: &str| screen.contains("│gpu:7 ") || screen.contains("┃gpu:7 ");
    assert!(!gpu7(&screen), "{screen}");
    press(
        &mut app,
        &[
            key(KeyCode::Down),
            key(KeyCode::Down),
            key(KeyCode::Down),
            key(KeyCode::Down),
        ],
    );
    let screen = frame(&app, 80, 24);
    assert!(gpu7(&screen), "scrolled to the later devices:\n{screen}");
    // Back to the tree: ↓ moves the selection again.
    press(&mut app, &[key(KeyCode::Tab), key(KeyCode::Down)]);
    assert_ne!(app.selected(), selected);
}

#[test]
fn the_wheel_scrolls_the_panel_under_the_pointer() {
    let m = mixed_model();
    let mut app = ten_devices(&m);
    resized(&mut app, 80, 24);
    let areas = devmap::tui::layout::areas(
        ratatui::layout::Rect::new(0, 0, 80, 24),
        app.progress_rows(),
        app.device_rows(),
    );
    let wheel = |app: &mut App, column: u16, row: u16| {
        drive(
            app,
            [mouse(MouseEvent {
                kind: MouseEventKind::ScrollDown,
                column,
                row,
                modifiers: KeyModifiers::NONE,
            })],
        );
    };
    let selected = app.rows.selected;
    wheel(&mut app, areas.devices.x + 3, areas.devices.y + 2);
    assert_eq!(app.devices_scroll, 3, "the Devices panel scrolled");
    assert_eq!(app.rows.selected, selected, "not the tree");
    wheel(&mut app, areas.details.x + 3, areas.details.y + 2);
    assert_eq!(app.details_scroll, 3);
    wheel(&mut app, areas.tree.x + 3, areas.tree.y + 3);
    assert_eq!(
        app.rows.selected,
        selected + 3,
        "over the tree, the selection moves"
    );
}

#[test]
fn tab_completes_paths_then_moves_on() {
    let m = mixed_model();
    let base = m.out("places");
    std::fs::create_dir_all(base.join("alpha_dir")).expect("mkdir");
    std::fs::create_dir_all(base.join("beta")).expect("mkdir");
    std::fs::write(base.join("alpine.txt"), "x").expect("file");
    std::fs::write(base.join(".hidden"), "x").expect("file");
    let mut app = app_for(&m);
    press(&mut app, &[ch('s'), key(KeyCode::Tab), ctrl('u')]);
    let typed = format!("{}/al", base.display());
    press(&mut app, &text(&typed));
    let out = |app: &App| match &app.mode {
        Mode::SaveDialog(d) => (d.out.clone(), d.field),
        _ => panic!("dialog"),
    };
    press(&mut app, &[key(KeyCode::Tab)]);
    assert_eq!(
        out(&app),
        (format!("{}/alp", base.display()), Field::Output),
        "as far as they agree"
    );
    // Tab again on an ambiguous prefix: the candidates are named, and the keys after
    // it still land in this field.
    press(&mut app, &[key(KeyCode::Tab)]);
    assert_eq!(
        out(&app),
        (format!("{}/alp", base.display()), Field::Output)
    );
    let said = app
        .message
        .as_ref()
        .map(|m| m.text.clone())
        .unwrap_or_default();
    assert_eq!(said, "Tab: alpha_dir/  alpine.txt");
    // Shift-Tab goes back a field, and Tab forward again.
    press(&mut app, &[key(KeyCode::BackTab)]);
    assert_eq!(out(&app).1, Field::ShardSize);
    press(&mut app, &[key(KeyCode::Tab)]);
    assert_eq!(out(&app).1, Field::Output);
    press(&mut app, &[ch('h'), key(KeyCode::Tab)]);
    assert_eq!(
        out(&app).0,
        format!("{}/alpha_dir/", base.display()),
        "one folder: with its slash"
    );
    // Nothing left to complete: Tab moves to the next field.
    press(&mut app, &[key(KeyCode::Tab)]);
    assert_eq!(out(&app).1, Field::Dtype);
    // The export path completes too; hidden entries only for a prefix with a dot.
    press(&mut app, &[key(KeyCode::Esc), ch('w'), ctrl('u')]);
    press(&mut app, &text(&format!("{}/b", base.display())));
    press(&mut app, &[key(KeyCode::Tab)]);
    let Mode::Export(d) = &app.mode else {
        panic!("export")
    };
    assert_eq!(d.path, format!("{}/beta/", base.display()));
    press(&mut app, &[ctrl('u')]);
    press(&mut app, &text(&format!("{}/.h", base.display())));
    press(&mut app, &[key(KeyCode::Tab)]);
    let Mode::Export(d) = &app.mode else {
        panic!("export")
    };
    assert_eq!(d.path, format!("{}/.hidden", base.display()));
}

#[test]
fn the_opening_screen_names_the_model_and_counts_time() {
    let mut terminal = Terminal::new(TestBackend::new(80, 10)).expect("terminal");
    terminal
        .draw(|f| {
            ui::loading(
                f,
                "/models/llama",
                Duration::from_millis(2_345),
                "fetching the headers: 12/160 shards",
            );
        })
        .expect("draw");
    let buffer = terminal.backend().buffer().clone();
    let text: String = (0..10)
        .map(|y| {
            (0..80)
                .map(|x| buffer[(x, y)].symbol().to_owned())
                .collect::<String>()
                + "\n"
        })
        .collect();
    assert!(text.contains("opening /models/llama … 2.3 s"), "{text}");
    assert!(text.contains("q quits"), "{text}");
    // What the loading thread says (a remote model's fetch) shows under it.
    assert!(
        text.contains("fetching the headers: 12/160 shards"),
        "{text}"
    );
}

/// The focused panel shows it twice: a thick border marked `▶` (without colour too) and,
/// in colour, a cyan border; the others keep a plain one.
#[test]
fn the_focused_panel_has_a_marked_thick_border_in_colour_and_without() {
    let m = mixed_model();
    for color in [true, false] {
        let mut app = app_for(&m);
        app.color = color;
        let b = buffer(&app, 120, 40);
        assert_eq!(b[(0, 1)].symbol(), "┏", "the tree's corner");
        let cyan = b[(0, 1)].fg == ratatui::style::Color::Cyan;
        assert_eq!(cyan, color, "colour {color}");
        press(&mut app, &[key(KeyCode::Tab)]);
        let b = buffer(&app, 120, 40);
        assert_eq!(b[(0, 1)].symbol(), "┌", "the tree gave the focus away");
        let screen = frame(&app, 120, 40);
        assert!(screen.contains("▶ Details"), "{screen}");
    }
}
