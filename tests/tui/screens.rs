//! Whole screens: snapshots at several sizes, the GPU and RAM gauges, the selection bar,
//! narrow screens, many devices, the opening screen and the focused panel.

use super::*;

#[test]
fn main_screen_at_three_sizes() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    press(
        &mut app,
        &[
            ch('j'),
            ch('j'),
            ch('j'),
            ch('j'),
            key(KeyCode::Right),
            ch('j'),
        ],
    );
    for (w, h) in [(80, 24), (120, 40), (160, 50)] {
        resized(&mut app, w, h);
        insta::assert_snapshot!(format!("main_{w}x{h}"), frame(&app, w, h));
    }
    resized(&mut app, 50, 12);
    let small = frame(&app, 50, 12);
    assert!(small.contains("needs at least 60×16"), "{small}");
}

/// At 80×24 no short value of the Details panel breaks onto a row of its own (it
/// showed `131K` / `params` and `256 KiB` / `100%`): every module and tensor of the
/// model is selected in turn and the panel's rows are read back.
#[test]
fn at_80x24_details_values_do_not_wrap() {
    let m = mixed_model();
    let demo = common::demo_dir();
    // The demo's sizes are the long ones (`515.50 KiB`).
    for mut app in [
        app_for(&m),
        App::new(load(&demo, &LoadOptions::default()).expect("the demo")),
    ] {
        details_fit_at_80x24(&mut app);
    }
}

fn details_fit_at_80x24(app: &mut App) {
    app.color = false;
    resized(app, 80, 24);
    // Everything open, so every row is visited.
    for _ in 0..200 {
        press(app, &[key(KeyCode::Right), ch('j')]);
    }
    press(app, &[ch('g')]);
    let mut seen = 0;
    for _ in 0..120 {
        let screen = frame(app, 80, 24);
        for line in screen.lines() {
            // The Details panel is the right-hand box of the top half.
            let Some(cell) = line.split('│').rev().nth(1) else {
                continue;
            };
            let value = cell.trim();
            let alone = [
                "params", "tensors", "tensor", "B", "KiB", "gpu:0", "cpu", "disk",
            ];
            let a_share = value.ends_with('%') && value.len() <= 4;
            assert!(
                !(alone.contains(&value) || a_share || value.starts_with("B)")),
                "`{value}` alone on a row of Details at 80×24 ({}):\n{screen}",
                selected_name(app)
            );
        }
        seen += 1;
        press(app, &[ch('j')]);
    }
    assert!(seen > 60, "visited every row");
}

#[test]
fn help_overlay_snapshot() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    press(&mut app, &[ch('?')]);
    insta::assert_snapshot!("help", frame(&app, 100, 30));
}

#[test]
fn gpu_gauges_and_budgets_come_from_the_gpu_source() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    app.budgets.gpu_total.clear();
    sampled(&mut app, Event::Gpus(fixed_gpus(), None));
    // GPU budgets are the free memory; cpu's is the available RAM.
    assert_eq!(app.device_budget(Placement::Gpu(1)), Some(6 * GIB));
    assert_eq!(app.device_budget(Placement::Cpu), Some(11 * GIB));
    let screen = frame(&app, 120, 40);
    assert!(
        screen.contains("GPU0") && screen.contains("4 GiB/24 GiB"),
        "{screen}"
    );
    assert!(
        screen.contains("GPU1") && screen.contains("18 GiB/24 GiB"),
        "{screen}"
    );
    assert!(
        screen.contains("≤ 20 GiB"),
        "gpu:0 measured against its free memory: {screen}"
    );
    insta::assert_snapshot!("gpus", screen);
    // No GPU: what the real NVML source reports without a driver library shows as
    // one line, no gauge, no error.
    use devmap::monitor::gpu::{GpuSource, Nvml};
    let mut no_driver = Nvml::open_library(std::ffi::OsStr::new("/nonexistent/libnvidia-ml.so.1"));
    sampled(&mut app, Event::Gpus(no_driver.gpus(), no_driver.note()));
    let screen = frame(&app, 120, 40);
    assert!(
        screen.contains("no GPU gauges: no NVIDIA driver found") && !screen.contains("GPU0"),
        "{screen}"
    );
}

#[test]
fn the_ram_graph_says_what_its_height_spans() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    // A 100 MB swing on 16 GiB: the graph magnifies it, and says so.
    sampled(&mut app, Event::Memory(sample(4.0, 11.0)));
    sampled(&mut app, Event::Memory(sample(4.1, 10.9)));
    let screen = frame(&app, 160, 50);
    assert!(
        screen.contains("used 4 GiB – 4.60 GiB in 10 s; graph from"),
        "{screen}"
    );
}

