//! Properties over random models: save, read back with the `safetensors` crate, and
//! find exactly the current value of every tensor; and the readers never panic on
//! random bytes (a bounded, stable-toolchain companion to the cargo-fuzz targets).

mod common;

use std::collections::BTreeMap;

use common::{Stored, read_saved};
use devmap::fixtures::{
    FixtureTensor, write_offload_dat, write_offload_per_tensor, write_safetensors,
};
use devmap::model::{LoadOptions, load};
use devmap::save::{Reporter, SaveOptions, prepare, write};
use devmap::types::DType;
use proptest::prelude::*;

const DTYPES: [DType; 9] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::U8,
    DType::Bool,
    DType::F8E4M3,
    DType::I32,
    DType::F64,
];

#[derive(Debug, Clone)]
struct Spec {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    offloaded: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::sample::select(vec!["a", "b", "experts"]),
        0u32..12,
        prop::sample::select(vec!["weight", "bias", "scale"]),
        prop::sample::select(DTYPES.to_vec()),
        prop::collection::vec(0u64..5, 0..4),
        any::<bool>(),
    )
        .prop_map(|(m, i, leaf, dtype, shape, offloaded)| Spec {
            name: format!("model.{m}.{i}.{leaf}"),
            dtype,
            shape,
            offloaded,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn save_then_read_back_gives_every_current_value(
        specs in prop::collection::vec(spec(), 1..14),
        shard_size in 1u64..3000,
        files in 1usize..4,
        tie_pairs in prop::collection::vec((0usize..14, 0usize..14), 0..3),
        keep_tied in any::<bool>(),
        per_tensor_form in any::<bool>(),
        jobs in 1usize..4,
    ) {
        // Unique names.
        let mut seen = std::collections::HashSet::new();
        let specs: Vec<Spec> = specs.into_iter().filter(|s| seen.insert(s.name.clone())).collect();
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("m");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("config.json"), r#"{"tie_word_embeddings": false}"#).expect("config");
        let tensors: Vec<FixtureTensor> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| FixtureTensor::patterned(&s.name, s.dtype, &s.shape, i as u64 + 1))
            .collect();
        for k in 0..files {
            let members: Vec<&FixtureTensor> = tensors.iter().skip(k).step_by(files).collect();
            if !members.is_empty() {
                write_safetensors(&dir.join(format!("part-{k}.safetensors")), &members).expect("write");
            }
        }
        let offloaded: Vec<FixtureTensor> = specs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.offloaded)
            .map(|(i, s)| FixtureTensor::patterned(&s.name, s.dtype, &s.shape, 10_000 + i as u64))
            .collect();
        // numpy cannot map an empty .dat, so accelerate never writes one: keep them
        // out of the .dat form.
        let offloaded: Vec<FixtureTensor> = if per_tensor_form {
            offloaded
        } else {
            offloaded.into_iter().filter(|t| !t.data.is_empty()).collect()
        };
        if !offloaded.is_empty() {
            if per_tensor_form {
                write_offload_per_tensor(&dir.join("offload"), &offloaded).expect("offload");
            } else {
                write_offload_dat(&dir.join("offload"), &offloaded).expect("offload");
            }
        }
        let mut current: BTreeMap<String, Stored> = tensors.iter().map(|t| (t.name.clone(), Stored::of(t))).collect();
        for t in &offloaded {
            current.insert(t.name.clone(), Stored::of(t));
        }
        let is_offloaded = |n: &str| offloaded.iter().any(|t| t.name == n);

        // Disjoint ties between tensors of the same dtype and shape: TIED=KEPT.
        let mut used = std::collections::HashSet::new();
        let mut ties = Vec::new();
        for (a, b) in tie_pairs {
            let (Some(x), Some(y)) = (specs.get(a), specs.get(b)) else { continue };
            if a == b || x.dtype != y.dtype || x.shape != y.shape || used.contains(&a) || used.contains(&b) {
                continue;
            }
            used.insert(a);
            used.insert(b);
            ties.push((x.name.clone(), y.name.clone()));
        }
        // The value of a tie group: an offload value wins, the kept name's first.
        let mut expected = current.clone();
        for (tied, kept) in &ties {
            let value = if is_offloaded(kept) || !is_offloaded(tied) {
                current[kept].clone()
            } else {
                current[tied].clone()
            };
            expected.insert(kept.clone(), value.clone());
            if keep_tied {
                expected.insert(tied.clone(), value);
            } else {
                expected.remove(tied);
            }
        }

        let ckpt = load(&dir, &LoadOptions { ties: ties.clone(), ..LoadOptions::default() }).expect("load");
        let options = SaveOptions {
            max_shard_size: shard_size,
            keep_tied,
            jobs,
            ..SaveOptions::new(tmp.path().join("out"))
        };
        let plan = prepare(&ckpt, &options).expect("plan");
        let cancel = std::sync::atomic::AtomicBool::new(false);
        write(&ckpt, &plan, &options, &cancel, &Reporter::new(None, &cancel)).expect("save");
        prop_assert_eq!(read_saved(&tmp.path().join("out")), expected);
    }

    /// Random header text behind a length prefix that fits (or nearly fits) it, so
    /// most cases get past the length check into UTF-8 and JSON parsing.
    #[test]
    fn the_header_reader_never_panics(
        body in prop::collection::vec(any::<u8>(), 0..300),
        slack in -2i64..=2,
        data in 0usize..16,
    ) {
        let declared = (body.len() as i64 + slack).max(0) as u64;
        let mut bytes = declared.to_le_bytes().to_vec();
        bytes.extend_from_slice(&body);
        bytes.resize(bytes.len() + data, 0);
        let len = bytes.len() as u64;
        let path = std::path::Path::new("header-under-test.safetensors");
        match devmap::formats::safetensors::parse_header(path, &bytes, len) {
            // Anything accepted is a real layout: it covers the data exactly.
            Ok(h) => {
                let covered: u64 = h.tensors.iter().map(|t| t.len).sum();
                prop_assert_eq!(h.data_start + covered, len);
            }
            // A refusal names the file, as every error a user can cause does.
            Err(e) => prop_assert!(
                e.to_string().contains("header-under-test.safetensors"),
                "an error that does not name the file: {e}"
            ),
        }
    }

    /// Headers laid out as the safetensors library lays them out — accepted, with
    /// every tensor where it was put — and the same with one defect, refused naming
    /// the file. (Random bytes almost never make a valid header, so this is where
    /// acceptance is checked at all.)
    #[test]
    fn well_formed_headers_are_read_back_and_one_defect_is_refused(
        tensors in prop::collection::vec((
            prop::sample::select(vec![("F32", 4u64), ("BF16", 2), ("U8", 1), ("I64", 8)]),
            prop::collection::vec(0u64..5, 0..3),
        ), 1..6),
        defect in 0usize..6,
    ) {
        let mut entries = Vec::new();
        let mut offset = 0u64;
        for (i, ((dtype, size), shape)) in tensors.iter().enumerate() {
            let len = size * shape.iter().product::<u64>();
            entries.push((format!("t{i}.weight"), *dtype, shape.clone(), offset, offset + len));
            offset += len;
        }
        let data_len = offset;
        // 0: none. 1: the last tensor ends one byte early. 2: an unknown dtype.
        // 3: a name twice. 4: one byte of data too many. 5: one too few.
        let last = entries.len() - 1;
        match defect {
            1 => entries[last].4 = entries[last].4.wrapping_sub(1),
            2 => entries[0].1 = "F33",
            3 if entries.len() > 1 => entries[1].0 = entries[0].0.clone(),
            _ => {}
        }
        let body: Vec<String> = entries
            .iter()
            .map(|(n, d, s, a, b)| format!("{n:?}:{{\"dtype\":{d:?},\"shape\":{s:?},\"data_offsets\":[{a},{b}]}}"))
            .collect();
        let mut header = format!("{{{}}}", body.join(","));
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        let data = match defect {
            4 => data_len + 1,
            5 => data_len.saturating_sub(1),
            _ => data_len,
        };
        bytes.resize(bytes.len() + data as usize, 0);
        let path = std::path::Path::new("header-under-test.safetensors");
        let parsed = devmap::formats::safetensors::parse_header(path, &bytes, bytes.len() as u64);
        // Some defects cannot be made: a name twice needs two tensors, one byte too
        // few needs some data.
        let broken = match defect {
            1 | 2 | 4 => true,
            3 => entries.len() > 1,
            5 => data_len > 0,
            _ => false,
        };
        match parsed {
            Ok(h) => {
                prop_assert!(!broken, "defect {defect} accepted");
                prop_assert_eq!(h.tensors.len(), entries.len());
                for (name, _, _, a, b) in &entries {
                    let found = h.tensors.iter().find(|t| *t.name == **name);
                    prop_assert!(found.is_some(), "{name} missing");
                    prop_assert_eq!(found.map(|t| t.len), Some(b - a));
                }
            }
            Err(e) => {
                prop_assert!(broken, "a well-formed header refused: {e}");
                prop_assert!(e.to_string().contains("header-under-test.safetensors"), "{e}");
            }
        }
    }

    #[test]
    fn the_header_reader_never_panics_on_near_valid_headers(
        entries in prop::collection::vec((
            "[a-z.]{0,6}",
            prop::sample::select(vec!["F32", "BF16", "U8", "I64", "X", ""]),
            prop::collection::vec(0u64..6, 0..3),
            0u64..40,
            0u64..40,
        ), 0..5),
        extra in 0usize..40,
    ) {
        let body: Vec<String> = entries
            .iter()
            .map(|(n, d, s, a, b)| format!("{n:?}:{{\"dtype\":{d:?},\"shape\":{s:?},\"data_offsets\":[{a},{b}]}}"))
            .collect();
        let header = format!("{{{}}}", body.join(","));
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + extra, 0);
        if let Ok(h) = devmap::formats::safetensors::parse_header(std::path::Path::new("x"), &bytes, bytes.len() as u64) {
            let covered: u64 = h.tensors.iter().map(|t| t.len).sum();
            prop_assert_eq!(covered, extra as u64, "accepted a layout that does not cover the data");
        }
    }

    /// Offload indexes of the `.dat` form whose entries are near valid (known and
    /// unknown dtypes, shapes, files of the right or a wrong length, missing files),
    /// over a real folder, so every check of the reader is reached.
    #[test]
    fn the_offload_reader_accepts_only_entries_that_match_their_files(
        entries in prop::collection::vec((
            prop::sample::select(vec!["a", "b.c", "d.e.f", "../up", ""]),
            prop::sample::select(vec!["float16", "bfloat16", "float32", "int64", "bool", "float99"]),
            prop::collection::vec(0u64..5, 0..3),
            // The .dat file: the right length (most often), one byte off, or missing.
            prop::sample::select(vec![Some(0i64), Some(0), Some(0), Some(1), Some(-1), None]),
        ), 0..5),
    ) {
        let tmp = tempfile::tempdir().expect("tmp");
        let folder = tmp.path().join("offload");
        std::fs::create_dir(&folder).expect("mkdir");
        let mut index = serde_json::Map::new();
        for (name, dtype, shape, dat_off) in &entries {
            index.insert((*name).to_owned(), serde_json::json!({"dtype": dtype, "shape": shape}));
            let size = devmap::types::DType::from_torch_name(dtype).map_or(4, devmap::types::DType::size);
            let exact = size * shape.iter().product::<u64>();
            if let (Some(off), false) = (dat_off, name.contains('/') || name.is_empty()) {
                let len = (exact as i64 + off).max(0) as usize;
                std::fs::write(folder.join(format!("{name}.dat")), vec![0u8; len]).expect("dat");
            }
        }
        let text = serde_json::Value::Object(index).to_string();
        let mut headers = devmap::formats::safetensors::HeaderCache::default();
        let parsed = devmap::formats::offload::parse_index(
            &folder, &folder.join("index.json"), &text, tmp.path(), &mut headers,
        );
        if let Ok(accepted) = parsed {
            for e in &accepted {
                let want = devmap::types::byte_len(e.dtype, &e.shape).expect("len");
                prop_assert_eq!(e.len, want, "{} accepted with the wrong length", e.name);
                let on_disk = std::fs::metadata(&e.file).map_or(0, |m| m.len());
                prop_assert_eq!(on_disk, want, "{} accepted over a file of another size", e.name);
                prop_assert!(!e.name.is_empty() && !e.name.contains(".."), "{:?} accepted", e.name);
            }
        }
    }

    #[test]
    fn near_valid_device_maps_never_panic(
        entries in prop::collection::vec(("[a-z.0-9]{0,8}", prop::sample::select(vec![
            "0", "-1", "1.5", "\"cpu\"", "\"disk\"", "\"cuda:3\"", "\"cuda:-2\"", "\"tpu\"", "null", "[]", "4294967296",
        ])), 0..6),
    ) {
        let body: Vec<String> = entries.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
        let text = format!("{{{}}}", body.join(","));
        if let Ok(map) = devmap::formats::device_map::parse_device_map(std::path::Path::new("m.json"), &text) {
            // Accepted: every key came from the input, with a value that names a device.
            for (key, placement) in map.entries() {
                let given = entries.iter().rev().find(|(k, _)| k == key);
                prop_assert!(given.is_some(), "key {key:?} was not in the input");
                prop_assert_ne!(*placement, devmap::model::Placement::Unmapped);
            }
        }
    }
}
