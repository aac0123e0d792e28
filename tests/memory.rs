//! Peak memory of a save does not grow with the shard: a few-hundred-MB model saved
//! as one shard, in a child process whose kernel-measured peak RSS (VmHWM) is read
//! back. This is a bound on memory, not a timing.

mod common;

use std::process::Command;

use devmap::fixtures::{FixtureTensor, write_json, write_offload_dat, write_safetensors};
use devmap::types::DType;

const LIMIT: u64 = 64 << 20;

/// Runs `command` (devmap, or a command that runs it) asking devmap for its peak RSS,
/// checks it succeeded, and returns the kernel-measured peak (VmHWM) in bytes.
fn peak_rss_of(command: &mut Command) -> u64 {
    let o = command
        .env("DEVMAP_REPORT_PEAK_RSS", "1")
        .output()
        .expect("run devmap");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    common::peak_rss(&err)
}

#[test]
fn one_big_shard_stays_under_64_mib() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("big");
    // 4 files x 9 tensors x 8 MiB = 288 MiB, plus 32 MiB offloaded.
    common::big_model(&dir, 4, 9, 8);
    let total: u64 = 4 * 9 * (8 << 20);
    let offloaded: Vec<FixtureTensor> = (0..4)
        .map(|i| FixtureTensor {
            name: format!("model.layers.3.w{i}"),
            dtype: DType::F32,
            shape: vec![2 << 20],
            data: vec![7u8; 8 << 20],
        })
        .collect();
    write_offload_dat(&dir.join("offload"), &offloaded).expect("offload");

    let out = tmp.path().join("out");
    let peak = peak_rss_of(Command::new(env!("CARGO_BIN_EXE_devmap")).args([
        "save",
        dir.to_str().expect("p"),
        "--out",
        out.to_str().expect("p"),
        "--max-shard-size",
        "100GB",
        "--quiet",
    ]));
    let written = std::fs::metadata(out.join("model.safetensors"))
        .expect("shard")
        .len();
    assert!(written > total, "one shard holding everything");
    eprintln!(
        "peak RSS {} MiB for a {} MiB shard",
        peak >> 20,
        written >> 20
    );
    assert!(
        peak < LIMIT,
        "peak RSS {peak} bytes >= 64 MiB while writing a {written}-byte shard"
    );
}

/// A safetensors file of `n` one-byte tensors named as a deep model names them
/// (`model.layers.L.block.wK`): metadata alone, the hostile case for memory.
fn many_tensors(path: &std::path::Path, n: usize) {
    use std::fmt::Write as _;
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    for i in 0..n {
        let _ = write!(
            header,
            ",\"model.layers.{}.block.w{}\":{{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[{i},{}]}}",
            i / 100,
            i % 100,
            i + 1
        );
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0u8, n));
    std::fs::write(path, bytes).expect("write");
}

/// Memory grows with the tensor count by a bounded amount per tensor: 200,000 tensors
/// saved and inspected, each in a child process whose peak RSS is read from /proc.
/// The bound here is 64 MiB + 250 bytes a tensor, in the debug build the tests run.
/// The save's tighter bound (150 bytes a tensor) is measured at a million tensors by
/// scripts/bench_hostile.sh (docs/performance.md, "Hostile metadata"): below that, the
/// peak does not grow in a line — glibc raises its mmap threshold as large lists are
/// freed, so 400,000 tensors peak lower than 200,000 — and a per-tensor slope between
/// two small counts measures the allocator, not devmap.
#[test]
fn two_hundred_thousand_tensors_stay_within_a_bound_per_tensor() {
    const N: u64 = 200_000;
    let bound = (64 << 20) + 250 * N;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("many");
    std::fs::create_dir(&dir).expect("mkdir");
    many_tensors(&dir.join("model.safetensors"), N as usize);
    let out = tmp.path().join("out");
    for args in [
        vec![
            "save",
            dir.to_str().expect("p"),
            "--out",
            out.to_str().expect("p"),
            "--quiet",
        ],
        vec!["inspect", dir.to_str().expect("p")],
    ] {
        let peak = peak_rss_of(
            Command::new(env!("CARGO_BIN_EXE_devmap"))
                .args(&args)
                .env("DEVMAP_PYTHON", ""),
        );
        eprintln!(
            "{}: peak RSS {} MiB for {N} tensors ({} B a tensor past 64 MiB)",
            args[0],
            peak >> 20,
            peak.saturating_sub(64 << 20) / N
        );
        assert!(
            peak < bound,
            "{}: peak RSS {peak} bytes for {N} tensors, over 64 MiB + 250 B a tensor",
            args[0]
        );
    }
}

