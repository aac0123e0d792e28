//! devmap in a real terminal: tmux runs it on a generated model, keys go in with
//! `send-keys`, the screen comes back with `capture-pane`. Ignored in a bare
//! `cargo test`; CI installs tmux and runs them with `--include-ignored`, where a
//! missing tmux fails them loudly.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{mixed_model, read_saved};

struct Tmux {
    socket: String,
}

/// Starts `script` under `sh -c` in a fresh tmux server of its own.
fn start(tag: &str, script: &str) -> Tmux {
    let tmux = Tmux {
        socket: format!("devmap-{tag}-{}", std::process::id()),
    };
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "e2e",
        "-x",
        "140",
        "-y",
        "45",
        "sh",
        "-c",
        script,
    ]);
    tmux
}

/// The shell line that runs devmap, then reports its exit code and the tty mode.
fn wrapped(env: &str, args: &str) -> String {
    format!(
        "{env} '{}' {args}; echo DEVMAP-EXIT=$?; stty -a | tr ' ' '\\n' | grep -x -- '-\\?icanon'; sleep 60",
        env!("CARGO_BIN_EXE_devmap")
    )
}

/// `q`: devmap exits 0, and the terminal is as it was.
fn quit_cleanly(tmux: &Tmux) {
    tmux.keys(&["q"]);
    let after = tmux.wait_for("DEVMAP-EXIT=", Duration::from_secs(10));
    assert!(after.contains("DEVMAP-EXIT=0"), "{after}");
    assert_restored(tmux);
}

