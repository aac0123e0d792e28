//! `pytorch_model.bin` folders (single and sharded) read without torch: state dicts in
//! `torch.save`'s format written by `devmap::fixtures::torch_bin`, saved as safetensors
//! and read back with the `safetensors` crate; hostile archives refused by name with
//! nothing written. The same against torch itself: tests/real/torch_bin.rs.

mod common;

use std::path::Path;

use common::{arg, devmap, stderr, stdout};
use devmap::fixtures::torch_bin::{stored_zip, write_torch_bin};
use devmap::fixtures::{FixtureTensor, write_json};
use devmap::types::DType;

fn tensors() -> Vec<FixtureTensor> {
    vec![
        FixtureTensor::patterned("model.embed_tokens.weight", DType::BF16, &[16, 8], 1),
        FixtureTensor::patterned("model.layers.0.mlp.up_proj.weight", DType::F32, &[12, 8], 2),
        FixtureTensor::patterned("model.layers.0.input_layernorm.weight", DType::F16, &[8], 3),
        FixtureTensor::patterned("model.layers.0.step", DType::I64, &[], 4),
        FixtureTensor::patterned("model.norm.weight", DType::F32, &[8], 5),
    ]
}

fn config(dir: &Path) {
    write_json(
        &dir.join("config.json"),
        &serde_json::json!({"architectures": ["ToyForCausalLM"], "model_type": "toy"}),
    )
    .expect("config");
}

#[test]
fn a_pytorch_model_bin_saves_as_safetensors_byte_for_byte() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    config(&src);
    let ts = tensors();
    write_torch_bin(
        &src.join("pytorch_model.bin"),
        &ts.iter().collect::<Vec<_>>(),
    )
    .expect("bin");
    let out = tmp.path().join("out");
    let o = common::save(&src, &out, &["--max-shard-size", "300B"]);
    assert!(o.status.success(), "{}", stderr(&o));
    common::assert_saved_exactly(&out, &ts, "pytorch_model.bin");
    assert!(
        !out.join("pytorch_model.bin").exists(),
        "the .bin is never copied"
    );
    let inspect = devmap(&["inspect", arg(&src), "--json"]);
    assert!(inspect.status.success(), "{}", stderr(&inspect));
    let report: serde_json::Value = serde_json::from_str(&stdout(&inspect)).expect("json");
    let names: Vec<&str> = report["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for t in &ts {
        assert!(names.contains(&t.name.as_str()), "{} in {names:?}", t.name);
    }
    let kinds: Vec<&str> = report["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .filter_map(|t| t["source"]["kind"].as_str())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "torch_bin").count(),
        ts.len(),
        "{kinds:?}"
    );
    let verify = devmap(&["verify", arg(&out), "--against", arg(&src)]);
    assert!(verify.status.success(), "{}", stdout(&verify));
}

#[test]
fn sharded_bin_files_are_read_through_their_index() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    config(&src);
    let ts = tensors();
    let (first, second) = ts.split_at(2);
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [
        ("pytorch_model-00001-of-00002.bin", first),
        ("pytorch_model-00002-of-00002.bin", second),
    ] {
        write_torch_bin(&src.join(file), &part.iter().collect::<Vec<_>>()).expect("bin");
        for t in part {
            weight_map.insert(t.name.clone(), file.into());
        }
    }
    write_json(
        &src.join("pytorch_model.bin.index.json"),
        &serde_json::json!({"metadata": {}, "weight_map": weight_map}),
    )
    .expect("index");
    let out = tmp.path().join("out");
    let o = common::save(&src, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    common::assert_saved_exactly(&out, &ts, "pytorch_model.bin");
}

/// Writes a `.bin` whose archive is `bytes` and returns the save's output.
fn save_hostile(name: &str, bytes: Vec<u8>) -> (std::process::Output, std::path::PathBuf) {
    let tmp = tempfile::tempdir().expect("tmp").keep();
    let src = tmp.join(name);
    std::fs::create_dir(&src).expect("mkdir");
    config(&src);
    std::fs::write(src.join("pytorch_model.bin"), bytes).expect("bin");
    let out = tmp.join("out");
    (common::save(&src, &out, &[]), out)
}

