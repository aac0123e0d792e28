//! The save dialog, its preview and checks, a real save, cancelling and quitting while
//! one runs, and verifying it.

use super::*;

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
            "model.embed_tokens.weight".to_owned(),
            "config"
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
    ) -> Vec<devmap::save::Refusal> {
        self.checks
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if options.out == self.nonempty && !options.force {
            vec![devmap::save::Refusal::NotEmpty {
                out: options.out.clone(),
                entries: 1,
            }]
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
    // The typed refusal, in the inspector's words: its key, not the CLI's flag.
    assert_eq!(d.preview.errors.len(), 1, "{:?}", d.preview.errors);
    assert!(
        d.preview.errors[0]
            .contains("/nonexistent/devmap-test/full is not empty (1 entry); press Ctrl-O"),
        "{:?}",
        d.preview.errors
    );
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
    assert_eq!(d.preview.cast_to, Some(devmap::types::DType::F32));
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
    let t = FixtureTensor::patterned("w", devmap::types::DType::F32, &[2], 1);
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
        .find(|t| &*t.name == "model.layers.2.proj.weight")
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

#[test]
fn the_preview_remembers_the_inputs_and_starting_a_save_opens_them_again() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('s')]);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(d.preview.errors.is_empty(), "{:?}", d.preview.errors);
    // An offload file goes after the first preview. Previews after edits reuse what
    // the first found (opening every input again cost 75 ms a preview on a big
    // offload folder); starting the save opens them again and refuses.
    let dat = std::fs::read_dir(m.dir.join("offload"))
        .expect("offload folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|e| e == "dat")
                && std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
        })
        .expect("a .dat file with data");
    std::fs::remove_file(&dat).expect("remove");
    press(&mut app, &[ctrl('u')]);
    press(&mut app, &text("1MB"));
    settle(&mut app);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(d.preview.errors.is_empty(), "{:?}", d.preview.errors);
    let out = m.out("after-removal");
    press(&mut app, &[key(KeyCode::Tab), ctrl('u')]);
    press(&mut app, &text(out.to_str().expect("utf-8")));
    settle(&mut app);
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(
        app.save.is_none(),
        "a save whose input is gone must not start"
    );
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("the dialog stays, with the reason")
    };
    let name = dat
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    assert!(
        d.preview.errors.iter().any(|e| e.contains(&name)),
        "{name} not named in {:?}",
        d.preview.errors
    );
    assert!(!out.exists(), "nothing written");
}

/// The inspector opens every input file once as it opens, off the UI thread (and builds
/// the planner's view), so the first save preview is as quick as later ones: a file
/// that goes after the inspector opened is not seen by the first preview either (it
/// was, before the opening work), and starting the save still finds it.
#[test]
fn the_inputs_are_opened_as_the_inspector_opens_and_again_when_a_save_starts() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let dat = std::fs::read_dir(m.dir.join("offload"))
        .expect("offload folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|e| e == "dat")
                && std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
        })
        .expect("a .dat file with data");
    std::fs::remove_file(&dat).expect("remove");
    let out = m.out("opened-first");
    press(&mut app, &[ch('s'), key(KeyCode::Tab), ctrl('u')]);
    press(&mut app, &text(out.to_str().expect("utf-8")));
    settle(&mut app);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(d.preview.errors.is_empty(), "{:?}", d.preview.errors);
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(
        app.save.is_none(),
        "a save whose input is gone must not start"
    );
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("the dialog stays, with the reason")
    };
    let name = dat
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    assert!(
        d.preview.errors.iter().any(|e| e.contains(&name)),
        "{name} not named in {:?}",
        d.preview.errors
    );
    assert!(!out.exists(), "nothing written");
}

/// Consent to overwrite belongs to one folder (issue 38): Ctrl-O given for one
/// non-empty folder, then the dialog closed, or its path changed to another folder
/// holding a model, asks again; nothing is written into the second folder.
#[test]
fn overwrite_consent_is_bound_to_the_folder_it_was_given_for() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let first = m.out("first");
    std::fs::create_dir(&first).expect("mkdir");
    std::fs::write(first.join("notes.txt"), "x").expect("w");
    // A second folder that holds a model: what a stray overwrite would destroy.
    let second = m.out("second");
    std::fs::create_dir(&second).expect("mkdir");
    std::fs::copy(
        m.dir.join("config.json"),
        second.join("model.safetensors.index.json"),
    )
    .expect("cp");
    let before = common::snapshot(&second);
    let set_out = |app: &mut App, path: &std::path::Path| {
        if matches!(&app.mode, Mode::SaveDialog(d) if d.field == Field::ShardSize) {
            press(app, &[key(KeyCode::Tab)]);
        }
        press(app, &[ctrl('u')]);
        press(app, &text(path.to_str().expect("p")));
        settle(app);
    };
    press(&mut app, &[ch('s')]);
    set_out(&mut app, &first);
    press(&mut app, &[ctrl('o')]);
    settle(&mut app);
    assert!(matches!(&app.mode, Mode::SaveDialog(d) if d.overwrites()));
    // Esc, then the dialog again with another folder.
    press(&mut app, &[key(KeyCode::Esc), ch('s')]);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(!d.overwrites(), "consent does not outlive the dialog");
    assert_eq!(d.out, first.to_str().expect("p"), "the path is remembered");
    set_out(&mut app, &second);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(d.preview.offer_overwrite, "asks again: {:?}", d.preview);
    assert!(
        d.preview.errors.iter().any(|e| e.contains("not empty")),
        "{:?}",
        d.preview.errors
    );
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(app.save.is_none(), "nothing starts");
    // Ctrl-O for one folder, then the path edited to another: asks again there too.
    set_out(&mut app, &first);
    press(&mut app, &[ctrl('o')]);
    settle(&mut app);
    assert!(matches!(&app.mode, Mode::SaveDialog(d) if d.overwrites()));
    set_out(&mut app, &second);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(!d.overwrites() && d.preview.offer_overwrite);
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(app.save.is_none(), "nothing starts");
    assert_eq!(
        common::snapshot(&second),
        before,
        "the second folder is untouched"
    );
}

/// A shard size typed as a bare number is bytes, as transformers reads it; the preview
/// asks whether megabytes were meant (issue 40).
#[test]
fn a_bare_number_as_the_shard_size_gets_a_did_you_mean() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('s'), ctrl('u')]);
    press(&mut app, &text("100"));
    settle(&mut app);
    let Mode::SaveDialog(d) = &app.mode else {
        panic!("dialog")
    };
    assert!(
        d.preview
            .warnings
            .iter()
            .any(|w| w.contains("did you mean 100MB")),
        "{:?}",
        d.preview.warnings
    );
}