#[test]
fn the_selection_bar_covers_the_whole_row_in_colour_and_without() {
    use ratatui::style::Modifier;
    let m = mixed_model();
    for color in [true, false] {
        let mut app = app_for(&m);
        app.color = color;
        press(&mut app, &[key(KeyCode::Down), key(KeyCode::Down)]);
        let areas = devmap::tui::layout::areas(
            ratatui::layout::Rect::new(0, 0, 120, 40),
            app.progress_rows(),
            app.device_rows(),
        );
        let buf = buffer(&app, 120, 40);
        let inner = (areas.tree.x + 1)..(areas.tree.x + areas.tree.width - 1);
        let reversed = |y: u16| {
            inner
                .clone()
                .filter(|&x| buf[(x, y)].modifier.contains(Modifier::REVERSED))
                .count()
        };
        let rows: Vec<u16> = (areas.tree.y..areas.tree.y + areas.tree.height)
            .filter(|&y| reversed(y) > 0)
            .collect();
        assert_eq!(rows.len(), 1, "one selected row (color {color})");
        assert_eq!(
            reversed(rows[0]),
            inner.len(),
            "every cell of the row, the coloured bar and badge included (color {color})"
        );
    }
}

/// At 60×18 the header keeps `[map edited]` and the warning count (the counts give
/// way, whole), and a dialog's key bar leaves out whole items instead of cutting one.
#[test]
fn at_60x18_markers_stay_and_key_hints_are_whole() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    resized(&mut app, 60, 18);
    press(&mut app, &[ch('j'), ch('D')]);
    // The message of the edit goes after its 4 seconds.
    app.handle(Action::Tick(std::time::Duration::from_secs(30)));
    let screen = frame(&app, 60, 18);
    let header = screen.lines().next().unwrap_or_default();
    assert!(header.contains("[map edited]"), "{header}");
    assert!(header.contains("! 1 warning"), "{header}");
    assert!(!header.contains('…'), "{header}");
    press(&mut app, &[ch('p')]);
    let screen = frame(&app, 60, 18);
    let footer = screen.lines().last().unwrap_or_default();
    assert!(footer.starts_with("edit budgets"), "{footer}");
    assert!(!footer.contains('…'), "no phrase cut: {footer}");
}

/// At 140 columns the demo's deepest rows keep the params column (a three-device note
/// on one row once dropped it from every row, 40 columns standing empty).
#[test]
fn at_140_columns_deep_rows_keep_the_params_column() {
    let demo = common::demo_dir();
    let mut app = App::new(load(&demo, &LoadOptions::default()).expect("the demo"));
    app.color = false;
    resized(&mut app, 140, 45);
    for _ in 0..200 {
        press(&mut app, &[key(KeyCode::Right), ch('j')]);
    }
    for _ in 0..40 {
        let screen = frame(&app, 140, 45);
        let header = screen
            .lines()
            .find(|l| l.contains("name") && l.contains("size"))
            .expect("the header");
        assert!(
            header.contains("params"),
            "{}: {screen}",
            selected_name(&app)
        );
        press(&mut app, &[ch('k')]);
    }
}

#[test]
fn narrow_screens_drop_share_and_params_before_names_and_devices() {
    let m = mixed_model();
    let mut app = app_for(&m);
    for (w, h) in [(60, 16), (80, 24), (120, 40), (160, 50)] {
        resized(&mut app, w, h);
        let screen = frame(&app, w, h);
        let header = screen
            .lines()
            .find(|l| l.contains("name") && l.contains("size"))
            .expect("the header");
        assert!(
            header.contains("device"),
            "{w}x{h}: the device column stays:\n{screen}"
        );
        if w >= 80 {
            assert!(
                screen.contains("embed_tokens ") && screen.contains("lm_head "),
                "{w}x{h}: names are whole:\n{screen}"
            );
        } else {
            // At 60 columns the name is what shrinks, after share and params.
            assert!(screen.contains("embed_to"), "{w}x{h}:\n{screen}");
        }
        assert!(screen.contains("gpu:0"), "{w}x{h}:\n{screen}");
        if w >= 120 {
            // The split note of a mixed module (what a map is debugged by): its first
            // two devices before the params column, the rest after it, and a device
            // that does not fit is left out whole, never cut mid-figure.
            assert!(
                screen.contains("gpu:0 48% cpu 26%"),
                "{w}x{h}: the split note is cut:\n{screen}"
            );
            assert!(header.contains("params"), "{w}x{h}:\n{screen}");
            assert!(!screen.contains("disk 2…"), "{w}x{h}:\n{screen}");
        }
        if w >= 160 {
            assert!(screen.contains("gpu:0 48% cpu 26% disk 27%"), "{screen}");
        }
        if w == 60 {
            assert!(
                !header.contains("share"),
                "share gives way first at {w}x{h}"
            );
        }
        if w >= 160 {
            assert!(
                header.contains("share") && header.contains("params"),
                "{w}x{h}"
            );
        }
    }
}

