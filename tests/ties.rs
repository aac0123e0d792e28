//! Ties are decided by evidence, never by a name alone (issue 38): with no config.json
//! an untied `lm_head` is kept (it was dropped as "tied to the embedding" before); a
//! head sharing the embedding's storage in a `torch.save` archive is tied by that
//! evidence; a head the device map places but nothing holds is refused, naming
//! `--config` and `--tie`; and `verify --against` flags a dropped head whose values
//! differed in the source. The same against torch, DCP and rank files:
//! tests/real/tie_sweep.rs.

mod common;

use std::path::Path;

use common::{arg, devmap, read_saved, stderr, stdout};
use devmap::fixtures::torch_bin::{write_torch_bin, write_torch_bin_aliased};
use devmap::fixtures::{FixtureTensor, LlamaShape, llama_config, llama_like, write_json};
use devmap::fixtures::{write_safetensors, write_sharded};
use devmap::types::DType;

const SHAPE: LlamaShape = LlamaShape {
    layers: 2,
    hidden: 16,
    intermediate: 24,
    vocab: 32,
    dtype: DType::BF16,
};
const HEAD: &str = "lm_head.weight";
const EMBED: &str = "model.embed_tokens.weight";

/// A Llama state dict with its own `lm_head` (another seed: other values), or one
/// holding the embedding's bytes.
fn llama_with_head(identical: bool) -> Vec<FixtureTensor> {
    let mut ts = llama_like(SHAPE);
    let mut head = FixtureTensor::patterned(HEAD, SHAPE.dtype, &[SHAPE.vocab, SHAPE.hidden], 991);
    if identical {
        head.data.clone_from(&ts[0].data);
    }
    ts.push(head);
    ts
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Safetensors,
    Bin,
}

fn write(dir: &Path, kind: Kind, ts: &[FixtureTensor]) {
    std::fs::create_dir_all(dir).expect("mkdir");
    match kind {
        Kind::Safetensors => write_sharded(dir, ts, 2).expect("shards"),
        Kind::Bin => {
            write_torch_bin(
                &dir.join("pytorch_model.bin"),
                &ts.iter().collect::<Vec<_>>(),
            )
            .expect("bin");
        }
    }
}

/// `devmap save` without --quiet, so its warnings show.
fn save_loud(src: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["save", arg(src), "--out", arg(out)];
    args.extend_from_slice(extra);
    devmap(&args)
}

fn inspect_json(src: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["inspect", arg(src), "--json"];
    args.extend_from_slice(extra);
    let o = devmap(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).expect("json")
}

fn warning_kinds(report: &serde_json::Value) -> Vec<String> {
    report["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(|w| w["kind"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn an_untied_head_without_config_json_is_kept_with_its_own_values() {
    for kind in [Kind::Safetensors, Kind::Bin] {
        let tmp = tempfile::tempdir().expect("tmp");
        let src = tmp.path().join("src");
        let ts = llama_with_head(false);
        write(&src, kind, &ts);
        let out = tmp.path().join("out");
        let o = save_loud(&src, &out, &[]);
        assert!(o.status.success(), "{kind:?}: {}", stderr(&o));
        let saved = read_saved(&out);
        assert_eq!(saved.len(), ts.len(), "{kind:?}: {:?}", saved.keys());
        for t in &ts {
            assert_eq!(saved[&t.name].data, t.data, "{kind:?}: {}", t.name);
        }
        let err = stderr(&o);
        assert!(
            err.contains("no config.json")
                && err.contains("differs from")
                && err.contains("--config DIR"),
            "{kind:?}: the save says why it kept both and names --config: {err}"
        );
        assert!(!err.contains("written once"), "{kind:?}: {err}");
        let report = inspect_json(&src, &[]);
        assert_eq!(report["ties"], serde_json::json!([]), "{kind:?}");
        assert!(
            warning_kinds(&report).contains(&"head_kept_without_config".to_owned()),
            "{kind:?}: {report}"
        );
        // The model's config decides: tie_word_embeddings true writes the head once.
        let config_dir = tmp.path().join("config");
        std::fs::create_dir(&config_dir).expect("mkdir");
        write_json(&config_dir.join("config.json"), &llama_config(SHAPE)).expect("config");
        let report = inspect_json(&src, &["--config", arg(&config_dir)]);
        assert_eq!(
            report["ties"],
            serde_json::json!([[EMBED, HEAD]]),
            "{kind:?}"
        );
        assert_eq!(report["tie_evidence"], serde_json::json!(["config"]));
    }
}

#[test]
fn identical_bytes_are_a_hint_kept_twice_unless_the_user_ties_them() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    let ts = llama_with_head(true);
    write(&src, Kind::Safetensors, &ts);
    let out = tmp.path().join("out");
    let o = save_loud(&src, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("holds the same bytes as"),
        "{}",
        stderr(&o)
    );
    assert!(read_saved(&out).contains_key(HEAD));
    let once = tmp.path().join("once");
    let tie = format!("{HEAD}={EMBED}");
    let o = save_loud(&src, &once, &["--tie", &tie]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("`{HEAD}` is tied to `{EMBED}` (--tie)")),
        "{}",
        stderr(&o)
    );
    let saved = read_saved(&once);
    assert!(!saved.contains_key(HEAD) && saved.contains_key(EMBED));
    let report = inspect_json(&src, &["--tie", &tie]);
    assert_eq!(report["tie_evidence"], serde_json::json!(["--tie"]));
}