/// After devmap exited: the tty is back in cooked mode and off the alternate screen.
fn assert_restored(tmux: &Tmux) -> String {
    std::thread::sleep(Duration::from_millis(300));
    let after = tmux.screen();
    let mode = after
        .lines()
        .find(|l| l.trim().ends_with("icanon"))
        .map_or("", str::trim);
    assert_eq!(mode, "icanon", "raw mode was not restored:\n{after}");
    assert!(
        !after.contains("Modules ·"),
        "still on the alternate screen:\n{after}"
    );
    after
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let o = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "e2e"])
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "e2e"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Types text literally.
    fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", "e2e", "-l", text]);
    }

    fn wait_for(&self, what: &str, within: Duration) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if s.contains(what) {
                return s;
            }
            assert!(
                start.elapsed() < within,
                "`{what}` did not appear within {within:?}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

#[test]
#[ignore = "needs tmux (CI installs it)"]
fn inspect_save_and_quit_in_a_real_terminal() {
    let m = mixed_model();
    let out = m.out("from-tui");
    let tmux = start("e2e", &wrapped("", &format!("'{}'", m.dir.display())));

    // The tree, placements and the RAM gauge are on screen.
    // The first memory reading arrives a moment after the first frame.
    tmux.wait_for("Modules", Duration::from_secs(20));
    let screen = tmux.wait_for("free ", Duration::from_secs(5));
    for want in [
        "lm_head", "model", "mixed", "gpu:0", "Devices", "disk", "RAM ", "devmap",
    ] {
        assert!(screen.contains(want), "`{want}` missing:\n{screen}");
    }

    // Open the save dialog, pick a shard size and an output folder, start.
    tmux.keys(&["s"]);
    tmux.wait_for("Save as sharded safetensors", Duration::from_secs(5));
    tmux.keys(&["C-u"]);
    tmux.type_text("2KB");
    tmux.keys(&["Tab", "C-u"]);
    tmux.type_text(out.to_str().expect("utf8"));
    tmux.wait_for("shard", Duration::from_secs(5));
    tmux.keys(&["Enter"]);
    let done = tmux.wait_for("Save — done", Duration::from_secs(30));
    assert!(done.contains("saved") && done.contains("shard"), "{done}");

    // Byte for byte.
    assert_eq!(read_saved(&out), m.expected);
    assert!(
        Path::new(&out)
            .join("model.safetensors.index.json")
            .exists()
    );

    // v reads the save back on its own thread and shows the verdict.
    tmux.keys(&["v"]);
    let verified = tmux.wait_for("Save — done · verified", Duration::from_secs(30));
    assert!(verified.contains("no differences"), "{verified}");

    // Quit; the terminal comes back cooked (icanon, not -icanon) and off the
    // alternate screen.
    quit_cleanly(&tmux);
}

/// `d` opens the device picker in a real terminal; Enter moves the module there.
#[test]
#[ignore = "needs tmux (CI installs it)"]
fn the_device_picker_moves_a_module_in_a_real_terminal() {
    let m = mixed_model();
    let tmux = start("picker", &wrapped("", &format!("'{}'", m.dir.display())));
    tmux.wait_for("Modules", Duration::from_secs(20));
    tmux.keys(&["j", "d"]);
    let picker = tmux.wait_for("Enter move here", Duration::from_secs(5));
    assert!(
        picker.contains("holds now") && picker.contains("with it"),
        "{picker}"
    );
    tmux.keys(&["Enter"]);
    let moved = tmux.wait_for("map edited", Duration::from_secs(5));
    assert!(moved.contains("→"), "{moved}");
    tmux.keys(&["u"]);
    tmux.wait_for("undid", Duration::from_secs(5));
    quit_cleanly(&tmux);
}

/// `devmap MODEL --context N --max-memory SPEC --tp 2` in a real terminal: the Devices
/// panel adds each device's KV cache to its weights and says which device is over, and
/// names the largest GPU of a two-rank vLLM server.
#[test]
#[ignore = "needs tmux (CI installs it)"]
fn the_kv_cache_is_in_the_devices_panel_in_a_real_terminal() {
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo");
    let args = format!(
        "'{}' --context 32768 --max-memory 0=32MiB,1=160MiB,cpu=1GiB --tp 2",
        demo.display()
    );
    let tmux = start("kv", &wrapped("", &args));
    let screen = tmux.wait_for(
        "Devices + KV + act. at 32768 tokens",
        Duration::from_secs(20),
    );
    // gpu:0: 1.4 MiB of weights, 64 MiB of cache (its layers' and the offloaded ones'),
    // 100 MiB of a 32768-token forward's activations; gpu:1 about 133 MiB.
    assert!(
        screen.contains("OVER 32 MiB") && screen.contains("≤ 160 MiB"),
        "{screen}"
    );
    // --tp 2: the largest GPU of that vLLM layout (1.26 MiB + 48 MiB of KV on rank 1).
    assert!(
        screen.contains("vLLM tp 2: largest GPU rank 1 of 2, 49.26 MiB ≤ 160 MiB"),
        "{screen}"
    );
    quit_cleanly(&tmux);
}

/// `f` filters the tree in a real terminal; Esc clears the filter.
#[test]
#[ignore = "needs tmux (CI installs it)"]
fn filter_mode_in_a_real_terminal() {
    let m = mixed_model();
    let tmux = start("filter", &wrapped("", &format!("'{}'", m.dir.display())));
    tmux.wait_for("Modules", Duration::from_secs(20));
    tmux.keys(&["f"]);
    tmux.type_text("dev:disk");
    let typed = tmux.wait_for("filter dev:disk", Duration::from_secs(5));
    assert!(
        !typed.contains("lm_head"),
        "gpu:0's lm_head is filtered out:\n{typed}"
    );
    tmux.keys(&["Enter"]);
    let kept = tmux.wait_for("[filter: dev:disk]", Duration::from_secs(5));
    assert!(kept.contains("disk"), "{kept}");
    tmux.keys(&["Escape"]);
    let cleared = tmux.wait_for("filter cleared", Duration::from_secs(5));
    assert!(cleared.contains("lm_head"), "{cleared}");
    quit_cleanly(&tmux);
}

/// `p` plans and previews, changing nothing until Enter: Esc leaves the map as it
/// was (no `[map edited]`, `q` quits without asking), Enter applies it.
#[test]
#[ignore = "needs tmux (CI installs it)"]
fn a_plan_is_a_preview_until_accepted_in_a_real_terminal() {
    let m = mixed_model();
    let tmux = start("plan", &wrapped("", &format!("'{}'", m.dir.display())));
    tmux.wait_for("Modules", Duration::from_secs(20));
    tmux.keys(&["p"]);
    tmux.wait_for("Plan", Duration::from_secs(5));
    tmux.keys(&["C-u"]);
    tmux.type_text("0=3KB,cpu=3KB");
    tmux.keys(&["Enter"]);
    let preview = tmux.wait_for("not applied", Duration::from_secs(10));
    assert!(preview.contains("would move"), "{preview}");
    assert!(!preview.contains("map edited"), "{preview}");
    tmux.keys(&["Escape"]);
    let discarded = tmux.wait_for("plan discarded", Duration::from_secs(5));
    assert!(!discarded.contains("map edited"), "{discarded}");
    tmux.keys(&["p"]);
    tmux.wait_for("Plan", Duration::from_secs(5));
    tmux.keys(&["C-u"]);
    tmux.type_text("0=3KB,cpu=3KB");
    tmux.keys(&["Enter"]);
    tmux.wait_for("not applied", Duration::from_secs(10));
    tmux.keys(&["Enter"]);
    let applied = tmux.wait_for("applied the plan", Duration::from_secs(5));
    assert!(applied.contains("map edited"), "{applied}");
    tmux.keys(&["u"]);
    tmux.wait_for("undid", Duration::from_secs(5));
    quit_cleanly(&tmux);
}

/// The dialog's preview follows what is typed: the size's new shard count appears
/// once the keys stop (the runtime's tick starts the check; with the samplers stopped,
/// nothing else could wake it). Before, it said `checking…` forever.
#[test]
#[ignore = "needs tmux (CI installs it)"]
fn typing_a_size_in_the_save_dialog_updates_the_preview() {
    let m = mixed_model();
    let tmux = start(
        "preview",
        &wrapped("DEVMAP_DEBUG_NO_TICKS=1", &format!("'{}'", m.dir.display())),
    );
    tmux.wait_for("Modules", Duration::from_secs(20));
    tmux.keys(&["s"]);
    let before = tmux.wait_for("tensors → 1 shard", Duration::from_secs(10));
    assert!(before.contains("Save as sharded safetensors"), "{before}");
    tmux.keys(&["C-u"]);
    tmux.type_text("1KB");
    let start = Instant::now();
    let shards = loop {
        let s = tmux.screen();
        let count = s
            .split("tensors → ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(n) = count.filter(|&n| n > 1)
            && !s.contains("checking")
        {
            break n;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the preview did not follow the typed size:\n{s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(shards > 3, "{shards}");
    // Esc and q apart, so the terminal does not read them as Alt-q.
    tmux.keys(&["Escape"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux.keys(&["q"]);
    tmux.wait_for("DEVMAP-EXIT=0", Duration::from_secs(10));
}

/// Keys 8 ms apart fall inside the 16 ms frame throttle. With the samplers stopped
/// (`DEVMAP_DEBUG_NO_TICKS`) nothing but input wakes the screen, so the last key shows
/// only if the runtime schedules a trailing frame for it — which is what is checked,
/// rather than a wall-clock limit (the time is printed, not asserted).
#[test]
#[ignore = "needs tmux (CI installs it)"]
fn the_last_key_is_drawn_without_a_later_tick() {
    let m = mixed_model();
    let tmux = start(
        "lastkey",
        &wrapped("DEVMAP_DEBUG_NO_TICKS=1", &format!("'{}'", m.dir.display())),
    );
    tmux.wait_for("Modules", Duration::from_secs(20));
    tmux.wait_for("free ", Duration::from_secs(5));
    for round in 0..5 {
        tmux.keys(&["/"]);
        let typed = format!("proj{round}");
        for c in typed.chars() {
            tmux.type_text(&c.to_string());
            std::thread::sleep(Duration::from_millis(8));
        }
        let start = Instant::now();
        tmux.wait_for(&format!("/{typed}▏"), Duration::from_secs(10));
        eprintln!(
            "round {round}: the last key showed {:?} after it was sent (capture-pane polls every 100 ms)",
            start.elapsed()
        );
        tmux.keys(&["Escape"]);
        tmux.wait_for("q quit", Duration::from_secs(10));
    }
    tmux.keys(&["q"]);
    let after = tmux.wait_for("DEVMAP-EXIT=", Duration::from_secs(10));
    assert!(after.contains("DEVMAP-EXIT=0"), "{after}");
}

/// A remote model opens behind the same "opening …" screen as a local one (its fetch
/// progress under the spinner, not printed over the terminal first), then the
/// inspector shows it by its hf:// name.
#[test]
#[ignore = "needs tmux (CI installs it)"]
fn a_remote_model_opens_in_the_inspector() {
    use common::hub_server;
    let m = mixed_model();
    let www = m.dir.parent().expect("parent").join("www");
    hub_server::publish(&www, "acme/tiny", "main", &m.dir).expect("publish");
    let server = hub_server::start(&www, hub_server::ServerOptions::default()).expect("server");
    let tmux = start(
        "remote",
        &wrapped(
            &format!("HF_ENDPOINT='{}'", server.endpoint()),
            "hf://acme/tiny",
        ),
    );
    let screen = tmux.wait_for("Modules", Duration::from_secs(20));
    assert!(screen.contains("hf://acme/tiny"), "{screen}");
    assert!(
        !screen.contains("fetching the headers"),
        "progress belongs to the opening screen, not the inspector:\n{screen}"
    );
    tmux.keys(&["q"]);
    let after = tmux.wait_for("DEVMAP-EXIT=", Duration::from_secs(10));
    assert!(after.contains("DEVMAP-EXIT=0"), "{after}");
    // Nothing was printed over the terminal before the inspector took it.
    assert!(!after.contains("shard headers in"), "{after}");
    assert_restored(&tmux);
}

/// Work that panics on its thread (`DEVMAP_DEBUG_PANIC_WORK=1` makes every piece of it
/// panic) is caught: the inspector stays on screen, says what failed, nothing is
/// printed over it, and `q` still quits.
#[test]
#[ignore = "needs tmux (CI installs it)"]
fn a_panicking_worker_is_reported_in_the_inspector() {
    let m = mixed_model();
    let tmux = start(
        "workpanic",
        &wrapped(
            "DEVMAP_DEBUG_PANIC_WORK=1",
            &format!("'{}'", m.dir.display()),
        ),
    );
    tmux.wait_for("Modules", Duration::from_secs(20));
    tmux.keys(&["j", "D"]);
    let screen = tmux.wait_for("re-totalling failed", Duration::from_secs(10));
    assert!(
        screen.contains("▶ Modules"),
        "still the inspector:\n{screen}"
    );
    assert!(!screen.contains("panicked at"), "{screen}");
    quit_cleanly(&tmux);
}

#[test]
#[ignore = "needs tmux (CI installs it)"]
fn sigterm_and_sighup_restore_the_terminal_and_cancel_the_save() {
    for signal in ["TERM", "HUP"] {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("big");
        std::fs::create_dir(&dir).expect("mkdir");
        // 2 GiB of holes (a sparse file: no disk until copied) in 64 MiB tensors and
        // 256MB shards: seconds of work, so the signal lands mid-save.
        let names: Vec<String> = (0..32)
            .map(|i| format!("model.layers.{i}.weight"))
            .collect();
        let shape = [16u64 << 20];
        let entries: Vec<devmap::formats::safetensors::HeaderEntry<'_>> = names
            .iter()
            .enumerate()
            .map(|(i, n)| devmap::formats::safetensors::HeaderEntry {
                name: n.as_str().into(),
                dtype: devmap::types::DType::F32,
                shape: shape.as_slice().into(),
                begin: (i as u64) << 26,
                end: (i as u64 + 1) << 26,
            })
            .collect();
        let header = devmap::formats::safetensors::encode_header(
            entries.into_iter(),
            &std::collections::BTreeMap::new(),
        );
        let path = dir.join("model.safetensors");
        std::fs::write(&path, &header).expect("write");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open")
            .set_len(header.len() as u64 + (32u64 << 26))
            .expect("sparse");
        let out = tmp.path().join("out");
        let tmux = start(
            &format!("sig{signal}"),
            &wrapped("", &format!("'{}'", dir.display())),
        );
        tmux.wait_for("Modules", Duration::from_secs(20));
        tmux.keys(&["s", "C-u"]);
        tmux.type_text("256MB");
        tmux.keys(&["Tab", "C-u"]);
        tmux.type_text(out.to_str().expect("utf8"));
        tmux.wait_for("shard", Duration::from_secs(5));
        tmux.keys(&["Enter"]);
        tmux.wait_for("Save — running", Duration::from_secs(10));
        let pid = tmux.run(&["list-panes", "-t", "e2e", "-F", "#{pane_pid}"]);
        // The pane runs sh, which runs devmap: signal the child.
        let children = Command::new("pgrep")
            .args(["-P", pid.trim()])
            .output()
            .expect("pgrep");
        let child = String::from_utf8_lossy(&children.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned();
        assert!(!child.is_empty(), "devmap's pid not found");
        Command::new("kill")
            .args([&format!("-{signal}"), &child])
            .status()
            .expect("kill");
        let after = tmux.wait_for("DEVMAP-EXIT=", Duration::from_secs(20));
        assert!(after.contains("DEVMAP-EXIT=0"), "{signal}: {after}");
        assert_restored(&tmux);
        let left: Vec<String> = std::fs::read_dir(&out)
            .map(|r| {
                r.map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "SIG{signal} left {left:?}");
    }
}

#[test]
#[ignore = "needs tmux (CI installs it)"]
fn a_panic_restores_the_terminal_and_prints_the_report() {
    let m = mixed_model();
    // Without a backtrace whatever the machine's RUST_BACKTRACE: the report must fit
    // the pane (the dev profile's line tables name frames color-eyre cannot filter).
    let tmux = start(
        "panic",
        &wrapped(
            "DEVMAP_DEBUG_PANIC=1 RUST_BACKTRACE=0",
            &format!("'{}'", m.dir.display()),
        ),
    );
    let after = tmux.wait_for("DEVMAP-EXIT=", Duration::from_secs(20));
    assert!(
        !after.contains("DEVMAP-EXIT=0"),
        "a panic must exit non-zero: {after}"
    );
    let after = assert_restored(&tmux);
    assert!(
        after.contains("panicking on purpose"),
        "the report is readable after restore:\n{after}"
    );
}

#[test]
#[ignore = "needs tmux (CI installs it)"]
fn a_model_that_cannot_be_opened_restores_the_terminal_and_says_why() {
    let m = mixed_model();
    // A shard the index names is gone: the load (on its own thread, behind the
    // "opening …" screen) fails.
    let shard = std::fs::read_dir(&m.dir)
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .expect("a shard");
    std::fs::remove_file(&shard).expect("rm");
    let tmux = start("broken", &wrapped("", &format!("'{}'", m.dir.display())));
    let after = tmux.wait_for("DEVMAP-EXIT=", Duration::from_secs(20));
    assert!(after.contains("DEVMAP-EXIT=1"), "{after}");
    assert!(after.contains("error: cannot open the model"), "{after}");
    assert!(after.contains("which is missing"), "{after}");
    assert_restored(&tmux);
}

/// TERM=dumb gets the plain report and a note, not escapes and the alternate screen.
#[test]
#[ignore = "needs tmux (CI installs it)"]
fn a_dumb_terminal_gets_the_plain_report() {
    let m = mixed_model();
    let tmux = start(
        "dumb",
        &wrapped("TERM=dumb", &format!("'{}'", m.dir.display())),
    );
    let screen = tmux.wait_for("DEVMAP-EXIT=", Duration::from_secs(20));
    assert!(screen.contains("DEVMAP-EXIT=0"), "{screen}");
    assert!(screen.contains("note: TERM=dumb"), "{screen}");
    assert!(screen.contains("lm_head"), "the report: {screen}");
    assert!(!screen.contains("Modules ·"), "the inspector ran: {screen}");
}
