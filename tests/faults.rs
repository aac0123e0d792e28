//! Faults during a save: a full disk, a killed process, cancels at many points, inputs
//! that change underneath, an output folder that cannot be written. Each must leave no
//! shard behind, keep earlier contents of the output folder, and say what happened.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{devmap, mixed_model, read_saved, snapshot, stderr};
use devmap::model::{LoadOptions, load};
use devmap::save::{Reporter, SaveError, SaveEvent, SaveJob, SaveOptions, prepare, write};

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `devmap save` of a big model in 4 MB shards, one at a time, that pauses once its
/// first tensor is written (the `DEVMAP_TEST_PAUSE` hook) for as long as the returned
/// pause file exists.
fn spawn_slow_save(dir: &Path, out: &Path, stderr: Stdio) -> (std::process::Child, PathBuf) {
    let pause = out.with_extension("pause");
    std::fs::write(&pause, b"").expect("pause file");
    let child = Command::new(env!("CARGO_BIN_EXE_devmap"))
        .env("DEVMAP_TEST_PAUSE", &pause)
        .args([
            "save",
            dir.to_str().expect("p"),
            "--out",
            out.to_str().expect("p"),
            "--max-shard-size",
            "4MB",
            "-j",
            "1",
            "-q",
        ])
        .stderr(stderr)
        .spawn()
        .expect("spawn");
    (child, pause)
}

/// Waits until a running save is paused with a shard half written.
fn wait_for_partial_file(child: &mut std::process::Child, out: &Path, pause: &Path) {
    let start = Instant::now();
    let mut reached = pause.as_os_str().to_os_string();
    reached.push(".reached");
    while !Path::new(&reached).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no partial file appeared"
        );
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the save finished too early to be interrupted"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        names_in(out).iter().any(|n| n.ends_with(".devmap-partial")),
        "paused without a partial file"
    );
}

#[test]
fn disk_full_mid_shard_removes_partial_files_and_keeps_earlier_content() {
    let m = mixed_model();
    let out = m.out("o");
    std::fs::create_dir(&out).expect("mkdir");
    std::fs::write(out.join("README.md"), "earlier content").expect("w");
    // RLIMIT_FSIZE of 4 KiB (8 blocks of 512 bytes): the first shard past it fails
    // with EFBIG, as a full disk fails with ENOSPC. SIGXFSZ is ignored so the write
    // returns the error instead of killing the process.
    let script = format!(
        "ulimit -f 8; trap '' XFSZ; exec '{}' save '{}' --out '{}' --force --max-shard-size 100KB -q",
        env!("CARGO_BIN_EXE_devmap"),
        m.dir.display(),
        out.display()
    );
    let before = snapshot(&m.dir);
    let o = Command::new("sh")
        .args(["-c", &script])
        .output()
        .expect("sh");
    let err = stderr(&o);
    assert!(!o.status.success(), "the save must fail: {err}");
    assert!(
        err.contains("devmap-partial") && err.contains("File too large"),
        "{err}"
    );
    assert_eq!(
        names_in(&out),
        vec!["README.md".to_owned()],
        "only the earlier content is left"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("README.md")).expect("r"),
        "earlier content"
    );
    assert_eq!(snapshot(&m.dir), before);
}

