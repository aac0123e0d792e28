//! torch.distributed.checkpoint folders written by `devmap::fixtures::dcp` (the layout
//! `dcp.save` writes, without torch): a nested state dict over two ranks, tensors split
//! on their rows and whole, put together byte for byte and read back with the
//! `safetensors` crate; the hostile variants (a chunk left out, two chunks that
//! overlap, a chunk stored outside the folder, a data file cut short or missing)
//! refused by name with nothing written. The same against torch itself:
//! tests/real/dcp.rs.

mod common;

use std::path::Path;

use common::{arg, devmap, stderr, stdout};
use devmap::fixtures::dcp::{DcpStored, DcpTensor, write_dcp, write_metadata};
use devmap::fixtures::{FixtureTensor, write_json};
use devmap::types::DType;

const UP: &str = "model.layers.0.mlp.up_proj.weight";

/// The model's tensors, and the checkpoint's: each under `model`, the up projection
/// and the embedding split over two ranks, the norm whole on rank 0, an optimizer
/// moment under `optim` (not the model's) and a step counter; and where each chunk
/// went.
fn checkpoint(dir: &Path) -> (Vec<FixtureTensor>, Vec<DcpTensor>, Vec<DcpStored>) {
    let model = vec![
        FixtureTensor::patterned("model.embed_tokens.weight", DType::BF16, &[16, 8], 1),
        FixtureTensor::patterned(UP, DType::F32, &[12, 8], 2),
        FixtureTensor::patterned("model.norm.weight", DType::F32, &[8], 3),
    ];
    let mut entries: Vec<DcpTensor> = model
        .iter()
        .map(|t| {
            let ranks = if t.shape.len() == 2 { 2 } else { 1 };
            DcpTensor::split_rows(&["model", &t.name], t.dtype, &t.shape, &t.data, ranks)
        })
        .collect();
    let moment = FixtureTensor::patterned("exp_avg", DType::F32, &[12, 8], 4);
    entries.push(DcpTensor::split_rows(
        &["optim", "state", UP, "exp_avg"],
        DType::F32,
        &moment.shape,
        &moment.data,
        2,
    ));
    let stored = write_dcp(dir, &entries, &[("step", 7)]).expect("dcp");
    (model, entries, stored)
}

fn config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("config");
    std::fs::create_dir_all(&config).expect("mkdir");
    write_json(
        &config.join("config.json"),
        &serde_json::json!({"architectures": ["ToyForCausalLM"], "model_type": "toy"}),
    )
    .expect("config");
    config
}

#[test]
fn a_dcp_folder_of_two_ranks_saves_the_model_byte_for_byte() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("ckpt");
    let (model, _, _) = checkpoint(&src);
    let config = config(tmp.path());
    let out = tmp.path().join("out");
    let o = common::save(&src, &out, &["--config", arg(&config)]);
    assert!(o.status.success(), "{}", stderr(&o));
    common::assert_saved_exactly(&out, &model, "two ranks");
    // inspect lists the split tensors, and says what is not the model's by the key it
    // is under.
    let inspect = devmap(&["inspect", arg(&src), "--config", arg(&config), "--json"]);
    assert!(inspect.status.success(), "{}", stderr(&inspect));
    let report: serde_json::Value = serde_json::from_str(&stdout(&inspect)).expect("json");
    let names: Vec<&str> = report["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&UP), "{names:?}");
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("`optim` (1 tensor)") && warnings.contains("`step`"),
        "{warnings}"
    );
}

/// `damage` applied to a fresh checkpoint's tensors, storage and folder: save refuses
/// naming each of `needles`, with nothing written.
fn refused(
    label: &str,
    damage: impl Fn(&Path, &mut Vec<DcpTensor>, &mut Vec<DcpStored>),
    needles: &[&str],
) {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("ckpt");
    let (_, mut entries, mut stored) = checkpoint(&src);
    damage(&src, &mut entries, &mut stored);
    let config = config(tmp.path());
    let out = tmp.path().join("out");
    let o = common::save(&src, &out, &["--config", arg(&config)]);
    common::assert_refused(&o, &out, label, needles);
}

/// The index in `stored` of tensor `entry`'s chunk `chunk`.
fn chunk_at(entries: &[DcpTensor], entry: usize, chunk: usize) -> usize {
    entries[..entry]
        .iter()
        .map(|t| t.chunks.len())
        .sum::<usize>()
        + chunk
}

#[test]
fn a_chunk_left_out_or_overlapping_is_refused_naming_the_tensor() {
    refused(
        "gap",
        |dir, entries, stored| {
            stored.remove(chunk_at(entries, 1, 1));
            entries[1].chunks.pop();
            write_metadata(dir, entries, stored).expect("metadata");
        },
        &[
            "`model.layers.0.mlp.up_proj.weight`",
            "in no chunk",
            "[6, 0]",
        ],
    );
    refused(
        "overlap",
        |dir, entries, stored| {
            entries[1].chunks[1].offsets[0] -= 1;
            write_metadata(dir, entries, stored).expect("metadata");
        },
        &[
            "`model.layers.0.mlp.up_proj.weight`",
            "chunks 0 and 1 overlap",
        ],
    );
}

#[test]
fn a_chunk_stored_outside_the_folder_or_past_its_file_is_refused() {
    refused(
        "outside",
        |dir, entries, stored| {
            stored[0].relative_path = "../__0_0.distcp".into();
            write_metadata(dir, entries, stored).expect("metadata");
        },
        &[
            "model.model.embed_tokens.weight",
            "not a file in the folder",
        ],
    );
    refused(
        "cut short",
        |dir, _, stored| {
            let first = stored
                .iter()
                .filter(|s| s.relative_path == "__1_0.distcp")
                .map(|s| s.offset)
                .min()
                .unwrap_or(0);
            common::cut(&dir.join("__1_0.distcp"), first + 10);
        },
        &["__1_0.distcp"],
    );
    refused(
        "missing rank",
        |dir, _, _| std::fs::remove_file(dir.join("__1_0.distcp")).expect("rm"),
        &["__1_0.distcp", "cannot be read"],
    );
}