#[test]
fn the_devices_panel_grows_to_ten_devices_and_keeps_over_budget_rows() {
    let m = mixed_model();
    let mut app = ten_devices(&m);
    resized(&mut app, 200, 60);
    let screen = frame(&app, 200, 60);
    for d in 0..8 {
        assert!(
            screen.contains(&format!("│gpu:{d} ")),
            "gpu:{d} shows:\n{screen}"
        );
    }
    let over: Vec<&str> = screen.lines().filter(|l| l.contains(" OVER")).collect();
    assert_eq!(over.len(), 2, "cpu and disk are over:\n{screen}");
    insta::assert_snapshot!("main_200x60_ten_devices", screen);
    // On a small screen not every device fits; those over budget still show.
    resized(&mut app, 80, 24);
    let screen = frame(&app, 80, 24);
    assert!(
        screen.contains("│cpu ") && screen.contains("│disk "),
        "{screen}"
    );
    assert_eq!(
        screen.lines().filter(|l| l.contains(" OVER")).count(),
        2,
        "{screen}"
    );
    assert!(
        screen.contains("more devices, all within budget"),
        "{screen}"
    );
}

#[test]
fn the_opening_screen_names_the_model_and_counts_time() {
    let mut terminal = Terminal::new(TestBackend::new(80, 10)).expect("terminal");
    terminal
        .draw(|f| {
            ui::loading(
                f,
                "/models/llama",
                Duration::from_millis(2_345),
                "fetching the headers: 12/160 shards",
            );
        })
        .expect("draw");
    let buffer = terminal.backend().buffer().clone();
    let text: String = (0..10)
        .map(|y| {
            (0..80)
                .map(|x| buffer[(x, y)].symbol().to_owned())
                .collect::<String>()
                + "\n"
        })
        .collect();
    assert!(text.contains("opening /models/llama … 2.3 s"), "{text}");
    assert!(text.contains("q quits"), "{text}");
    // What the loading thread says (a remote model's fetch) shows under it.
    assert!(
        text.contains("fetching the headers: 12/160 shards"),
        "{text}"
    );
}

/// The focused panel shows it twice: a thick border marked `▶` (without colour too) and,
/// in colour, a cyan border; the others keep a plain one.
#[test]
fn the_focused_panel_has_a_marked_thick_border_in_colour_and_without() {
    let m = mixed_model();
    for color in [true, false] {
        let mut app = app_for(&m);
        app.color = color;
        let b = buffer(&app, 120, 40);
        assert_eq!(b[(0, 1)].symbol(), "┏", "the tree's corner");
        let cyan = b[(0, 1)].fg == ratatui::style::Color::Cyan;
        assert_eq!(cyan, color, "colour {color}");
        press(&mut app, &[key(KeyCode::Tab)]);
        let b = buffer(&app, 120, 40);
        assert_eq!(b[(0, 1)].symbol(), "┌", "the tree gave the focus away");
        let screen = frame(&app, 120, 40);
        assert!(screen.contains("▶ Details"), "{screen}");
    }
}

