//! The devmap Python package on real models (tests/python/live_save.py): a live model
//! in a Python session — CPU and disk-offloaded values, in-memory edits, a merged LoRA,
//! fused MoE experts, tied weights — saved with `devmap.save_pretrained` and compared
//! with transformers' own `save_pretrained` of the same model (names, dtypes, bytes,
//! config), reloaded for the live model's logits; the GPU path's staging through a
//! small buffer, run on CPU tensors; meta tensors, a tensor changed
//! during the save and Ctrl-C refused with nothing committed. The package's compiled
//! module is built here with cargo (the same crate `pip install ./python` builds) and
//! put beside the package's Python files. Ignored by a bare `cargo test`; `.ci/run`
//! runs it with the reference libraries installed.

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "needs torch, transformers, accelerate, peft: run .ci/run"]
fn live_models_save_as_transformers_saves_them() {
    let package = crate::common::python_package();
    let py =
        crate::common::hf_python().unwrap_or_else(|why| panic!("live_save.py cannot run: {why}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/live_save.py");
    let o = Command::new(py)
        .arg(script)
        .envs(package.env())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("python");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{out}");
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 8, "{out}");
}

#[test]
#[ignore = "needs torch, transformers, accelerate and tmux: run .ci/run"]
fn the_inspector_opens_on_a_live_model_in_a_terminal_and_prints_a_report_elsewhere() {
    let package = crate::common::python_package();
    let py = crate::common::hf_python()
        .unwrap_or_else(|why| panic!("live_inspect.py cannot run: {why}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/live_inspect.py");
    // Outside a terminal, and in one with no devmap command to start: the report.
    for mode in ["--report", "--no-command"] {
        let report = Command::new(&py)
            .arg(&script)
            .arg(mode)
            .envs(package.env())
            .output()
            .expect("python");
        let out = String::from_utf8_lossy(&report.stdout);
        assert!(
            report.status.success() && out.contains("ok: "),
            "{mode}: {out}\n{}",
            String::from_utf8_lossy(&report.stderr)
        );
    }

    // In a real terminal: tmux runs the script, the inspector draws, `q` returns to Python.
    let socket = format!("devmap-live-{}", std::process::id());
    let tmux = |args: &[&str]| {
        let o = Command::new("tmux")
            .arg("-L")
            .arg(&socket)
            .args(args)
            .output()
            .expect("tmux");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // The inspector is the devmap command's; a save there reads the session's memory.
    let saved = tempfile::tempdir().expect("tmp");
    let out = saved.path().join("from-inspector");
    let path: String = package
        .env()
        .into_iter()
        .chain([
            ("DEVMAP_BIN", env!("CARGO_BIN_EXE_devmap").into()),
            ("LIVE_INSPECT_OUT", out.clone().into_os_string()),
        ])
        .map(|(k, v)| format!("{k}='{}' ", v.to_string_lossy()))
        .collect();
    let line = format!(
        "{path}'{}' '{}' 2>/dev/null; sleep 60",
        py.display(),
        script.display()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        "e2e",
        "-x",
        "120",
        "-y",
        "32",
        "sh",
        "-c",
        &line,
    ]);
    let wait = |what: &str| {
        let start = std::time::Instant::now();
        loop {
            let screen = tmux(&["capture-pane", "-p", "-t", "e2e"]);
            if screen.contains(what) {
                return screen;
            }
            if start.elapsed() > std::time::Duration::from_secs(90) {
                tmux(&["kill-server"]);
                panic!("`{what}` did not appear; screen:\n{screen}");
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    let screen = wait("Modules");
    assert!(
        screen.contains("LlamaForCausalLM in this Python session"),
        "{screen}"
    );
    assert!(
        screen.contains("disk") && screen.contains("cpu"),
        "{screen}"
    );
    // `s`: the save dialog, an output folder, Enter.
    tmux(&["send-keys", "-t", "e2e", "s"]);
    wait("Save as sharded safetensors");
    tmux(&["send-keys", "-t", "e2e", "Tab", "C-u"]);
    tmux(&["send-keys", "-t", "e2e", "-l", out.to_str().expect("utf8")]);
    tmux(&["send-keys", "-t", "e2e", "Enter"]);
    let done = wait("Save — done");
    assert!(done.contains("saved"), "{done}");
    tmux(&["send-keys", "-t", "e2e", "q"]);
    let after = wait("SAVE CHECKED");
    tmux(&["kill-server"]);
    assert!(
        after.contains("INSPECTOR CLOSED") && !after.contains("Modules ·"),
        "still on the inspector's screen:\n{after}"
    );
    assert!(after.contains("wrong: []"), "{after}");
}

/// A LoRA merged by peft into a model whose layers sit on disk (tests/python/
/// bridge_offload.py): peft leaves those layers' values in a plain dict on the hook,
/// devmap reads them there and writes what save_pretrained writes, names the layers
/// peft's merge did not change, and `--merge-lora` from the files merges them; DoRA,
/// `modules_to_save` and `offload_buffers=True` saved as transformers saves them.
#[test]
#[ignore = "needs torch, transformers, accelerate, peft: run .ci/run"]
fn a_lora_merged_into_disk_offloaded_layers_saves_as_save_pretrained_writes_it() {
    let (ok, out, err) = crate::common::run_package_script("bridge_offload.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 5, "{out}");
}

/// `devmap.save_on_signal` on a training loop killed by SIGTERM at 20 random moments
/// (tests/python/save_on_signal.py): each time the weights of the step boundary the
/// signal arrived in, loaded by from_pretrained; a second signal cancels the save.
#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn a_sigterm_saves_the_weights_of_the_step_boundary() {
    let (ok, out, err) = crate::common::run_package_script("save_on_signal.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 2, "{out}");
}

/// `devmap.save_pretrained` on every rank of an FSDP2 job (tests/python/fsdp_ranks.py:
/// gloo on CPU, 2 and 4 ranks, a tied Llama and a Mixtral with fused experts, trained
/// two steps): each rank writes its shards' blocks into the shard files, rank 0
/// commits; equal to transformers' save of the gathered model, byte-identical to
/// devmap's save of it unsharded, in float32 and cast to bfloat16; ranks that plan
/// different saves are refused on every rank with nothing written.
#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn every_rank_of_an_fsdp_job_writes_its_own_shards() {
    let (ok, out, err) = crate::common::run_package_script("fsdp_ranks.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 4, "{out}");
}
