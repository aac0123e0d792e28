//! One save written by the ranks of a sharded job (`save::ranks`) without Python or
//! torch: each "rank" is a manifest whose tensors hold only that rank's blocks (Rust
//! buffers, read through /proc/self/mem), the steps run in the order the Python
//! package runs them across processes. The output is read back with the `safetensors`
//! crate and compared with the whole tensors; a missing rank, two ranks writing the
//! same elements and elements no rank wrote are refused at the commit with the rank or
//! tensor named and OUT left as it was. (tests/python/fsdp_ranks.py checks real FSDP2
//! jobs against transformers.)

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use devmap::formats::live::{RankOf, parse_manifest};
use devmap::model::load::load_live;
use devmap::save::parts::Distributed;
use devmap::save::shards::DtypeChoice;
use devmap::save::{SaveError, SaveOptions, ranks};

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `w` [7, 5] split along dimension 0 (3, 3, 1 rows, as torch.chunk deals 7 over 3),
/// `v` [4, 6] along dimension 1 (columns 0..3 and 3..6, on ranks 0 and 1), `b` [5]
/// whole on rank 0: the whole tensors, and each rank's blocks as buffers.
struct Model {
    w: Vec<f32>,
    v: Vec<f32>,
    b: Vec<f32>,
    /// Per rank, its blocks.
    blocks: Vec<Vec<Block>>,
}

/// A block a rank holds: (tensor, offsets, sizes, the block's bytes).
type Block = (&'static str, Vec<u64>, Vec<u64>, Vec<u8>);

fn model() -> Model {
    let w: Vec<f32> = (0..35).map(|i| i as f32 * 0.25 - 2.0).collect();
    let v: Vec<f32> = (0..24).map(|i| 100.0 + i as f32).collect();
    let b: Vec<f32> = (0..5).map(|i| -(i as f32)).collect();
    let rows = |from: usize, to: usize| f32_bytes(&w[from * 5..to * 5]);
    let columns = |from: usize, to: usize| {
        let picked: Vec<f32> = (0..4)
            .flat_map(|r| v[r * 6 + from..r * 6 + to].to_vec())
            .collect();
        f32_bytes(&picked)
    };
    let blocks = vec![
        vec![
            ("w", vec![0, 0], vec![3, 5], rows(0, 3)),
            ("v", vec![0, 0], vec![4, 3], columns(0, 3)),
            ("b", vec![0], vec![5], f32_bytes(&b)),
        ],
        vec![
            ("w", vec![3, 0], vec![3, 5], rows(3, 6)),
            ("v", vec![0, 3], vec![4, 3], columns(3, 6)),
        ],
        vec![("w", vec![6, 0], vec![1, 5], rows(6, 7))],
    ];
    Model { w, v, b, blocks }
}

/// Rank `rank`'s manifest: every tensor whole in shape, its source this rank's blocks.
fn manifest(config: &Path, blocks: &[Block], rank: u32) -> String {
    let pieces = |name: &str| -> Vec<serde_json::Value> {
        blocks
            .iter()
            .filter(|b| b.0 == name)
            .map(|(_, offsets, sizes, data)| {
                serde_json::json!({"offsets": offsets, "sizes": sizes, "address": data.as_ptr() as u64})
            })
            .collect()
    };
    let tensor = |name: &str, shape: &[u64]| {
        serde_json::json!({"name": name, "dtype": "float32", "shape": shape, "device": "cpu",
                           "source": {"kind": "pieces", "pieces": pieces(name)}})
    };
    serde_json::json!({
        "format": devmap::formats::live::FORMAT,
        "config_dir": config,
        "rank": {"rank": rank, "world": 3},
        "tensors": [tensor("w", &[7, 5]), tensor("v", &[4, 6]), tensor("b", &[5])],
    })
    .to_string()
}

struct Rank {
    ckpt: devmap::model::Checkpoint,
    plan: devmap::save::SavePlan,
    options: SaveOptions,
    part: RankOf,
}

fn planned(text: &str, out: &Path, dtype: DtypeChoice) -> Rank {
    let origin = Path::new("manifest");
    let manifest = parse_manifest(text, origin).expect("manifest");
    let part = manifest.rank.expect("a rank");
    let ckpt = load_live(&manifest, origin).expect("loads");
    let mut options = SaveOptions::new(out);
    options.dtype = dtype;
    options.max_shard_size = 100;
    options.distributed = Some(Distributed::Ranks(part));
    let plan = devmap::save::prepare(&ckpt, &options).expect("plans");
    Rank {
        ckpt,
        plan,
        options,
        part,
    }
}

fn config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("config");
    std::fs::create_dir_all(&config).expect("mkdir");
    std::fs::write(
        config.join("config.json"),
        r#"{"model_type": "toy", "dtype": "float32"}"#,
    )
    .expect("config");
    config
}

