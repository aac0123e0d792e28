//! Journeys through the inspector's real runtime (event loop, ticks, effects, worker
//! and save threads), scripted, on a virtual clock, drawn on `TestBackend`.

use super::*;
use crate::common::journey::paste;

fn dialog(app: &App) -> &devmap::tui::app::SaveDialog {
    match &app.mode {
        Mode::SaveDialog(d) => d,
        other => panic!("the save dialog is not open: {other:?}"),
    }
}

/// The bug the App-only tests hid: the runtime dropped the effects of its ticks, so the
/// debounced preview never started and the dialog said `checking…` forever.
#[test]
fn typing_a_shard_size_updates_the_preview_once_the_keys_stop() {
    let m = mixed_model();
    let mut app = bare_app(&m);
    let first = press(&mut app, &[ch('s')]);
    assert!(first.contains("1 shard"), "{first}");
    let mut keys = vec![ctrl('u')];
    keys.extend(text("1KB"));
    let typed = press(&mut app, &keys);
    assert_eq!(dialog(&app).size, "1KB");
    // Nothing but time passes: the runtime's tick starts the preview on a thread and
    // the result lands.
    let _ = typed;
    let after = wait(&mut app, Duration::from_secs(1));
    let d = dialog(&app);
    assert!(d.preview_pending.is_none() && d.preview_due.is_none());
    let shards = d.preview.shard_sizes.len();
    assert!(shards > 3, "{shards} shards for 1KB\n{after}");
    assert!(!after.contains("checking"), "{after}");
    assert!(after.contains(&format!("→ {shards} shard")), "{after}");
}

#[test]
fn a_save_and_its_verification_run_on_their_threads_to_the_end() {
    let m = mixed_model();
    let mut app = bare_app(&m);
    let out = m.out("saved-through-the-runtime");
    let mut keys = vec![ch('s'), ctrl('u')];
    keys.extend(text("1KB"));
    keys.push(key(KeyCode::Tab));
    keys.push(ctrl('u'));
    keys.extend(text(out.to_str().expect("path")));
    press(&mut app, &keys);
    assert_eq!(dialog(&app).field, Field::Output);
    // Enter before the preview's quiet time: the save starts from a fresh check.
    let done = drive(
        &mut app,
        [
            Step::Wait(Duration::from_millis(500)),
            press_step(key(KeyCode::Enter)),
        ],
    );
    let save = app.save.as_ref().expect("a save ran");
    assert!(
        matches!(save.outcome, Some(Outcome::Done(_))),
        "{:?}\n{}",
        save.outcome,
        screen(&done)
    );
    assert!(save.shards.len() > 3, "{}", save.shards.len());
    assert_eq!(read_saved(&out), m.expected);
    let screen_text = screen(&done);
    assert!(screen_text.contains("v verify"), "{screen_text}");

    let verified = press(&mut app, &[ch('v')]);
    assert!(verified.contains("verified"), "{verified}");
    assert!(verified.contains("no differences"), "{verified}");
}

#[test]
fn a_paste_is_one_edit_of_the_open_field_and_never_runs_as_keys() {
    let m = mixed_model();
    let mut app = bare_app(&m);
    let map_before = app.ckpt.device_map.clone();
    // `/` then a paste of `layers.3⏎dq`: the text is the query, the line break and the
    // letters after it do not move a layer or open the quit prompt.
    let screen_text = screen(&drive(
        &mut app,
        [press_step(ch('/')), paste("layers.3\ndq")],
    ));
    assert_eq!(app.mode, Mode::Search("layers.3dq".into()), "{screen_text}");
    assert_eq!(app.ckpt.device_map, map_before);
    assert!(!app.quitting);
    press(&mut app, &[key(KeyCode::Esc)]);
    // Outside a text field a paste does nothing but say so.
    let ignored = screen(&drive(&mut app, [paste("dddq")]));
    assert_eq!(app.mode, Mode::Browse);
    assert_eq!(app.ckpt.device_map, map_before);
    assert!(ignored.contains("paste ignored"), "{ignored}");
    // In the save dialog's path field it lands at the cursor, as typed text would.
    press(&mut app, &[ch('s'), key(KeyCode::Tab), ctrl('u')]);
    drive(&mut app, [paste("/tmp/pasted\r\n-out")]);
    assert_eq!(dialog(&app).out, "/tmp/pasted-out");
}