/// A GPTQ checkpoint of `weights` 4-bit weights of 8,192 inputs and 4,096 outputs
/// (16 MiB packed each: a full 14 MiB read band, and a second band), words from a
/// cheap hash, groups of 128 in order.
/// `weights` 4-bit weights of 8,192 inputs, GPTQ's layout (4,096 outputs, 16 MiB
/// packed each) or (`awq`) AWQ's (8,192 outputs, 32 MiB each: more than the 28 MiB
/// read band its threads share, so two such bands at once would cross the limit).
fn packed_model(dir: &std::path::Path, weights: u64, awq: bool) {
    let (inputs, outputs, groups) = (8192u64, if awq { 8192 } else { 4096 }, 64u64);
    let words = |n: u64, seed: u64| -> Vec<u8> {
        (0..n)
            .flat_map(|k| {
                (((k ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32).to_le_bytes()
            })
            .collect()
    };
    let mut tensors = Vec::new();
    for w in 0..weights {
        let m = format!("model.layers.{w}.mlp.down_proj");
        tensors.extend([
            FixtureTensor {
                name: format!("{m}.qweight"),
                dtype: DType::I32,
                shape: if awq {
                    vec![inputs, outputs / 8]
                } else {
                    vec![inputs / 8, outputs]
                },
                data: words(inputs / 8 * outputs, w),
            },
            FixtureTensor {
                name: format!("{m}.qzeros"),
                dtype: DType::I32,
                shape: vec![groups, outputs / 8],
                data: words(groups * outputs / 8, w + 100),
            },
            FixtureTensor {
                name: format!("{m}.scales"),
                dtype: DType::F16,
                shape: vec![groups, outputs],
                data: (0..groups * outputs)
                    .flat_map(|k| half::f16::from_f32(0.001 + (k % 97) as f32 * 1e-4).to_le_bytes())
                    .collect(),
            },
        ]);
        if !awq {
            tensors.push(FixtureTensor {
                name: format!("{m}.g_idx"),
                dtype: DType::I32,
                shape: vec![inputs],
                data: (0..inputs)
                    .flat_map(|i| ((i / 128) as i32).to_le_bytes())
                    .collect(),
            });
        }
    }
    std::fs::create_dir_all(dir).expect("mkdir");
    write_safetensors(
        &dir.join("model.safetensors"),
        &tensors.iter().collect::<Vec<_>>(),
    )
    .expect("weights");
    write_json(
        &dir.join("config.json"),
        &serde_json::json!({
            "architectures": ["ToyForCausalLM"],
            "quantization_config": if awq {
                serde_json::json!({"quant_method": "awq", "bits": 4, "group_size": 128,
                    "zero_point": true, "version": "gemm"})
            } else {
                serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 128,
                    "desc_act": false, "sym": false, "checkpoint_format": "gptq"})
            },
        }),
    )
    .expect("config");
}

/// Dequantizing into several shards two at a time computes on no more threads than
/// there are cores, each holding one band: three GPTQ weights, a shard each, written
/// by two jobs on two cores (`taskset`, so the count is the same on any machine) stay
/// under 64 MiB. Before, each job split its weight among every core: four bands at
/// once on two cores, 69 MiB here (87 MiB at the benchmark's sizes). The bands are
/// kept for the next thread, not freed (`save::compute::with_scratch`): glibc keeps what
/// a finished thread freed in that thread's arena.
/// AWQ's threads share one read band (`save::gptq::shared`), held with their permits:
/// the second job's weight waits for them rather than holding a second band.
#[test]
fn dequantizing_shards_two_at_a_time_stays_under_64_mib() {
    for awq in [false, true] {
        dequantize_three_shards_on_two_jobs(awq);
    }
}

