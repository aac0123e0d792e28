//! The planner on generated models: what accelerate's algorithm does, checked as
//! properties of the maps it gives (the byte-exact comparison with accelerate itself
//! is tests/real/accelerate_plan.rs).

mod common;

use std::path::Path;

use common::{devmap, stderr, stdout};
use devmap::fixtures::{LlamaShape, llama_config, llama_like, write_json, write_safetensors};
use devmap::model::{LoadOptions, Placement, load};
use devmap::plan::{PlanOptions, parse_max_memory, plan};
use devmap::types::DType;

fn llama(dir: &Path, layers: usize) -> u64 {
    llama_stored_as(dir, layers, DType::BF16)
}

/// A small Llama checkpoint stored in `dtype`; returns its bytes.
fn llama_stored_as(dir: &Path, layers: usize, dtype: DType) -> u64 {
    let shape = LlamaShape {
        layers,
        hidden: 64,
        intermediate: 176,
        vocab: 512,
        dtype,
    };
    std::fs::create_dir_all(dir).expect("mkdir");
    let tensors = llama_like(shape);
    let refs: Vec<_> = tensors.iter().collect();
    write_safetensors(&dir.join("model.safetensors"), &refs).expect("write");
    write_json(&dir.join("config.json"), &llama_config(shape)).expect("config");
    tensors.iter().map(|t| t.data.len() as u64).sum()
}

fn planned(dir: &Path, spec: &str, no_split: &[&str]) -> devmap::model::Checkpoint {
    planned_as(dir, spec, no_split, None)
}

/// The checkpoint placed by the plan for budgets `spec`, loaded as `dtype`.
fn planned_as(
    dir: &Path,
    spec: &str,
    no_split: &[&str],
    dtype: Option<DType>,
) -> devmap::model::Checkpoint {
    let mut ckpt = load(dir, &LoadOptions::default()).expect("load");
    let map = plan_of(&ckpt, spec, no_split, dtype).map;
    ckpt.apply_device_map(Some(map));
    ckpt
}

/// The plan for `ckpt` with budgets `spec`.
fn plan_of(
    ckpt: &devmap::model::Checkpoint,
    spec: &str,
    no_split: &[&str],
    dtype: Option<DType>,
) -> devmap::plan::Planned {
    let options = PlanOptions {
        max_memory: parse_max_memory(spec).expect("spec"),
        no_split: no_split.iter().map(|s| (*s).to_owned()).collect(),
        dtype,
        // The walk itself, as accelerate's infer_auto_device_map does it.
        mode: devmap::plan::PlanMode::Sequential,
    };
    plan(ckpt, &options).expect("plan")
}

/// A plan's map keys, in order.
fn map_keys(planned: &devmap::plan::Planned) -> Vec<&str> {
    planned
        .map
        .entries()
        .iter()
        .map(|(k, _)| k.as_str())
        .collect()
}

fn device_of(ckpt: &devmap::model::Checkpoint, name: &str) -> Placement {
    ckpt.tensor(name)
        .unwrap_or_else(|| panic!("{name}"))
        .placement
}

#[test]
fn a_model_that_fits_on_one_gpu_goes_there_whole() {
    let tmp = tempfile::tempdir().expect("tmp");
    let total = llama(tmp.path(), 4);
    let ckpt = planned(tmp.path(), &format!("0={}", total * 3), &[]);
    let map = ckpt.device_map.as_ref().expect("map");
    assert_eq!(map.entries(), &[(String::new(), Placement::Gpu(0))]);
    assert!(
        ckpt.tensors()
            .iter()
            .all(|t| t.placement == Placement::Gpu(0))
    );
}

#[test]
fn spills_in_device_order_and_never_goes_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    let total = llama(tmp.path(), 8);
    let ckpt = planned(
        tmp.path(),
        &format!("0={},cpu={}", total / 3, total / 3),
        &[],
    );
    let order = |p: Placement| match p {
        Placement::Gpu(_) => 0,
        Placement::Cpu => 1,
        Placement::Disk => 2,
        _ => 9,
    };
    let devices: Vec<u8> = (0..8)
        .map(|l| {
            order(device_of(
                &ckpt,
                &format!("model.layers.{l}.mlp.up_proj.weight"),
            ))
        })
        .collect();
    assert!(
        devices.windows(2).all(|w| w[0] <= w[1]),
        "layers went back to an earlier device: {devices:?}"
    );
    assert!(
        devices.contains(&0) && devices.contains(&1) && devices.contains(&2),
        "{devices:?}"
    );
    assert!(
        ckpt.tensors()
            .iter()
            .all(|t| t.placement != Placement::Unmapped)
    );
}

#[test]
fn tied_embeddings_stay_together() {
    let tmp = tempfile::tempdir().expect("tmp");
    let total = llama(tmp.path(), 6);
    for fraction in [5, 10, 20, 30, 50, 80] {
        let budget = total * fraction / 100;
        let ckpt = planned(
            tmp.path(),
            &format!("0={budget},1={budget},cpu={budget}"),
            &[],
        );
        assert_eq!(
            device_of(&ckpt, "lm_head.weight"),
            device_of(&ckpt, "model.embed_tokens.weight"),
            "at {fraction}%"
        );
    }
}

#[test]
fn no_split_blocks_are_kept_whole_unless_lifted() {
    let tmp = tempfile::tempdir().expect("tmp");
    let total = llama(tmp.path(), 6);
    let spec = format!("0={},cpu={}", total * 3 / 10, total * 4 / 10);
    let whole = planned(tmp.path(), &spec, &[]);
    let deep = |ckpt: &devmap::model::Checkpoint| {
        ckpt.device_map
            .as_ref()
            .expect("map")
            .entries()
            .iter()
            .filter(|(k, _)| k.split('.').count() > 3)
            .count()
    };
    assert_eq!(
        deep(&whole),
        0,
        "a decoder layer was split: {:?}",
        whole.device_map
    );
    let split = planned(tmp.path(), &spec, &["none"]);
    assert!(
        deep(&split) > 0,
        "with nothing protected, a layer boundary should split: {:?}",
        split.device_map
    );
    // A pattern of the user's: the MLPs may not be split, everything else may.
    let mlp = planned(tmp.path(), &spec, &["model.layers.*.mlp"]);
    assert!(
        mlp.device_map
            .as_ref()
            .expect("map")
            .entries()
            .iter()
            .all(|(k, _)| !k.contains(".mlp.")),
        "{:?}",
        mlp.device_map
    );
}

#[test]
fn a_module_larger_than_every_budget_goes_to_disk() {
    let tmp = tempfile::tempdir().expect("tmp");
    let big = devmap::fixtures::FixtureTensor::patterned(
        "model.embed_tokens.weight",
        DType::F32,
        &[1024, 256],
        1,
    );
    let small =
        devmap::fixtures::FixtureTensor::patterned("model.norm.weight", DType::F32, &[16], 2);
    write_safetensors(&tmp.path().join("model.safetensors"), &[&big, &small]).expect("write");
    let ckpt = planned(tmp.path(), "0=100KB,cpu=100KB", &[]);
    assert_eq!(
        device_of(&ckpt, "model.embed_tokens.weight"),
        Placement::Disk
    );
}

