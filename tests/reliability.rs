//! Nothing lost: saves that race for one output folder, a commit that fails at any
//! step, names taken by folders or FIFOs, non-UTF-8 file names, and device maps whose
//! weights exist nowhere. Each case was seen to lose or mix data before.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use common::{Stored, arg, mixed_model, read_saved, snapshot, stderr};
use devmap::fixtures::{FixtureTensor, write_json, write_offload_dat};
use devmap::model::{LoadOptions, load};
use devmap::save::{Reporter, SaveOptions, prepare, write};
use devmap::types::DType;

/// Files a save leaves while it runs; none may remain after it ends.
fn unfinished(out: &Path) -> Vec<String> {
    std::fs::read_dir(out)
        .map(|r| {
            r.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".devmap-partial") || n.ends_with(".devmap-old"))
                .collect()
        })
        .unwrap_or_default()
}

/// OUT's entries with their kind and, for regular files, their bytes; a FIFO is never
/// opened (reading it would block).
fn listing(out: &Path) -> BTreeMap<PathBuf, (String, Vec<u8>)> {
    let mut all = BTreeMap::new();
    let mut stack = vec![out.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("ls").filter_map(Result::ok) {
            let path = e.path();
            let kind = e.file_type().expect("type");
            let bytes = if kind.is_file() {
                std::fs::read(&path).expect("read")
            } else {
                Vec::new()
            };
            if kind.is_dir() {
                stack.push(path.clone());
            }
            all.insert(path, (format!("{kind:?}"), bytes));
        }
    }
    all
}