#[test]
fn a_head_sharing_the_embeddings_storage_is_tied_by_that_evidence() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let ts = llama_like(SHAPE);
    write_torch_bin_aliased(
        &src.join("pytorch_model.bin"),
        &ts.iter().collect::<Vec<_>>(),
        &[(HEAD, EMBED)],
    )
    .expect("bin");
    let report = inspect_json(&src, &[]);
    assert_eq!(report["ties"], serde_json::json!([[EMBED, HEAD]]));
    assert_eq!(report["tie_evidence"], serde_json::json!(["same storage"]));
    let text = devmap(&["inspect", arg(&src)]);
    assert!(
        stdout(&text).contains("(same storage)"),
        "{}",
        stdout(&text)
    );
    let out = tmp.path().join("out");
    let o = save_loud(&src, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("(same storage): written once"),
        "{}",
        stderr(&o)
    );
    let saved = read_saved(&out);
    assert_eq!(saved.len(), ts.len());
    assert!(!saved.contains_key(HEAD));
    let o = devmap(&["verify", arg(&out), "--against", arg(&src)]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

#[test]
fn a_missing_head_the_map_places_is_refused_without_config_naming_the_choice() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let ts = llama_like(SHAPE);
    write_safetensors(
        &src.join("model.safetensors"),
        &ts.iter().collect::<Vec<_>>(),
    )
    .expect("write");
    write_json(
        &src.join("device_map.json"),
        &serde_json::json!({"model": "cpu", "lm_head": "cpu"}),
    )
    .expect("map");
    let out = tmp.path().join("out");
    let o = save_loud(&src, &out, &[]);
    assert!(!o.status.success(), "refused");
    let err = stderr(&o);
    assert!(
        err.contains("--config DIR") && err.contains(&format!("--tie {HEAD}={EMBED}")),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
    assert!(
        warning_kinds(&inspect_json(&src, &[])).contains(&"head_tie_unknown".to_owned()),
        "inspect says so too"
    );
    // Either choice saves.
    let o = save_loud(&src, &out, &["--tie", &format!("{HEAD}={EMBED}")]);
    assert!(o.status.success(), "{}", stderr(&o));
    write_json(&src.join("config.json"), &llama_config(SHAPE)).expect("config");
    let o = save_loud(&src, &tmp.path().join("out2"), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn verify_flags_a_dropped_head_whose_values_differ_in_the_source() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    let ts = llama_with_head(false);
    write(&src, Kind::Bin, &ts);
    let out = tmp.path().join("out");
    let tie = format!("{HEAD}={EMBED}");
    // The user ties them by mistake: the head's own values are not written.
    let o = save_loud(&src, &out, &["--tie", &tie]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!read_saved(&out).contains_key(HEAD));
    // Against the source as it is, the head is missing.
    let o = devmap(&["verify", arg(&out), "--against", arg(&src)]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains(HEAD), "{}", stdout(&o));
    // With the same --tie, the source's own values still say the drop lost data.
    let o = devmap(&["verify", arg(&out), "--against", arg(&src), "--tie", &tie]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(HEAD) && stdout(&o).contains("different values"),
        "{}",
        stdout(&o)
    );
    // A config that ties them while the checkpoint holds another head: dropped on
    // the config's word, and flagged the same way.
    let with_config = tmp.path().join("with_config");
    write(&with_config, Kind::Safetensors, &ts);
    write_json(&with_config.join("config.json"), &llama_config(SHAPE)).expect("config");
    let out2 = tmp.path().join("out2");
    let o = save_loud(&with_config, &out2, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = devmap(&["verify", arg(&out2), "--against", arg(&with_config)]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("different values"), "{}", stdout(&o));
    // A head equal to its embedding, tied by the config: nothing to flag.
    let same = tmp.path().join("same");
    write(&same, Kind::Safetensors, &llama_with_head(true));
    write_json(&same.join("config.json"), &llama_config(SHAPE)).expect("config");
    let out3 = tmp.path().join("out3");
    let o = save_loud(&same, &out3, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = devmap(&["verify", arg(&out3), "--against", arg(&same)]);
    assert!(o.status.success(), "{}", stdout(&o));
}