#[test]
fn gb_and_gib_budgets_differ_like_transformers_says() {
    let tmp = tempfile::tempdir().expect("tmp");
    llama(tmp.path(), 8);
    // 300KB = 300,000 bytes; 300KiB = 307,200: the extra 7 KiB moves a boundary.
    let count_on = |spec: &str| {
        let ckpt = planned(tmp.path(), spec, &["none"]);
        ckpt.tensors()
            .iter()
            .filter(|t| t.placement == Placement::Gpu(0))
            .count()
    };
    assert!(count_on("0=300KiB,cpu=10MB") >= count_on("0=300KB,cpu=10MB"));
    assert_ne!(
        planned(tmp.path(), "0=300KiB,cpu=10MB", &["none"]).device_map,
        planned(tmp.path(), "0=300KB,cpu=10MB", &["none"]).device_map
    );
}

#[test]
fn cli_plan_explains_writes_and_never_overwrites_the_input_map() {
    let tmp = tempfile::tempdir().expect("tmp");
    let total = llama(tmp.path().join("m").as_path(), 6);
    let dir = tmp.path().join("m");
    std::fs::write(dir.join("device_map.json"), "{\"\": \"cpu\"}").expect("w");
    let spec = format!("0={},cpu={}", total / 3, total / 3);
    let o = devmap(&[
        "plan",
        dir.to_str().expect("p"),
        "--max-memory",
        &spec,
        "--explain",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let map: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json map");
    assert!(
        map.as_object().expect("object").values().any(|v| v == 0),
        "{map}"
    );
    let why = stderr(&o);
    assert!(
        why.contains("split into its children") && why.contains("moving on to cpu"),
        "{why}"
    );
    // --out onto the input map is refused.
    let o = devmap(&[
        "plan",
        dir.to_str().expect("p"),
        "--max-memory",
        &spec,
        "--out",
        dir.join("device_map.json").to_str().expect("p"),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("never writes its inputs"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("device_map.json")).expect("r"),
        "{\"\": \"cpu\"}"
    );
    // Elsewhere it is written, and devmap reads it back as the same placements.
    let out = tmp.path().join("planned.json");
    let o = devmap(&[
        "plan",
        dir.to_str().expect("p"),
        "--max-memory",
        &spec,
        "--out",
        out.to_str().expect("p"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let reread = load(
        &dir,
        &LoadOptions {
            device_map: Some(out),
            ..Default::default()
        },
    )
    .expect("load");
    let expected = planned(&dir, &spec, &[]);
    for (a, b) in reread.tensors().iter().zip(expected.tensors()) {
        assert_eq!(a.placement, b.placement, "{}", a.name);
    }
}

#[test]
fn inspect_reports_a_device_over_its_budget() {
    let m = common::mixed_model();
    let o = devmap(&[
        "inspect",
        m.dir.to_str().expect("p"),
        "--max-memory",
        "0=1KB,cpu=1MB",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("gpu:0 holds") && text.contains("its budget is 1000 B"),
        "{text}"
    );
    assert!(
        !text.contains("cpu holds"),
        "cpu is within its budget: {text}"
    );
}

#[test]
fn a_load_dtype_plans_like_the_model_stored_in_it() {
    // An F32 checkpoint loaded as bfloat16 takes the room of the BF16 checkpoint.
    let tmp = tempfile::tempdir().expect("tmp");
    let bf16 = tmp.path().join("bf16");
    let total = llama(&bf16, 6);
    let f32_dir = tmp.path().join("f32");
    llama_stored_as(&f32_dir, 6, DType::F32);
    let spec = format!("0={},cpu={}", total / 3, total / 3);
    let as_bf16 = |dir: &Path, dtype: Option<DType>| planned_as(dir, &spec, &[], dtype).device_map;
    assert_eq!(as_bf16(&f32_dir, Some(DType::BF16)), as_bf16(&bf16, None));
    assert_ne!(
        as_bf16(&f32_dir, None),
        as_bf16(&bf16, None),
        "stored F32 needs twice the room"
    );
    // The CLI takes torch's names.
    let o = devmap(&[
        "plan",
        f32_dir.to_str().expect("p"),
        "--max-memory",
        &spec,
        "--dtype",
        "bfloat16",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = devmap(&[
        "plan",
        f32_dir.to_str().expect("p"),
        "--max-memory",
        &spec,
        "--dtype",
        "float7",
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("not a dtype"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_load_dtype_wider_than_stored_grows_the_plan() {
    // from_pretrained(dtype=float32) of a bfloat16 checkpoint holds 4 bytes an element:
    // planned at the stored 2, layers would go to devices that cannot hold them.
    let tmp = tempfile::tempdir().expect("tmp");
    let bf16 = tmp.path().join("bf16");
    llama(&bf16, 6);
    let f32_dir = tmp.path().join("f32");
    let total_f32 = llama_stored_as(&f32_dir, 6, DType::F32);
    let spec = format!("0={},cpu={}", total_f32 / 3, total_f32 / 3);
    let map = |dir: &Path, dtype| planned_as(dir, &spec, &[], dtype).device_map;
    assert_eq!(map(&bf16, Some(DType::F32)), map(&f32_dir, None));
    assert_ne!(map(&bf16, Some(DType::F32)), map(&bf16, None));
}

#[test]
fn balanced_modes_spread_the_layers_over_the_gpus_as_from_pretrained_does() {
    use devmap::plan::PlanMode;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("m");
    let total = llama(&dir, 6);
    let ckpt = load(&dir, &LoadOptions::default()).expect("load");
    let spec = format!("0={},1={},cpu={}", 2 * total, 2 * total, 2 * total);
    let used = |mode| {
        let options = PlanOptions {
            max_memory: parse_max_memory(&spec).expect("spec"),
            no_split: Vec::new(),
            dtype: None,
            mode,
        };
        let planned = plan(&ckpt, &options).expect("plan");
        let on = |gpu| {
            planned
                .used
                .iter()
                .find(|(p, _)| *p == Placement::Gpu(gpu))
                .map_or(0, |(_, b)| *b)
        };
        (on(0), on(1))
    };
    // Sequential fills GPU 0; "auto" caps it near half the model; balanced_low_0
    // leaves GPU 0 what GPU 1 cannot hold.
    let (seq0, seq1) = used(PlanMode::Sequential);
    assert!(seq0 >= total && seq1 == 0, "{seq0} {seq1}");
    let (auto0, auto1) = used(PlanMode::Balanced);
    assert!(auto0 > 0 && auto1 > 0 && auto0 < total, "{auto0} {auto1}");
    let (low0, low1) = used(PlanMode::BalancedLow0);
    assert!(
        low0 < auto0 && low1 > auto1,
        "{low0} {low1} vs {auto0} {auto1}"
    );
    // The CLI takes from_pretrained's words.
    for mode in ["auto", "balanced", "balanced_low_0", "sequential"] {
        let o = devmap(&[
            "plan",
            dir.to_str().expect("p"),
            "--max-memory",
            &spec,
            "--device-map",
            mode,
        ]);
        assert!(o.status.success(), "{mode}: {}", stderr(&o));
    }
}

#[test]
fn non_persistent_buffers_count_in_their_module_and_a_buffer_only_module_is_placed() {
    // A Llama holds two rotary tables no checkpoint has (`model.rotary_emb.inv_freq`
    // and `original_inv_freq`, F32, head_dim / 2 each; head_dim = 64 / 4 heads):
    // accelerate counts them in `model.rotary_emb`, and so must the plan.
    let tmp = tempfile::tempdir().expect("tmp");
    let llama_dir = tmp.path().join("llama");
    llama(&llama_dir, 4);
    // The same tensors under an architecture devmap does not know: no buffers.
    let unknown = tmp.path().join("unknown");
    llama(&unknown, 4);
    let config = std::fs::read_to_string(unknown.join("config.json")).expect("config");
    std::fs::write(
        unknown.join("config.json"),
        config.replace("LlamaForCausalLM", "HomeGrownForCausalLM"),
    )
    .expect("write");
    let on_disk = |dir: &Path, dtype: Option<DType>| {
        let ckpt = load(dir, &LoadOptions::default()).expect("load");
        let planned = plan_of(&ckpt, "0=1KB", &[], dtype);
        planned
            .used
            .iter()
            .find(|(p, _)| *p == Placement::Disk)
            .map(|(_, b)| *b)
            .expect("disk used")
    };
    let rotary = 2 * 8 * 4;
    assert_eq!(on_disk(&llama_dir, None), on_disk(&unknown, None) + rotary);
    // Loaded as bfloat16, the tables stay F32 (made in float32 whatever the load
    // dtype), and transformers counts them at 4 bytes an element.
    assert_eq!(
        on_disk(&llama_dir, Some(DType::BF16)),
        on_disk(&unknown, Some(DType::BF16)) + rotary
    );
    // Split across devices, the map names the module that holds only buffers, as
    // accelerate's (and `hf_device_map`) does; saving with that map accepts the key.
    let ckpt = load(&llama_dir, &LoadOptions::default()).expect("load");
    let total = ckpt
        .tensors()
        .iter()
        .map(devmap::model::Tensor::bytes)
        .sum::<u64>();
    let planned = plan_of(&ckpt, &format!("0={},cpu={}", total / 3, total), &[], None);
    let keys = map_keys(&planned);
    assert!(keys.contains(&"model.rotary_emb"), "{keys:?}");
    assert!(!keys.iter().any(|k| k.ends_with("inv_freq")), "{keys:?}");
    let mut placed = ckpt.clone();
    placed.apply_device_map(Some(planned.map.clone()));
    assert_eq!(devmap::model::checks::unused_map_keys(&placed), None);
    assert!(devmap::model::checks::keys_without_data(&placed).is_empty());
}

#[test]
fn a_disk_budget_is_accepted_as_accelerate_accepts_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let total = llama(tmp.path(), 8);
    let spec = format!("0={},cpu={}", total / 3, total / 3);
    let without = planned(tmp.path(), &spec, &[]);
    // accelerate's max_memory may name disk; its planner still lets disk take the rest
    // (even past the budget), and so does devmap's.
    let with = planned(tmp.path(), &format!("{spec},disk=1KB"), &[]);
    assert_eq!(with.device_map, without.device_map);
    assert!(
        with.device_totals()
            .iter()
            .any(|(p, b)| *p == Placement::Disk && *b > 1000)
    );
    // The over-budget check holds the disk total against it.
    let o = devmap(&[
        "inspect",
        tmp.path().to_str().expect("p"),
        "--max-memory",
        &format!("{spec},disk=1KB"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let map = tmp.path().join("planned.json");
    let o2 = devmap(&[
        "plan",
        tmp.path().to_str().expect("p"),
        "--max-memory",
        &format!("{spec},disk=1KB"),
        "--out",
        map.to_str().expect("p"),
    ]);
    assert!(o2.status.success(), "{}", stderr(&o2));
    let o = devmap(&[
        "inspect",
        tmp.path().to_str().expect("p"),
        "--device-map",
        map.to_str().expect("p"),
        "--max-memory",
        &format!("{spec},disk=1KB"),
    ]);
    assert!(stdout(&o).contains("disk holds"), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("its budget is 1000 B"),
        "{}",
        stdout(&o)
    );
}

/// Writes `names` (each 64×64 bf16, or [64] for norms and biases) with `config`.
fn model_of(dir: &Path, names: &[String], config: serde_json::Value) {
    use devmap::fixtures::FixtureTensor;
    std::fs::create_dir_all(dir).expect("mkdir");
    let tensors: Vec<FixtureTensor> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let vector = n.rsplit('.').next() == Some("bias") || n.to_lowercase().contains("norm");
            let shape: &[u64] = if vector { &[64] } else { &[64, 64] };
            FixtureTensor::patterned(n, DType::BF16, shape, i as u64)
        })
        .collect();
    let refs: Vec<_> = tensors.iter().collect();
    write_safetensors(&dir.join("model.safetensors"), &refs).expect("write");
    write_json(&dir.join("config.json"), &config).expect("config");
}

/// A T5 checkpoint as transformers 5 saves it: one `shared` embedding (the encoder's and
/// decoder's `embed_tokens` and `lm_head` are ties of it).
fn t5(dir: &Path, blocks: usize) {
    let mut names = vec!["shared.weight".to_owned()];
    for side in ["encoder", "decoder"] {
        for b in 0..blocks {
            let p = format!("{side}.block.{b}.layer");
            for w in ["q", "k", "v", "o"] {
                names.push(format!("{p}.0.SelfAttention.{w}.weight"));
            }
            names.push(format!("{p}.0.layer_norm.weight"));
            let ff = if side == "decoder" {
                for w in ["q", "k", "v", "o"] {
                    names.push(format!("{p}.1.EncDecAttention.{w}.weight"));
                }
                names.push(format!("{p}.1.layer_norm.weight"));
                2
            } else {
                1
            };
            names.push(format!("{p}.{ff}.DenseReluDense.wi.weight"));
            names.push(format!("{p}.{ff}.DenseReluDense.wo.weight"));
            names.push(format!("{p}.{ff}.layer_norm.weight"));
        }
        names.push(format!("{side}.final_layer_norm.weight"));
    }
    model_of(
        dir,
        &names,
        serde_json::json!({
            "architectures": ["T5ForConditionalGeneration"],
            "model_type": "t5",
            "d_model": 64,
            "tie_word_embeddings": true,
        }),
    );
}

/// The order comes from transformers' T5 class: the encoder is defined before the
/// decoder (by name, `decoder` sorts first), and inside a decoder block cross-attention
/// comes before its norm and the MLP (a list of three classes keeps its indices).
#[test]
fn t5_is_planned_encoder_first_as_its_class_defines_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    t5(tmp.path(), 2);
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    // The tied names transformers leaves out are known, tied to `shared`.
    for name in [
        "encoder.embed_tokens.weight",
        "decoder.embed_tokens.weight",
        "lm_head.weight",
    ] {
        let id = ckpt.index_of(name).unwrap_or_else(|| panic!("{name}"));
        let group = ckpt.tie_group(id).expect("tied");
        assert_eq!(&*ckpt.tensors()[group.kept()].name, "shared.weight");
    }
    // Room for about half: the encoder (and the shared embedding) on cpu, the decoder
    // after it on disk.
    let ckpt = planned(tmp.path(), "cpu=200KB", &[]);
    assert_eq!(device_of(&ckpt, "shared.weight"), Placement::Cpu);
    assert_eq!(
        device_of(&ckpt, "encoder.block.1.layer.1.DenseReluDense.wo.weight"),
        Placement::Cpu
    );
    assert_eq!(
        device_of(&ckpt, "decoder.final_layer_norm.weight"),
        Placement::Disk
    );
    // Inside a decoder block, as accelerate walks it: in layer 1 cross-attention
    // before its norm (in layer 0 the norm follows self-attention; collapsing both
    // indices to one would put the norm first).
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    let tree = devmap::plan::order::PlanTree::build(
        &ckpt,
        (
            &std::collections::HashSet::default(),
            &std::collections::HashSet::default(),
        ),
        &["none".to_owned()],
        None,
    );
    let children = |name: &str| -> Vec<String> {
        let id = tree
            .nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("{name}"));
        tree.children_in_order(id)
            .into_iter()
            .map(|c| tree.nodes[c].name.clone())
            .collect()
    };
    // Its dropout, which holds nothing, is walked too, last, as transformers walks it.
    assert_eq!(
        children("decoder.block.0.layer.1"),
        [
            "decoder.block.0.layer.1.EncDecAttention",
            "decoder.block.0.layer.1.layer_norm",
            "decoder.block.0.layer.1.dropout"
        ]
    );
    assert_eq!(children("")[..3], ["shared", "encoder", "decoder"]);
}

/// BERT's masked-LM head is tied to the word embeddings (transformers does not save
/// `cls.predictions.decoder.weight`), and its embeddings are never split.
#[test]
fn bert_ties_its_head_to_the_embeddings_and_keeps_them_whole() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut names: Vec<String> = [
        "bert.embeddings.word_embeddings.weight",
        "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight",
        "bert.embeddings.LayerNorm.weight",
        "bert.embeddings.LayerNorm.bias",
    ]
    .map(str::to_owned)
    .to_vec();
    for l in 0..4 {
        for part in [
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "intermediate.dense",
            "output.dense",
        ] {
            names.push(format!("bert.encoder.layer.{l}.{part}.weight"));
        }
    }
    names.extend(
        [
            "cls.predictions.bias",
            "cls.predictions.transform.dense.weight",
            "cls.predictions.transform.LayerNorm.weight",
        ]
        .map(str::to_owned),
    );
    model_of(
        tmp.path(),
        &names,
        serde_json::json!({
            "architectures": ["BertForMaskedLM"],
            "model_type": "bert",
            "hidden_size": 64,
        }),
    );
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    let head = ckpt
        .index_of("cls.predictions.decoder.weight")
        .expect("the tied head is known");
    let group = ckpt.tie_group(head).expect("tied");
    assert_eq!(
        &*ckpt.tensors()[group.kept()].name,
        "bert.embeddings.word_embeddings.weight"
    );
    // A budget that ends inside the embeddings: they go on together, not split.
    let ckpt = planned(tmp.path(), "0=20KB,cpu=1MB", &[]);
    let embeddings: Vec<Placement> = names[..5].iter().map(|n| device_of(&ckpt, n)).collect();
    assert!(
        embeddings.iter().all(|&p| p == embeddings[0]),
        "{embeddings:?}"
    );
}

/// An architecture the table lacks plans by name heuristics, and says so (with and
/// without `--explain`).
#[test]
fn an_unknown_architecture_is_planned_by_heuristics_with_a_note() {
    let tmp = tempfile::tempdir().expect("tmp");
    llama(tmp.path(), 2);
    let config = tmp.path().join("config.json");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        text.replace("LlamaForCausalLM", "HomeGrownForCausalLM"),
    )
    .expect("write");
    let out = devmap(&[
        "plan",
        tmp.path().to_str().expect("utf8"),
        "--max-memory",
        "cpu=100KB",
        "--explain",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        said.contains("HomeGrownForCausalLM is not in devmap's architecture table"),
        "{said}"
    );
    // Without --explain too: a plan that may differ from accelerate's says so plainly.
    let out = devmap(&[
        "plan",
        tmp.path().to_str().expect("utf8"),
        "--max-memory",
        "cpu=100KB",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("warning: HomeGrownForCausalLM is not in devmap's architecture table"),
        "{}",
        stderr(&out)
    );
    // A known architecture plans from the table, with no such warning.
    let known = tempfile::tempdir().expect("tmp");
    llama(known.path(), 2);
    let out = devmap(&[
        "plan",
        known.path().to_str().expect("utf8"),
        "--max-memory",
        "cpu=100KB",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("architecture table"),
        "{}",
        stderr(&out)
    );
}

/// transformers 5 loads Mixtral's per-expert tensors fused (`mlp.experts.gate_up_proj`,
/// `mlp.experts.down_proj`) and renames `block_sparse_moe` to `mlp`: a plan that splits
/// inside a layer names those runtime modules, never the checkpoint's, and the map
/// places every per-expert tensor.
#[test]
fn moe_plans_name_the_runtime_modules_transformers_loads() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut names: Vec<String> = vec!["model.embed_tokens.weight".into()];
    for l in 0..3 {
        let p = format!("model.layers.{l}");
        for w in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            names.push(format!("{p}.self_attn.{w}.weight"));
        }
        names.push(format!("{p}.block_sparse_moe.gate.weight"));
        for e in 0..4 {
            for w in ["w1", "w2", "w3"] {
                names.push(format!("{p}.block_sparse_moe.experts.{e}.{w}.weight"));
            }
        }
        names.push(format!("{p}.input_layernorm.weight"));
        names.push(format!("{p}.post_attention_layernorm.weight"));
    }
    names.push("model.norm.weight".into());
    names.push("lm_head.weight".into());
    model_of(
        tmp.path(),
        &names,
        serde_json::json!({
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "tie_word_embeddings": false,
        }),
    );
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    let planned = plan_of(&ckpt, "0=150KB,cpu=150KB", &["none"], None);
    let keys = map_keys(&planned);
    assert!(
        keys.iter().all(|k| !k.contains("block_sparse_moe")),
        "{keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.contains(".mlp.experts")),
        "the plan splits inside a layer: {keys:?}"
    );
    let mut placed = ckpt.clone();
    placed.apply_device_map(Some(planned.map));
    for t in placed.tensors() {
        assert!(
            matches!(
                t.placement,
                Placement::Gpu(0) | Placement::Cpu | Placement::Disk
            ),
            "{} is {:?}",
            t.name,
            t.placement
        );
    }
    // inspect names the runtime parameter each per-expert tensor is loaded into.
    let out = devmap(&["inspect", tmp.path().to_str().expect("utf8"), "--json"]);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    let loaded_as = |name: &str| {
        report["tensors"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["name"] == name))
            .map(|t| t["loaded_as"].clone())
            .unwrap_or_default()
    };
    assert_eq!(
        loaded_as("model.layers.1.block_sparse_moe.experts.2.w3.weight"),
        "model.layers.1.mlp.experts.gate_up_proj"
    );
    assert_eq!(
        loaded_as("model.layers.1.block_sparse_moe.gate.weight"),
        "model.layers.1.mlp.gate.weight"
    );
    assert_eq!(
        loaded_as("model.layers.1.self_attn.q_proj.weight"),
        serde_json::Value::Null
    );
    // w1 and w3 are halves of one fused parameter: they go together.
    for e in 0..4 {
        let at = |w: &str| {
            device_of(
                &placed,
                &format!("model.layers.1.block_sparse_moe.experts.{e}.{w}.weight"),
            )
        };
        assert_eq!(at("w1"), at("w3"));
    }
}

/// A checkpoint whose names are not the ones its architecture's entry describes (here
/// every name under another top-level module) is planned by the heuristics, repeated
/// blocks kept whole, rather than with nothing protected.
#[test]
fn names_the_table_does_not_describe_fall_back_to_the_heuristics() {
    let tmp = tempfile::tempdir().expect("tmp");
    let names: Vec<String> = (0..3)
        .flat_map(|l| {
            ["q_proj", "k_proj"].map(|w| format!("backbone.layers.{l}.self_attn.{w}.weight"))
        })
        .collect();
    model_of(
        tmp.path(),
        &names,
        serde_json::json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}),
    );
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    let tree = devmap::plan::order::PlanTree::build(
        &ckpt,
        (
            &std::collections::HashSet::default(),
            &std::collections::HashSet::default(),
        ),
        &[],
        None,
    );
    let layer = tree
        .nodes
        .iter()
        .find(|n| n.name == "backbone.layers.1")
        .expect("layer");
    assert!(layer.no_split, "the repeated block stays whole");
}

/// A Llava checkpoint as transformers 5 saves it (`language_model.model.layers.N`,
/// `language_model.lm_head`, `vision_tower`, `multi_modal_projector`), which the loaded
/// model names otherwise (`model.language_model.layers.N`, `lm_head`,
/// `model.vision_tower`): a device map from the loaded model places every tensor, an
/// offload entry under the loaded name is the tensor's value, and plans use the loaded
/// names.
#[test]
fn vision_language_checkpoints_answer_to_the_names_the_loaded_model_has() {
    use devmap::fixtures::{FixtureTensor, write_offload_per_tensor};
    let tmp = tempfile::tempdir().expect("tmp");
    let mut names: Vec<String> = vec![
        "language_model.model.embed_tokens.weight".into(),
        "language_model.model.norm.weight".into(),
        "language_model.lm_head.weight".into(),
        "multi_modal_projector.linear_1.weight".into(),
        "vision_tower.vision_model.embeddings.patch_embedding.weight".into(),
    ];
    for l in 0..3 {
        for w in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            names.push(format!(
                "language_model.model.layers.{l}.self_attn.{w}.weight"
            ));
        }
        names.push(format!(
            "language_model.model.layers.{l}.mlp.up_proj.weight"
        ));
    }
    model_of(
        tmp.path(),
        &names,
        serde_json::json!({
            "architectures": ["LlavaForConditionalGeneration"],
            "model_type": "llava",
            "text_config": {"model_type": "llama", "tie_word_embeddings": false},
            "tie_word_embeddings": false,
        }),
    );
    // hf_device_map of the loaded model, and an offload entry under its runtime name.
    write_json(
        &tmp.path().join("device_map.json"),
        &serde_json::json!({
            "model.vision_tower": 0,
            "model.multi_modal_projector": 0,
            "model.language_model.embed_tokens": 0,
            "model.language_model.layers.0": 0,
            "model.language_model.layers.1": "cpu",
            "model.language_model.layers.2": "disk",
            "model.language_model.norm": "disk",
            "lm_head": "disk",
        }),
    )
    .expect("map");
    let fresh = FixtureTensor::patterned(
        "model.language_model.layers.2.mlp.up_proj.weight",
        DType::BF16,
        &[64, 64],
        4242,
    );
    write_offload_per_tensor(&tmp.path().join("offload"), std::slice::from_ref(&fresh))
        .expect("offload");
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    assert_eq!(
        ckpt.tensors().len(),
        names.len(),
        "no extra tensor for the entry"
    );
    for t in ckpt.tensors() {
        assert!(
            !matches!(t.placement, Placement::Unmapped),
            "{} unmapped",
            t.name
        );
    }
    assert_eq!(
        device_of(&ckpt, "language_model.model.layers.1.mlp.up_proj.weight"),
        Placement::Cpu
    );
    assert_eq!(
        device_of(&ckpt, "language_model.lm_head.weight"),
        Placement::Disk
    );
    // transformers matches these keys against the loaded names too: no trap to warn of.
    let warnings = common::warning_text(&ckpt);
    assert!(!warnings.contains("transformers 5 puts"), "{warnings}");
    let up = ckpt
        .tensor("language_model.model.layers.2.mlp.up_proj.weight")
        .expect("up");
    assert!(
        matches!(up.source, devmap::model::Source::Offload(_)),
        "the runtime-named offload entry is its value: {:?}",
        up.source
    );
    // A plan names the loaded model's modules.
    let planned = plan_of(&ckpt, "0=100KB,cpu=60KB", &[], None);
    let keys = map_keys(&planned);
    assert!(
        keys.iter().all(|k| !k.starts_with("language_model")
            && !k.starts_with("vision_tower")
            && !k.starts_with("multi_modal_projector")),
        "{keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.starts_with("model.language_model")),
        "{keys:?}"
    );
}

/// A tie the table knows whose members differ in shape is no tie: a warning names
/// them, and no tied copy is made for the members the checkpoint lacks.
#[test]
fn a_table_tie_with_shapes_that_differ_is_a_warning_and_no_tie() {
    use devmap::fixtures::FixtureTensor;
    let tmp = tempfile::tempdir().expect("tmp");
    let tensors = [
        FixtureTensor::patterned("shared.weight", DType::BF16, &[64, 16], 1),
        FixtureTensor::patterned("encoder.embed_tokens.weight", DType::BF16, &[32, 16], 2),
        FixtureTensor::patterned(
            "encoder.block.0.layer.0.SelfAttention.q.weight",
            DType::BF16,
            &[16, 16],
            3,
        ),
    ];
    let refs: Vec<_> = tensors.iter().collect();
    write_safetensors(&tmp.path().join("model.safetensors"), &refs).expect("write");
    write_json(
        &tmp.path().join("config.json"),
        &serde_json::json!({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "tie_word_embeddings": true}),
    )
    .expect("config");
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    assert!(ckpt.ties.is_empty(), "{:?}", ckpt.ties);
    assert_eq!(ckpt.tensors().len(), 3, "no tied copies");
    let warnings = common::warning_text(&ckpt);
    assert!(
        warnings.contains("encoder.embed_tokens.weight") && warnings.contains("shared.weight"),
        "{warnings}"
    );
}

/// `plan --json` carries the same map as the plain output, each device's bytes against
/// its budget, the mode and dtype, and says what it does not count yet.
#[test]
fn plan_json_carries_the_map_the_devices_and_what_is_not_counted() {
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo");
    let args = [
        "plan",
        demo.to_str().expect("p"),
        "--max-memory",
        "0=1MB,cpu=1MB",
        "--dtype",
        "float32",
    ];
    let plain = devmap(&args);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let map: serde_json::Value = serde_json::from_str(&stdout(&plain)).expect("the map");
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let o = devmap(&with_json);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(report["device_map"], map);
    assert_eq!(report["mode"], "auto");
    assert_eq!(report["dtype"], "float32");
    assert_eq!(report["budgets"]["0"], 1_000_000);
    assert_eq!(report["budgets"]["cpu"], 1_000_000);
    let devices = report["devices"].as_array().expect("devices");
    let gpu = devices.iter().find(|d| d["device"] == 0).expect("GPU 0");
    assert_eq!(gpu["budget"], 1_000_000);
    assert!(
        gpu["bytes"]
            .as_u64()
            .is_some_and(|b| b > 0 && b <= 1_000_000),
        "{gpu}"
    );
    // float32 doubles the demo's bfloat16 bytes: more than the 2.52 MiB stored, in all.
    let total: u64 = devices.iter().filter_map(|d| d["bytes"].as_u64()).sum();
    assert!(total > 2_640_000, "{total}");
    assert_eq!(
        report["not_counted"],
        serde_json::json!(["kv_cache", "activations"])
    );
}

/// `--context` adds each device's KV cache to its weights and holds the sum against its
/// budget: a budget the weights fit but weights + KV do not is reported OVER, in the
/// text and in `--json`.
#[test]
fn the_kv_cache_counts_against_each_budget() {
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo");
    let o = common::devmap(&[
        "plan",
        common::arg(&demo),
        "--max-memory",
        "0=4MiB,cpu=1GiB",
        "--context",
        "4096",
        "--json",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&common::stdout(&o)).expect("json");
    let kv = &report["kv_cache"];
    assert_eq!(kv["context"], 4096);
    let layers = kv["layers"].as_array().expect("layers");
    assert!(!layers.is_empty());
    let sum: u64 = layers
        .iter()
        .map(|l| l["bytes"].as_u64().expect("bytes"))
        .sum();
    assert_eq!(kv["bytes"].as_u64(), Some(sum));
    let gpu = report["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["device"] == 0)
        .expect("gpu 0 used");
    let (weights, kv_bytes) = (
        gpu["bytes"].as_u64().unwrap_or(0),
        gpu["kv_bytes"].as_u64().unwrap_or(0),
    );
    let act_bytes = gpu["activation_bytes"].as_u64().unwrap_or(0);
    assert!(weights <= 4 << 20 && kv_bytes > 0 && act_bytes > 0, "{gpu}");
    assert_eq!(
        gpu["over"],
        weights + kv_bytes + act_bytes > 4 << 20,
        "{gpu}"
    );
    // With --context, the cache and the activations are counted.
    assert_eq!(report["not_counted"], serde_json::json!([]), "{report}");
    let text = common::devmap(&[
        "plan",
        common::arg(&demo),
        "--max-memory",
        "0=4MiB,cpu=1GiB",
        "--context",
        "4096",
    ]);
    let err = common::stderr(&text);
    assert!(
        err.contains("KV cache at 4096 tokens × 1 sequence"),
        "{err}"
    );
    assert!(err.contains("OVER its 4 MiB budget"), "{err}");
}

/// `--reserve-kv` places the weights so that every device has room for the cache its
/// layers make: the cache of a layer on the CPU is made on the first GPU (accelerate's
/// execution device), not on the CPU. The budgets it prints are the `max_memory` that
/// gives the same map without it.
#[test]
fn reserve_kv_leaves_each_device_room_for_its_cache() {
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo");
    let plan = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["plan", common::arg(&demo), "--json"];
        args.extend_from_slice(extra);
        let o = common::devmap(&args);
        assert!(o.status.success(), "{}", common::stderr(&o));
        serde_json::from_str(&common::stdout(&o)).expect("json")
    };
    let device = |report: &serde_json::Value, name: serde_json::Value| {
        report["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .find(|d| d["device"] == name)
            .cloned()
    };
    // A 64-token forward's activations (--prefill) are reserved too.
    let budgets = [
        "--max-memory",
        "0=2MiB,1=2MiB,cpu=1GiB",
        "--context",
        "512",
        "--prefill",
        "64",
    ];
    // Weights alone fit the GPUs; their cache does not.
    let plain = plan(&budgets);
    assert!(
        plain["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .any(|d| d["over"] == true),
        "{plain}"
    );
    let mut reserving = budgets.to_vec();
    reserving.push("--reserve-kv");
    let reserved = plan(&reserving);
    for d in reserved["devices"].as_array().expect("devices") {
        assert_eq!(d["over"], false, "{d}");
    }
    // Some layers went to the CPU, and their cache is counted on GPU 0.
    let cpu = device(&reserved, "cpu".into()).expect("layers on the CPU");
    assert!(cpu["bytes"].as_u64().is_some_and(|b| b > 0), "{cpu}");
    assert_eq!(cpu["kv_bytes"], 0, "{cpu}");
    let (gpu0, gpu1) = (
        device(&reserved, 0.into()).expect("gpu 0"),
        device(&reserved, 1.into()).expect("gpu 1"),
    );
    let kv = |d: &serde_json::Value| d["kv_bytes"].as_u64().unwrap_or(0);
    assert_eq!(
        kv(&gpu0) + kv(&gpu1),
        reserved["kv_cache"]["bytes"].as_u64().expect("kv bytes"),
        "the whole cache is on the GPUs: {reserved}"
    );
    // Each GPU computes layers: each holds one layer's activations (and gpu:0 the head's
    // logits); the CPU computes none.
    let per_layer = reserved["activations"]["per_layer"]
        .as_u64()
        .expect("activations");
    assert_eq!(reserved["activations"]["tokens"], 64);
    assert_eq!(gpu1["activation_bytes"], per_layer, "{gpu1}");
    assert!(
        gpu0["activation_bytes"].as_u64() > Some(per_layer),
        "{gpu0}"
    );
    assert_eq!(cpu["activation_bytes"], 0, "{cpu}");
    // The lowered budgets, given as max_memory, plan the same map.
    let lowered = &reserved["weight_budgets"];
    for (device, full) in [("0", 2u64 << 20), ("1", 2 << 20)] {
        assert!(
            lowered[device].as_u64().is_some_and(|b| b < full),
            "{lowered}"
        );
    }
    let spec = format!(
        "0={},1={},cpu={}",
        lowered["0"], lowered["1"], lowered["cpu"]
    );
    let again = plan(&["--max-memory", &spec]);
    assert_eq!(again["device_map"], reserved["device_map"]);
    // Without --context there is nothing to reserve.
    let o = common::devmap(&["plan", common::arg(&demo), "--reserve-kv"]);
    assert!(!o.status.success());
    assert!(
        common::stderr(&o).contains("--context"),
        "{}",
        common::stderr(&o)
    );
}

/// Writes tensors of the given shapes (bf16) with `config`.
fn shaped_model(dir: &Path, tensors: &[(String, Vec<u64>)], config: &serde_json::Value) {
    use devmap::fixtures::FixtureTensor;
    std::fs::create_dir_all(dir).expect("mkdir");
    let made: Vec<FixtureTensor> = tensors
        .iter()
        .enumerate()
        .map(|(i, (n, shape))| FixtureTensor::patterned(n, DType::BF16, shape, i as u64))
        .collect();
    write_safetensors(
        &dir.join("model.safetensors"),
        &made.iter().collect::<Vec<_>>(),
    )
    .expect("write");
    write_json(&dir.join("config.json"), config).expect("config");
}

fn ranks_of(dir: &Path, flags: &[&str]) -> serde_json::Value {
    let mut args = vec!["plan", common::arg(dir), "--json"];
    args.extend_from_slice(flags);
    let o = common::devmap(&args);
    assert!(o.status.success(), "{}", common::stderr(&o));
    serde_json::from_str(&common::stdout(&o)).expect("json")
}

/// DeepSeek-V3's layout under `--tp 2 --ep 2`, as vLLM's deepseek_v2.py shards it: MLA's
/// `q_a_proj` and `kv_a_proj_with_mqa` whole on every rank, `q_b_proj`/`kv_b_proj`
/// split by rows and `o_proj` by columns; the dense first layer's MLP and the shared
/// experts split like any MLP; 5 routed experts over 2 expert ranks, 3 and 2, each
/// whole; the vocabulary (1000) padded to 1024 and halved; the router, its bias and the
/// norms whole; the multi-token-prediction layer left out. MLA's latent cache is whole
/// on every rank.
#[test]
fn plan_tp_ep_shards_deepseek_v3_as_vllm_does() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("dsv3");
    let mut tensors: Vec<(String, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), vec![1000, 64]),
        ("lm_head.weight".into(), vec![1000, 64]),
        ("model.norm.weight".into(), vec![64]),
        // The multi-token-prediction layer (num_hidden_layers = 2).
        ("model.layers.2.eh_proj.weight".into(), vec![64, 128]),
    ];
    for l in 0..2 {
        let p = format!("model.layers.{l}.");
        for (n, s) in [
            ("input_layernorm.weight", vec![64]),
            ("post_attention_layernorm.weight", vec![64]),
            ("self_attn.q_a_proj.weight", vec![32, 64]),
            ("self_attn.q_a_layernorm.weight", vec![32]),
            ("self_attn.q_b_proj.weight", vec![96, 32]),
            ("self_attn.kv_a_proj_with_mqa.weight", vec![24, 64]),
            ("self_attn.kv_a_layernorm.weight", vec![16]),
            ("self_attn.kv_b_proj.weight", vec![128, 16]),
            ("self_attn.o_proj.weight", vec![64, 64]),
        ] {
            tensors.push((format!("{p}{n}"), s));
        }
    }
    for (n, s) in [
        ("gate_proj", vec![96, 64]),
        ("up_proj", vec![96, 64]),
        ("down_proj", vec![64, 96]),
    ] {
        tensors.push((format!("model.layers.0.mlp.{n}.weight"), s));
    }
    let moe = "model.layers.1.mlp.";
    tensors.push((format!("{moe}gate.weight"), vec![5, 64]));
    tensors.push((format!("{moe}gate.e_score_correction_bias"), vec![5]));
    for owner in [
        "experts.0",
        "experts.1",
        "experts.2",
        "experts.3",
        "experts.4",
        "shared_experts",
    ] {
        for (n, s) in [
            ("gate_proj", vec![24, 64]),
            ("up_proj", vec![24, 64]),
            ("down_proj", vec![64, 24]),
        ] {
            tensors.push((format!("{moe}{owner}.{n}.weight"), s));
        }
    }
    let config = serde_json::json!({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
        "n_routed_experts": 5, "n_shared_experts": 1, "moe_intermediate_size": 24,
        "intermediate_size": 96, "first_k_dense_replace": 1, "vocab_size": 1000,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    });
    shaped_model(&dir, &tensors, &config);
    let report = ranks_of(&dir, &["--tp", "2", "--ep", "2", "--context", "10"]);
    // Elements each rank holds, by vLLM's rules.
    let vocab = 1024 / 2 * 64;
    let mla = 32 * 64 + 32 + 96 * 32 / 2 + 24 * 64 + 16 + 128 * 16 / 2 + 64 * 64 / 2;
    let layer_norms = 2 * 64;
    let dense_mlp = 2 * (96 * 64 / 2) + 64 * 96 / 2;
    let expert = 2 * 24 * 64 + 64 * 24;
    let shared = 2 * (24 * 64 / 2) + 64 * 24 / 2;
    let router = 5 * 64 + 5;
    let common = 2 * vocab + 64 + 2 * (layer_norms + mla) + dense_mlp + router + shared;
    let want = [(common + 3 * expert) * 2, (common + 2 * expert) * 2];
    let ranks = report["ranks"].as_array().expect("ranks");
    let got: Vec<u64> = ranks
        .iter()
        .map(|r| r["weights"].as_u64().expect("weights"))
        .collect();
    assert_eq!(got, want, "{report}");
    // MLA's latent cache, whole on each rank: 10 tokens × (16 + 8) × 2 layers, bf16.
    for r in ranks {
        assert_eq!(r["kv_bytes"], 10 * 24 * 2 * 2, "{r}");
    }
    assert_eq!(report["largest"], 0);
    assert!(
        report["notes"]
            .to_string()
            .contains("past num_hidden_layers"),
        "{report}"
    );
    assert_eq!(report["replicated_unknown"], serde_json::json!([]));
}

/// Llama under `--tp 4` with 2 key/value heads: each rank holds one key and one value
/// head (replicated twice), and so half the cache, not a quarter; the vocabulary (1000)
/// is padded to 1024, 256 rows a rank. `--pp 2` puts the embedding on the first stage
/// and the final norm and head on the last; a budget given for one GPU holds every rank.
#[test]
fn plan_tp_replicates_kv_heads_when_fewer_than_ranks() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("llama");
    let mut tensors: Vec<(String, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), vec![1000, 64]),
        ("lm_head.weight".into(), vec![1000, 64]),
        ("model.norm.weight".into(), vec![64]),
    ];
    for l in 0..2 {
        let p = format!("model.layers.{l}.");
        for (n, s) in [
            ("input_layernorm.weight", vec![64]),
            ("post_attention_layernorm.weight", vec![64]),
            ("self_attn.q_proj.weight", vec![64, 64]),
            ("self_attn.k_proj.weight", vec![32, 64]),
            ("self_attn.v_proj.weight", vec![32, 64]),
            ("self_attn.o_proj.weight", vec![64, 64]),
            ("mlp.gate_proj.weight", vec![128, 64]),
            ("mlp.up_proj.weight", vec![128, 64]),
            ("mlp.down_proj.weight", vec![64, 128]),
        ] {
            tensors.push((format!("{p}{n}"), s));
        }
    }
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "vocab_size": 1000, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    });
    shaped_model(&dir, &tensors, &config);
    let report = ranks_of(&dir, &["--tp", "4", "--context", "100"]);
    let layer =
        2 * 64 + 64 * 64 / 4 + 2 * (16 * 64) + 64 * 64 / 4 + 2 * (128 * 64 / 4) + 64 * 128 / 4;
    let want = (2 * (256 * 64) + 64 + 2 * layer) * 2;
    for r in report["ranks"].as_array().expect("ranks") {
        assert_eq!(r["weights"], want, "{r}");
        // One head of 16 for keys and values, 100 tokens, 2 layers, bf16.
        assert_eq!(r["kv_bytes"], 2 * 16 * 100 * 2 * 2, "{r}");
    }
    assert!(
        report["notes"].to_string().contains("replicated 2 times"),
        "{report}"
    );
    let staged = ranks_of(&dir, &["--pp", "2", "--max-memory", "0=300KB"]);
    let ranks = staged["ranks"].as_array().expect("ranks");
    let half = 2 * 64 + 64 * 64 + 2 * (32 * 64) + 64 * 64 + 2 * (128 * 64) + 64 * 128;
    assert_eq!(ranks[0]["weights"], (1024 * 64 + half) * 2);
    assert_eq!(ranks[1]["weights"], (1024 * 64 + 64 + half) * 2);
    assert_eq!(ranks[0]["layers"], serde_json::json!([0, 1]));
    for r in ranks {
        assert_eq!(r["budget"], 300_000, "{r}");
        assert_eq!(r["over"], r["weights"].as_u64() > Some(300_000), "{r}");
    }
    // vLLM refuses heads that do not split.
    let o = common::devmap(&["plan", common::arg(&dir), "--tp", "3"]);
    assert!(!o.status.success());
    assert!(
        common::stderr(&o).contains("do not split over 3"),
        "{}",
        common::stderr(&o)
    );
}

/// A checkpoint with Qwen3-14B's config.json and tensor shapes (bf16, 29.5 GB), whose
/// data is a hole in a sparse file: `plan` reads headers only.
fn qwen3_14b_shaped(dir: &Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let (h, i, layers, vocab) = (5120u64, 17408u64, 40, 151_936u64);
    let mut shapes: Vec<(String, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), vec![vocab, h]),
        ("lm_head.weight".into(), vec![vocab, h]),
        ("model.norm.weight".into(), vec![h]),
    ];
    for l in 0..layers {
        let p = format!("model.layers.{l}.");
        for (n, s) in [
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![40 * 128, h]),
            ("self_attn.k_proj.weight", vec![8 * 128, h]),
            ("self_attn.v_proj.weight", vec![8 * 128, h]),
            ("self_attn.o_proj.weight", vec![h, 40 * 128]),
            ("self_attn.q_norm.weight", vec![128]),
            ("self_attn.k_norm.weight", vec![128]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
        ] {
            shapes.push((format!("{p}{n}"), s));
        }
    }
    let mut header = serde_json::Map::new();
    let mut at = 0u64;
    for (name, shape) in &shapes {
        let bytes = shape.iter().product::<u64>() * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [at, at + bytes]}),
        );
        at += bytes;
    }
    let text = serde_json::to_string(&serde_json::Value::Object(header)).expect("json");
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    let path = dir.join("model.safetensors");
    std::fs::write(&path, &bytes).expect("header");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(bytes.len() as u64 + at))
        .expect("sparse data");
    write_json(
        &dir.join("config.json"),
        &serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "hidden_size": h, "intermediate_size": i, "num_hidden_layers": layers,
            "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": vocab, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
            "hidden_act": "silu", "attention_bias": false,
        }),
    )
    .expect("config");
}

