//! Hostile inputs and environments that used to hang, panic, abort or mislead: special
//! files where files are expected, closed and full output streams, huge names and
//! metadata, control characters in names, thousands of offload files, hard links.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{arg, devmap, mixed_model, read_saved, stderr, stdout};
use devmap::fixtures::{FixtureTensor, write_json, write_offload_dat, write_safetensors};
use devmap::types::DType;

/// Runs devmap and fails the test if it has not finished within `secs`: the point of
/// several tests here is that devmap does not hang.
fn devmap_within(args: &[&str], secs: u64) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_devmap"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            panic!("devmap {args:?} still running after {secs} s: it hangs");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

/// `devmap save DIR --out OUT ARGS` run by a shell after `setup` (a limit, a
/// redirection), as a user's shell would.
fn shell_save(setup: &str, dir: &Path, out: &Path, args: &str, redirect: &str) -> Output {
    let script = format!(
        "{setup} exec '{}' save '{}' --out '{}' {args} {redirect}",
        env!("CARGO_BIN_EXE_devmap"),
        dir.display(),
        out.display()
    );
    Command::new("bash")
        .args(["-c", &script])
        .output()
        .expect("bash")
}

/// What a folder holds (nothing when it does not exist).
fn entries(dir: &Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .map(|r| r.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default()
}

fn mkfifo(path: &Path) {
    let ok = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo")
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

#[test]
fn special_files_where_files_are_expected_are_refused_without_hanging() {
    let m = mixed_model();
    // --device-map naming a FIFO nobody writes to.
    let fifo = m.out("map.fifo");
    mkfifo(&fifo);
    let o = devmap_within(&["inspect", arg(&m.dir), "--device-map", arg(&fifo)], 20);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("FIFO"), "{}", stderr(&o));

    // config.json and device_map.json that are folders: never taken for "absent".
    // A config that is a folder is an error; the map is optional, so the model opens
    // without it with a warning naming it (issue 40), and a save refuses.
    for name in ["config.json", "device_map.json"] {
        let tmp = tempfile::tempdir().expect("tmp");
        let t = FixtureTensor::patterned("w", DType::F32, &[2], 1);
        write_safetensors(&tmp.path().join("model.safetensors"), &[&t]).expect("w");
        std::fs::create_dir(tmp.path().join(name)).expect("mkdir");
        let o = devmap_within(&["inspect", arg(tmp.path())], 20);
        let said = format!("{}{}", stdout(&o), stderr(&o));
        assert!(said.contains(name) && said.contains("a folder"), "{said}");
        if name == "config.json" {
            assert!(!o.status.success(), "{name} as a folder must be refused");
        } else {
            assert!(o.status.success(), "{said}");
            let out = tmp.path().join("out");
            let o = devmap_within(&["save", arg(tmp.path()), "--out", arg(&out)], 20);
            assert!(!o.status.success(), "a save with an unreadable map refuses");
        }
    }

    // A shard that is a FIFO.
    let tmp = tempfile::tempdir().expect("tmp");
    mkfifo(&tmp.path().join("model.safetensors"));
    let o = devmap_within(&["inspect", arg(tmp.path())], 20);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("FIFO"), "{}", stderr(&o));

    // An offload `.dat` that is a folder: found when the model is opened, before
    // any save writes.
    let m = mixed_model();
    let dat = m.dir.join("offload/model.scale.dat");
    std::fs::remove_file(&dat).expect("rm");
    std::fs::create_dir(&dat).expect("mkdir");
    let out = m.out("o");
    let o = devmap_within(&["save", arg(&m.dir), "--out", arg(&out), "-q"], 20);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("model.scale.dat") && err.contains("not a regular file"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
}

#[test]
fn closed_and_full_output_streams_end_quietly_without_a_panic() {
    let m = mixed_model();
    // `devmap inspect --json | head -c 10`: the reader goes away early.
    let script = format!(
        "'{}' inspect '{}' --json | head -c 10 >/dev/null; echo \"status=${{PIPESTATUS[0]}}\"",
        env!("CARGO_BIN_EXE_devmap"),
        m.dir.display()
    );
    let big = m.out("long-report");
    // A long report, so the pipe closes while devmap still writes.
    let names: Vec<FixtureTensor> = (0..3000)
        .map(|i| FixtureTensor::patterned(&format!("block.{i}.w"), DType::U8, &[1], i))
        .collect();
    std::fs::create_dir(&big).expect("mkdir");
    write_safetensors(
        &big.join("model.safetensors"),
        &names.iter().collect::<Vec<_>>(),
    )
    .expect("w");
    let script = script.replace(&m.dir.display().to_string(), &big.display().to_string());
    let o = Command::new("bash")
        .args(["-c", &format!("{script}; true")])
        .output()
        .expect("bash");
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
    let status = stdout(&o);
    assert!(
        status.contains("status=1"),
        "a closed pipe is a quiet failure, not a signal or a panic: {status} {err}"
    );

    // stderr on a full device during a save: no abort, a non-zero exit, and the save
    // is cancelled (it could not tell anyone what it did).
    let out = m.out("full");
    let o = shell_save("", &m.dir, &out, "--max-shard-size 700", "2>/dev/full");
    assert_eq!(o.status.code(), Some(1), "no signal, no abort: {o:?}");
    let left = entries(&out);
    assert!(left.is_empty(), "a cancelled save left {left:?}");
}

#[test]
fn control_characters_in_names_never_reach_the_terminal_raw() {
    let tmp = tempfile::tempdir().expect("tmp");
    let evil = "model.\x1b]0;pwned\x07\nerror: forged.\u{202e}weight";
    let t = FixtureTensor::patterned(evil, DType::F32, &[2], 1);
    let plain = FixtureTensor::patterned("model.plain.weight", DType::F32, &[2], 2);
    write_safetensors(&tmp.path().join("model.safetensors"), &[&t, &plain]).expect("w");
    // Unmapped, so the name also appears in a warning.
    write_json(
        &tmp.path().join("device_map.json"),
        &serde_json::json!({"model.plain": "cpu"}),
    )
    .expect("map");
    let o = devmap(&["inspect", arg(tmp.path()), "--depth", "9"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for raw in ['\x1b', '\x07', '\u{202e}'] {
        assert!(!text.contains(raw), "raw {raw:?} in the report:\n{text}");
    }
    assert!(
        !text.lines().any(|l| l.starts_with("error: forged")),
        "{text}"
    );
    assert!(
        text.contains("\\x1b]0;pwned\\x07\\nerror: forged.\\u{202e}weight"),
        "{text}"
    );
    // --json stays exact: JSON escaping is enough there.
    let o = devmap(&["inspect", arg(tmp.path()), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let names: Vec<&str> = v["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert!(names.contains(&evil), "{names:?}");
    // Error messages escape names too: a save refused for the unmapped tensor's
    // missing data is not what we test here, so force an error naming it.
    let offload = tmp.path().join("offload");
    std::fs::create_dir(&offload).expect("mkdir");
    write_json(
        &offload.join("index.json"),
        &serde_json::json!({ evil: {"dtype": "float32", "shape": [3]} }),
    )
    .expect("index");
    let o = devmap(&["inspect", arg(tmp.path())]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        !err.contains('\x1b') && !err.contains('\u{202e}'),
        "{err:?}"
    );
    assert!(
        !err.lines().any(|l| l.starts_with("error: forged")),
        "{err}"
    );
}

#[test]
fn a_70000_character_name_is_reported() {
    let tmp = tempfile::tempdir().expect("tmp");
    let long = format!("model.{}.weight", "x".repeat(70_000));
    let t = FixtureTensor::patterned(&long, DType::U8, &[1], 1);
    write_safetensors(&tmp.path().join("model.safetensors"), &[&t]).expect("w");
    let o = devmap(&["inspect", arg(tmp.path())]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(&"x".repeat(70_000)));
}

#[test]
fn offload_folders_accelerate_really_writes_are_saved() {
    // An empty tensor has no `.dat` (numpy cannot map an empty file), and a big model
    // has thousands of `.dat` files: more than a low open-file limit.
    let m = mixed_model();
    let many: Vec<FixtureTensor> = (0..3000)
        .map(|i| FixtureTensor::patterned(&format!("extra.{i}.w"), DType::U8, &[3], 7 + i))
        .collect();
    let empty = FixtureTensor::patterned("extra.empty", DType::F32, &[0, 4], 9);
    let folder = m.dir.join("offload");
    let mut all = many.clone();
    all.push(empty.clone());
    // The mixed model's own offload entries stay; the new ones join them.
    let index_path = folder.join("index.json");
    let mut index: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&index_path).expect("r")).expect("json");
    let extra = m.out("extra");
    write_offload_dat(&extra, &all).expect("dat");
    let extra_index: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(extra.join("index.json")).expect("r"))
            .expect("json");
    for (k, v) in extra_index {
        index.insert(k, v);
    }
    write_json(&index_path, &serde_json::Value::Object(index)).expect("index");
    for t in &many {
        std::fs::rename(
            extra.join(format!("{}.dat", t.name)),
            folder.join(format!("{}.dat", t.name)),
        )
        .expect("mv");
    }
    // No `.dat` for the empty tensor.
    let _ = std::fs::remove_file(folder.join("extra.empty.dat"));
    let out = m.out("o");
    let o = shell_save(
        "ulimit -n 256;",
        &m.dir,
        &out,
        "--max-shard-size 2KB -q",
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = read_saved(&out);
    for t in all.iter().chain(std::iter::once(&empty)) {
        assert_eq!(saved[&t.name].data, t.data, "{}", t.name);
    }
}

#[test]
fn a_tensor_named_metadata_is_refused_before_writing() {
    let m = mixed_model();
    let folder = m.dir.join("offload");
    let index_path = folder.join("index.json");
    let mut index: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&index_path).expect("r")).expect("json");
    index.insert(
        "__metadata__".into(),
        serde_json::json!({"dtype": "uint8", "shape": [2]}),
    );
    write_json(&index_path, &serde_json::Value::Object(index)).expect("index");
    std::fs::write(folder.join("__metadata__.dat"), [1u8, 2]).expect("dat");
    let out = m.out("o");
    let o = devmap(&["save", arg(&m.dir), "--out", arg(&out), "-q"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("named `__metadata__`"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
}

#[test]
fn json_inputs_over_the_size_cap_are_refused_without_reading_them() {
    let m = mixed_model();
    let huge = m.out("huge-map.json");
    let f = std::fs::File::create(&huge).expect("create");
    // Sparse: a gigabyte on paper, nothing on disk.
    f.set_len(1 << 30).expect("set_len");
    let o = devmap_within(&["inspect", arg(&m.dir), "--device-map", arg(&huge)], 20);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("is 1 GiB (1073741824 bytes), over the 64 MiB"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn plan_out_through_a_hard_link_to_the_input_map_is_refused() {
    let m = mixed_model();
    let link = m.out("linked-map.json");
    std::fs::hard_link(m.dir.join("device_map.json"), &link).expect("link");
    let before = std::fs::read(&link).expect("r");
    let o = devmap(&[
        "plan",
        arg(&m.dir),
        "--max-memory",
        "cpu=1GB",
        "--out",
        arg(&link),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("is the input device map"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&link).expect("r"), before);
}

#[test]
fn each_progress_line_names_its_own_shard() {
    let m = mixed_model();
    let out = m.out("o");
    let o = devmap(&[
        "save",
        arg(&m.dir),
        "--out",
        arg(&out),
        "--max-shard-size",
        "600",
        "--jobs",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let wrote: Vec<&str> = err.lines().filter(|l| l.contains("wrote ")).collect();
    assert!(wrote.len() > 3, "{err}");
    for line in &wrote {
        // `  wrote model-0000K-of-0000N.safetensors (K/N)`
        let name = line.split_whitespace().nth(1).expect("name");
        let k: usize = name[6..11].parse().expect("K");
        assert!(line.ends_with(&format!("({k}/{})", wrote.len())), "{line}");
    }
    let mut names: Vec<&str> = wrote
        .iter()
        .map(|l| l.split_whitespace().nth(1).expect("name"))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), wrote.len(), "a shard named twice: {err}");
}

#[test]
fn offload_entries_sharing_bytes_are_not_a_tie_and_shape_changes_are_named() {
    let tmp = tempfile::tempdir().expect("tmp");
    let a_w = FixtureTensor::patterned("a.w", DType::F32, &[2, 2], 1);
    let b_w = FixtureTensor::patterned("b.w", DType::F32, &[2, 2], 2);
    let c_w = FixtureTensor::patterned("c.w", DType::F32, &[2, 2], 3);
    write_safetensors(&tmp.path().join("model.safetensors"), &[&a_w, &b_w, &c_w]).expect("w");
    let offload = tmp.path().join("offload");
    std::fs::create_dir(&offload).expect("mkdir");
    // a.w and b.w both point at one tensor of another file (zeros look alike too).
    let shared = FixtureTensor::patterned("x", DType::F32, &[2, 2], 9);
    write_safetensors(&offload.join("values.safetensors"), &[&shared]).expect("w");
    // c.w comes back as a .dat of another shape.
    let c_new = FixtureTensor::patterned("c.w", DType::F32, &[4], 4);
    std::fs::write(offload.join("c.w.dat"), &c_new.data).expect("dat");
    write_json(
        &offload.join("index.json"),
        &serde_json::json!({
            "a.w": {"safetensors_file": "values.safetensors", "weight_name": "x", "dtype": "float32"},
            "b.w": {"safetensors_file": "values.safetensors", "weight_name": "x", "dtype": "float32"},
            "c.w": {"dtype": "float32", "shape": [4]},
        }),
    )
    .expect("index");
    let v = {
        let o = devmap(&["inspect", arg(tmp.path()), "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).expect("json")
    };
    assert_eq!(
        v["ties"],
        serde_json::json!([]),
        "no tie without config or --tie"
    );
    let kinds: Vec<(&str, serde_json::Value)> = v["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .map(|w| (w["kind"].as_str().expect("kind"), w["names"].clone()))
        .collect();
    assert!(
        kinds.contains(&("shared_offload_bytes", serde_json::json!(["a.w", "b.w"]))),
        "{kinds:?}"
    );
    let shape = v["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .find(|w| w["kind"] == "offload_shape_differs")
        .expect("a shape warning");
    assert!(
        shape["message"]
            .as_str()
            .is_some_and(|m| m.contains("[4]") && m.contains("[2, 2]")),
        "{shape}"
    );
    // Saved: both names, each with the shared value.
    let elsewhere = tempfile::tempdir().expect("tmp");
    let out = elsewhere.path().join("out");
    let o = devmap(&["save", arg(tmp.path()), "--out", arg(&out), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = read_saved(&out);
    assert_eq!(saved["a.w"].data, shared.data);
    assert_eq!(saved["b.w"].data, shared.data);
    assert_eq!(saved["c.w"].shape, vec![4]);
    // Tied on request: no warning, written once.
    let o = devmap(&["inspect", arg(tmp.path()), "--json", "--tie", "b.w=a.w"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert!(
        !v["warnings"]
            .as_array()
            .expect("warnings")
            .iter()
            .any(|w| w["kind"] == "shared_offload_bytes"),
        "{}",
        v["warnings"]
    );
}

#[test]
fn a_full_disk_while_copying_config_files_names_the_output() {
    let m = mixed_model();
    // Shards of under 4 KiB fit the file-size limit; a 100 KB tokenizer does not.
    std::fs::write(m.dir.join("tokenizer.json"), vec![b'x'; 100_000]).expect("w");
    let out = m.out("o");
    let o = shell_save(
        "ulimit -f 8; trap '' XFSZ;",
        &m.dir,
        &out,
        "--max-shard-size 1KB -q",
        "",
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.contains(&out.display().to_string()) && first.contains("tokenizer.json"),
        "the error must name the output file, not the input: {err}"
    );
    assert!(!first.contains(&m.dir.display().to_string()), "{err}");
    let left = entries(&out);
    assert!(left.is_empty(), "a failed save left {left:?}");
}

#[test]
fn a_source_that_became_unreadable_is_found_before_writing() {
    use devmap::model::{LoadOptions, load};
    use devmap::save::{SaveOptions, prepare};
    let m = mixed_model();
    let ckpt = load(&m.dir, &LoadOptions::default()).expect("load");
    // After the model was opened, an offload file is swapped for a folder (as root,
    // permissions cannot make a file unreadable; this is the case a test can make).
    let dat = m.dir.join("offload/model.norm.weight.dat");
    std::fs::remove_file(&dat).expect("rm");
    std::fs::create_dir(&dat).expect("mkdir");
    let out = m.out("o");
    let err = prepare(&ckpt, &SaveOptions::new(&out))
        .expect_err("must refuse")
        .to_string();
    assert!(
        err.contains("model.norm.weight.dat") && err.contains("a folder"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
}

/// A stderr that is a non-blocking pipe, full for a moment (another process shares it
/// and set O_NONBLOCK, as test harnesses do): the error message waits for room instead
/// of being dropped, so a non-zero exit always says why.
#[test]
fn a_full_non_blocking_stderr_still_gets_the_reason() {
    let script = r#"
import os, subprocess, sys, time
devmap, missing = sys.argv[1], sys.argv[2]
r, w = os.pipe()
os.set_blocking(w, False)
filled = 0
try:
    while True:
        filled += os.write(w, b"x" * 4096)
except BlockingIOError:
    pass
p = subprocess.Popen([devmap, "inspect", missing], stderr=w, stdout=subprocess.DEVNULL)
os.close(w)
time.sleep(0.5)
data = b""
while True:
    chunk = os.read(r, 65536)
    if not chunk:
        break
    data += chunk
p.wait()
print(data[filled:].decode(errors="replace"))
print("status=%d" % p.returncode)
"#;
    let missing = std::env::temp_dir().join("devmap-no-such-model-here");
    let o = Command::new("python3")
        .args(["-c", script, env!("CARGO_BIN_EXE_devmap")])
        .arg(&missing)
        .output()
        .expect("python3");
    let said = stdout(&o);
    assert!(said.contains("status=1"), "{said}\n{}", stderr(&o));
    assert!(
        said.contains("error:") && said.contains("devmap-no-such-model-here"),
        "the reason was dropped: {said}"
    );
}