#[test]
fn hostile_archives_are_refused_by_name_and_nothing_is_written() {
    let t = FixtureTensor::patterned("w", DType::F32, &[4], 1);
    let tmp = tempfile::tempdir().expect("tmp");
    let good = tmp.path().join("good.bin");
    write_torch_bin(&good, &[&t]).expect("bin");
    let good = std::fs::read(good).expect("read");

    // A pickle that names os.system.
    let evil = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00lsR.".to_vec();
    let forbidden = stored_zip(&[("archive/data.pkl".into(), evil)]);
    // The archive cut in its central directory; cut inside a member's data.
    let cut = good[..good.len() - 30].to_vec();
    let short = {
        // The storage member claims 16 bytes; keep the directory but drop data.
        let t_long = FixtureTensor::patterned("w", DType::F32, &[8], 1);
        let mut bytes = Vec::new();
        let tmp2 = tmp.path().join("long.bin");
        write_torch_bin(&tmp2, &[&t_long]).expect("bin");
        bytes.extend(std::fs::read(&tmp2).expect("read"));
        // Rewrite the storage to half its size: the pickle's tensor needs more.
        let members = [
            ("long/data.pkl".to_owned(), pickle_of(&bytes)),
            ("long/data/0".to_owned(), vec![0u8; 16]),
        ];
        stored_zip(&members)
    };
    let mut compressed = good.clone();
    // Method 8 (deflate) in the first central directory entry.
    let cd = find(&compressed, &0x0201_4b50u32.to_le_bytes()).expect("directory");
    compressed[cd + 10] = 8;
    use devmap::formats::Kind;
    for (name, bytes, needle, kind) in [
        ("forbidden", forbidden, "`os.system`", Kind::Unsafe),
        ("cut", cut, "zip", Kind::Malformed),
        ("short", short, "needs elements", Kind::Malformed),
        (
            "compressed",
            compressed,
            "compressed zip member",
            Kind::Unsupported,
        ),
    ] {
        // The reader says what kind of problem it is, besides naming it.
        let file = tmp.path().join(format!("{name}.bin"));
        std::fs::write(&file, &bytes).expect("write");
        let refused = devmap::formats::torch_bin::read_bin(&file).expect_err(name);
        assert_eq!(refused.kind(), Some(kind), "{name}: {refused}");
        let (o, out) = save_hostile(name, bytes);
        let err = stderr(&o);
        assert!(!o.status.success(), "{name}: saved");
        assert!(err.contains(needle), "{name}: {err}");
        assert!(
            err.contains("pytorch_model.bin"),
            "{name} names the file: {err}"
        );
        assert!(!out.exists(), "{name}: something was written");
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The data.pkl member of a `.bin` written by the fixture.
fn pickle_of(archive: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("a.bin");
    std::fs::write(&path, archive).expect("write");
    let file = std::fs::File::open(&path).expect("open");
    let members =
        devmap::formats::zip::members(&path, &file, archive.len() as u64).expect("members");
    let pkl = members
        .iter()
        .find(|m| m.name.ends_with("data.pkl"))
        .expect("pickle");
    devmap::formats::zip::read_member(&path, &file, pkl).expect("read")
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    /// A `.bin` with bytes changed or cut: read or refused, never a panic, and what
    /// reads has every tensor inside the file (the fuzz target `torch_bin` does the same
    /// without a seed's structure).
    #[test]
    fn damaged_archives_read_or_are_refused_never_panic(
        flips in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 0..6),
        cut in proptest::option::of(0usize..4096),
    ) {
        let ts = tensors();
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("pytorch_model.bin");
        write_torch_bin(&path, &ts.iter().collect::<Vec<_>>()).expect("bin");
        let mut bytes = std::fs::read(&path).expect("read");
        for (at, value) in flips {
            let i = at % bytes.len();
            bytes[i] ^= value;
        }
        if let Some(n) = cut {
            bytes.truncate(n % (bytes.len() + 1));
        }
        std::fs::write(&path, &bytes).expect("write");
        if let Ok((header, views)) = devmap::formats::torch_bin::read_bin(&path) {
            for t in &header.tensors {
                proptest::prop_assert!(t.offset + t.len <= bytes.len() as u64, "{} outside", t.name);
            }
            for v in &views {
                let r = v.pieces[0].range;
                proptest::prop_assert!(r.offset + r.len <= bytes.len() as u64, "{} outside", v.name);
            }
        }
    }
}

/// A training checkpoint has weights and nothing else: `--config DIR` gives the
/// config.json and the small files, read from there and copied beside the save.
#[test]
fn config_names_the_folder_a_bare_checkpoint_takes_its_config_from() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (ckpt, cfg) = (tmp.path().join("step-1000"), tmp.path().join("base"));
    std::fs::create_dir(&ckpt).expect("mkdir");
    std::fs::create_dir(&cfg).expect("mkdir");
    config(&cfg);
    std::fs::write(cfg.join("tokenizer.json"), "{}").expect("tokenizer");
    let ts = tensors();
    write_torch_bin(
        &ckpt.join("pytorch_model.bin"),
        &ts.iter().collect::<Vec<_>>(),
    )
    .expect("bin");
    let out = tmp.path().join("out");
    let o = common::save(&ckpt, &out, &["--config", arg(&cfg)]);
    assert!(o.status.success(), "{}", stderr(&o));
    common::assert_saved_exactly(&out, &ts, "pytorch_model.bin");
    for f in ["config.json", "tokenizer.json"] {
        assert_eq!(
            std::fs::read(out.join(f)).expect("copied"),
            std::fs::read(cfg.join(f)).expect("source"),
            "{f}"
        );
    }
    // The config is read from there: it ties the head, which nothing ties without it.
    write_json(
        &cfg.join("config.json"),
        &serde_json::json!({"architectures": ["ToyForCausalLM"], "tie_word_embeddings": true}),
    )
    .expect("config");
    let ties = |extra: &[&str]| {
        let mut args = vec!["inspect", arg(&ckpt), "--json"];
        args.extend_from_slice(extra);
        let report: serde_json::Value =
            serde_json::from_str(&stdout(&devmap(&args))).expect("json");
        report["ties"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(ties(&[]), 0, "without a config nothing ties the head");
    assert_eq!(ties(&["--config", arg(&cfg)]), 1, "the config ties it");
    // A folder without a config.json is no --config.
    let o = common::save(&ckpt, &tmp.path().join("never"), &["--config", arg(&ckpt)]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("has no config.json"), "{}", stderr(&o));
    assert!(!tmp.path().join("never").exists());
}

/// The archive reader takes a zip's end record, directory, local headers and small
/// members from the first and last few KiB it reads first. Archives where they lie
/// elsewhere — a directory too long for the tail, a long comment after the end
/// record, a member in the middle — are listed and read the same.
#[test]
fn zip_members_anywhere_in_the_archive_are_listed_and_read() {
    use devmap::formats::zip;
    let tmp = tempfile::tempdir().expect("tmp");
    let members: Vec<(String, Vec<u8>)> = (0..300)
        .map(|i| {
            let len = if i == 150 { 20_000 } else { i % 7 };
            (format!("archive/data/{i}"), vec![i as u8; len])
        })
        .collect();
    let plain = stored_zip(&members);
    // The end record's comment (its last two bytes give the length) pushes the end
    // record out of the last 4 KiB.
    let mut commented = plain.clone();
    let n = commented.len();
    commented[n - 2..].copy_from_slice(&9000u16.to_le_bytes());
    commented.extend(vec![b'c'; 9000]);
    // A small archive: its directory and last members lie in the last 4 KiB.
    let small_members: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| (format!("archive/data/{i}"), vec![i as u8 + 1; 300 + i]))
        .collect();
    let small = stored_zip(&small_members);
    for (name, bytes, members) in [
        ("plain.zip", plain, &members),
        ("commented.zip", commented, &members),
        ("small.zip", small, &small_members),
    ] {
        let path = tmp.path().join(name);
        std::fs::write(&path, &bytes).expect("write");
        let file = std::fs::File::open(&path).expect("open");
        let listed = zip::members(&path, &file, bytes.len() as u64).expect(name);
        assert_eq!(listed.len(), members.len(), "{name}");
        for (m, (want_name, want)) in listed.iter().zip(members) {
            assert_eq!(&m.name, want_name, "{name}");
            assert_eq!(m.len, want.len() as u64, "{name}");
            let read = zip::read_member(&path, &file, m).expect("read");
            assert_eq!(&read, want, "{name}: {want_name}");
            let at = m.offset as usize;
            assert_eq!(
                &bytes[at..at + want.len()],
                &want[..],
                "{name}: {want_name}"
            );
        }
    }
}
