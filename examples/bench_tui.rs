//! Frame and key timings of the TUI on a ~100,000-tensor model (a benchmark, not a
//! test):
//!
//!     cargo run --release --example bench_tui [-- DIR]
//!
//! Generates (once) a sparse 60-layer x 256-expert MoE checkpoint over 160 shards in
//! DIR (default target/bench/moe), then reports: time to open it (all headers, the
//! tree), and median / worst time to draw a frame, to handle a key, and to search.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use devmap::fixtures::{MoeShape, write_sparse_moe};
use devmap::model::{LoadOptions, load};
use devmap::tui::app::{Action, App};
use devmap::tui::ui;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[v.len() - 1])
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn main() -> std::io::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("target/bench/moe"), PathBuf::from);
    if !dir.join("model.safetensors.index.json").exists() {
        let (n, bytes) = write_sparse_moe(
            &dir,
            MoeShape {
                layers: 60,
                experts: 256,
                hidden: 7168,
                expert_intermediate: 2048,
                shards: 160,
            },
        )?;
        println!(
            "generated {n} tensors describing {} in {}",
            devmap::human_bytes(bytes),
            dir.display()
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
    Ok(())
}
