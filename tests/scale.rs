//! The giant-model fixture used by the benchmarks, checked for real: a 60-layer ×
//! 256-expert MoE over 160 shards whose data regions are holes, so "657 GiB" costs a
//! few MB of disk, and devmap reads every header of it. Timings live in the benchmarks
//! (examples/bench_open.rs, examples/bench_tui.rs), not here.

use std::os::unix::fs::MetadataExt;

use devmap::fixtures::{MoeShape, write_sparse_moe};
use devmap::model::{LoadOptions, ModuleTree, load};

#[test]
fn a_hundred_thousand_tensor_sparse_checkpoint_opens() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("moe");
    let shape = MoeShape::GIANT;
    let (count, bytes) = write_sparse_moe(&dir, shape).expect("generate");
    assert!(count > 90_000, "{count} tensors");
    assert!(bytes > 600 << 30, "{bytes} bytes described");
    let (mut apparent, mut allocated, mut files) = (0u64, 0u64, 0usize);
    for e in std::fs::read_dir(&dir).expect("dir") {
        let m = e.expect("entry").metadata().expect("meta");
        apparent += m.len();
        allocated += m.blocks() * 512;
        files += 1;
    }
    assert_eq!(files, 160 + 2, "160 shards, the index and config.json");
    assert!(apparent > bytes, "the files describe their data");
    assert!(
        allocated < 256 << 20,
        "sparse: {allocated} bytes allocated for {apparent} apparent"
    );

    let ckpt = load(&dir, &LoadOptions::default()).expect("every header parses");
    assert_eq!(ckpt.tensors().len(), count);
    assert_eq!(ckpt.total_bytes(), bytes);
    assert_eq!(ckpt.files.len(), 160);
    let tree = ModuleTree::build(&ckpt);
    let layers = tree
        .children(ModuleTree::ROOT)
        .find(|&c| &*tree.nodes[c].name == "model")
        .and_then(|m| tree.children(m).find(|&c| &*tree.nodes[c].name == "layers"))
        .expect("model.layers");
    assert_eq!(tree.children(layers).count(), 60);
    assert_eq!(tree.nodes[ModuleTree::ROOT].tensors as usize, count);
}