/// A quantized weight's details say its format, where its scales are and its size once
/// dequantized; its scales are part of its row, not a row that looks like a weight.
#[test]
fn the_details_of_a_quantized_weight_and_its_scales() {
    use devmap::fixtures::{FixtureTensor, write_json, write_safetensors};
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("fp8");
    std::fs::create_dir(&dir).expect("mkdir");
    let weight = FixtureTensor {
        name: "model.layers.0.mlp.down_proj.weight".into(),
        dtype: devmap::types::DType::F8E4M3,
        shape: vec![4, 8],
        data: vec![0x38; 32],
    };
    let scales = FixtureTensor {
        name: "model.layers.0.mlp.down_proj.weight_scale_inv".into(),
        dtype: devmap::types::DType::F32,
        shape: vec![1, 1],
        data: 1f32.to_le_bytes().to_vec(),
    };
    write_safetensors(&dir.join("model.safetensors"), &[&weight, &scales]).expect("weights");
    write_json(
        &dir.join("config.json"),
        &serde_json::json!({
            "architectures": ["ToyForCausalLM"],
            "dtype": "bfloat16",
            "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        }),
    )
    .expect("config");
    let mut app = App::new(load(&dir, &LoadOptions::default()).expect("load"));
    app.size = (120, 40);
    app.color = false;
    select(&mut app, "model.layers.0.mlp.down_proj.weight");
    let screen = frame(&app, 120, 40);
    // (The panel continues a long value under its column, broken at its parts.)
    for piece in [
        "quantized fp8 e4m3, 128×128 blocks; scales",
        "weight_scale_inv",
        "64 B as bfloat16",
    ] {
        assert!(screen.contains(piece), "{piece}: {screen}");
    }
    // The scales are part of the weight: no row of their own, their 4 bytes counted in
    // the weight's row (32 + 4), and a search for them lands on the weight.
    assert!(!screen.contains("weight_scale_inv   "), "{screen}");
    let weight_row = screen
        .lines()
        .find(|l| l.contains("  weight "))
        .unwrap_or_default();
    assert!(weight_row.contains("36 B"), "{weight_row}");
    press(&mut app, &[ch('g'), ch('/')]);
    press(&mut app, &text("scale_inv"));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert_eq!(selected_name(&app), "model.layers.0.mlp.down_proj.weight");
}

/// A model with a shard cut short opens in the inspector (as the CLI opens it, for
/// looking): the warning names the file, and a tensor it lost says it has no data.
#[test]
fn a_truncated_shard_opens_degraded_in_the_inspector() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = common::demo_copy(tmp.path());
    common::cut(&dir.join("model-00002-of-00002.safetensors"), 100);
    let options = LoadOptions {
        open_broken: true,
        ..LoadOptions::default()
    };
    let mut app = App::new(load(&dir, &options).expect("opens degraded"));
    app.color = false;
    let screen = frame(&app, 120, 40);
    assert!(screen.contains("warning"), "{screen}");
    press(&mut app, &[ch('!')]);
    let warnings = frame(&app, 120, 40);
    assert!(
        warnings.contains("model-00002-of-00002.safetensors cannot be read"),
        "{warnings}"
    );
    press(&mut app, &[key(KeyCode::Esc)]);
    select(&mut app, "model.norm.weight");
    let details = frame(&app, 120, 40);
    assert!(details.contains("nowhere"), "{details}");
    // Without the option (a save's open) the model does not open.
    assert!(load(&dir, &LoadOptions::default()).is_err());
}

/// A tensor stored in blocks across a training run's ranks (transformers 5 rank
/// files): Details shows the dimension they split and each rank's block; a top-level
/// module shows each rank's share.
#[test]
fn details_show_the_ranks_blocks_of_a_sharded_checkpoint() {
    use safetensors::Dtype;
    use safetensors::tensor::TensorView;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("ckpt");
    std::fs::create_dir(&dir).expect("dir");
    for rank in 0..2u64 {
        let bytes: Vec<u8> = (0..8u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let metadata = std::collections::HashMap::from([
            ("format".to_owned(), "pt".to_owned()),
            (
                "DCP_SHARDING_INFO".to_owned(),
                serde_json::json!({"model.w.weight": {"saved_offsets": [2 * rank, 0]}}).to_string(),
            ),
        ]);
        let view = TensorView::new(Dtype::F32, vec![2, 4], &bytes).expect("view");
        let file = dir.join(format!(
            "shard-{:05}-model-00001-of-00001.safetensors",
            rank + 1
        ));
        safetensors::serialize_to_file(vec![("model.w.weight", view)], Some(metadata), &file)
            .expect("write");
    }
    let mut app = App::new(load(&dir, &LoadOptions::default()).expect("rank files"));
    app.color = false;
    select(&mut app, "model");
    let top = frame(&app, 120, 40);
    assert!(top.contains("rank 0") && top.contains("rank 1"), "{top}");
    assert!(top.contains("50% of the stored blocks"), "{top}");
    select(&mut app, "model.w.weight");
    let details = frame(&app, 120, 40);
    assert!(details.contains("along dim 0 in 2 blocks"), "{details}");
    assert!(details.contains("at [2, 0] size [2, 4]"), "{details}");
    assert!(details.contains("· rank files ·"), "{details}");
}
