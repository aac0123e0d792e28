//! `devmap verify`: every kind of difference made on purpose and named, clean saves
//! verified clean, and the exit statuses (0 clean, 1 differences, 2 unusable input).

mod common;

use std::path::{Path, PathBuf};

use common::{arg, devmap, mixed_model, stderr, stdout};
use devmap::fixtures::{FixtureTensor, LlamaShape, llama_config, llama_like, write_json};
use devmap::formats::safetensors::{HeaderTensor, read_header};
use devmap::types::DType;

/// A small tied Llama in three shards, and where to save it.
struct Case {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    out: PathBuf,
}

/// The small tied Llama these tests save.
fn small_llama(dtype: DType) -> LlamaShape {
    LlamaShape {
        layers: 3,
        hidden: 32,
        intermediate: 64,
        vocab: 128,
        dtype,
    }
}

fn llama(dtype: DType) -> Case {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    let shape = small_llama(dtype);
    std::fs::create_dir_all(&src).expect("mkdir");
    devmap::fixtures::write_sharded(&src, &llama_like(shape), 3).expect("shards");
    write_json(&src.join("config.json"), &llama_config(shape)).expect("config");
    let out = tmp.path().join("out");
    Case {
        _tmp: tmp,
        src,
        out,
    }
}

fn save(case: &Case, extra: &[&str]) {
    let mut args = vec!["--max-shard-size", "20KB"];
    args.extend_from_slice(extra);
    let o = common::save(&case.src, &case.out, &args);
    assert!(o.status.success(), "save failed: {}", stderr(&o));
}

/// Runs `devmap verify OUT --json [extra]`; returns the exit status and the report.
fn verify(out: &Path, extra: &[&str]) -> (i32, serde_json::Value) {
    let mut args = vec!["verify", arg(out), "--json", "--quiet"];
    args.extend_from_slice(extra);
    let o = devmap(&args);
    let code = o.status.code().expect("exit status");
    let report = serde_json::from_str(&stdout(&o)).unwrap_or(serde_json::Value::Null);
    (code, report)
}

/// The `(kind, subject)` of every difference in a report.
fn differences(report: &serde_json::Value) -> Vec<(String, String)> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["severity"] == "difference")
        .map(|f| {
            (
                f["kind"].as_str().expect("kind").to_owned(),
                f["subject"].as_str().expect("subject").to_owned(),
            )
        })
        .collect()
}

/// `kind` about `subject` is found, and no other difference of the same check (a
/// missing shard is also MISSING tensors to the check against the architecture).
fn assert_only(report: &serde_json::Value, kind: &str, subject: &str) {
    let found = differences(report);
    assert!(
        found.iter().any(|(k, s)| k == kind && s == subject),
        "expected a `{kind}` difference about `{subject}`, got {found:?}"
    );
    let check_of = |k: &str| {
        report["findings"]
            .as_array()
            .and_then(|a| a.iter().find(|f| f["kind"] == k))
            .map(|f| f["check"].clone())
    };
    let same_check: Vec<_> = found
        .iter()
        .filter(|(k, _)| check_of(k) == check_of(kind))
        .collect();
    assert!(
        same_check.iter().all(|(k, _)| k == kind),
        "only `{kind}` differences expected of its check, got {found:?}"
    );
}

fn index(out: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(out.join("model.safetensors.index.json")).expect("index");
    serde_json::from_str(&text).expect("json")
}

fn write_index(out: &Path, value: &serde_json::Value) {
    write_json(&out.join("model.safetensors.index.json"), value).expect("index");
}

/// The shard holding `tensor` and the tensor's absolute offset in it.
fn locate(out: &Path, tensor: &str) -> (PathBuf, u64) {
    let (path, t) = header_entry(out, tensor);
    (path, t.offset)
}

/// The shard that holds `tensor` in a saved `out`, and the tensor's header entry.
fn header_entry(out: &Path, tensor: &str) -> (PathBuf, HeaderTensor) {
    let file = index(out)["weight_map"][tensor]
        .as_str()
        .expect("in index")
        .to_owned();
    let path = out.join(file);
    let header = read_header(&path).expect("header");
    let t = header
        .tensors
        .into_iter()
        .find(|t| &*t.name == tensor)
        .expect("in header");
    (path, t)
}

fn edit_config(out: &Path, key: &str, value: serde_json::Value) {
    let path = out.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("json");
    config[key] = value;
    write_json(&path, &config).expect("config");
}