#[test]
fn a_save_is_refused_while_another_holds_the_output_folder() {
    let m = mixed_model();
    let out = m.out("o");
    std::fs::create_dir(&out).expect("mkdir");
    // What a running save holds: an exclusive lock on the folder itself.
    let held = std::fs::File::open(&out).expect("open out");
    held.try_lock().expect("lock");
    let o = common::save(&m.dir, &out, &["--force"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("another devmap save is writing into"), "{err}");
    assert_eq!(
        std::fs::read_dir(&out).expect("ls").count(),
        0,
        "wrote nothing"
    );
    drop(held);
    let o = common::save(&m.dir, &out, &["--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(read_saved(&out), m.expected);
}

#[test]
fn racing_saves_leave_one_complete_save_never_a_mix() {
    let m = mixed_model();
    // Two different results: A reads the offload folder (sharded), B ignores it (one
    // file), so their disk-offloaded tensors differ.
    let empty_offload = m.out("no-offload");
    std::fs::create_dir(&empty_offload).expect("mkdir");
    let a_extra = ["--force", "--max-shard-size", "700"];
    let b_extra = ["--force", "--offload-folder", arg(&empty_offload)];
    let reference = |name: &str, extra: &[&str]| {
        let out = m.out(name);
        let o = common::save(&m.dir, &out, extra);
        assert!(o.status.success(), "{}", stderr(&o));
        read_saved(&out)
    };
    let a = reference("ref-a", &a_extra);
    let b = reference("ref-b", &b_extra);
    assert_ne!(a, b, "fixture: the two saves must differ");

    for round in 0..8 {
        let out = m.out(&format!("race-{round}"));
        let spawn = |extra: &[&str]| {
            common::save_command(&m.dir, &out, extra)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        };
        let first = spawn(&a_extra);
        let second = spawn(&b_extra);
        let results = [
            first.wait_with_output().expect("wait"),
            second.wait_with_output().expect("wait"),
        ];
        let succeeded = results.iter().filter(|o| o.status.success()).count();
        assert!(succeeded >= 1, "round {round}: neither save succeeded");
        for o in results.iter().filter(|o| !o.status.success()) {
            let err = stderr(o);
            assert!(
                err.contains("another devmap save is writing")
                    || err.contains("or one still running"),
                "round {round}: a failed save must say another one runs: {err}"
            );
        }
        assert_eq!(unfinished(&out), Vec::<String>::new(), "round {round}");
        let saved = read_saved(&out);
        assert!(
            saved == a || saved == b,
            "round {round}: OUT holds neither save whole"
        );
        let single = out.join("model.safetensors").exists();
        let indexed = out.join("model.safetensors.index.json").exists();
        assert!(single != indexed, "round {round}: both layouts in OUT");
    }
}

/// Saves `m` once with `first` shard size, then again with `second` and `--force`,
/// failing the second save's commit at every rename in turn.
fn commit_fails_at_every_step(first: u64, second: u64) {
    let m = mixed_model();
    let out = m.out("o");
    let ckpt = load(&m.dir, &LoadOptions::default()).expect("load");
    let cancel = AtomicBool::new(false);
    let run = |options: &SaveOptions| {
        let plan = prepare(&ckpt, options)?;
        write(
            &ckpt,
            &plan,
            options,
            &cancel,
            &Reporter::new(None, &cancel),
        )
    };
    let earlier = SaveOptions {
        max_shard_size: first,
        ..SaveOptions::new(&out)
    };
    run(&earlier).expect("earlier save");
    // The earlier save, told apart from the new one by an extra file in the index.
    let before = snapshot(&out);
    let mut step = 0;
    loop {
        let options = SaveOptions {
            max_shard_size: second,
            force: true,
            commit_fault: Some(step),
            ..SaveOptions::new(&out)
        };
        match run(&options) {
            Ok(_) => break,
            Err(e) => {
                assert!(e.to_string().contains("injected failure"), "{e}");
                assert_eq!(
                    snapshot(&out),
                    before,
                    "a failure at rename {step} must leave the earlier save as it was"
                );
            }
        }
        step += 1;
        assert!(step < 200, "the commit never succeeded");
    }
    // Every file of both saves was moved at least once, each a step that failed.
    assert!(step >= 4, "only {step} steps were exercised");
    assert_eq!(read_saved(&out), m.expected);
    assert_eq!(unfinished(&out), Vec::<String>::new());
}

#[test]
fn a_failed_commit_over_a_sharded_save_restores_it_whole() {
    commit_fails_at_every_step(700, 5_000_000_000);
}

#[test]
fn a_failed_commit_over_a_single_file_save_restores_it_whole() {
    commit_fails_at_every_step(5_000_000_000, 700);
}

#[test]
fn names_taken_by_a_folder_or_fifo_are_refused_before_writing() {
    let m = mixed_model();
    for (name, make) in [
        ("config.json", "dir"),
        ("model.safetensors", "fifo"),
        ("tokenizer.json", "dir"),
    ] {
        let out = m.out(&format!("taken-{name}"));
        let o = common::save(&m.dir, &out, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let target = out.join(name);
        std::fs::remove_file(&target).expect("rm");
        if make == "dir" {
            std::fs::create_dir(&target).expect("mkdir");
            std::fs::write(target.join("inside"), b"keep me").expect("w");
        } else {
            let ok = std::process::Command::new("mkfifo")
                .arg(&target)
                .status()
                .expect("mkfifo")
                .success();
            assert!(ok, "mkfifo");
        }
        let before = listing(&out);
        let o = common::save(&m.dir, &out, &["--force"]);
        assert!(!o.status.success(), "{name}: must refuse");
        let err = stderr(&o);
        assert!(
            err.contains(&format!("{name} exists and is not a regular file")),
            "{err}"
        );
        assert_eq!(listing(&out), before, "{name}: OUT must be untouched");
        assert_eq!(unfinished(&out), Vec::<String>::new());
    }
}

#[test]
fn files_whose_names_differ_only_in_non_utf8_bytes_are_both_copied() {
    let m = mixed_model();
    let names: [&[u8]; 2] = [b"notes-\xff.txt", b"notes-\xfe.txt"];
    for (i, name) in names.iter().enumerate() {
        std::fs::write(m.dir.join(OsStr::from_bytes(name)), format!("note {i}")).expect("w");
    }
    let out = m.out("o");
    let o = common::save(&m.dir, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    for (i, name) in names.iter().enumerate() {
        let copied = std::fs::read(out.join(OsStr::from_bytes(name))).expect("copied");
        assert_eq!(copied, format!("note {i}").as_bytes());
    }
    assert_eq!(unfinished(&out), Vec::<String>::new());
    assert_eq!(read_saved(&out), m.expected);
}

/// A device map over a whole model whose checkpoint is gone: only the disk-offloaded
/// layer has data.
fn model_without_checkpoint() -> (tempfile::TempDir, PathBuf, BTreeMap<String, Stored>) {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("model");
    std::fs::create_dir(&dir).expect("mkdir");
    let offloaded = vec![
        FixtureTensor::patterned("model.layers.1.proj.weight", DType::F16, &[8, 8], 3),
        FixtureTensor::patterned("model.layers.1.norm.weight", DType::F32, &[8], 4),
    ];
    write_offload_dat(&dir.join("offload"), &offloaded).expect("offload");
    write_json(
        &dir.join("device_map.json"),
        &serde_json::json!({
            "model.embed_tokens": 0,
            "model.layers.0": "cpu",
            "model.layers.1": "disk",
            "model.rotary_emb": 0,
        }),
    )
    .expect("map");
    let expected = offloaded
        .iter()
        .map(|t| (t.name.clone(), Stored::of(t)))
        .collect();
    (tmp, dir, expected)
}

#[test]
fn a_map_whose_weights_exist_nowhere_is_refused_unless_allowed() {
    let (tmp, dir, expected) = model_without_checkpoint();
    let out = tmp.path().join("out");
    let o = common::save(&dir, &out, &[]);
    assert!(!o.status.success(), "an almost empty save must be refused");
    let err = stderr(&o);
    assert!(
        err.contains("2 device-map keys cover no tensor that has data")
            && err.contains("`model.embed_tokens`")
            && err.contains("`model.layers.0`")
            && err.contains("--allow-partial"),
        "{err}"
    );
    // The layer that has data, and the parameter-free rotary embedding, are not named.
    assert!(
        !err.contains("`model.layers.1`") && !err.contains("rotary"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");

    let o = common::save(&dir, &out, &["--allow-partial"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(read_saved(&out), expected);
}

/// The pre-flight's reasons are typed: a caller (the inspector, the Python package)
/// acts on the kind, not on the words.
#[test]
fn the_preflight_names_each_refusal_by_its_kind() {
    use devmap::save::{Refusal, SaveError, SaveOptions};
    let m = common::mixed_model();
    let ckpt = devmap::model::load::load(&m.dir, &devmap::model::load::LoadOptions::default())
        .expect("loads");
    let out = m.out("typed-out");
    std::fs::create_dir(&out).expect("mkdir");
    std::fs::write(out.join("notes.txt"), b"mine").expect("write");
    let refusals = |options: &SaveOptions| match devmap::save::prepare(&ckpt, options) {
        Err(SaveError::Refused(reasons)) => reasons,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        refusals(&SaveOptions::new(&out)),
        vec![Refusal::NotEmpty {
            out: out.clone(),
            entries: 1
        }]
    );
    std::fs::write(out.join("model.safetensors.devmap-partial"), b"").expect("write");
    let mut forced = SaveOptions::new(&out);
    forced.force = true;
    assert!(
        matches!(
            refusals(&forced).as_slice(),
            [Refusal::Unfinished { files: 1, .. }]
        ),
        "{:?}",
        refusals(&forced)
    );
    let inside = SaveOptions::new(m.dir.join("saved"));
    assert!(
        matches!(refusals(&inside).as_slice(), [Refusal::OutInModel { .. }]),
        "{:?}",
        refusals(&inside)
    );
}
