//! What a newcomer types in the first hour, and what devmap should answer (issue 42's
//! "a newcomer's first hour"): a mistyped local path is "no such folder", not a Hub
//! repo id with an outdated download command; a file given for a folder opens the
//! folder that holds it; a mistyped subcommand gets "did you mean"; messages name
//! `hf download`, the command huggingface_hub ships today; `save` and `verify` do not
//! offer `--max-remote-shards`.

mod common;

use common::{arg, devmap, stderr, stdout};

#[test]
fn a_mistyped_local_path_is_no_such_folder() {
    let tmp = tempfile::tempdir().expect("tmp");
    std::fs::create_dir(tmp.path().join("assets")).expect("mkdir");
    std::fs::create_dir(tmp.path().join("assets/demo")).expect("mkdir");
    // `assets/dem` looks like a repo id, but `assets` is a folder here.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_devmap"))
        .args(["inspect", "assets/dem"])
        .current_dir(tmp.path())
        .env("HF_HUB_CACHE", tmp.path().join("no-cache"))
        .output()
        .expect("run");
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("no such folder") && err.contains("assets/dem") && err.contains("assets/demo"),
        "{err}"
    );
    assert!(!err.contains("huggingface-cli"), "{err}");
    // A path that does not exist at all.
    let missing = tmp.path().join("nowhere/model");
    let o = devmap(&["inspect", arg(&missing)]);
    assert!(stderr(&o).contains("no such folder"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("is not a directory"), "{}", stderr(&o));
}

#[test]
fn a_repo_id_missing_from_the_cache_names_hf_download() {
    let tmp = tempfile::tempdir().expect("tmp");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_devmap"))
        .args(["inspect", "someorg/somemodel"])
        .current_dir(tmp.path())
        .env("HF_HUB_CACHE", tmp.path().join("cache"))
        .output()
        .expect("run");
    let err = stderr(&o);
    assert!(err.contains("hf download someorg/somemodel"), "{err}");
    assert!(!err.contains("huggingface-cli"), "{err}");
}

#[test]
fn a_weights_file_opens_the_folder_that_holds_it() {
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo");
    let file = demo.join("model-00001-of-00002.safetensors");
    let o = devmap(&["inspect", arg(&file)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("57 tensors"), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("the folder that holds it"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn only_the_commands_that_read_a_remote_model_offer_its_shard_limit() {
    for (command, offers) in [
        (&["--help"][..], true),
        (&["inspect", "--help"][..], true),
        (&["plan", "--help"][..], true),
        (&["save", "--help"][..], false),
        (&["verify", "--help"][..], false),
    ] {
        let o = devmap(command);
        assert!(o.status.success(), "{command:?}");
        assert_eq!(
            stdout(&o).contains("--max-remote-shards"),
            offers,
            "{command:?}: save and verify refuse a remote model, so they do not offer its limit"
        );
    }
    // Where it is offered, it is taken after the command.
    let o = devmap(&["inspect", "assets/demo", "--max-remote-shards", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_mistyped_subcommand_gets_did_you_mean() {
    let o = devmap(&["inspct", "assets/demo"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("did you mean `inspect`"), "{err}");
}

#[test]
fn a_bare_number_as_a_shard_size_asks_whether_megabytes_were_meant() {
    let tmp = tempfile::tempdir().expect("tmp");
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo");
    let out = tmp.path().join("out");
    let o = devmap(&[
        "save",
        arg(&demo),
        "--out",
        arg(&out),
        "--max-shard-size",
        "100",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("did you mean 100MB"), "{}", stderr(&o));
    let o = devmap(&[
        "save",
        arg(&demo),
        "--out",
        arg(&tmp.path().join("out2")),
        "--max-shard-size",
        "100MB",
    ]);
    assert!(!stderr(&o).contains("did you mean"), "{}", stderr(&o));
}