/// The steps in the order the Python package runs them; `writing` says which ranks
/// write (a rank that died writes nothing). The commit's result.
fn run(ranks: &[Rank], writing: &[usize]) -> Result<devmap::save::SaveReport, SaveError> {
    let fingerprints: Vec<String> = ranks
        .iter()
        .map(|r| ranks::fingerprint(&r.ckpt, &r.plan))
        .collect();
    assert!(fingerprints.iter().all(|f| *f == fingerprints[0]));
    let zero = &ranks[0];
    ranks::create(&zero.ckpt, &zero.plan, &zero.options, 3).expect("creates");
    let cancel = AtomicBool::new(false);
    for &k in writing {
        let r = &ranks[k];
        ranks::write_held(
            &r.ckpt,
            &r.plan,
            &r.options,
            (r.part, true),
            &cancel,
            &mut |_| {},
        )
        .expect("writes and reads back what it wrote");
    }
    let result = ranks::commit(&zero.ckpt, &zero.plan, &zero.options, 3, &cancel);
    if result.is_err() {
        ranks::abandon(&zero.ckpt, &zero.plan, &zero.options.out);
    }
    result
}

#[test]
fn three_ranks_write_their_blocks_into_one_checkpoint() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = config(tmp.path());
    let m = model();
    for (dtype, name) in [
        (DtypeChoice::AsLoaded, "F32"),
        (DtypeChoice::To(devmap::types::DType::BF16), "BF16"),
    ] {
        let out = tmp.path().join(format!("out-{name}"));
        let ranks: Vec<Rank> = (0..3)
            .map(|k| planned(&manifest(&config, &m.blocks[k], k as u32), &out, dtype))
            .collect();
        let report = run(&ranks, &[2, 0, 1]).expect("commits");
        assert!(
            report.shard_files.len() > 1,
            "100-byte shards: several files"
        );
        let saved = common::read_saved(&out);
        let as_saved = |values: &[f32]| -> Vec<u8> {
            if name == "F32" {
                f32_bytes(values)
            } else {
                values
                    .iter()
                    .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                    .collect()
            }
        };
        for (tensor, values, shape) in [
            ("w", &m.w, vec![7, 5]),
            ("v", &m.v, vec![4, 6]),
            ("b", &m.b, vec![5]),
        ] {
            let t = &saved[tensor];
            assert_eq!((t.dtype.as_str(), &t.shape), (name, &shape), "{tensor}");
            assert_eq!(t.data, as_saved(values), "{tensor} in {name}");
        }
        assert!(!out.join(devmap::save::parts::PARTS_DIR).exists());
        assert!(out.join("config.json").exists());
    }
}

