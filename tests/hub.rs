//! Models where users keep them: repo ids resolved in a Hugging Face cache laid out as
//! huggingface_hub writes it, and `hf://` / `http(s)://` models read by their headers
//! over HTTP range requests from a local Hub-like server (127.0.0.1 only; no test
//! needs the internet).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::Ordering;

use common::hub_server::{self, HubServer, ServerOptions};
use common::{arg, snapshot, stderr, stdout};
use devmap::fixtures::{LlamaShape, llama_config, llama_like, write_json, write_sharded};
use devmap::types::DType;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const OTHER_COMMIT: &str = "fedcba9876543210fedcba9876543210fedcba98";

/// A tied Llama in three shards.
fn model(dir: &Path, layers: usize) {
    let shape = LlamaShape {
        layers,
        hidden: 32,
        intermediate: 64,
        vocab: 128,
        dtype: DType::BF16,
    };
    std::fs::create_dir_all(dir).expect("mkdir");
    write_sharded(dir, &llama_like(shape), 3).expect("shards");
    write_json(&dir.join("config.json"), &llama_config(shape)).expect("config");
}

/// Puts `model`'s files in the cache at `root` as huggingface_hub does: content in
/// `blobs/`, the snapshot made of relative symlinks, `refs/REF` naming the commit.
fn cache(root: &Path, repo: &str, commit: &str, refs: &[&str], model: &Path) -> PathBuf {
    let folder = root.join(format!("models--{}", repo.replace('/', "--")));
    let blobs = folder.join("blobs");
    let snapshot = folder.join("snapshots").join(commit);
    std::fs::create_dir_all(&blobs).expect("blobs");
    std::fs::create_dir_all(&snapshot).expect("snapshot");
    for e in std::fs::read_dir(model).expect("model") {
        let e = e.expect("entry");
        let bytes = std::fs::read(e.path()).expect("read");
        // huggingface_hub names blobs by their sha256 (LFS) or git hash; any unique
        // name works for the layout.
        let blob = format!(
            "{:016x}{}",
            bytes.len(),
            e.file_name().to_string_lossy().len()
        );
        let blob = format!(
            "{blob}-{}",
            e.file_name().to_string_lossy().replace('.', "_")
        );
        std::fs::write(blobs.join(&blob), &bytes).expect("blob");
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snapshot.join(e.file_name()))
            .expect("symlink");
    }
    for r in refs {
        let path = folder.join("refs").join(r);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("refs");
        std::fs::write(path, commit).expect("ref");
    }
    snapshot
}

/// Runs devmap with a clean Hugging Face environment plus `env`.
fn devmap_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_devmap"));
    cmd.args(args).env_remove("RUST_BACKTRACE");
    for var in [
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HOME",
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HF_ENDPOINT",
        "XDG_CACHE_HOME",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run devmap")
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "devmap failed: {}", stderr(o));
    serde_json::from_str(&stdout(o)).expect("json report")
}

/// What must be the same whether a model is read from a folder or elsewhere: every
/// tensor (name, dtype, shape, placement, source kind), ties, totals and warnings.
fn same_model(a: &serde_json::Value, b: &serde_json::Value) {
    // Source files compared by name: one side's are paths, the other's addresses.
    let by_name = |v: &serde_json::Value| {
        let mut v = v.clone();
        for t in v["tensors"].as_array_mut().into_iter().flatten() {
            if let Some(file) = t["source"]["file"].as_str() {
                let name = file.rsplit('/').next().unwrap_or(file).to_owned();
                t["source"]["file"] = name.into();
            }
        }
        v
    };
    let (a, b) = (&by_name(a), &by_name(b));
    for key in ["tensors", "ties", "devices", "total_bytes"] {
        assert_eq!(a[key], b[key], "`{key}` differs");
    }
    let kinds = |v: &serde_json::Value| -> Vec<String> {
        v["warnings"]
            .as_array()
            .map(|w| w.iter().map(|x| x["kind"].to_string()).collect())
            .unwrap_or_default()
    };
    assert_eq!(kinds(a), kinds(b));
}

