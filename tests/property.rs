//! Properties over random models: save, read back with the `safetensors` crate, and
//! find exactly the current value of every tensor; and the readers never panic on
//! random bytes (a bounded, stable-toolchain companion to the cargo-fuzz targets).

mod common;

use std::collections::BTreeMap;

use common::{Stored, read_saved};
use devmap::fixtures::{
    FixtureTensor, write_offload_dat, write_offload_per_tensor, write_safetensors,
};
use devmap::model::{DType, LoadOptions, load};
use devmap::save::{Reporter, SaveOptions, prepare, write};
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

    #[test]
    fn the_header_reader_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = devmap::formats::safetensors::parse_header(std::path::Path::new("x"), &bytes, bytes.len() as u64);
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

    #[test]
    fn the_device_map_and_offload_readers_never_panic(text in "\\PC{0,200}") {
        let p = std::path::Path::new("/nonexistent-devmap/offload");
        let _ = devmap::formats::device_map::parse_device_map(std::path::Path::new("m.json"), &text);
        let mut headers = devmap::formats::safetensors::HeaderCache::default();
        let _ = devmap::formats::offload::parse_index(p, &p.join("index.json"), &text, p, &mut headers);
    }

    #[test]
    fn near_valid_device_maps_never_panic(
        entries in prop::collection::vec(("[a-z.0-9]{0,8}", prop::sample::select(vec![
            "0", "-1", "1.5", "\"cpu\"", "\"disk\"", "\"cuda:3\"", "\"cuda:-2\"", "\"tpu\"", "null", "[]", "4294967296",
        ])), 0..6),
    ) {
        let body: Vec<String> = entries.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
        let text = format!("{{{}}}", body.join(","));
        let _ = devmap::formats::device_map::parse_device_map(std::path::Path::new("m.json"), &text);
    }
}
