//! A save split over processes (`--part K/N`, then `--commit N`): byte-identical to a
//! single save of an offload folder; parts racing on one OUT; a part killed mid-write
//! and rerun; a commit while a part still writes, or with a part missing, or over the
//! parts of another model: refused by name, nothing published. (DCP, ZeRO-3 and
//! torchrun's `--part auto` are in tests/real/parts.rs.)

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{mixed_model, stderr};

/// `devmap save` in 1 KB shards (the fixture then needs several), as the common
/// helper runs it.
fn part_save(dir: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut command = common::save_command(dir, out, &["--max-shard-size", "1KB"]);
    command.args(extra);
    command
}

fn save(dir: &Path, out: &Path, extra: &[&str]) -> Output {
    part_save(dir, out, extra).output().expect("devmap")
}

/// Every file of `dir` (not the parts folder) with its bytes, by name.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect();
    v.sort();
    v
}

fn published(out: &Path) -> bool {
    out.join("config.json").exists() || out.join("model.safetensors.index.json").exists()
}

#[test]
fn four_parts_and_a_commit_write_exactly_what_one_save_writes() {
    let m = mixed_model();
    let single = m.out("single");
    let o = save(&m.dir, &single, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let split = m.out("split");
    for k in 1..=4 {
        let o = save(&m.dir, &split, &["--part", &format!("{k}/4")]);
        assert!(o.status.success(), "part {k}: {}", stderr(&o));
        assert!(!published(&split), "part {k} published something");
    }
    // The commit verifies what it publishes against the sources, as a save does.
    let o = save(&m.dir, &split, &["--commit", "4", "--verify"]);
    assert!(o.status.success(), "commit: {}", stderr(&o));
    let shards = files(&single)
        .iter()
        .filter(|(n, _)| n.ends_with(".safetensors"))
        .count();
    assert!(
        shards >= 4,
        "the fixture should need several shards: {shards}"
    );
    assert_eq!(files(&single), files(&split));
    assert!(
        !split.join(devmap::save::parts::PARTS_DIR).exists(),
        "the parts folder is cleared after the commit"
    );
    common::read_saved(&split);
}

#[test]
fn parts_racing_on_one_out_commit_to_the_single_save() {
    let m = mixed_model();
    let single = m.out("single");
    assert!(save(&m.dir, &single, &[]).status.success());
    let split = m.out("split");
    let children: Vec<_> = (1..=4)
        .map(|k| {
            part_save(&m.dir, &split, &["--part", &format!("{k}/4")])
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for c in children {
        let o = c.wait_with_output().expect("wait");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = save(&m.dir, &split, &["--commit", "4"]);
    assert!(o.status.success(), "commit: {}", stderr(&o));
    assert_eq!(files(&single), files(&split));
}

/// Part `k` of 2 as a child that pauses once its first tensor is written (the
/// `DEVMAP_TEST_PAUSE` hook), and the pause file that holds it there.
fn paused_part(dir: &Path, out: &Path, k: u32) -> (std::process::Child, PathBuf) {
    let pause = out.with_extension(format!("pause{k}"));
    std::fs::write(&pause, b"").expect("pause file");
    let child = part_save(dir, out, &["-j", "1", "--part", &format!("{k}/2")])
        .env("DEVMAP_TEST_PAUSE", &pause)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut reached = pause.as_os_str().to_os_string();
    reached.push(".reached");
    let start = Instant::now();
    while !Path::new(&reached).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the part never paused"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    (child, pause)
}

#[test]
fn a_commit_while_a_part_writes_is_refused_and_a_killed_part_reruns() {
    let m = mixed_model();
    let single = m.out("single");
    assert!(save(&m.dir, &single, &[]).status.success());
    let split = m.out("split");
    assert!(save(&m.dir, &split, &["--part", "1/2"]).status.success());
    let (mut writing, pause) = paused_part(&m.dir, &split, 2);
    // Part 2 holds its folder: the commit must not publish half of it.
    let o = save(&m.dir, &split, &["--commit", "2"]);
    assert!(
        !o.status.success(),
        "a commit during a part's write went through"
    );
    assert!(
        stderr(&o).contains("part 2/2") && stderr(&o).contains("still writing"),
        "{}",
        stderr(&o)
    );
    assert!(!published(&split));
    // SIGKILL mid-write: nothing of it may count, and a rerun of that part alone
    // finishes the save.
    writing.kill().expect("kill");
    writing.wait().expect("wait");
    let _ = std::fs::remove_file(&pause);
    let o = save(&m.dir, &split, &["--commit", "2"]);
    assert!(
        !o.status.success() && stderr(&o).contains("part 2/2"),
        "{}",
        stderr(&o)
    );
    assert!(!published(&split));
    let o = save(&m.dir, &split, &["--part", "2/2"]);
    assert!(o.status.success(), "rerun of part 2: {}", stderr(&o));
    let o = save(&m.dir, &split, &["--commit", "2"]);
    assert!(o.status.success(), "commit: {}", stderr(&o));
    assert_eq!(files(&single), files(&split));
}

#[test]
fn parts_of_another_model_are_never_published_together() {
    let a = mixed_model();
    let b = mixed_model();
    // The same tensors with other values: another model, another plan.
    let config = b.dir.join("config.json");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, text.replace('{', "{\"note\": 1, ")).expect("config");
    let shard = std::fs::read_dir(&b.dir)
        .expect("dir")
        .map(|e| e.expect("e").path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .expect("a shard");
    let mut bytes = std::fs::read(&shard).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&shard, bytes).expect("write");

    let out = a.out("shared");
    assert!(save(&a.dir, &out, &["--part", "1/2"]).status.success());
    // B's part 2 into A's OUT: refused, naming the other save's parts.
    let o = save(&b.dir, &out, &["--part", "2/2"]);
    assert!(
        !o.status.success(),
        "a part of another model was written beside A's"
    );
    assert!(
        stderr(&o).contains("parts of another save"),
        "{}",
        stderr(&o)
    );
    // A's commit with its part 2 missing: refused by name.
    let o = save(&a.dir, &out, &["--commit", "2"]);
    assert!(
        !o.status.success() && stderr(&o).contains("part 2/2"),
        "{}",
        stderr(&o)
    );
    assert!(!published(&out));
    // B cannot commit A's part either.
    let o = save(&b.dir, &out, &["--commit", "2"]);
    assert!(
        !o.status.success() && stderr(&o).contains("part 1/2"),
        "{}",
        stderr(&o)
    );
    assert!(!published(&out));
}

#[test]
fn part_numbers_are_checked_and_verify_waits_for_the_commit() {
    let m = mixed_model();
    let out = m.out("o");
    for bad in ["0/2", "3/2", "2", "x/y"] {
        let o = save(&m.dir, &out, &["--part", bad]);
        assert!(!o.status.success(), "--part {bad} was taken");
    }
    let o = save(&m.dir, &out, &["--part", "1/2", "--verify"]);
    assert!(!o.status.success(), "--verify with --part was taken");
    let o = Command::new(env!("CARGO_BIN_EXE_devmap"))
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SLURM_PROCID")
        .env_remove("SLURM_NTASKS")
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .args([
            "save",
            m.dir.to_str().expect("p"),
            "--out",
            out.to_str().expect("p"),
            "--part",
            "auto",
        ])
        .output()
        .expect("devmap");
    assert!(
        !o.status.success() && stderr(&o).contains("RANK/WORLD_SIZE"),
        "{}",
        stderr(&o)
    );
}
