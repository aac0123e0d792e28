//! Journeys through the inspector: keys go through the real runtime (event loop, ticks,
//! effects, worker and save threads) from a script on a virtual clock, frames are drawn
//! on ratatui's `TestBackend` and snapshotted with insta. Readings the terminal's
//! samplers would send (memory, GPUs) and the size are handed to the App as the
//! runtime hands them; nothing the App asks for is carried out here — the runtime does
//! it. Orders the threads would race for (a key while a re-total runs, a preview that
//! lands late) are pinned with the script's `Hold` and `Release`.

#[path = "../common/mod.rs"]
mod common;

mod map_edits;
mod navigation;
mod runtime;
mod save;
mod screens;

use std::time::Duration;

use common::journey::{
    Journey, ch, ctrl, drive, key, press, press_now, press_step, screen, text, type_keys, wait,
};
use common::{mixed_model, read_saved};
use devmap::model::{LoadOptions, Placement, load};
use devmap::monitor::MemorySample;
use devmap::tui::app::{Action, App, Budgets, Confirm, Field, Mode, Outcome, PREVIEW_DELAY};
use devmap::tui::runtime::Event;
use devmap::tui::script::Step;
use devmap::tui::ui;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyModifiers, MouseEvent, MouseEventKind};

const GIB: u64 = 1 << 30;

fn sample(used_gib: f64, available_gib: f64) -> MemorySample {
    MemorySample {
        total: 16 * GIB,
        used: (used_gib * GIB as f64) as u64,
        available: (available_gib * GIB as f64) as u64,
        rss: 12 << 20,
        cached: 2 * GIB,
    }
}

/// An App over the mixed fixture with fixed budgets, at 120×40, with no memory readings.
fn bare_app(model: &common::Model) -> App {
    let ckpt = load(&model.dir, &LoadOptions::default()).expect("load");
    let mut app = App::new(ckpt);
    app.budgets = Budgets {
        disk_free: Some(100 * GIB),
        gpu_total: vec![(0, 24 * GIB)],
        ..Budgets::default()
    };
    app.size = (120, 40);
    app
}

/// [`bare_app`] with forty memory readings, as the sampler sends them.
fn app_for(model: &common::Model) -> App {
    let mut app = bare_app(model);
    drive(
        &mut app,
        (0..40).map(|i| Step::Event(Event::Memory(sample(4.0 + f64::from(i % 7) * 0.1, 11.0)))),
    );
    app
}

/// Lets the clock run past the save preview's quiet time, as a user who stopped
/// typing does; the runtime's tick starts the preview and its result lands.
fn settle(app: &mut App) {
    wait(app, PREVIEW_DELAY + Duration::from_millis(1));
}

/// The App's screen at another size: a resize as the terminal sends it, through the
/// runtime.
fn resized(app: &mut App, width: u16, height: u16) -> String {
    app.size = (width, height);
    screen(&drive(
        app,
        [press_event(ratatui::crossterm::event::Event::Resize(
            width, height,
        ))],
    ))
}

fn press_event(event: ratatui::crossterm::event::Event) -> Step {
    Step::Event(Event::Terminal(event))
}

/// A reading the terminal's samplers send (memory, GPUs), through the runtime.
fn sampled(app: &mut App, event: Event) {
    drive(app, [Step::Event(event)]);
}

fn mouse(event: MouseEvent) -> Step {
    press_event(ratatui::crossterm::event::Event::Mouse(event))
}

fn selected_name(app: &App) -> String {
    app.tree.full_name(app.selected().expect("a selection"))
}

fn frame(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("terminal");
    terminal.draw(|f| ui::draw(app, f)).expect("draw");
    let buffer = terminal.backend().buffer().clone();
    let mut out = String::new();
    for y in 0..height {
        let line: String = (0..width)
            .map(|x| buffer[(x, y)].symbol().to_owned())
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn fixed_gpus() -> Vec<devmap::monitor::gpu::GpuInfo> {
    use devmap::monitor::gpu::{FixedGpus, GpuInfo, GpuSource};
    let mut source = FixedGpus(vec![
        GpuInfo {
            index: 0,
            name: "Test GPU".into(),
            total: 24 * GIB,
            free: 20 * GIB,
        },
        GpuInfo {
            index: 1,
            name: "Test GPU".into(),
            total: 24 * GIB,
            free: 6 * GIB,
        },
    ]);
    source.gpus()
}

/// Selects the module `name` by pressing keys, as a user would: from the top, down,
/// opening the modules on its path.
fn select(app: &mut App, name: &str) {
    let mut journey = Journey::start(app);
    select_in(&mut journey, app, name);
    journey.end(app);
}

/// [`select`] within a journey (while work it started may be running).
fn select_in(journey: &mut Journey, app: &mut App, name: &str) {
    journey.press(app, &[ch('g')]);
    for _ in 0..200 {
        let at = selected_name(app);
        if at == name {
            return;
        }
        if name.starts_with(&format!("{at}.")) {
            // Opens the module, or (open already) steps onto its first child.
            journey.press(app, &[ch('l')]);
            continue;
        }
        journey.press(app, &[ch('j')]);
    }
    panic!("{name} is not in the visible tree");
}

/// The buffer of one frame, for tests that look at styles, not only symbols.
fn buffer(app: &App, width: u16, height: u16) -> ratatui::buffer::Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("terminal");
    terminal.draw(|f| ui::draw(app, f)).expect("draw");
    terminal.backend().buffer().clone()
}

/// The mixed fixture spread over eight GPUs, cpu and disk, with cpu and disk over
/// their budgets.
fn ten_devices(m: &common::Model) -> App {
    let mut map = serde_json::Map::new();
    map.insert("lm_head".into(), 0.into());
    map.insert("model.embed_tokens".into(), 0.into());
    for l in 0..12 {
        let device: serde_json::Value = match l {
            0..=7 => l.into(),
            8 | 9 => "cpu".into(),
            _ => "disk".into(),
        };
        map.insert(format!("model.layers.{l}"), device);
    }
    for (k, v) in [
        ("model.norm", "disk"),
        ("model.scale", "disk"),
        ("model.empty", "cpu"),
    ] {
        map.insert(k.into(), v.into());
    }
    let path = m.out("ten-devices.json");
    devmap::fixtures::write_json(&path, &serde_json::Value::Object(map)).expect("map");
    let options = LoadOptions {
        device_map: Some(path),
        ..LoadOptions::default()
    };
    let ckpt = load(&m.dir, &options).expect("load");
    let mut app = App::new(ckpt);
    app.budgets = Budgets {
        disk_free: Some(100),
        gpu_total: (0..8).map(|i| (i, 24 * GIB)).collect(),
        ..Budgets::default()
    };
    // About 200 bytes of RAM available: cpu is over its budget too.
    sampled(&mut app, Event::Memory(sample(4.0, 2e-7)));
    app
}