const VICTIM: &str = "model.layers.1.mlp.up_proj.weight";

#[test]
fn a_clean_save_verifies_clean_alone_and_against_its_source() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["differences"], 0);
    assert!(report["shards"].as_u64().expect("shards") > 1);
    let (code, report) = verify(&case.out, &["--against", arg(&case.src)]);
    assert_eq!(code, 0, "{report}");
    let tensors = report["tensors"].as_u64().expect("tensors");
    assert_eq!(report["compared"].as_u64(), Some(tensors));
    // Both sides are read: the checkpoint and the sources.
    let size = index(&case.out)["metadata"]["total_size"]
        .as_u64()
        .expect("total_size");
    assert_eq!(report["bytes_read"].as_u64(), Some(2 * size));
}

#[test]
fn one_flipped_byte_is_named_by_the_content_check() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    let (path, offset) = locate(&case.out, VICTIM);
    let mut bytes = std::fs::read(&path).expect("shard");
    bytes[offset as usize + 7] ^= 0x10;
    std::fs::write(&path, bytes).expect("write");
    // Structure alone cannot see it...
    assert_eq!(verify(&case.out, &[]).0, 0);
    // ...the comparison with the source does.
    let (code, report) = verify(&case.out, &["--against", arg(&case.src)]);
    assert_eq!(code, 1);
    assert_only(&report, "content", VICTIM);
}

#[test]
fn a_missing_shard_is_named() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    let (path, _) = locate(&case.out, VICTIM);
    std::fs::remove_file(&path).expect("rm");
    let shard = path.file_name().expect("name").to_str().expect("utf8");
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "missing-shard", shard);
    // Against the source, the lost tensors are named too.
    let (_, report) = verify(&case.out, &["--against", arg(&case.src)]);
    assert!(differences(&report).contains(&("missing-tensor".into(), VICTIM.into())));
}

#[test]
fn a_tensor_missing_from_the_index_is_named() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    let mut idx = index(&case.out);
    idx["weight_map"]
        .as_object_mut()
        .expect("map")
        .remove(VICTIM);
    write_index(&case.out, &idx);
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "not-in-index", VICTIM);
}

#[test]
fn a_tensor_in_two_shards_is_named() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    // A further shard that repeats VICTIM beside a tensor of its own.
    let (path, t) = header_entry(&case.out, VICTIM);
    let offset = t.offset;
    let bytes = std::fs::read(&path).expect("shard");
    let copy = FixtureTensor {
        name: VICTIM.into(),
        dtype: t.dtype,
        shape: t.shape.to_vec(),
        data: bytes[offset as usize..(offset + t.len) as usize].to_vec(),
    };
    let extra = FixtureTensor::patterned("model.extra.weight", DType::BF16, &[4], 7);
    devmap::fixtures::write_safetensors(
        &case.out.join("model-extra.safetensors"),
        &[&copy, &extra],
    )
    .expect("extra shard");
    let mut idx = index(&case.out);
    idx["weight_map"]["model.extra.weight"] = "model-extra.safetensors".into();
    idx["metadata"]["total_size"] =
        (idx["metadata"]["total_size"].as_u64().expect("size") + extra.data.len() as u64).into();
    idx["metadata"]["total_parameters"] = (idx["metadata"]["total_parameters"]
        .as_u64()
        .expect("params")
        + 4)
    .into();
    write_index(&case.out, &idx);
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1, "{report}");
    assert_only(&report, "in-two-shards", VICTIM);
}

#[test]
fn a_wrong_total_size_is_named() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    let mut idx = index(&case.out);
    idx["metadata"]["total_size"] =
        (idx["metadata"]["total_size"].as_u64().expect("size") + 2).into();
    write_index(&case.out, &idx);
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "totals", "model.safetensors.index.json");
}

#[test]
fn a_dropped_untied_head_is_named() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    // The save dropped lm_head (tied in the source); a config that unties it means
    // transformers expects the head in the weights.
    edit_config(&case.out, "tie_word_embeddings", false.into());
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    // transformers' class says so: MISSING, as its load report would.
    assert_only(&report, "missing", "lm_head.weight");
    // An architecture devmap's table lacks: the name-based check still says it.
    edit_config(
        &case.out,
        "architectures",
        serde_json::json!(["ToyForCausalLM"]),
    );
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "tie-dropped", "lm_head.weight");
    assert!(
        report["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .any(|f| f["kind"] == "not-checked" && f["severity"] == "note"),
        "{report}"
    );
}