#[test]
fn keys_pressed_while_a_retotal_runs_wait_for_it_and_then_apply() {
    let m = mixed_model();
    let mut app = bare_app(&m);
    press(&mut app, &[ch('j'), ch('j')]);
    let selected = app.selected();
    // `d` starts a re-total on a worker; `u` comes while it runs and waits for it.
    drive(&mut app, [press_now(ch('D')), press_now(ch('u'))]);
    assert!(app.busy.is_none(), "the work landed");
    assert_eq!(app.selected(), selected);
    assert!(app.undo.is_empty(), "u undid the d");
    assert_eq!(app.redo.len(), 1);
}

/// "Edited" means different from the map as opened (or last exported): `d` then `u`
/// is no edit, and `q` quits without asking.
#[test]
fn an_edit_taken_back_is_no_edit() {
    let m = mixed_model();
    let mut app = bare_app(&m);
    let edited = press(&mut app, &[ch('j'), ch('D')]);
    assert!(app.map_edited());
    assert!(edited.contains("map edited"), "{edited}");
    let undone = press(&mut app, &[ch('u')]);
    assert!(!app.map_edited());
    assert!(!undone.contains("map edited"), "{undone}");
    press(&mut app, &[ch('q')]);
    assert!(
        app.quitting,
        "q asked although nothing was edited: {:?}",
        app.mode
    );
}

/// A device that a plan empties keeps its row in the Devices panel, at 0 B: rows do not
/// jump while the map is edited.
#[test]
fn a_device_emptied_by_a_plan_keeps_its_row() {
    let m = mixed_model();
    let mut app = bare_app(&m);
    let before = press(&mut app, &[]);
    for device in ["gpu:0", "cpu", "disk"] {
        assert!(
            before.contains(&format!("│{device} ")),
            "{device}:\n{before}"
        );
    }
    let mut keys = vec![ch('p'), ctrl('u')];
    keys.extend(text("cpu=1GB"));
    // Enter plans, a second Enter accepts the preview.
    keys.push(key(KeyCode::Enter));
    keys.push(key(KeyCode::Enter));
    let after = press(&mut app, &keys);
    assert!(
        app.tree.nodes[0]
            .split
            .iter()
            .all(|(p, _)| p.to_string() == "cpu"),
        "the plan put everything on cpu: {:?}",
        app.tree.nodes[0].split
    );
    let row = |device: &str| {
        after
            .lines()
            .find(|l| l.contains(&format!("│{device} ")) || l.contains(&format!("┃{device} ")))
            .map(str::to_owned)
    };
    for device in ["gpu:0", "disk"] {
        let line = row(device).unwrap_or_else(|| panic!("{device} lost its row:\n{after}"));
        assert!(line.contains(" 0 B "), "{line}");
    }
}

/// The help overlay on a screen shorter than it: it says there is more, and scrolls to
/// its last line.
#[test]
fn the_help_overlay_scrolls_on_a_short_screen() {
    let m = mixed_model();
    let mut app = bare_app(&m);
    app.size = (80, 24);
    let first = press(&mut app, &[ch('?')]);
    assert!(first.contains("more (↑↓ scroll)"), "{first}");
    assert!(!first.contains("Esc closes"), "{first}");
    let last = press(&mut app, &[key(KeyCode::PageDown), key(KeyCode::PageDown)]);
    assert!(last.contains("mouse wheel scrolls · Esc closes"), "{last}");
    assert!(last.contains("above"), "{last}");
    press(&mut app, &[key(KeyCode::Esc)]);
    assert_eq!(app.mode, Mode::Browse);
}

