//! transformers 5 distributed checkpoints built here with the safetensors crate, as
//! torch's `HuggingFaceStorageWriter(save_distributed=True)` lays them out: rank files
//! `shard-0000K-model-00001-of-00001.safetensors` holding each rank's block under the
//! full name, `DCP_SHARDING_INFO` giving the blocks' offsets. (tests/python/dcp_ranks.py
//! checks files torch itself wrote.) Put together bit for bit, split along rows and
//! along columns; a gap is a warning for inspect and a refusal for save; blocks of one
//! name in two dtypes are refused naming both files.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{arg, devmap, read_saved, save, stderr};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// The f32 bytes of `values`.
fn f32s(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// Rows `rows` and columns `cols` of the 5×4 matrix whose element (r, c) is 4r + c.
fn block(rows: std::ops::Range<u32>, cols: std::ops::Range<u32>) -> Vec<u8> {
    f32s(rows.flat_map(|r| cols.clone().map(move |c| (4 * r + c) as f32)))
}

/// One rank's block: name, dtype, shape, bytes, offsets in the whole tensor.
type Block<'a> = (&'a str, Dtype, Vec<usize>, Vec<u8>, Vec<u64>);

/// A rank file holding `tensors`.
fn rank_file(dir: &Path, rank: usize, tensors: &[Block]) {
    let info: serde_json::Map<String, serde_json::Value> = tensors
        .iter()
        .map(|(name, _, _, _, at)| {
            (
                (*name).to_owned(),
                serde_json::json!({ "saved_offsets": at }),
            )
        })
        .collect();
    let metadata = HashMap::from([
        ("format".to_owned(), "pt".to_owned()),
        (
            "DCP_SHARDING_INFO".to_owned(),
            serde_json::Value::Object(info).to_string(),
        ),
    ]);
    let views: Vec<(&str, TensorView)> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes, _)| {
            (
                *name,
                TensorView::new(*dtype, shape.clone(), bytes).expect("view"),
            )
        })
        .collect();
    let file = dir.join(format!(
        "shard-{:05}-model-00001-of-00001.safetensors",
        rank + 1
    ));
    safetensors::serialize_to_file(views, Some(metadata), &file).expect("write");
}

#[test]
fn blocks_along_rows_and_columns_are_put_together() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("ckpt");
    std::fs::create_dir(&dir).expect("dir");
    let bias = f32s([1.0, 2.0, 3.0]);
    rank_file(
        &dir,
        0,
        &[
            (
                "rows.weight",
                Dtype::F32,
                vec![3, 4],
                block(0..3, 0..4),
                vec![0, 0],
            ),
            (
                "cols.weight",
                Dtype::F32,
                vec![5, 1],
                block(0..5, 0..1),
                vec![0, 0],
            ),
            ("bias", Dtype::F32, vec![3], bias.clone(), vec![0]),
        ],
    );
    rank_file(
        &dir,
        1,
        &[
            (
                "rows.weight",
                Dtype::F32,
                vec![2, 4],
                block(3..5, 0..4),
                vec![3, 0],
            ),
            (
                "cols.weight",
                Dtype::F32,
                vec![5, 3],
                block(0..5, 1..4),
                vec![0, 1],
            ),
        ],
    );
    let out = tmp.path().join("out");
    let o = save(&dir, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = read_saved(&out);
    let whole = block(0..5, 0..4);
    for name in ["rows.weight", "cols.weight"] {
        assert_eq!(saved[name].shape, [5, 4], "{name}");
        assert_eq!(saved[name].data, whole, "{name}");
    }
    assert_eq!(saved["bias"].data, bias);

    let o = devmap(&["inspect", arg(&dir), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let cols = report["tensors"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == "cols.weight"))
        .expect("cols.weight");
    assert_eq!(cols["source"]["kind"], "pieces");
    assert_eq!(cols["source"]["chunks"][1]["rank"], 1);
    assert_eq!(
        cols["source"]["chunks"][1]["offsets"],
        serde_json::json!([0, 1])
    );
}

#[test]
fn a_gap_is_warned_and_refused_and_mixed_dtypes_name_both_files() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("gap");
    std::fs::create_dir(&dir).expect("dir");
    rank_file(
        &dir,
        0,
        &[("w", Dtype::F32, vec![3, 4], block(0..3, 0..4), vec![0, 0])],
    );
    rank_file(
        &dir,
        1,
        &[("w", Dtype::F32, vec![1, 4], block(4..5, 0..4), vec![4, 0])],
    );
    let o = devmap(&["inspect", arg(&dir)]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned() + &stderr(&o);
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains("`w` is stored in 2 chunks across ranks that do not make it up"),
        "{text}"
    );
    assert!(text.contains("[3, 0]"), "{text}");
    let out = tmp.path().join("out");
    let o = save(&dir, &out, &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("in no chunk"), "{}", stderr(&o));
    assert!(!out.exists());

    let dir = tmp.path().join("dtypes");
    std::fs::create_dir(&dir).expect("dir");
    rank_file(
        &dir,
        0,
        &[("w", Dtype::F32, vec![3, 4], block(0..3, 0..4), vec![0, 0])],
    );
    let half: Vec<u8> = vec![0; 2 * 4 * 2];
    rank_file(&dir, 1, &[("w", Dtype::F16, vec![2, 4], half, vec![3, 0])]);
    let o = devmap(&["inspect", arg(&dir)]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("shard-00002-model-00001-of-00001.safetensors")
            && err.contains("shard-00001-model-00001-of-00001.safetensors")
            && err.contains("`w`"),
        "{err}"
    );
}

/// Rows `rows` and columns `cols` of an R×C matrix whose element (r, c) is
/// (r·C + c) mod 251 — exact in bfloat16.
fn big_block(c_total: u32, rows: std::ops::Range<u32>, cols: std::ops::Range<u32>) -> Vec<u8> {
    f32s(rows.flat_map(|r| cols.clone().map(move |c| ((r * c_total + c) % 251) as f32)))
}

#[test]
fn a_column_split_past_one_window_is_put_together_and_cast() {
    // 4096 × 640 f32 (10 MiB: more than one assembly window), split into columns of
    // 100, 300 and 240 over three ranks.
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("ckpt");
    std::fs::create_dir(&dir).expect("dir");
    let (rows, cols) = (4096u32, 640u32);
    for (rank, (c0, c1)) in [(0, 100), (100, 400), (400, 640)].into_iter().enumerate() {
        rank_file(
            &dir,
            rank,
            &[(
                "w",
                Dtype::F32,
                vec![rows as usize, (c1 - c0) as usize],
                big_block(cols, 0..rows, c0..c1),
                vec![0, u64::from(c0)],
            )],
        );
    }
    let whole = big_block(cols, 0..rows, 0..cols);
    let out = tmp.path().join("out");
    let o = save(&dir, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(read_saved(&out)["w"].data == whole, "assembled as written");
    let out = tmp.path().join("bf16");
    let o = save(&dir, &out, &["--dtype", "bfloat16"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = read_saved(&out);
    assert_eq!(saved["w"].dtype, "BF16");
    // Small integers are exact in bfloat16: its bytes are the f32's upper halves.
    let want: Vec<u8> = whole.chunks(4).flat_map(|f| [f[2], f[3]]).collect();
    assert!(saved["w"].data == want, "cast as assembled");
    let o = devmap(&[
        "verify",
        arg(&out),
        "--against",
        arg(&dir),
        "--dtype",
        "bfloat16",
        "--quiet",
    ]);
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
}