#[test]
fn an_extra_tied_copy_is_named_unless_the_save_asked_for_it() {
    let case = llama(DType::BF16);
    save(&case, &["--keep-tied"]);
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "tie-extra", "lm_head.weight");
    // Against a save with the same --keep-tied, the copy is expected.
    let (code, report) = verify(&case.out, &["--against", arg(&case.src), "--keep-tied"]);
    assert_eq!(code, 0, "{report}");
    // Against a default save, it is a copy that save would not write.
    let (code, report) = verify(&case.out, &["--against", arg(&case.src)]);
    assert_eq!(code, 1);
    assert!(differences(&report).contains(&("extra-tensor".into(), "lm_head.weight".into())));
}

#[test]
fn old_and_new_shards_mixed_are_named() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    // A shard of an earlier save, with a different shard count, left behind.
    let first = case.out.join("model-00001-of-00002.safetensors");
    let shards = devmap::formats::input::safetensors_files(&case.out).expect("list");
    std::fs::copy(&shards[0], &first).expect("copy");
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "stale-shard", "model-00001-of-00002.safetensors");
    // A single-file checkpoint beside an index is read instead of the index.
    std::fs::remove_file(&first).expect("rm");
    std::fs::copy(&shards[0], case.out.join("model.safetensors")).expect("copy");
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "stale-shard", "model.safetensors");
}

#[test]
fn a_config_dtype_that_disagrees_with_the_tensors_is_named() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    edit_config(&case.out, "torch_dtype", "float16".into());
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "config-dtype", "config.json");
}

#[test]
fn casts_are_recomputed_through_the_savers_recipe() {
    let case = llama(DType::F32);
    save(&case, &["--dtype", "bfloat16"]);
    let (code, report) = verify(
        &case.out,
        &["--against", arg(&case.src), "--dtype", "bfloat16"],
    );
    assert_eq!(code, 0, "{report}");
    // The dtype the save used matters: compared with a plain copy, every floating
    // tensor's dtype differs.
    let (code, report) = verify(&case.out, &["--against", arg(&case.src)]);
    assert_eq!(code, 1);
    assert!(differences(&report).iter().all(|(k, _)| k == "dtype"));
    let (path, offset) = locate(&case.out, VICTIM);
    let mut bytes = std::fs::read(&path).expect("shard");
    bytes[offset as usize] ^= 1;
    std::fs::write(&path, bytes).expect("write");
    let (code, report) = verify(
        &case.out,
        &["--against", arg(&case.src), "--dtype", "bfloat16"],
    );
    assert_eq!(code, 1);
    assert_only(&report, "content", VICTIM);
}