/// A search query longer than the status line scrolls: the cursor and the match count
/// stay on screen.
#[test]
fn a_long_search_query_keeps_its_cursor_and_count_in_view() {
    let m = mixed_model();
    let mut app = bare_app(&m);
    app.size = (80, 24);
    let mut keys = vec![ch('/')];
    keys.extend(text(&"layers".repeat(20)));
    let screen = press(&mut app, &keys);
    let status = screen.lines().last().expect("status line").to_owned();
    assert!(status.starts_with("/…"), "{status}");
    assert!(status.contains("s▏"), "the cursor: {status}");
    assert!(status.contains("0 matches"), "the count: {status}");
    // The cursor moved to the start: the start shows, the end is marked cut.
    let screen = press(&mut app, &[key(KeyCode::Home)]);
    let status = screen.lines().last().expect("status line").to_owned();
    assert!(status.starts_with("/▏layers"), "{status}");
    assert!(status.contains("…   0 matches"), "{status}");
}

/// Every view at the three sizes users run in (60×16 is the smallest the layout takes),
/// reached through the runtime. The snapshots are read for text cut mid-word or
/// mid-number, and kept.
#[test]
fn every_view_at_three_sizes() {
    let m = mixed_model();
    let out = m.out("snap-out");
    type Keys = Vec<ratatui::crossterm::event::KeyEvent>;
    let views: Vec<(&str, Keys)> = vec![
        ("browse", vec![ch('j'), ch('j')]),
        ("search", {
            let mut k = vec![ch('/')];
            k.extend(text("proj"));
            k
        }),
        ("save_dialog", vec![ch('s')]),
        ("export", vec![ch('w')]),
        ("help", vec![ch('?')]),
        ("warnings", vec![ch('!')]),
        ("plan", vec![ch('p')]),
        ("plan_preview", {
            let mut k = vec![ch('p'), ctrl('u')];
            k.extend(text("0=4KB,cpu=4KB"));
            k.push(key(KeyCode::Enter));
            k
        }),
        ("quit_asks", vec![ch('j'), ch('D'), ch('q')]),
        ("saved", {
            let mut k = vec![ch('s'), ctrl('u')];
            k.extend(text("2KB"));
            k.push(key(KeyCode::Tab));
            k.push(ctrl('u'));
            k.extend(text(out.to_str().expect("path")));
            k.push(key(KeyCode::Enter));
            k
        }),
    ];
    for (width, height) in [(60u16, 16u16), (80, 24), (100, 30)] {
        for (name, keys) in &views {
            let _ = std::fs::remove_dir_all(&out);
            let mut app = bare_app(&m);
            app.size = (width, height);
            let screen = press(&mut app, keys);
            // The output path varies per run: name it the same in every snapshot.
            let screen = screen.replace(out.to_str().expect("path"), "OUT");
            let dir = m.dir.to_str().expect("path").to_owned();
            let screen = screen.replace(&dir, "MODEL");
            insta::assert_snapshot!(format!("view_{name}_{width}x{height}"), screen);
        }
    }
}

#[test]
fn the_title_says_a_quantized_checkpoint_is_quantized() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("fp8");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let w = devmap::fixtures::FixtureTensor::patterned(
        "model.layers.0.mlp.down_proj.weight",
        devmap::types::DType::F8E4M3,
        &[4, 4],
        1,
    );
    let s = devmap::fixtures::FixtureTensor::patterned(
        "model.layers.0.mlp.down_proj.weight_scale_inv",
        devmap::types::DType::F32,
        &[1, 1],
        2,
    );
    devmap::fixtures::write_safetensors(&dir.join("model.safetensors"), &[&w, &s])
        .expect("weights");
    devmap::fixtures::write_json(
        &dir.join("config.json"),
        &serde_json::json!({"quantization_config": {"quant_method": "fp8"}}),
    )
    .expect("config");
    let mut app = App::new(load(&dir, &LoadOptions::default()).expect("load"));
    app.size = (100, 20);
    let shown = wait(&mut app, Duration::from_millis(50));
    let title = shown.lines().next().unwrap_or_default();
    assert!(title.contains("· fp8 quantized"), "{shown}");
}