#[test]
fn a_repo_id_opens_its_cache_snapshot() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    model(&src, 2);
    let root = tmp.path().join("hub");
    let snap = cache(&root, "acme/tiny-llama", COMMIT, &["main"], &src);
    let env = [("HF_HUB_CACHE", arg(&root))];
    let direct = json(&devmap_env(&["inspect", arg(&src), "--json"], &[]));
    let o = devmap_env(&["inspect", "acme/tiny-llama", "--json"], &env);
    let cached = json(&o);
    assert_eq!(cached["model"], arg(&snap));
    // The symlinks into blobs/ are the cache's layout, not worth a warning.
    assert!(!stdout(&o).contains("symlinks_outside"), "{}", stdout(&o));
    same_model(&direct, &cached);
    // plan works the same way.
    let o = devmap_env(
        &["plan", "acme/tiny-llama", "--max-memory", "cpu=40KB"],
        &env,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let p = devmap_env(&["plan", arg(&src), "--max-memory", "cpu=40KB"], &[]);
    assert_eq!(stdout(&o), stdout(&p));
}

#[test]
fn the_cache_root_follows_huggingface_hubs_variables() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    model(&src, 1);
    // HF_HOME/hub
    let home = tmp.path().join("hf-home");
    let snap = cache(&home.join("hub"), "acme/m", COMMIT, &["main"], &src);
    let o = devmap_env(&["inspect", "acme/m", "--json"], &[("HF_HOME", arg(&home))]);
    assert_eq!(json(&o)["model"], arg(&snap));
    // XDG_CACHE_HOME/huggingface/hub
    let xdg = tmp.path().join("xdg");
    let snap = cache(
        &xdg.join("huggingface/hub"),
        "acme/m",
        COMMIT,
        &["main"],
        &src,
    );
    let o = devmap_env(
        &["inspect", "acme/m", "--json"],
        &[("XDG_CACHE_HOME", arg(&xdg))],
    );
    assert_eq!(json(&o)["model"], arg(&snap));
    // HOME/.cache/huggingface/hub
    let user = tmp.path().join("user");
    let snap = cache(
        &user.join(".cache/huggingface/hub"),
        "acme/m",
        COMMIT,
        &["main"],
        &src,
    );
    let o = devmap_env(&["inspect", "acme/m", "--json"], &[("HOME", arg(&user))]);
    assert_eq!(json(&o)["model"], arg(&snap));
    // HF_HUB_CACHE wins over HF_HOME.
    let o = devmap_env(
        &["inspect", "acme/m", "--json"],
        &[
            ("HF_HOME", "/nonexistent"),
            ("HF_HUB_CACHE", arg(&xdg.join("huggingface/hub"))),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn revisions_resolve_through_refs_or_as_commits() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    model(&one, 1);
    model(&two, 2);
    let root = tmp.path().join("hub");
    cache(&root, "acme/m", COMMIT, &["main"], &one);
    let v2 = cache(&root, "acme/m", OTHER_COMMIT, &["v2", "refs/pr/3"], &two);
    let env = [("HF_HUB_CACHE", arg(&root))];
    for spec in [
        "acme/m@v2",
        "acme/m@refs/pr/3",
        &format!("acme/m@{OTHER_COMMIT}"),
    ] {
        let o = devmap_env(&["inspect", spec, "--json"], &env);
        assert_eq!(json(&o)["model"], arg(&v2), "{spec}");
    }
}

#[test]
fn a_missing_repo_or_revision_says_what_the_cache_has() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    model(&src, 1);
    let root = tmp.path().join("hub");
    cache(&root, "acme/m", COMMIT, &["main", "v1"], &src);
    cache(&root, "other/x", COMMIT, &["main"], &src);
    let env = [("HF_HUB_CACHE", arg(&root))];
    let o = devmap_env(&["inspect", "acme/absent"], &env);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("acme/absent is not in the Hugging Face cache"),
        "{err}"
    );
    assert!(err.contains("acme/m, other/x"), "{err}");
    assert!(err.contains("hf download acme/absent"), "{err}");
    let o = devmap_env(&["inspect", "acme/m@v9"], &env);
    let err = stderr(&o);
    assert!(
        err.contains("revision `v9` of acme/m is not in the cache"),
        "{err}"
    );
    assert!(err.contains("refs: main, v1"), "{err}");
    assert!(err.contains(&format!("snapshots: {COMMIT}")), "{err}");
}