/// docs/examples.md's "Will it run?" example, line for line: each `$ devmap plan
/// hf://Qwen/Qwen3-14B …` command run on a local checkpoint of Qwen3-14B's config and
/// shapes, every report line the README shows printed as shown.
#[test]
fn the_readme_will_it_run_example_is_what_plan_prints() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/examples.md"))
        .expect("docs/examples.md");
    let block = readme
        .split("**Will it run?**")
        .nth(1)
        .and_then(|rest| rest.split("```\n").nth(1))
        .expect("the example block");
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("qwen3-14b");
    qwen3_14b_shaped(&model);
    let mut commands = 0;
    let mut said = String::new();
    for line in block.lines() {
        if let Some(command) = line.strip_prefix("$ devmap ") {
            let args: Vec<String> = command
                .split_whitespace()
                .map(|a| {
                    if a == "hf://Qwen/Qwen3-14B" {
                        model.display().to_string()
                    } else {
                        a.to_owned()
                    }
                })
                .collect();
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_devmap"))
                .args(&args)
                .output()
                .expect("devmap");
            assert!(o.status.success(), "{command}: {}", common::stderr(&o));
            said = common::stderr(&o);
            commands += 1;
        } else if !line.is_empty() && !line.starts_with('{') && !line.starts_with('…') {
            assert!(
                said.lines().any(|l| l == line),
                "the README shows `{line}`; devmap printed:\n{said}"
            );
        }
    }
    assert!(commands >= 2, "{block}");
}
