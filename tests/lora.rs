//! `--merge-lora` without Python: adapters written here in peft's layout; refusals
//! before writing, inspect's listing, composition with offload values, `--dtype`,
//! ties and `verify --against`, and flat memory on a model far larger than the adapter.
//! (tests/real/lora_merge.rs compares the values with peft's own merge.)

mod common;

use std::path::{Path, PathBuf};

use common::{arg, devmap, mixed_model, read_saved, stderr, stdout};
use devmap::fixtures::{FixtureTensor, write_json, write_safetensors};
use devmap::types::DType;

/// Writes a LoRA adapter folder: for each module, A `[r, in]` and B `[out, r]` in f32.
fn adapter(dir: &Path, config: serde_json::Value, pairs: &[(&str, u64, u64, u64)]) -> PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut tensors = Vec::new();
    for (i, (module, r, out, inp)) in pairs.iter().enumerate() {
        let key = format!("base_model.model.{module}");
        let mut a = FixtureTensor::patterned(
            &format!("{key}.lora_A.weight"),
            DType::F32,
            &[*r, *inp],
            40 + i as u64,
        );
        let mut b = FixtureTensor::patterned(
            &format!("{key}.lora_B.weight"),
            DType::F32,
            &[*out, *r],
            80 + i as u64,
        );
        for t in [&mut a, &mut b] {
            for (k, c) in t.data.chunks_exact_mut(4).enumerate() {
                let v = ((k * 31 + i * 7) % 17) as f32 / 17.0 - 0.5;
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        tensors.push(a);
        tensors.push(b);
    }
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    write_safetensors(&dir.join("adapter_model.safetensors"), &refs).expect("weights");
    write_json(&dir.join("adapter_config.json"), &config).expect("config");
    dir.to_path_buf()
}

/// `devmap save MODEL --out OUT --quiet --merge-lora ADAPTER [extra]`, which must
/// succeed.
fn save_merged(model: &Path, adapter: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec!["--merge-lora", arg(adapter)];
    args.extend_from_slice(extra);
    let o = common::save(model, out, &args);
    assert!(o.status.success(), "{}", stderr(&o));
}

fn lora(r: u64, alpha: u64) -> serde_json::Value {
    serde_json::json!({"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": ["proj"]})
}

fn f16_values(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(2)
        .map(|b| f64::from(half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()))
        .collect()
}

/// The straightforward delta: scale · B·A, in f64.
fn delta(dir: &Path, module: &str, r: usize, out: usize, inp: usize, scale: f64) -> Vec<f64> {
    let bytes = std::fs::read(dir.join("adapter_model.safetensors")).expect("adapter");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("adapter");
    let f32s = |name: &str| -> Vec<f64> {
        st.tensor(name)
            .expect("tensor")
            .data()
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect()
    };
    let a = f32s(&format!("base_model.model.{module}.lora_A.weight"));
    let b = f32s(&format!("base_model.model.{module}.lora_B.weight"));
    let mut d = vec![0.0; out * inp];
    for i in 0..out {
        for j in 0..inp {
            d[i * inp + j] = scale * (0..r).map(|k| b[i * r + k] * a[k * inp + j]).sum::<f64>();
        }
    }
    d
}

#[test]
fn merged_values_are_the_current_value_plus_the_delta() {
    let m = mixed_model();
    // Layer 2's weight comes from the checkpoint, layer 9's from the offload folder.
    let ad = adapter(
        &m.out("adapter"),
        lora(4, 8),
        &[
            ("model.layers.2.proj", 4, 16, 16),
            ("model.layers.9.proj", 4, 16, 16),
        ],
    );
    let out = m.out("merged");
    save_merged(&m.dir, &ad, &out, &[]);
    let saved = read_saved(&out);
    for module in ["model.layers.2.proj", "model.layers.9.proj"] {
        let name = format!("{module}.weight");
        let before = f16_values(&m.expected[&name].data);
        let after = f16_values(&saved[&name].data);
        let want = delta(&ad, module, 4, 16, 16, 2.0);
        for (k, ((b, a), d)) in before.iter().zip(&after).zip(&want).enumerate() {
            // One float16 rounding of the sum: within half an ulp of the exact value.
            let exact = b + d;
            if exact.is_nan() {
                // The fixture's bytes include NaNs: they stay NaN.
                assert!(a.is_nan(), "{name}[{k}]: {b} + {d} gave {a}, not NaN");
                continue;
            }
            if exact.abs() >= 65520.0 {
                // Infinities stay, and a sum at or past float16's largest value plus half
                // an ulp rounds to infinity of its sign.
                assert!(
                    a.is_infinite() && a.signum() == exact.signum(),
                    "{name}[{k}]: {b} + {d} = {exact} gave {a}, not {}inf",
                    if exact < 0.0 { "-" } else { "" }
                );
                continue;
            }
            if exact.abs() > 65504.0 {
                // Past the largest float16 but within half an ulp of it: rounds to it.
                assert!(
                    a.to_bits() == 65504.0f64.copysign(exact).to_bits(),
                    "{name}[{k}]: {b} + {d} gave {a}"
                );
                continue;
            }
            let ulp = 2f64.powi(exact.abs().max(6.1e-5).log2().floor() as i32 - 10);
            assert!(
                (a - exact).abs() <= ulp * 0.5 + 1e-12,
                "{name}[{k}]: {a} vs {exact}"
            );
        }
    }
    // Everything else is byte for byte what a save without the adapter writes.
    for (name, value) in &m.expected {
        if !name.ends_with("layers.2.proj.weight") && !name.ends_with("layers.9.proj.weight") {
            assert_eq!(&saved[name], value, "{name}");
        }
    }
}

#[test]
fn verify_against_recomputes_the_merge() {
    let m = mixed_model();
    let ad = adapter(
        &m.out("adapter"),
        lora(2, 4),
        &[("model.layers.5.proj", 2, 16, 16)],
    );
    let out = m.out("merged");
    save_merged(&m.dir, &ad, &out, &[]);
    let o = devmap(&[
        "verify",
        arg(&out),
        "--against",
        arg(&m.dir),
        "--merge-lora",
        arg(&ad),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    // Without the adapter, exactly the merged tensor differs.
    let o = devmap(&[
        "verify",
        arg(&out),
        "--against",
        arg(&m.dir),
        "--json",
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let differences: Vec<&str> = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["severity"] == "difference")
        .map(|f| f["subject"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(differences, ["model.layers.5.proj.weight"]);
}

#[test]
fn a_cast_after_the_merge_is_the_merge_then_the_cast() {
    let m = mixed_model();
    let ad = adapter(
        &m.out("adapter"),
        lora(2, 4),
        &[("model.layers.1.proj", 2, 16, 16)],
    );
    let (plain, cast) = (m.out("plain"), m.out("cast"));
    save_merged(&m.dir, &ad, &plain, &[]);
    save_merged(&m.dir, &ad, &cast, &["--dtype", "float32"]);
    let name = "model.layers.1.proj.weight";
    let merged = f16_values(&read_saved(&plain)[name].data);
    let widened: Vec<f64> = read_saved(&cast)[name]
        .data
        .chunks_exact(4)
        .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    assert_eq!(merged.len(), widened.len());
    for (k, (a, b)) in merged.iter().zip(&widened).enumerate() {
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "{name}[{k}]: {a} vs {b}"
        );
    }
}

#[test]
fn inspect_lists_what_the_adapter_changes() {
    let m = mixed_model();
    let ad = adapter(
        &m.out("adapter"),
        serde_json::json!({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_rslora": true,
                           "rank_pattern": {"layers.3.proj": 2}}),
        &[
            ("model.layers.0.proj", 4, 16, 16),
            ("model.layers.3.proj", 2, 16, 16),
        ],
    );
    let o = devmap(&["inspect", arg(&m.dir), "--merge-lora", arg(&ad)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("LORA (applied on save: 2 tensors merged, 0 replaced)"),
        "{text}"
    );
    assert!(text.contains("model.layers.0.proj.weight  += "), "{text}");
    // rsLoRA: 8/√4 = 4 and 8/√2 ≈ 5.656854.
    assert!(text.contains("linear, rank 4, scale 4"), "{text}");
    assert!(text.contains("linear, rank 2, scale 5.656854"), "{text}");
    let o = devmap(&["inspect", arg(&m.dir), "--merge-lora", arg(&ad), "--json"]);
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let t = report["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .find(|t| t["name"] == "model.layers.3.proj.weight")
        .expect("tensor");
    assert_eq!(t["lora"][0]["rank"], 2);
    assert_eq!(t["lora"][0]["kind"], "linear");
}

#[test]
fn adapter_problems_are_refused_before_writing() {
    let m = mixed_model();
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            adapter(
                &m.out("unknown-module"),
                lora(2, 4),
                &[("model.layers.77.proj", 2, 16, 16)],
            ),
            "adapts `model.layers.77.proj`, but the model has no tensor `model.layers.77.proj.weight`",
        ),
        (
            adapter(
                &m.out("wrong-shape"),
                lora(2, 4),
                &[("model.layers.1.proj", 2, 16, 12)],
            ),
            "do not fit `model.layers.1.proj.weight` [16, 16]",
        ),
        (
            adapter(
                &m.out("wrong-rank"),
                lora(8, 4),
                &[("model.layers.1.proj", 2, 16, 16)],
            ),
            "has rank 2, but the config gives `model.layers.1.proj` rank 8",
        ),
        (
            adapter(
                &m.out("ia3"),
                serde_json::json!({"peft_type": "IA3", "target_modules": ["proj"]}),
                &[("model.layers.1.proj", 2, 16, 16)],
            ),
            "is a IA3 adapter; devmap merges LoRA adapters only",
        ),
        (
            adapter(
                &m.out("regex"),
                serde_json::json!({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "rank_pattern": {"layers\\.\\d+\\.proj": 2}}),
                &[("model.layers.1.proj", 2, 16, 16)],
            ),
            "is a regular expression",
        ),
    ];
    let before = common::snapshot(&m.dir);
    for (dir, message) in cases {
        let out = m.out("never");
        let o = common::save(&m.dir, &out, &["--merge-lora", arg(&dir)]);
        assert!(!o.status.success(), "{} was accepted", dir.display());
        let err = stderr(&o);
        assert!(err.contains(message), "{}: {err}", dir.display());
        assert!(err.contains(arg(&dir)), "the adapter is named: {err}");
        assert!(!out.exists(), "nothing may be written");
    }
    let o = devmap(&[
        "save",
        arg(&m.dir),
        "--out",
        arg(&m.out("never")),
        "--merge-lora",
        arg(&m.dir),
    ]);
    assert!(
        stderr(&o).contains("not a peft adapter folder"),
        "{}",
        stderr(&o)
    );
    assert_eq!(common::snapshot(&m.dir), before, "inputs untouched");
}

#[test]
fn a_merge_into_a_tied_embedding_changes_every_name_of_the_group() {
    let m = mixed_model();
    let dir = m.out("adapter");
    std::fs::create_dir_all(&dir).expect("mkdir");
    // Embedding LoRA: A [r, num], B [dim, r] (the embedding is [64, 16]).
    let a = FixtureTensor::patterned(
        "base_model.model.model.embed_tokens.lora_embedding_A",
        DType::F32,
        &[2, 64],
        5,
    );
    let b = FixtureTensor::patterned(
        "base_model.model.model.embed_tokens.lora_embedding_B",
        DType::F32,
        &[16, 2],
        6,
    );
    let mut tensors = vec![a, b];
    for t in &mut tensors {
        for (k, c) in t.data.chunks_exact_mut(4).enumerate() {
            c.copy_from_slice(&(((k % 9) as f32 - 4.0) / 8.0).to_le_bytes());
        }
    }
    let refs: Vec<&FixtureTensor> = tensors.iter().collect();
    write_safetensors(&dir.join("adapter_model.safetensors"), &refs).expect("w");
    write_json(&dir.join("adapter_config.json"), &lora(2, 2)).expect("c");
    let out = m.out("merged");
    save_merged(&m.dir, &dir, &out, &["--keep-tied"]);
    let saved = read_saved(&out);
    let embed = &saved["model.embed_tokens.weight"];
    assert_ne!(embed, &m.expected["model.embed_tokens.weight"], "merged");
    assert_eq!(
        &saved["lm_head.weight"], embed,
        "the tied head carries the merge too"
    );
}

#[test]
fn memory_stays_flat_on_a_model_far_larger_than_the_adapter() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("big");
    // 144 MiB of f32 weights, each [1024, 2048]; a rank-16 pair on every one of them.
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut pairs = Vec::new();
    for f in 0..2 {
        let tensors: Vec<FixtureTensor> = (0..9)
            .map(|i| {
                let mut data = vec![0u8; 8 << 20];
                for (k, c) in data.chunks_exact_mut(4).enumerate().step_by(4099) {
                    c.copy_from_slice(&((k % 13) as f32).to_le_bytes());
                }
                FixtureTensor {
                    name: format!("model.layers.{f}.w{i}.weight"),
                    dtype: DType::F32,
                    shape: vec![1024, 2048],
                    data,
                }
            })
            .collect();
        let refs: Vec<&FixtureTensor> = tensors.iter().collect();
        write_safetensors(&dir.join(format!("part{f}.safetensors")), &refs).expect("write");
        for i in 0..9 {
            pairs.push((format!("model.layers.{f}.w{i}"), 16, 1024, 2048));
        }
    }
    let pairs_ref: Vec<(&str, u64, u64, u64)> = pairs
        .iter()
        .map(|(m, r, o, i)| (m.as_str(), *r, *o, *i))
        .collect();
    let ad = adapter(&tmp.path().join("adapter"), lora(16, 32), &pairs_ref);
    let largest_pair = 16 * (1024 + 2048) * 4;
    let out = tmp.path().join("out");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_devmap"))
        .args([
            "save",
            arg(&dir),
            "--out",
            arg(&out),
            "--quiet",
            "--no-fsync",
            "--merge-lora",
            arg(&ad),
        ])
        .env("DEVMAP_REPORT_PEAK_RSS", "1")
        .output()
        .expect("run");
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let peak = common::peak_rss(&err);
    eprintln!("peak RSS {} MiB merging 18 pairs into 144 MiB", peak >> 20);
    // Two writers, each holding one pair in f32 and one block.
    assert!(
        peak < (64 << 20) + 2 * largest_pair,
        "peak RSS {peak} bytes"
    );
}

#[test]
fn the_inspector_marks_merged_tensors_and_the_save_dialog_names_the_adapter() {
    use common::journey::{ch, key, press};
    use devmap::tui::app::{App, Mode};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::KeyCode;
    let m = mixed_model();
    let ad = adapter(
        &m.out("adapter"),
        lora(2, 4),
        &[("model.layers.0.proj", 2, 16, 16)],
    );
    let mut ckpt =
        devmap::model::load(&m.dir, &devmap::model::LoadOptions::default()).expect("load");
    devmap::model::lora::apply_adapter(&mut ckpt, &ad).expect("adapter");
    let mut app = App::new(ckpt);
    app.size = (140, 45);
    let frame = |app: &App| {
        let mut terminal = Terminal::new(TestBackend::new(140, 45)).expect("terminal");
        terminal
            .draw(|f| devmap::tui::ui::draw(app, f))
            .expect("draw");
        let buffer = terminal.backend().buffer().clone();
        (0..45)
            .map(|y| {
                (0..140)
                    .map(|x| buffer[(x, y)].symbol().to_owned())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    // Open model > layers > 0 and select its proj.weight.
    for _ in 0..60 {
        let screen = frame(&app);
        if screen
            .lines()
            .any(|l| l.contains("proj.weight") || l.contains("│  │  │  weight"))
        {
            break;
        }
        press(&mut app, &[key(KeyCode::Right)]);
    }
    let mut found = false;
    for _ in 0..80 {
        let selected = app.selected().map(|id| app.tree.full_name(id));
        if selected.as_deref() == Some("model.layers.0.proj.weight") {
            found = true;
            break;
        }
        press(&mut app, &[key(KeyCode::Right), key(KeyCode::Down)]);
    }
    assert!(found, "reached the merged tensor");
    let screen = frame(&app);
    assert!(screen.contains("lora      + "), "{screen}");
    assert!(
        screen.contains("(linear, rank") && screen.contains("2, scale 2) on save"),
        "{screen}"
    );
    let row = screen
        .lines()
        .find(|l| l.contains("weight") && l.contains('+'))
        .unwrap_or("");
    assert!(!row.is_empty(), "the tree marks the tensor: {screen}");
    press(&mut app, &[ch('s')]);
    let Mode::SaveDialog(dialog) = &app.mode else {
        panic!("save dialog")
    };
    let (adapters, merged) = dialog
        .preview
        .lora
        .clone()
        .expect("the preview names the merge");
    assert_eq!(merged, 1);
    assert_eq!(adapters, [ad.to_string_lossy().into_owned()]);
    assert!(frame(&app).contains("merged into 1 tensor as the save streams"));
}

/// NaN or ±Inf in an adapter, and a `lora_alpha` so large that the merge overflows:
/// refused naming the key or the tensor, nothing written; `--allow-nonfinite` writes
/// what peft would.
#[test]
fn non_finite_adapters_and_overflowing_merges_are_refused_by_name() {
    let m = mixed_model();
    for (label, value) in [("nan", f32::NAN), ("inf", f32::INFINITY)] {
        let dir = adapter(
            &m.out(&format!("ad-{label}")),
            lora(4, 8),
            &[("model.layers.2.proj", 4, 16, 16)],
        );
        // One value of lora_A made non-finite, in place.
        let weights = dir.join("adapter_model.safetensors");
        let header = devmap::formats::safetensors::read_header(&weights).expect("header");
        let a = header
            .tensors
            .iter()
            .find(|t| t.name.ends_with("lora_A.weight"))
            .expect("lora_A");
        let mut bytes = std::fs::read(&weights).expect("read");
        let at = (a.offset + 4 * 5) as usize;
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        std::fs::write(&weights, bytes).expect("write");
        let out = m.out(&format!("out-{label}"));
        let o = common::save(&m.dir, &out, &["--merge-lora", arg(&dir)]);
        assert!(!o.status.success(), "{label}: merged");
        let err = stderr(&o);
        assert!(
            err.contains("base_model.model.model.layers.2.proj.lora_A.weight")
                && err.contains("1 NaN or infinite value (the first at element 5)")
                && err.contains("--allow-nonfinite"),
            "{label}: {err}"
        );
        assert!(!out.exists(), "{label}: something was written");
        // Allowed: the merge goes through and the weight holds non-finite values.
        save_merged(&m.dir, &dir, &out, &["--allow-nonfinite"]);
        let merged = f16_values(&read_saved(&out)["model.layers.2.proj.weight"].data);
        assert!(merged.iter().any(|v| !v.is_finite()), "{label}");
    }
    // lora_alpha = 3e38: every delta is huge; the float16 weight overflows.
    let dir = adapter(
        &m.out("ad-alpha"),
        serde_json::json!({"peft_type": "LORA", "r": 4, "lora_alpha": 3e38, "target_modules": ["proj"]}),
        &[("model.layers.2.proj", 4, 16, 16)],
    );
    let out = m.out("out-alpha");
    let o = common::save(&m.dir, &out, &["--merge-lora", arg(&dir)]);
    assert!(!o.status.success(), "an overflowing merge was written");
    let err = stderr(&o);
    assert!(
        err.contains("merging the adapter into `model.layers.2.proj.weight` makes element")
            && err.contains("does not fit F16"),
        "{err}"
    );
    assert!(
        !out.exists() || std::fs::read_dir(&out).expect("ls").next().is_none(),
        "something was kept"
    );
    save_merged(
        &m.dir,
        &dir,
        &m.out("out-alpha-allowed"),
        &["--allow-nonfinite"],
    );
}

#[test]
fn an_adapter_naming_modules_as_the_loaded_model_does_merges_into_the_checkpoint_names() {
    // A Llava checkpoint names its text tower `language_model.model.…`; peft saves
    // the adapter under the loaded model's `model.language_model.…`.
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = tmp.path().join("base");
    std::fs::create_dir_all(&base).expect("mkdir");
    let weight = FixtureTensor::patterned(
        "language_model.model.layers.0.self_attn.q_proj.weight",
        DType::F32,
        &[8, 8],
        1,
    );
    let norm = FixtureTensor::patterned("language_model.model.norm.weight", DType::F32, &[8], 2);
    devmap::fixtures::write_safetensors(&base.join("model.safetensors"), &[&weight, &norm])
        .expect("base");
    devmap::fixtures::write_json(
        &base.join("config.json"),
        &serde_json::json!({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"}),
    )
    .expect("config");
    let adapter = tmp.path().join("adapter");
    std::fs::create_dir_all(&adapter).expect("mkdir");
    let module = "base_model.model.model.language_model.layers.0.self_attn.q_proj";
    let a = FixtureTensor::patterned(&format!("{module}.lora_A.weight"), DType::F32, &[2, 8], 3);
    let b = FixtureTensor::patterned(&format!("{module}.lora_B.weight"), DType::F32, &[8, 2], 4);
    devmap::fixtures::write_safetensors(&adapter.join("adapter_model.safetensors"), &[&a, &b])
        .expect("adapter");
    devmap::fixtures::write_json(
        &adapter.join("adapter_config.json"),
        &serde_json::json!({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}),
    )
    .expect("adapter config");
    let mut ckpt =
        devmap::model::load(&base, &devmap::model::LoadOptions::default()).expect("load");
    let summary = devmap::model::lora::apply_adapter(&mut ckpt, &adapter).expect("merges");
    assert_eq!(
        summary.merged,
        vec!["language_model.model.layers.0.self_attn.q_proj.weight".to_owned()]
    );
}
