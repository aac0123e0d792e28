//! Frame and key timings of the TUI on a ~100,000-tensor model (a benchmark, not a
//! test):
//!
//!     cargo run --release --example bench_tui [-- [--deep] DIR]
//!
//! Generates (once) a sparse 60-layer x 256-expert MoE checkpoint over 160 shards in
//! DIR (default target/bench/moe) — the wide shape, 92,583 tensors — or with `--deep`
//! a dense Llama of 10,200 layers over 100 shards (default target/bench/deep, 91,803
//! tensors), then reports: time to open it (all headers, the tree), median / worst
//! time to draw a frame, to handle a key, to search, and the work each edit hands off
//! (re-total, undo, plan, save preview).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use devmap::fixtures::{MoeShape, write_sparse_deep, write_sparse_moe};
use devmap::model::{LoadOptions, load};
use devmap::tui::app::{Action, App, Effect};
use devmap::tui::ui;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[v.len() - 1])
}

fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), v[v.len() - 1])
}

/// A table row: name, count, median, p99, worst.
fn print_row(name: &str, v: Vec<Duration>) {
    let n = v.len();
    let (median, p99, worst) = percentiles(v);
    println!(
        "| {name} | {n} | {} | {} | {} |",
        ms(median),
        ms(p99),
        ms(worst)
    );
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let deep = args.iter().any(|a| a == "--deep");
    let dir = args.iter().find(|a| *a != "--deep").map_or_else(
        || {
            PathBuf::from(if deep {
                "target/bench/deep"
            } else {
                "target/bench/moe"
            })
        },
        PathBuf::from,
    );
    if !dir.join("model.safetensors.index.json").exists() {
        let (n, bytes) = if deep {
            write_sparse_deep(&dir, 10_200, 512, 100)?
        } else {
            write_sparse_moe(&dir, MoeShape::GIANT)?
        };
        println!(
            "generated {n} tensors describing {} in {}",
            devmap::human_bytes(bytes),
            dir.display()
        );
    }
    // With the four-device map and the offload folder `gen_offload_map` writes beside
    // it (when it has): `inspect`'s work against the inspector's first full frame, each
    // from the files, alternated so a busy machine slows both alike.
    let offloaded = dir.with_file_name(format!(
        "{}-map/offloaded",
        dir.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    ));
    if offloaded.join("offload/index.json").exists() {
        let mut reports = Vec::new();
        let mut first_frames = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            let c = load(&offloaded, &LoadOptions::default()).map_err(std::io::Error::other)?;
            std::hint::black_box(devmap::inspect::to_text(
                &c,
                devmap::inspect::TextOptions::default(),
            ));
            reports.push(t.elapsed());
            drop(c);
            let t = Instant::now();
            let c = load(&offloaded, &LoadOptions::default()).map_err(std::io::Error::other)?;
            let mut app = App::new(c);
            app.handle(Action::Resize {
                width: 160,
                height: 50,
            });
            let Ok(mut terminal) = Terminal::new(TestBackend::new(160, 50));
            let Ok(_) = terminal.draw(|f| ui::draw(&app, f));
            first_frames.push(t.elapsed());
        }
        let (report, _) = stats(reports);
        let (frame, _) = stats(first_frames);
        println!(
            "with {}'s map and offload folder: inspect report {} median, inspector's first frame {} median ({:.2}x)",
            offloaded.display(),
            ms(report),
            ms(frame),
            frame.as_secs_f64() / report.as_secs_f64()
        );
    }
    let mut opens = Vec::new();
    let mut ckpt = None;
    for _ in 0..5 {
        let t = Instant::now();
        let c = load(&dir, &LoadOptions::default()).map_err(std::io::Error::other)?;
        let tree = devmap::model::ModuleTree::build(&c);
        opens.push(t.elapsed());
        std::hint::black_box(tree);
        ckpt = Some(c);
    }
    let ckpt = ckpt.ok_or_else(|| std::io::Error::other("no load"))?;
    let tensors = ckpt.tensors().len();
    let t = Instant::now();
    let mut app = App::new(ckpt);
    let app_new = t.elapsed();
    // The work the runtime starts on its own thread as the inspector opens (the
    // inputs opened once, the planner's view built): the UI draws and takes keys
    // meanwhile; the first save preview and the first `p` below come after it, as
    // they do for a user who opens the save dialog or the planner.
    let mut opening = Vec::new();
    for effect in app.opening_work() {
        if let Effect::Compute(work) = effect {
            let t = Instant::now();
            app.handle(work.run());
            opening.push(t.elapsed());
        }
    }
    app.color = false;
    app.handle(Action::Resize {
        width: 160,
        height: 50,
    });
    let Ok(mut terminal) = Terminal::new(TestBackend::new(160, 50));
    // Open the layers module so the tree has thousands of rows to page through.
    for a in [
        Action::Down,
        Action::Expand,
        Action::Down,
        Action::Down,
        Action::Expand,
    ] {
        app.handle(a);
    }
    let mut draws = Vec::new();
    let mut keys = Vec::new();
    let script = [
        Action::Down,
        Action::PageDown,
        Action::Expand,
        Action::Down,
        Action::Collapse,
        Action::PageDown,
    ];
    for i in 0..600 {
        let action = script[i % script.len()].clone();
        let t = Instant::now();
        app.handle(action);
        keys.push(t.elapsed());
        let t = Instant::now();
        let Ok(_) = terminal.draw(|f| ui::draw(&app, f));
        draws.push(t.elapsed());
    }
    let mut searches = Vec::new();
    for q in [
        "experts.255.down",
        "layers.59.mlp.gate",
        "norm",
        "nothing-matches-this",
    ] {
        app.handle(Action::StartSearch);
        let t = Instant::now();
        for c in q.chars() {
            app.handle(Action::Input(c));
        }
        searches.push(t.elapsed() / q.len() as u32);
        app.handle(Action::Close);
    }
    // Key to frame (handle + draw) for each kind of key, as the runtime does it. Work
    // the key hands off (Effect::Compute) runs afterwards, as on its own thread: its
    // time is reported apart, and so is the frame that shows its result.
    let mut work_times = Vec::new();
    let mut landing_frames = Vec::new();
    let mut key_to_frame = |app: &mut App, action: Action| {
        let t = Instant::now();
        let effects = app.handle(action);
        let Ok(_) = terminal.draw(|f| ui::draw(app, f));
        let key = t.elapsed();
        let mut queue: std::collections::VecDeque<Effect> = effects.into();
        while let Some(effect) = queue.pop_front() {
            if let Effect::Compute(work) = effect {
                let what = work.what;
                let t = Instant::now();
                let landed = work.run();
                work_times.push((what, t.elapsed()));
                let t = Instant::now();
                queue.extend(app.handle(landed));
                let Ok(_) = terminal.draw(|f| ui::draw(app, f));
                landing_frames.push(t.elapsed());
            }
        }
        key
    };
    let mut navigation = Vec::new();
    for i in 0..600 {
        navigation.push(key_to_frame(&mut app, script[i % script.len()].clone()));
    }
    let mut search_typing = Vec::new();
    for _ in 0..5 {
        key_to_frame(&mut app, Action::StartSearch);
        for c in "layers.7.mlp.experts.12".chars() {
            search_typing.push(key_to_frame(&mut app, Action::Input(c)));
        }
        key_to_frame(&mut app, Action::Close);
    }
    let mut filter_typing = Vec::new();
    for _ in 0..5 {
        key_to_frame(&mut app, Action::StartFilter);
        for c in "layers.7 dev:cpu".chars() {
            filter_typing.push(key_to_frame(&mut app, Action::Input(c)));
        }
        key_to_frame(&mut app, Action::Close);
    }
    // Whole-tree keys: sort through every order, open and close everything.
    let mut whole_tree = Vec::new();
    for _ in 0..2 {
        for action in [
            Action::CycleSort,
            Action::CycleSort,
            Action::CycleSort,
            Action::CycleSort,
            Action::ExpandAll,
            Action::CollapseAll,
        ] {
            whole_tree.push(key_to_frame(&mut app, action));
        }
    }
    let mut save_typing = Vec::new();
    let mut previews = Vec::new();
    let mut clock = Duration::from_secs(1);
    for round in 0..5 {
        key_to_frame(&mut app, Action::OpenSave);
        key_to_frame(&mut app, Action::ClearField);
        for c in "200MB".chars() {
            save_typing.push(key_to_frame(&mut app, Action::Input(c)));
        }
        key_to_frame(&mut app, Action::NextField);
        key_to_frame(&mut app, Action::ClearField);
        for c in format!("/tmp/devmap-bench-out-{round}").chars() {
            save_typing.push(key_to_frame(&mut app, Action::Input(c)));
        }
        for preset in [Action::NextField, Action::NextPreset, Action::PrevPreset] {
            save_typing.push(key_to_frame(&mut app, preset));
        }
        // The keys stopped: the deferred preview (plan and checks) runs on this tick.
        clock += Duration::from_secs(1);
        previews.push(key_to_frame(&mut app, Action::Tick(clock)));
        key_to_frame(&mut app, Action::Close);
    }
    let mut export_typing = Vec::new();
    for _ in 0..5 {
        key_to_frame(&mut app, Action::StartExport);
        key_to_frame(&mut app, Action::ClearField);
        for c in "/tmp/devmap-bench-map.json".chars() {
            export_typing.push(key_to_frame(&mut app, Action::Input(c)));
        }
        key_to_frame(&mut app, Action::Close);
    }
    let mut device_edits = Vec::new();
    for _ in 0..10 {
        device_edits.push(key_to_frame(&mut app, Action::CycleDevice));
    }
    let mut undos = Vec::new();
    for _ in 0..10 {
        undos.push(key_to_frame(&mut app, Action::Undo));
    }
    let mut plans = Vec::new();
    for _ in 0..3 {
        key_to_frame(&mut app, Action::StartPlan);
        key_to_frame(&mut app, Action::ClearField);
        for c in "0=80GiB,1=80GiB,cpu=200GiB".chars() {
            key_to_frame(&mut app, Action::Input(c));
        }
        plans.push(key_to_frame(&mut app, Action::Submit));
        // Accept the preview: the map goes in place.
        key_to_frame(&mut app, Action::Submit);
    }
    // Edits on the planned map (a key per layer: 10,200 on the deep shape): their
    // re-totals come after the 20 of `d` and `u` above.
    for _ in 0..5 {
        key_to_frame(&mut app, Action::Undo);
        key_to_frame(&mut app, Action::Redo);
    }
    let by_kind = |what: &str| -> Vec<Duration> {
        work_times
            .iter()
            .filter(|(w, _)| *w == what)
            .map(|(_, d)| *d)
            .collect()
    };
    let (mut retotals, checks, plannings) = (
        by_kind("re-totalling"),
        by_kind("checking"),
        by_kind("planning"),
    );
    let on_planned = retotals.split_off(retotals.len().min(20));
    let (open_med, open_max) = stats(opens);
    let (draw_med, draw_max) = stats(draws);
    let (key_med, key_max) = stats(keys);
    let (search_med, search_max) = stats(searches);
    println!(
        "{tensors} tensors, {} tree rows visible after opening layers",
        app.rows.visible().len()
    );
    println!("| what | median | worst |");
    println!("| --- | ---: | ---: |");
    println!(
        "| open (headers + tree) | {} | {} |",
        ms(open_med),
        ms(open_max)
    );
    println!(
        "| App::new (tree, checks) | {} | {} |",
        ms(app_new),
        ms(app_new)
    );
    println!(
        "| draw a frame (160x50) | {} | {} |",
        ms(draw_med),
        ms(draw_max)
    );
    println!("| handle a key | {} | {} |", ms(key_med), ms(key_max));
    println!(
        "| search keystroke (all names) | {} | {} |",
        ms(search_med),
        ms(search_max)
    );
    println!();
    println!("key to frame (handle the key, draw 160x50), {tensors} tensors:");
    println!("| keys | n | median | p99 | worst |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (name, v) in [
        ("navigation (↑↓, PgDn, →←)", navigation),
        ("typing a search", search_typing),
        (
            "typing a filter (the tree re-filtered each key)",
            filter_typing,
        ),
        ("`o` sort / `+` open all / `-` close all", whole_tree),
        (
            "typing in the save dialog (size, path, Tab, ←→)",
            save_typing,
        ),
        ("typing the export path", export_typing),
        ("`d` (re-place a module; re-total handed off)", device_edits),
        ("`u` (undo; re-total handed off)", undos),
        ("save preview starts after the keys stop", previews),
        ("`p` Enter (plan handed off)", plans),
        ("frame showing handed-off work's result", landing_frames),
    ] {
        print_row(name, v);
    }
    println!();
    println!("work off the UI thread (the UI keeps drawing and taking keys meanwhile):");
    println!("| work | n | median | p99 | worst |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (name, v) in [
        ("opening work (once, as the inspector opens)", opening),
        ("re-total after `d` and `u`", retotals),
        ("save preview (plan + checks)", checks),
        ("`p`: plan + re-total", plannings),
        ("re-total after `u` / Ctrl-R on the planned map", on_planned),
    ] {
        print_row(name, v);
    }
    Ok(())
}