#[test]
fn killed_mid_save_leaves_only_marked_partial_files_and_the_next_run_says_so() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("big");
    common::big_model(&dir, 4, 8, 4); // 128 MiB
    let out = tmp.path().join("out");
    let (mut child, pause) = spawn_slow_save(&dir, &out, Stdio::null());
    wait_for_partial_file(&mut child, &out, &pause);
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let left = names_in(&out);
    assert!(!left.is_empty());
    for name in &left {
        assert!(
            name.ends_with(".devmap-partial"),
            "a killed save left `{name}` under a final name"
        );
    }
    // The next run does not take them for shards: it names them and says what to do.
    let o = devmap(&[
        "save",
        dir.to_str().expect("p"),
        "--out",
        out.to_str().expect("p"),
        "-q",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("interrupted save")
            && err.contains(".devmap-partial")
            && err.contains("delete them"),
        "{err}"
    );
    // After deleting them, the save goes through.
    for name in &left {
        std::fs::remove_file(out.join(name)).expect("rm");
    }
    let o = devmap(&[
        "save",
        dir.to_str().expect("p"),
        "--out",
        out.to_str().expect("p"),
        "--force",
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn cancel_from_the_tui_at_many_points() {
    use devmap::tui::app::{Action, App, Effect, Outcome};
    let m = mixed_model();
    for cancel_after in [0usize, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 1000] {
        let ckpt = load(&m.dir, &LoadOptions::default()).expect("load");
        let mut app = App::new(ckpt);
        let out = m.out(&format!("cancel-{cancel_after}"));
        app.handle(Action::OpenSave);
        app.handle(Action::ClearField);
        app.handle(Action::Input('1'));
        app.handle(Action::NextField);
        app.handle(Action::ClearField);
        for c in out.to_str().expect("p").chars() {
            app.handle(Action::Input(c));
        }
        let mut effects = app.handle(Action::Submit);
        let Some(Effect::StartSave {
            ckpt,
            plan,
            options,
        }) = effects.pop()
        else {
            panic!("no save started for {cancel_after}")
        };
        // Reporting through a rendezvous channel: the writers wait for this thread at
        // every shard, so "cancel after N events" means the same thing on a fast
        // machine and a slow one.
        let job = SaveJob::spawn_with_channel(ckpt, plan, options, 0).expect("spawn");
        let mut seen = 0;
        loop {
            if seen == cancel_after {
                // Esc, then y: the UI asks, then cancels.
                app.handle(Action::Close);
                for e in app.handle(Action::Yes) {
                    if matches!(e, Effect::CancelSave) {
                        job.cancel();
                    }
                }
                // The UI still answers while the save winds down.
                app.handle(Action::Down);
            }
            let event = job
                .events
                .recv_timeout(Duration::from_secs(10))
                .expect("an event within 10 s: no deadlock");
            let last = matches!(
                event,
                SaveEvent::Finished(_) | SaveEvent::Failed(_) | SaveEvent::Cancelled
            );
            app.handle(Action::Save(event));
            seen += 1;
            if last {
                break;
            }
        }
        let result = job.join();
        match app.save.as_ref().and_then(|s| s.outcome.clone()) {
            Some(Outcome::Cancelled) => {
                assert!(matches!(result, Err(SaveError::Cancelled)));
                assert!(
                    !out.exists() || names_in(&out).is_empty(),
                    "cancel at {cancel_after} left {:?}",
                    names_in(&out)
                );
            }
            Some(Outcome::Done(_)) => {
                assert!(
                    cancel_after > 60,
                    "finished although cancelled after {cancel_after} events"
                );
                assert_eq!(read_saved(&out), m.expected);
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
}

#[test]
fn an_input_truncated_or_rewritten_during_the_save_stops_it() {
    for how in ["truncate", "rewrite"] {
        let m = mixed_model();
        let ckpt = Arc::new(load(&m.dir, &LoadOptions::default()).expect("load"));
        let options = SaveOptions {
            max_shard_size: 1000,
            ..SaveOptions::new(m.out("o"))
        };
        let plan = prepare(&ckpt, &options).expect("plan");
        // Another process changes a shard after devmap opened the model.
        let victim = m.dir.join("model-00002-of-00003.safetensors");
        let len = std::fs::metadata(&victim).expect("m").len();
        if how == "truncate" {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&victim)
                .expect("o")
                .set_len(len / 2)
                .expect("t");
        } else {
            // The same bytes written again: only the modification time tells, set
            // explicitly rather than waited for.
            let modified = std::fs::metadata(&victim)
                .expect("m")
                .modified()
                .expect("mtime");
            let bytes = std::fs::read(&victim).expect("r");
            std::fs::write(&victim, bytes).expect("w");
            std::fs::File::options()
                .write(true)
                .open(&victim)
                .expect("o")
                .set_modified(modified + Duration::from_secs(5))
                .expect("touch");
        }
        let cancel = std::sync::atomic::AtomicBool::new(false);
        let err = write(
            &ckpt,
            &plan,
            &options,
            &cancel,
            &Reporter::new(None, &cancel),
        )
        .expect_err("must stop");
        let text = err.to_string();
        assert!(
            matches!(err, SaveError::SourceChanged { .. }),
            "{how}: {text}"
        );
        assert!(
            text.contains("model-00002-of-00003.safetensors") && text.contains("changed"),
            "{how}: {text}"
        );
        // It says what changed.
        let what = if how == "truncate" {
            "its size went from"
        } else {
            "its modification time changed"
        };
        assert!(text.contains(what), "{how}: {text}");
        assert!(!m.out("o").exists(), "{how}: output left behind");
    }
}

/// Writability is asked of the file system, not read from mode bits: a 0555 folder
/// is refused exactly when this process cannot create a file in it (root can), and
/// the test asks the file system the same question as its oracle.
#[test]
fn an_output_folder_is_refused_exactly_when_it_cannot_be_written() {
    use std::os::unix::fs::PermissionsExt;
    let m = mixed_model();
    let out = m.out("ro");
    std::fs::create_dir(&out).expect("mkdir");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    let probe = out.join("oracle-probe");
    let writable = std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(&probe);
    let o = devmap(&[
        "save",
        m.dir.to_str().expect("p"),
        "--out",
        out.to_str().expect("p"),
        "-q",
    ]);
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).expect("chmod back");
    if writable {
        assert!(
            o.status.success(),
            "a folder this process can write: {}",
            stderr(&o)
        );
        assert_eq!(read_saved(&out), m.expected);
    } else {
        refused_as_unwritable(&o, &out);
    }
}

/// The save failed before writing anything into `out`, saying it cannot create files
/// there.
fn refused_as_unwritable(o: &std::process::Output, out: &std::path::Path) {
    assert!(!o.status.success(), "{}", stderr(o));
    assert!(
        stderr(o).contains("cannot create files in"),
        "{}",
        stderr(o)
    );
    assert!(names_in(out).is_empty());
}

/// A 0755 folder owned by root, saved into by another user: refused before writing
/// (mode bits alone said "not read-only").
#[test]
#[ignore = "needs root to run devmap as another user (CI runs as root)"]
fn a_folder_owned_by_another_user_is_refused_before_writing() {
    use std::os::unix::fs::PermissionsExt;
    let m = mixed_model();
    // The model must be readable by `nobody`.
    fn open_up(p: &std::path::Path) {
        let dir = p.is_dir();
        let mode = if dir { 0o755 } else { 0o644 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        if dir {
            for e in std::fs::read_dir(p).expect("ls") {
                open_up(&e.expect("entry").path());
            }
        }
    }
    // A copy of the binary `nobody` can reach: the build folder may sit where only root
    // can (CI keeps it in root's home).
    let binary = m.tmp.path().join("devmap");
    std::fs::copy(env!("CARGO_BIN_EXE_devmap"), &binary).expect("copy the binary");
    open_up(m.tmp.path());
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = m.out("roots");
    std::fs::create_dir(&out).expect("mkdir");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let o = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(&binary)
        .args([
            "save",
            m.dir.to_str().expect("p"),
            "--out",
            out.to_str().expect("p"),
            "-q",
        ])
        .output()
        .expect("runuser");
    refused_as_unwritable(&o, &out);
}

#[test]
fn sigterm_cancels_a_cli_save_cleanly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("big");
    common::big_model(&dir, 4, 8, 4);
    let out = tmp.path().join("out");
    let (mut child, pause) = spawn_slow_save(&dir, &out, Stdio::piped());
    wait_for_partial_file(&mut child, &out, &pause);
    let pid = child.id().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    let o = child.wait_with_output().expect("wait");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cancelled"), "{err}");
    assert!(
        !out.exists() || names_in(&out).is_empty(),
        "left {:?}",
        names_in(&out)
    );
}