#[test]
fn against_reads_the_offload_folder_like_save() {
    let m = mixed_model();
    let out = m.out("saved");
    let o = devmap(&[
        "save",
        arg(&m.dir),
        "--out",
        arg(&out),
        "--quiet",
        "--max-shard-size",
        "1KB",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (code, report) = verify(&out, &["--against", arg(&m.dir)]);
    assert_eq!(code, 0, "{report}");
    // The zero-element tensor is reported, not failed.
    let notes: Vec<_> = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["severity"] == "note")
        .map(|f| {
            (
                f["kind"].as_str().unwrap_or(""),
                f["subject"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(
        notes.contains(&("empty-tensor", "model.empty")),
        "{notes:?}"
    );
    // Without the offload folder the source holds the checkpoint's stale values: the
    // offloaded tensors differ (an offload folder elsewhere is given explicitly).
    let empty = m.out("no-offload");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let (code, report) = verify(
        &out,
        &["--against", arg(&m.dir), "--offload-folder", arg(&empty)],
    );
    assert_eq!(code, 1);
    let found = differences(&report);
    assert!(
        found.contains(&("content".into(), "model.norm.weight".into())),
        "{found:?}"
    );
    assert!(!found.iter().any(|(_, t)| t == "model.layers.0.proj.weight"));
}

#[test]
fn all_zero_and_uniform_tensors_are_notes_not_failures() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    let (path, t) = header_entry(&case.out, VICTIM);
    let (offset, len) = (t.offset, t.len);
    let mut bytes = std::fs::read(&path).expect("shard");
    bytes[offset as usize..(offset + len) as usize].fill(0);
    std::fs::write(&path, bytes).expect("write");
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 0, "{report}");
    let note = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["subject"] == VICTIM)
        .expect("a note on the zeroed tensor");
    assert_eq!(note["kind"], "all-zero");
    assert_eq!(note["severity"], "note");
}

#[test]
fn unusable_input_exits_2_with_a_message() {
    let case = llama(DType::BF16);
    let o = devmap(&["verify", arg(&case.out)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no such folder"), "{}", stderr(&o));
    save(&case, &[]);
    let missing = case.src.with_file_name("nowhere");
    let o = devmap(&["verify", arg(&case.out), "--against", arg(&missing)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("nowhere"), "{}", stderr(&o));
}

#[test]
fn an_empty_folder_is_a_difference_not_a_crash() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (code, report) = verify(tmp.path(), &[]);
    assert_eq!(code, 1);
    assert_eq!(differences(&report)[0].0, "no-weights");
}

#[test]
fn a_corrupt_header_is_named_with_the_file() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    let (path, _) = locate(&case.out, VICTIM);
    let mut bytes = std::fs::read(&path).expect("shard");
    bytes.truncate(bytes.len() - 1);
    std::fs::write(&path, bytes).expect("write");
    let shard = path.file_name().expect("name").to_str().expect("utf8");
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    let found = differences(&report);
    assert!(
        found.contains(&("invalid-header".into(), shard.into())),
        "{found:?}"
    );
}

#[test]
fn save_verify_checks_what_it_wrote() {
    let case = llama(DType::BF16);
    let o = devmap(&[
        "save",
        arg(&case.src),
        "--out",
        arg(&case.out),
        "--verify",
        "--max-shard-size",
        "20KB",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("verify: ") && stderr(&o).contains("no differences"),
        "{}",
        stderr(&o)
    );
}

/// `--weights-only` asks for no config.json: verifying that save does not count the
/// missing config against it (a plain `verify` of the folder still does).
#[test]
fn save_weights_only_verify_expects_no_config() {
    let case = llama(DType::BF16);
    let o = devmap(&[
        "save",
        arg(&case.src),
        "--out",
        arg(&case.out),
        "--weights-only",
        "--verify",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("no differences"), "{}", stderr(&o));
    assert!(!case.out.join("config.json").exists());
    let o = devmap(&["verify", arg(&case.out)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).contains("config.json: is missing"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn the_text_report_names_each_difference_and_sums_up() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    edit_config(&case.out, "tie_word_embeddings", false.into());
    let o = devmap(&["verify", arg(&case.out)]);
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    assert!(
        text.contains("difference: lm_head.weight: MISSING: LlamaForCausalLM has it (shape [128, 32] by config.json)"),
        "{text}"
    );
    assert!(text.contains("1 difference,"), "{text}");
    // Each check's verdict on its own: which proof failed.
    // The table names the transformers it was generated from.
    let table = devmap::model::expect::source()
        .split(',')
        .next()
        .unwrap_or_default();
    assert!(
        text.contains(&format!(
            "files: 0 problems; as transformers expects (LlamaForCausalLM, devmap's table of {table}): 1 problem"
        )),
        "{text}"
    );
}

/// The kinds of the differences `check` found.
fn kinds_of(report: &serde_json::Value, check: &str) -> Vec<String> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["severity"] == "difference" && f["check"] == check)
        .map(|f| f["kind"].as_str().expect("kind").to_owned())
        .collect()
}

#[test]
fn a_config_that_disagrees_with_the_weights_is_mismatched_missing_or_unexpected() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["architecture"], "LlamaForCausalLM");
    assert_eq!(report["checks"]["expects"], 0);

    // A vocabulary resized in the config only: the embedding no longer fits it.
    edit_config(&case.out, "vocab_size", 256.into());
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "mismatched", "model.embed_tokens.weight");

    // One layer more than the weights hold: its tensors are MISSING.
    edit_config(&case.out, "vocab_size", 128.into());
    edit_config(&case.out, "num_hidden_layers", 4.into());
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "missing", "model.layers.3.mlp.up_proj.weight");
    assert_eq!(kinds_of(&report, "expects").len(), 9, "{report}");

    // One fewer: the last layer's are UNEXPECTED.
    edit_config(&case.out, "num_hidden_layers", 2.into());
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    assert_only(&report, "unexpected", "model.layers.2.mlp.up_proj.weight");
}

#[test]
fn a_transposed_weight_is_mismatched_and_nan_is_a_difference_unless_allowed() {
    let case = llama(DType::F32);
    save(&case, &[]);
    // Rewrite VICTIM's header entry as [hidden, intermediate]: same bytes, wrong shape.
    let (path, t) = header_entry(&case.out, VICTIM);
    let header = read_header(&path).expect("header");
    // A NaN in another tensor of the same shard.
    let nan_in = header
        .tensors
        .iter()
        .find(|h| h.name != t.name && h.dtype == DType::F32 && h.len >= 4)
        .map(|h| h.name.clone())
        .expect("another float32 tensor in the shard");
    let tensors: Vec<FixtureTensor> = {
        let bytes = std::fs::read(&path).expect("shard");
        header
            .tensors
            .iter()
            .map(|h| {
                let mut shape = h.shape.to_vec();
                if h.name == t.name {
                    shape.reverse();
                }
                let mut data = bytes[h.offset as usize..(h.offset + h.len) as usize].to_vec();
                if h.name == nan_in {
                    data[..4].copy_from_slice(&f32::NAN.to_le_bytes());
                }
                FixtureTensor {
                    name: h.name.to_string(),
                    dtype: h.dtype,
                    shape,
                    data,
                }
            })
            .collect()
    };
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    devmap::fixtures::write_safetensors(&path, &refs).expect("rewrite");
    let (code, report) = verify(&case.out, &[]);
    assert_eq!(code, 1);
    let expects = kinds_of(&report, "expects");
    assert!(expects.contains(&"mismatched".to_owned()), "{report}");
    assert!(expects.contains(&"non-finite".to_owned()), "{report}");
    // --allow-nonfinite makes the NaN a note; the transposed weight stays wrong.
    let (code, report) = verify(&case.out, &["--allow-nonfinite"]);
    assert_eq!(code, 1);
    assert_eq!(kinds_of(&report, "expects"), vec!["mismatched".to_owned()]);
}

#[test]
fn a_config_for_another_model_lists_twenty_of_each_kind_and_counts_the_rest() {
    let case = llama(DType::BF16);
    save(&case, &[]);
    edit_config(&case.out, "hidden_size", 64.into());
    let o = devmap(&["verify", arg(&case.out)]);
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    let listed = text
        .lines()
        .filter(|l| l.starts_with("difference: ") && l.contains("MISMATCHED"))
        .count();
    assert_eq!(listed, 20, "{text}");
    assert!(
        text.contains("more of kind mismatched (--json lists every one)"),
        "{text}"
    );
}

/// A checkpoint without tensors its architecture has (a training run that lost some)
/// is saved as asked, but `devmap save` first says what transformers' loader would
/// leave randomly initialised — the check `verify` runs on the written folder, here on
/// the plan. A complete model, and `--quiet`, say nothing of the kind.
#[test]
fn save_says_before_writing_what_transformers_would_miss() -> Result<(), Box<dyn std::error::Error>>
{
    let tmp = tempfile::tempdir()?;
    let shape = small_llama(DType::BF16);
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src)?;
    let all = llama_like(shape);
    let kept: Vec<FixtureTensor> = all
        .iter()
        .filter(|t| !t.name.starts_with("model.layers.0."))
        .cloned()
        .collect();
    let lost = all.len() - kept.len();
    devmap::fixtures::write_sharded(&src, &kept, 1)?;
    write_json(&src.join("config.json"), &llama_config(shape))?;
    let out = tmp.path().join("out");
    let o = devmap(&["save", arg(&src), "--out", arg(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("warning: model.layers.0.mlp.gate_proj.weight: MISSING: LlamaForCausalLM has it (shape [64, 32] by config.json) but the checkpoint does not; transformers would leave it randomly initialised"),
        "{err}"
    );
    assert_eq!(err.matches(": MISSING: ").count(), lost, "{err}");
    // Said before writing: the warnings come before the save's first line.
    let said = err.find("MISSING").unwrap_or(usize::MAX);
    assert!(said < err.find("saving ").unwrap_or(0), "{err}");
    // verify of the written folder finds the same.
    let (code, report) = verify(&out, &[]);
    assert_eq!(code, 1);
    assert_eq!(differences(&report).len(), lost);

    let quiet = devmap(&[
        "save",
        arg(&src),
        "--out",
        arg(&tmp.path().join("quiet")),
        "--quiet",
    ]);
    assert!(quiet.status.success() && !stderr(&quiet).contains("MISSING"));
    let complete = llama(DType::BF16);
    let o = devmap(&["save", arg(&complete.src), "--out", arg(&complete.out)]);
    assert!(
        o.status.success() && !stderr(&o).contains("MISSING"),
        "{}",
        stderr(&o)
    );
    Ok(())
}