#[test]
fn a_missing_rank_two_ranks_on_the_same_elements_and_a_gap_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = config(tmp.path());
    let m = model();
    let out = tmp.path().join("out");
    let ranks: Vec<Rank> = (0..3)
        .map(|k| {
            planned(
                &manifest(&config, &m.blocks[k], k as u32),
                &out,
                DtypeChoice::AsLoaded,
            )
        })
        .collect();

    // Rank 1 never wrote.
    let err = run(&ranks, &[0, 2]).expect_err("refused").to_string();
    assert!(err.contains("rank 1 of 3 did not write its part"), "{err}");
    assert_eq!(
        std::fs::read_dir(&out).map_or(0, Iterator::count),
        0,
        "OUT untouched"
    );

    // Rank 2 claims rank 1's rows too: overlap.
    let mut greedy = m.blocks[2].clone();
    greedy.push(m.blocks[1][0].clone());
    let overlapping = [
        planned(
            &manifest(&config, &m.blocks[0], 0),
            &out,
            DtypeChoice::AsLoaded,
        ),
        planned(
            &manifest(&config, &m.blocks[1], 1),
            &out,
            DtypeChoice::AsLoaded,
        ),
        planned(&manifest(&config, &greedy, 2), &out, DtypeChoice::AsLoaded),
    ];
    let err = run(&overlapping, &[0, 1, 2])
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("`w`: the ranks' blocks do not make it up: ranks 1 and 2 both wrote"),
        "{err}"
    );

    // Nobody holds `v`'s last three columns.
    let mut short = m.blocks[1].clone();
    short.retain(|b| b.0 != "v");
    let gap = [
        planned(
            &manifest(&config, &m.blocks[0], 0),
            &out,
            DtypeChoice::AsLoaded,
        ),
        planned(&manifest(&config, &short, 1), &out, DtypeChoice::AsLoaded),
        planned(
            &manifest(&config, &m.blocks[2], 2),
            &out,
            DtypeChoice::AsLoaded,
        ),
    ];
    let err = run(&gap, &[0, 1, 2]).expect_err("refused").to_string();
    assert!(
        err.contains("`v`: the ranks' blocks do not make it up"),
        "{err}"
    );
    assert!(err.contains("missing"), "{err}");
    assert_eq!(
        std::fs::read_dir(&out).map_or(0, Iterator::count),
        0,
        "OUT untouched"
    );

    // A rank whose model has another shape plans another save.
    let other = manifest(&config, &m.blocks[0], 0).replace("[7,5]", "[8,5]");
    let changed = planned(&other, &out, DtypeChoice::AsLoaded);
    assert_ne!(
        ranks::fingerprint(&changed.ckpt, &changed.plan),
        ranks::fingerprint(&ranks[0].ckpt, &ranks[0].plan)
    );
}

/// A rank's read-back finds a byte that is not what its shard holds, and names the
/// tensor, the rank and where.
#[test]
fn a_rank_reading_back_a_changed_block_fails_naming_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = config(tmp.path());
    let m = model();
    let out = tmp.path().join("out");
    let ranks: Vec<Rank> = (0..3)
        .map(|k| {
            planned(
                &manifest(&config, &m.blocks[k], k as u32),
                &out,
                DtypeChoice::AsLoaded,
            )
        })
        .collect();
    let zero = &ranks[0];
    let dir = ranks::create(&zero.ckpt, &zero.plan, &zero.options, 3).expect("creates");
    let cancel = AtomicBool::new(false);
    let one = &ranks[1];
    ranks::write_held(
        &one.ckpt,
        &one.plan,
        &one.options,
        (one.part, false),
        &cancel,
        &mut |_| {},
    )
    .expect("writes");
    ranks::verify_held(&one.ckpt, &one.plan, &one.options, one.part, &cancel).expect("as written");
    // Flip one byte of rank 1's rows of `w` in the shard that holds it.
    let (shard, at) = one
        .plan
        .shards
        .iter()
        .find_map(|s| {
            s.tensors
                .iter()
                .find(|t| t.name(&one.ckpt) == "w")
                .map(|t| (s, s.header_len + t.begin + 3 * 5 * 4 + 7))
        })
        .expect("w is planned");
    let path = dir.join(&shard.file_name);
    let mut bytes = std::fs::read(&path).expect("shard");
    bytes[at as usize] ^= 0x40;
    std::fs::write(&path, &bytes).expect("write back");
    let err = ranks::verify_held(&one.ckpt, &one.plan, &one.options, one.part, &cancel)
        .expect_err("the changed byte is found")
        .to_string();
    assert!(
        err.contains("`w`: what rank 1 wrote differs from its shards")
            && err.contains(&format!("from byte {at}")),
        "{err}"
    );
}

#[test]
fn blocks_outside_the_tensor_or_overlapping_on_one_rank_are_refused_when_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = config(tmp.path());
    let m = model();
    let mut wide = m.blocks[0].clone();
    wide[0].2 = vec![8, 5];
    let origin = Path::new("manifest");
    let text = manifest(&config, &wide, 0);
    let parsed = parse_manifest(&text, origin).expect("parses");
    let err = load_live(&parsed, origin).expect_err("refused").to_string();
    assert!(
        err.contains("`w`") && err.contains("reaches outside"),
        "{err}"
    );
}