fn dequantize_three_shards_on_two_jobs(awq: bool) {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let cpus = if cores >= 2 { "0-1" } else { "0" };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("packed");
    packed_model(&dir, 3, awq);
    let format = if awq { "AWQ" } else { "GPTQ" };
    let out = tmp.path().join("out");
    let peak = peak_rss_of(
        Command::new("taskset")
            .args(["-c", cpus, env!("CARGO_BIN_EXE_devmap"), "save"])
            .args([dir.to_str().expect("p"), "--out", out.to_str().expect("p")])
            .args([
                "--dtype",
                "bfloat16",
                "--max-shard-size",
                "70MB",
                "--jobs",
                "2",
                "--quiet",
            ])
            .env("DEVMAP_PYTHON", ""),
    );
    let shards = std::fs::read_dir(&out)
        .expect("out")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        })
        .count();
    assert_eq!(shards, 3, "a shard a weight");
    eprintln!(
        "peak RSS {} MiB, 3 {format} shards on 2 jobs, {cpus}",
        peak >> 20
    );
    assert!(
        peak < LIMIT,
        "peak RSS {} MiB >= 64 MiB dequantizing 3 {format} shards on 2 jobs",
        peak >> 20
    );
}

/// The memory the save dialog shows counts a band for each thread that computes at
/// once: as many as there are cores, at most eight a writer. The plan of the test
/// above (three GPTQ shards, two jobs) needs one band more on two cores than on one,
/// and sixteen bands on a 64-core machine, not sixty-four.
#[test]
fn the_memory_need_counts_the_threads_that_compute() {
    use devmap::save::shards::{DtypeChoice, SaveOptions};
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("gptq");
    packed_model(&dir, 3, false);
    let ckpt = devmap::model::load::load(&dir, &devmap::model::load::LoadOptions::default())
        .expect("loads");
    let mut options = SaveOptions::new(tmp.path().join("out"));
    options.max_shard_size = 70_000_000;
    options.dtype = DtypeChoice::To(DType::BF16);
    let plan = devmap::save::shards::plan(&ckpt, &options).expect("plan");
    assert_eq!(plan.shards.len(), 3);
    let need = |cores| plan.memory_need_on(&ckpt, 2, cores);
    let band = devmap::save::gptq::BAND_BYTES;
    assert_eq!(need(2).bytes - need(1).bytes, band);
    assert_eq!(need(64).bytes - need(1).bytes, 15 * band);
    assert_eq!(
        need(64).bytes,
        need(16).bytes,
        "eight threads a writer at most"
    );
    assert!(
        need(2)
            .parts
            .iter()
            .any(|p| p.contains("per computing thread")),
        "{:?}",
        need(2).parts
    );
}

/// `verify --against` recomputes each dequantized weight through the kernels a save
/// uses, which keep their bands for the next weight (`save::compute::with_scratch`);
/// like a save, it frees them when done, so a process that goes on (a Python session)
/// holds none.
#[test]
fn verify_against_frees_the_bands_it_kept() {
    use devmap::model::{LoadOptions, load};
    use devmap::save::compute::kept_scratch;
    use devmap::save::shards::DtypeChoice;
    use devmap::save::{Reporter, SaveOptions, prepare, write};
    use devmap::verify::{Progress, SaveReference, verify};
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("gptq");
    packed_model(&dir, 1, false);
    let ckpt = load(&dir, &LoadOptions::default()).expect("load");
    let out = tmp.path().join("out");
    let options = SaveOptions {
        dtype: DtypeChoice::To(DType::BF16),
        ..SaveOptions::new(out.clone())
    };
    let plan = prepare(&ckpt, &options).expect("plan");
    let cancel = std::sync::atomic::AtomicBool::new(false);
    write(
        &ckpt,
        &plan,
        &options,
        &cancel,
        &Reporter::new(None, &cancel),
    )
    .expect("save");
    assert_eq!(kept_scratch(), 0, "the save freed its bands");
    let expected = SaveReference::new(&ckpt, &options).expect("expected");
    let report = verify(&out, Some(&expected), false, &Progress::default()).expect("verify");
    assert_eq!(report.compared, 1, "the weight was recomputed and compared");
    assert_eq!(kept_scratch(), 0, "verify --against freed its bands");
}