#[test]
fn save_from_the_cache_is_a_save_from_the_folder_and_leaves_the_cache_alone() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    model(&src, 2);
    let root = tmp.path().join("hub");
    cache(&root, "acme/m", COMMIT, &["main"], &src);
    let before = snapshot(&root);
    let env = [("HF_HUB_CACHE", arg(&root))];
    let (a, b) = (
        tmp.path().join("from-cache"),
        tmp.path().join("from-folder"),
    );
    let o = devmap_env(
        &[
            "save",
            "acme/m",
            "--out",
            arg(&a),
            "--quiet",
            "--max-shard-size",
            "20KB",
        ],
        &env,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = devmap_env(
        &[
            "save",
            arg(&src),
            "--out",
            arg(&b),
            "--quiet",
            "--max-shard-size",
            "20KB",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(common::read_saved(&a), common::read_saved(&b));
    // config.json is copied as a file (the symlink followed), not as a link.
    let config = a.join("config.json");
    assert!(
        !std::fs::symlink_metadata(&config)
            .expect("config")
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read(&config).ok(),
        std::fs::read(src.join("config.json")).ok()
    );
    assert_eq!(snapshot(&root), before, "the cache was modified");
    // And verify takes the repo id too.
    let o = devmap_env(&["verify", arg(&a), "--against", "acme/m"], &env);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

#[test]
fn an_existing_folder_wins_over_a_repo_id() {
    let tmp = tempfile::tempdir().expect("tmp");
    let local = tmp.path().join("acme/m");
    model(&local, 1);
    let o = Command::new(env!("CARGO_BIN_EXE_devmap"))
        .args(["inspect", "acme/m", "--json"])
        .current_dir(tmp.path())
        .env("HF_HUB_CACHE", tmp.path().join("empty-cache"))
        .output()
        .expect("run");
    assert_eq!(json(&o)["model"], "acme/m");
}

// ---- remote models -------------------------------------------------------------

struct Served {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    root: PathBuf,
    server: HubServer,
}

fn serve(options: ServerOptions) -> Served {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    model(&src, 3);
    let root = tmp.path().join("www");
    hub_server::publish(&root, "acme/tiny", "main", &src).expect("publish");
    let server = hub_server::start(&root, options).expect("server");
    Served {
        _tmp: tmp,
        src,
        root,
        server,
    }
}

/// `devmap inspect hf://acme/tiny` against `served`, which must fail: its stderr.
fn inspect_fails(served: &Served) -> String {
    let endpoint = served.server.endpoint();
    let o = devmap_env(
        &["inspect", "hf://acme/tiny"],
        &[("HF_ENDPOINT", endpoint.as_str())],
    );
    assert!(!o.status.success(), "{}", stdout(&o));
    stderr(&o)
}

fn model_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .map(|e| e.metadata().expect("meta").len())
        .sum()
}

#[test]
fn hf_urls_read_only_headers_and_give_the_same_tree_and_plan() {
    let served = serve(ServerOptions::default());
    let endpoint = served.server.endpoint();
    let env = [("HF_ENDPOINT", endpoint.as_str())];
    let local = json(&devmap_env(&["inspect", arg(&served.src), "--json"], &[]));
    let o = devmap_env(&["inspect", "hf://acme/tiny", "--json"], &env);
    let remote = json(&o);
    assert_eq!(remote["model"], "hf://acme/tiny");
    same_model(&local, &remote);
    let embed = remote["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .find(|t| t["name"] == "model.embed_tokens.weight")
        .expect("embedding");
    assert!(
        embed["source"]["file"]
            .as_str()
            .is_some_and(|f| f.starts_with("hf://acme/tiny/model-0000")),
        "{embed}"
    );
    // Two range requests per shard (8 bytes, then the header), plus config and index.
    let stats = &served.server.stats;
    assert_eq!(stats.requests.load(Ordering::Relaxed), 2 * 3 + 2);
    let fetched = stats.body_bytes.load(Ordering::Relaxed);
    let headers: u64 = std::fs::read_dir(&served.src)
        .expect("src")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .map(|e| {
            devmap::formats::safetensors::read_header(&e.path())
                .expect("header")
                .data_start
        })
        .sum();
    let small_files = std::fs::metadata(served.src.join("config.json"))
        .expect("c")
        .len()
        + std::fs::metadata(served.src.join("model.safetensors.index.json"))
            .expect("i")
            .len();
    assert_eq!(
        fetched,
        headers + small_files,
        "only headers, config and index"
    );
    assert!(fetched < model_bytes(&served.src) / 4);
    assert!(stderr(&o).contains("3 shard headers"), "{}", stderr(&o));
    // The header mirror is gone once devmap is done.
    let scratch = served.root.with_file_name("scratch");
    std::fs::create_dir_all(&scratch).expect("scratch");
    let o = devmap_env(
        &["inspect", "hf://acme/tiny"],
        &[
            ("HF_ENDPOINT", endpoint.as_str()),
            ("TMPDIR", arg(&scratch)),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_dir(&scratch).expect("scratch").count(), 0);

    let args = ["--max-memory", "0=30KB,cpu=30KB"];
    let p_local = devmap_env(&[&["plan", arg(&served.src)], &args[..]].concat(), &[]);
    let p_remote = devmap_env(&[&["plan", "hf://acme/tiny"], &args[..]].concat(), &env);
    assert!(p_remote.status.success(), "{}", stderr(&p_remote));
    assert_eq!(stdout(&p_local), stdout(&p_remote));
}

#[test]
fn redirects_are_followed_with_their_ranges() {
    let served = serve(ServerOptions {
        redirect: true,
        ..ServerOptions::default()
    });
    let endpoint = served.server.endpoint();
    let o = devmap_env(
        &["inspect", "hf://acme/tiny", "--json"],
        &[("HF_ENDPOINT", endpoint.as_str())],
    );
    let remote = json(&o);
    same_model(
        &json(&devmap_env(&["inspect", arg(&served.src), "--json"], &[])),
        &remote,
    );
    assert!(model_bytes(&served.src) / 4 > served.server.stats.body_bytes.load(Ordering::Relaxed));
}

#[test]
fn a_plain_url_of_an_index_or_a_file_works_too() {
    let served = serve(ServerOptions::default());
    let base = format!("{}/cdn/acme/tiny/main", served.server.endpoint());
    let o = devmap_env(
        &[
            "inspect",
            &format!("{base}/model.safetensors.index.json"),
            "--json",
        ],
        &[],
    );
    let remote = json(&o);
    same_model(
        &json(&devmap_env(&["inspect", arg(&served.src), "--json"], &[])),
        &remote,
    );
    // One shard file alone: its tensors.
    let shard = std::fs::read_dir(&served.src)
        .expect("src")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(".safetensors"))
        .expect("a shard");
    let o = devmap_env(&["inspect", &format!("{base}/{shard}"), "--json"], &[]);
    let one = json(&o);
    let header = devmap::formats::safetensors::read_header(&served.src.join(&shard)).expect("h");
    assert_eq!(
        one["tensors"].as_array().expect("tensors").len(),
        header.tensors.len()
    );
}

#[test]
fn errors_name_the_status_and_the_url() {
    let served = serve(ServerOptions::default());
    let endpoint = served.server.endpoint();
    let env = [("HF_ENDPOINT", endpoint.as_str())];
    let o = devmap_env(&["inspect", "hf://acme/absent"], &env);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "HTTP 404 for {endpoint}/acme/absent/resolve/main/model.safetensors"
        )),
        "{err}"
    );
    assert!(err.contains("no such repo"), "{err}");
}

#[test]
fn a_private_repo_needs_the_token_from_hf_token_or_the_login_file() {
    let served = serve(ServerOptions {
        token: Some("hf_secret".into()),
        redirect: true,
        ..ServerOptions::default()
    });
    let err = inspect_fails(&served);
    let endpoint = served.server.endpoint();
    assert!(
        err.contains("HTTP 401") && err.contains("HF_TOKEN"),
        "{err}"
    );
    let o = devmap_env(
        &["inspect", "hf://acme/tiny", "--json"],
        &[
            ("HF_ENDPOINT", endpoint.as_str()),
            ("HF_TOKEN", "hf_secret"),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let home = served.root.with_file_name("hf-home");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(home.join("token"), "hf_secret\n").expect("token");
    let o = devmap_env(
        &["inspect", "hf://acme/tiny", "--json"],
        &[("HF_ENDPOINT", endpoint.as_str()), ("HF_HOME", arg(&home))],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_server_that_ignores_range_is_refused() {
    let served = serve(ServerOptions {
        ignore_range: true,
        ..ServerOptions::default()
    });
    let err = inspect_fails(&served);
    assert!(err.contains("ignores Range requests"), "{err}");
    assert!(err.contains("will not download"), "{err}");
}

#[test]
fn a_truncated_header_is_named_with_its_url() {
    let served = serve(ServerOptions::default());
    let dir = served.root.join("acme/tiny/main");
    let shard = std::fs::read_dir(&dir)
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .expect("shard");
    let header = devmap::formats::safetensors::read_header(&shard).expect("header");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .expect("open");
    f.set_len(header.data_start / 2).expect("truncate");
    let err = inspect_fails(&served);
    let name = shard
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    assert!(err.contains(&format!("/resolve/main/{name}")), "{err}");
}

#[test]
fn saving_a_remote_model_is_refused_before_any_request() {
    let served = serve(ServerOptions::default());
    let endpoint = served.server.endpoint();
    let out = served.root.with_file_name("out");
    let o = devmap_env(
        &["save", "hf://acme/tiny", "--out", arg(&out)],
        &[("HF_ENDPOINT", endpoint.as_str())],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("hf://acme/tiny is a remote model"), "{err}");
    assert!(err.contains("hf download acme/tiny"), "{err}");
    assert_eq!(served.server.stats.requests.load(Ordering::Relaxed), 0);
    assert!(!out.exists());
    // The library refuses too (the inspector's save dialog goes through it).
    let mirror = devmap::remote::fetch(
        &devmap::remote::Source::Hub {
            endpoint: endpoint.clone(),
            repo: "acme/tiny".into(),
            revision: "main".into(),
        },
        None,
        &|_, _| {},
    )
    .expect("fetch");
    let mut ckpt =
        devmap::model::load(&mirror.dir, &devmap::model::LoadOptions::default()).expect("load");
    ckpt.remote = Some(
        devmap::remote::Source::Hub {
            endpoint: endpoint.clone(),
            repo: "acme/tiny".into(),
            revision: "main".into(),
        }
        .describe(),
    );
    let refused =
        devmap::save::prepare(&ckpt, &devmap::save::SaveOptions::new(&out)).expect_err("refused");
    assert!(refused.to_string().contains("remote model"), "{refused}");
}

#[test]
fn the_inspectors_save_dialog_refuses_a_remote_model() {
    use common::journey::{ch, key, press};
    use devmap::tui::app::{App, Mode};
    use ratatui::crossterm::event::KeyCode;
    let served = serve(ServerOptions::default());
    let source = devmap::remote::Source::Hub {
        endpoint: served.server.endpoint(),
        repo: "acme/tiny".into(),
        revision: "main".into(),
    };
    let mirror = devmap::remote::fetch(&source, None, &|_, _| {}).expect("fetch");
    let mut ckpt =
        devmap::model::load(&mirror.dir, &devmap::model::LoadOptions::default()).expect("load");
    ckpt.remote = Some(source.describe());
    drop(mirror);
    let mut app = App::new(ckpt);
    // Through the inspector's runtime: the preview runs on its worker thread.
    press(&mut app, &[ch('s')]);
    let Mode::SaveDialog(dialog) = &app.mode else {
        panic!("the save dialog is open")
    };
    assert!(
        dialog
            .preview
            .errors
            .iter()
            .any(|e| e.contains("hf://acme/tiny is a remote model")),
        "{:?}",
        dialog.preview.errors
    );
    // Enter starts nothing.
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(app.save.is_none() && matches!(app.mode, Mode::SaveDialog(_)));
}

/// A fetch killed before it cleaned up leaves its header mirror behind; the next fetch
/// removes mirrors whose devmap is gone, and nothing else.
#[test]
fn mirrors_left_by_a_killed_devmap_are_removed_by_the_next_fetch() {
    let served = serve(ServerOptions::default());
    let parent = tempfile::tempdir().expect("tmp");
    // A process that has ended: its pid names the orphan.
    let mut child = std::process::Command::new("true").spawn().expect("true");
    let dead = child.id();
    child.wait().expect("wait");
    let orphan = parent.path().join(format!("devmap-remote-{dead}-0badf00d"));
    std::fs::create_dir(&orphan).expect("orphan");
    std::fs::write(orphan.join("model.safetensors"), b"header").expect("file");
    // A running devmap's mirror (this process), and a folder only named alike.
    let live = parent
        .path()
        .join(format!("devmap-remote-{}-00000001", std::process::id()));
    std::fs::create_dir(&live).expect("live");
    let other = parent.path().join("devmap-remote-notes");
    std::fs::create_dir(&other).expect("other");
    let mirror = devmap::remote::fetch(
        &devmap::remote::Source::Hub {
            endpoint: served.server.endpoint(),
            repo: "acme/tiny".into(),
            revision: "main".into(),
        },
        Some(parent.path()),
        &|_, _| {},
    )
    .expect("fetch");
    assert!(!orphan.exists(), "the orphan is removed");
    assert!(live.exists() && other.exists());
    drop(mirror);
}

/// The Hub token goes to `HF_ENDPOINT`'s origin (scheme, host and port) and nowhere
/// else: not to a server a URL names, not across a redirect to another port or name.
#[test]
fn the_token_goes_only_to_the_endpoints_origin() {
    let auth = |served: &Served| {
        served
            .server
            .stats
            .with_authorization
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    // A URL source with HF_ENDPOINT unset: the token is the Hub's, not this server's.
    let served = serve(ServerOptions::default());
    let url = format!(
        "{}/acme/tiny/resolve/main/model.safetensors.index.json",
        served.server.endpoint()
    );
    let o = devmap_env(&["inspect", &url, "--json"], &[("HF_TOKEN", "hf_secret")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(auth(&served), 0, "the token was sent to a URL's own host");

    // The same URL with HF_ENDPOINT on that very origin: the token goes with it.
    let endpoint = served.server.endpoint();
    let o = devmap_env(
        &["inspect", &url, "--json"],
        &[("HF_TOKEN", "hf_secret"), ("HF_ENDPOINT", &endpoint)],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(auth(&served) > 0, "the endpoint's own URLs carry the token");

    // Another name for the same address and port is another origin.
    let before = auth(&served);
    let by_name = url.replace("127.0.0.1", "localhost");
    let o = devmap_env(
        &["inspect", &by_name, "--json"],
        &[("HF_TOKEN", "hf_secret"), ("HF_ENDPOINT", &endpoint)],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(auth(&served), before, "localhost is not 127.0.0.1's origin");

    // A redirect from the endpoint to another port: the token stays behind, and the
    // endpoint's own requests still carry it.
    let cdn = serve(ServerOptions::default());
    let hub = serve(ServerOptions {
        token: Some("hf_secret".into()),
        redirect: true,
        redirect_to: Some(cdn.server.endpoint()),
        ..ServerOptions::default()
    });
    let o = devmap_env(
        &["inspect", "hf://acme/tiny", "--json"],
        &[
            ("HF_TOKEN", "hf_secret"),
            ("HF_ENDPOINT", &hub.server.endpoint()),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let cdn_requests = cdn
        .server
        .stats
        .requests
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        cdn_requests > 0,
        "the shards were read through the redirect"
    );
    assert_eq!(
        auth(&cdn),
        0,
        "the token crossed a redirect to another port"
    );
    assert!(auth(&hub) > 0);
}

#[test]
fn redirects_resolve_as_browsers_resolve_them() {
    use devmap::remote::http::resolve_location;
    let from = "http://127.0.0.1:8080/acme/tiny/resolve/main/model.safetensors";
    assert_eq!(
        resolve_location(from, "/cdn/x").as_deref(),
        Some("http://127.0.0.1:8080/cdn/x")
    );
    assert_eq!(
        resolve_location(from, "https://cdn.example/x").as_deref(),
        Some("https://cdn.example/x")
    );
    assert_eq!(
        resolve_location(from, "//other:9/x").as_deref(),
        Some("http://other:9/x")
    );
    assert_eq!(
        resolve_location(from, "other.safetensors").as_deref(),
        Some("http://127.0.0.1:8080/acme/tiny/resolve/main/other.safetensors")
    );
}

#[test]
fn origins_compare_scheme_host_and_port() {
    use devmap::remote::http::Origin;
    let hub = Origin::of("https://huggingface.co").expect("origin");
    assert_eq!(
        Origin::of("https://HuggingFace.co:443/x"),
        Some(hub.clone())
    );
    assert_ne!(Origin::of("http://huggingface.co/x"), Some(hub.clone()));
    assert_ne!(
        Origin::of("https://huggingface.co:8443/x"),
        Some(hub.clone())
    );
    assert_ne!(
        Origin::of("https://huggingface.co.evil/x"),
        Some(hub.clone())
    );
    assert_ne!(Origin::of("https://evil@x.org/huggingface.co"), Some(hub));
    assert_eq!(Origin::of("ftp://x"), None);
    assert_eq!(Origin::of("http://h:notaport/"), None);
}

/// A server that answers one byte at a time (slowloris) gets the request's whole time
/// limit once, retries included — not once per attempt.
#[test]
fn the_time_limit_covers_a_request_and_its_retries() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let connections = std::sync::Arc::new(AtomicU64::new(0));
    let seen = std::sync::Arc::clone(&connections);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            seen.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n");
                for _ in 0..1000 {
                    if stream.write_all(b"{").is_err() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            });
        }
    });
    let client = devmap::remote::http::Client::with_limit(
        None,
        None,
        std::time::Duration::from_millis(1500),
    );
    let err = client
        .get_json(&format!("http://{addr}/config.json"), false)
        .expect_err("a 100 s answer within a 1.5 s limit");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "no retry after the limit was spent: {err}"
    );
}

/// Small metadata files go through one bounded reader: a FIFO or a device as a cache
/// ref, and a sparse gigabyte as `config.json`, are refused from what they are and
/// their size — never read, never waited on.
#[test]
fn refs_and_configs_that_are_not_small_files_are_refused_unread() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    model(&src, 1);
    let root = tmp.path().join("hub");
    cache(&root, "acme/tiny", COMMIT, &[], &src);
    let refs = root.join("models--acme--tiny").join("refs");
    std::fs::create_dir_all(&refs).expect("refs");
    let fifo = refs.join("main");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    std::os::unix::fs::symlink("/dev/zero", refs.join("zero")).expect("symlink");
    let env = [("HF_HUB_CACHE", arg(&root))];
    for (revision, what) in [("main", "a FIFO"), ("zero", "a device")] {
        let o = devmap_env(&["inspect", &format!("acme/tiny@{revision}")], &env);
        assert!(!o.status.success(), "{revision}");
        let err = stderr(&o);
        assert!(
            err.contains(what) && err.contains("refs"),
            "{revision}: {err}"
        );
    }
    // A 1 GiB sparse config.json: refused from its size, at the memory of any run.
    let sparse = tmp.path().join("sparse");
    model(&sparse, 1);
    let config = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(sparse.join("config.json"))
        .expect("config");
    config.set_len(1 << 30).expect("sparse");
    let o = devmap_env(
        &["inspect", arg(&sparse)],
        &[("DEVMAP_REPORT_PEAK_RSS", "1")],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("config.json")
            && err.contains("1 GiB (1073741824 bytes)")
            && err.contains("not read"),
        "{err}"
    );
    let peak = common::peak_rss(&err);
    assert!(peak < 32 << 20, "read before refusing: peak RSS {peak}");
}

/// A cache snapshot that is itself a symlink to a folder outside the cache is followed,
/// and said.
#[test]
fn a_snapshot_that_leads_out_of_the_cache_is_named() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    model(&src, 1);
    let root = tmp.path().join("hub");
    let snap = cache(&root, "acme/tiny", COMMIT, &["main"], &src);
    std::fs::remove_dir_all(&snap).expect("rm");
    std::os::unix::fs::symlink(&src, &snap).expect("symlink");
    let o = devmap_env(&["inspect", "acme/tiny"], &[("HF_HUB_CACHE", arg(&root))]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("the cache snapshot itself, outside"),
        "followed silently:\n{text}"
    );
}

/// An index naming thousands of shards is refused before a request is made for any of
/// them (each costs two), and the flag that raises the cap is named.
#[test]
fn an_index_naming_too_many_shards_is_refused_before_fetching_them() {
    let served = serve(ServerOptions::default());
    let index_path = served
        .root
        .join("acme/tiny/main/model.safetensors.index.json");
    let weight_map: serde_json::Map<String, serde_json::Value> = (0..5000)
        .map(|i| {
            (
                format!("model.layers.{i}.w"),
                format!("model-{:05}-of-05000.safetensors", i + 1).into(),
            )
        })
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": 5000}, "weight_map": weight_map});
    std::fs::write(&index_path, index.to_string()).expect("index");
    let endpoint = served.server.endpoint();
    let o = devmap_env(
        &["inspect", "hf://acme/tiny"],
        &[("HF_ENDPOINT", endpoint.as_str())],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("names 5000 shards, over the 4096")
            && err.contains("--max-remote-shards 5000"),
        "{err}"
    );
    let requests = served
        .server
        .stats
        .requests
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        requests <= 3,
        "{requests} requests: shard headers were fetched"
    );
}

/// A shard whose header is 60 MB (whitespace JSON allows): fetched into one buffer,
/// not two (the remote path held the length prefix and the header twice: 196 MiB for a
/// 100 MB header), so the peak stays near one copy.
#[test]
fn a_large_remote_header_is_held_once() {
    use std::io::Write;
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("padded");
    std::fs::create_dir_all(&model).expect("mkdir");
    let padding = 60_000_000;
    let mut header = Vec::with_capacity(padding + 100);
    header.push(b'{');
    header.resize(padding, b' ');
    header.extend_from_slice(br#""w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}"#);
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut f = std::fs::File::create(model.join("model.safetensors")).expect("create");
    f.write_all(&(header.len() as u64).to_le_bytes())
        .expect("len");
    f.write_all(&header).expect("header");
    f.write_all(&[1, 2, 3, 4]).expect("data");
    drop(f);
    let root = tmp.path().join("www");
    hub_server::publish(&root, "acme/padded", "main", &model).expect("publish");
    let server = hub_server::start(&root, ServerOptions::default()).expect("server");
    let endpoint = server.endpoint();
    let o = devmap_env(
        &["inspect", "hf://acme/padded"],
        &[
            ("HF_ENDPOINT", endpoint.as_str()),
            ("DEVMAP_REPORT_PEAK_RSS", "1"),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let peak = common::peak_rss(&stderr(&o));
    assert!(
        peak < 90 << 20,
        "a 60 MB header peaked at {} MiB: held more than once",
        peak >> 20
    );
}
