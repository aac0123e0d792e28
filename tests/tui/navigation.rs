//! Moving through the tree and the panels: keys, search, ties, clicks and the wheel,
//! focus, text fields and Tab completion, escaped names, help and quitting.

use super::*;

#[test]
fn navigation_keys() {
    let m = mixed_model();
    let mut app = app_for(&m);
    assert_eq!(selected_name(&app), "lm_head");
    press(&mut app, &[ch('j')]);
    assert_eq!(selected_name(&app), "model");
    press(&mut app, &[key(KeyCode::Down), key(KeyCode::Down)]);
    assert_eq!(
        selected_name(&app),
        "model.empty",
        "named children sort by name"
    );
    press(&mut app, &[key(KeyCode::Down)]);
    assert_eq!(selected_name(&app), "model.layers");
    press(&mut app, &[key(KeyCode::Right)]);
    assert!(app.rows.is_expanded(app.selected().expect("sel")));
    press(&mut app, &[ch('l')]);
    assert_eq!(
        selected_name(&app),
        "model.layers.0",
        "→ on an open module steps into it"
    );
    press(&mut app, &[ch('G')]);
    assert_eq!(selected_name(&app), "model.scale");
    press(&mut app, &[ch('g')]);
    assert_eq!(selected_name(&app), "lm_head");
    press(&mut app, &[key(KeyCode::PageDown)]);
    let after_page = app.rows.selected;
    assert!(after_page > 3, "a page moves many rows: {after_page}");
    press(&mut app, &[key(KeyCode::PageUp)]);
    assert_eq!(app.rows.selected, 0);
    // ← on a closed node goes to its parent; on an open one it closes.
    press(&mut app, &[ch('j'), ch('j'), ch('j'), ch('j'), ch('j')]);
    assert_eq!(selected_name(&app), "model.layers.0");
    press(&mut app, &[ch('h')]);
    assert_eq!(selected_name(&app), "model.layers");
    press(&mut app, &[key(KeyCode::Left)]);
    assert!(!app.rows.is_expanded(app.selected().expect("sel")));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(
        app.rows.is_expanded(app.selected().expect("sel")),
        "Enter expands"
    );
    // Mouse wheel.
    let wheel = |kind| MouseEvent {
        kind,
        column: 0,
        row: 0,
        modifiers: KeyModifiers::NONE,
    };
    let before = app.rows.selected;
    drive(&mut app, [mouse(wheel(MouseEventKind::ScrollDown))]);
    assert_eq!(app.rows.selected, before + 3);
    drive(&mut app, [mouse(wheel(MouseEventKind::ScrollUp))]);
    assert_eq!(app.rows.selected, before);
}

#[test]
fn search_and_step_through_matches() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('/')]);
    assert!(matches!(app.mode, Mode::Search(_)));
    press(&mut app, &text("layers.5.mask"));
    assert_eq!(
        selected_name(&app),
        "model.layers.5.mask",
        "incremental search selects as you type"
    );
    press(&mut app, &[key(KeyCode::Enter)]);
    assert_eq!(app.mode, Mode::Browse);
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("norm.weight"));
    press(&mut app, &[key(KeyCode::Enter)]);
    let first = selected_name(&app);
    assert!(first.ends_with("norm.weight"), "{first}");
    let count = app.matches.len();
    assert_eq!(count, 13, "12 layer norms and the final norm");
    press(&mut app, &[ch('n')]);
    let second = selected_name(&app);
    assert_ne!(first, second);
    press(&mut app, &[ch('N')]);
    assert_eq!(selected_name(&app), first);
    // Esc leaves search without moving.
    press(&mut app, &[ch('/'), ch('x'), key(KeyCode::Esc)]);
    assert_eq!(app.mode, Mode::Browse);
}

#[test]
fn jump_to_tie_partner() {
    let m = mixed_model();
    let mut app = app_for(&m);
    // `t` on a module asks for a tensor…
    press(&mut app, &[ch('t')]);
    assert!(frame(&app, 120, 40).contains("select a tensor"));
    press(&mut app, &[key(KeyCode::Right), ch('j')]);
    assert_eq!(selected_name(&app), "lm_head.weight");
    // The details say what ties them: the fixture's config.json.
    let shown = frame(&app, 120, 40);
    assert!(
        shown.contains("evidence  config"),
        "the tie's evidence is shown:\n{shown}"
    );
    press(&mut app, &[ch('t')]);
    assert_eq!(selected_name(&app), "model.embed_tokens.weight");
    // …and once it jumps, the footer says where it went, not that any more.
    let jumped = frame(&app, 120, 40);
    assert!(!jumped.contains("select a tensor"), "{jumped}");
    assert!(
        jumped.contains("`model.embed_tokens.weight` is tied to `lm_head.weight`"),
        "{jumped}"
    );
    press(&mut app, &[ch('t')]);
    assert_eq!(selected_name(&app), "lm_head.weight");
}

#[test]
fn quit_help_and_ctrl_c() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('?')]);
    assert_eq!(app.mode, Mode::Help);
    press(&mut app, &[key(KeyCode::Esc)]);
    assert_eq!(app.mode, Mode::Browse);
    let mut journey = Journey::start(&mut app);
    journey.press(&mut app, &[ch('q')]);
    assert!(journey.quit());
    let mut app = app_for(&m);
    let mut journey = Journey::start(&mut app);
    journey.press(&mut app, &[ctrl('c')]);
    assert!(journey.quit());
}

#[test]
fn names_with_control_characters_are_drawn_escaped() {
    use devmap::fixtures::{FixtureTensor, write_safetensors};
    let tmp = tempfile::tempdir().expect("tmp");
    let evil = "model.\x1b]0;pwned\x07.\u{202e}w";
    let t = FixtureTensor::patterned(evil, devmap::types::DType::F32, &[2], 1);
    write_safetensors(&tmp.path().join("model.safetensors"), &[&t]).expect("w");
    let ckpt = load(tmp.path(), &LoadOptions::default()).expect("load");
    let mut app = App::new(ckpt);
    resized(&mut app, 120, 40);
    // Open the last module and select the tensor, so the tree and details show it.
    press(&mut app, &[ch('G'), ch('l'), ch('G')]);
    let screen = frame(&app, 120, 40);
    for raw in ['\x1b', '\x07', '\u{202e}'] {
        assert!(!screen.contains(raw), "raw {raw:?} drawn:\n{screen}");
    }
    assert!(screen.contains("\\x1b]0;pwned\\x07"), "{screen}");
    assert!(screen.contains("\\u{202e}w"), "{screen}");
}

#[test]
fn search_counts_its_matches_and_esc_puts_the_tree_back() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let before = app.rows.clone();
    let start = selected_name(&app);
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("norm.weight"));
    // Thirteen norms: twelve layers' and the final one. The first is selected: 1/13.
    assert_eq!(app.match_position(), Some((1, 13)));
    assert!(frame(&app, 120, 40).contains("1/13"));
    // Esc: the selection, scroll and expansion of before the search.
    press(&mut app, &[key(KeyCode::Esc)]);
    assert_eq!(app.rows, before);
    assert_eq!(selected_name(&app), start);
    // Enter keeps the place; n steps and says where it is.
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("norm.weight"));
    press(&mut app, &[key(KeyCode::Enter), ch('n')]);
    assert_eq!(app.match_position(), Some((2, 13)));
    assert!(
        app.message
            .as_ref()
            .is_some_and(|m| m.text == "match 2/13 for `norm.weight`"),
        "{:?}",
        app.message
    );
    // A search that finds nothing: `n` repeats it and says it still finds nothing.
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("no-such-name"));
    press(&mut app, &[key(KeyCode::Enter), ch('n')]);
    assert_eq!(
        app.message.as_ref().map(|m| m.text.as_str()),
        Some("still no name contains `no-such-name`")
    );
}

#[test]
fn search_matches_are_highlighted_in_the_tree() {
    use ratatui::style::Modifier;
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("scale"));
    press(&mut app, &[key(KeyCode::Enter)]);
    let buf = buffer(&app, 120, 40);
    let screen = frame(&app, 120, 40);
    let (y, line) = screen
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(" scale "))
        .expect("the matching row");
    let x = line.find("scale").expect("name") as u16;
    let x = line[..x as usize].chars().count() as u16;
    assert!(
        buf[(x, y as u16)].modifier.contains(Modifier::UNDERLINED),
        "the match is underlined (visible without colour)"
    );
    let (y2, line2) = screen
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(" norm "))
        .expect("another row");
    let x2 = line2[..line2.find("norm").expect("n")].chars().count() as u16;
    assert!(!buf[(x2, y2 as u16)].modifier.contains(Modifier::UNDERLINED));
}

#[test]
fn a_click_selects_a_row_and_a_second_click_opens_it() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let row_of = |app: &App, name: &str| -> u16 {
        frame(app, 120, 40)
            .lines()
            .position(|l| l.contains(&format!("▸ {name} ")) || l.contains(&format!("▾ {name} ")))
            .expect("row on screen") as u16
    };
    let click = |app: &mut App, row: u16| {
        drive(
            app,
            [mouse(MouseEvent {
                kind: MouseEventKind::Down(ratatui::crossterm::event::MouseButton::Left),
                column: 6,
                row,
                modifiers: KeyModifiers::NONE,
            })],
        );
    };
    let y = row_of(&app, "layers");
    click(&mut app, y);
    let selected = app.selected().map(|id| app.tree.full_name(id));
    assert_eq!(selected.as_deref(), Some("model.layers"));
    assert!(
        frame(&app, 120, 40).contains("▸ layers"),
        "one click only selects"
    );
    click(&mut app, y);
    assert!(
        frame(&app, 120, 40).contains("▾ layers"),
        "a second click opens it"
    );
    click(&mut app, y);
    assert!(
        frame(&app, 120, 40).contains("▸ layers"),
        "and a third closes it"
    );
    // Clicks outside the tree's rows change nothing.
    let before = app.rows.selected;
    click(&mut app, 0);
    click(&mut app, 39);
    assert_eq!(app.rows.selected, before);
}

#[test]
fn text_fields_edit_at_the_cursor() {
    let m = mixed_model();
    let mut app = app_for(&m);
    press(&mut app, &[ch('s'), key(KeyCode::Tab), ctrl('u')]);
    press(&mut app, &text("/data/models/out"));
    // ← twice, then type: the character goes before "ut".
    press(&mut app, &[key(KeyCode::Left), key(KeyCode::Left), ch('X')]);
    let out = |app: &App| match &app.mode {
        Mode::SaveDialog(d) => d.out.clone(),
        _ => panic!("dialog"),
    };
    assert_eq!(out(&app), "/data/models/oXut");
    assert!(
        frame(&app, 120, 40).contains("/data/models/oX▏ut"),
        "the cursor shows where it is"
    );
    // Home, then type at the start; End, then Backspace at the end.
    press(
        &mut app,
        &[
            key(KeyCode::Home),
            ch('.'),
            key(KeyCode::End),
            key(KeyCode::Backspace),
        ],
    );
    assert_eq!(out(&app), "./data/models/oXu");
    // Ctrl-W deletes the last path part, then the one before with its slash.
    press(&mut app, &[ctrl('w')]);
    assert_eq!(out(&app), "./data/models/");
    press(&mut app, &[ctrl('w')]);
    assert_eq!(out(&app), "./data/");
    // Ctrl-U deletes to the start from the cursor.
    press(&mut app, &[key(KeyCode::Left), ctrl('u')]);
    assert_eq!(out(&app), "/");
    // In the size field ←/→ still step the presets.
    press(&mut app, &[key(KeyCode::BackTab)]);
    let size = |app: &App| match &app.mode {
        Mode::SaveDialog(d) => d.size.clone(),
        _ => panic!("dialog"),
    };
    assert_eq!(size(&app), "50GB");
    press(&mut app, &[key(KeyCode::Left)]);
    assert_eq!(size(&app), "20GB");
    // The export dialog's path edits the same way, its cursor starting at the end.
    press(&mut app, &[key(KeyCode::Esc), ch('w'), ctrl('u')]);
    press(&mut app, &text("map.json"));
    press(
        &mut app,
        &[key(KeyCode::Home), ch('x'), key(KeyCode::Right), ch('y')],
    );
    let Mode::Export(d) = &app.mode else {
        panic!("export")
    };
    assert_eq!(d.path, "xmyap.json");
}

#[test]
fn tab_focuses_details_and_devices_which_then_scroll() {
    let m = mixed_model();
    let mut app = ten_devices(&m);
    resized(&mut app, 80, 24);
    // A tensor with a long Details text: the embedding (tied, with its source).
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("embed_tokens.weight"));
    press(&mut app, &[key(KeyCode::Enter)]);
    let selected = app.selected();
    let details_top = |app: &App| {
        frame(app, 80, 24)
            .lines()
            .nth(2)
            .map(|l| l.chars().skip(50).collect::<String>())
            .unwrap_or_default()
    };
    let before = details_top(&app);
    press(&mut app, &[key(KeyCode::Tab)]);
    assert!(
        frame(&app, 80, 24).contains("Details · ↑↓ scroll"),
        "the focus shows"
    );
    press(&mut app, &[key(KeyCode::Down), key(KeyCode::Down)]);
    assert_ne!(details_top(&app), before, "Details scrolled");
    assert_eq!(app.selected(), selected, "the tree selection did not move");
    // Devices: ten rows in a panel of fewer; scrolling shows the later ones.
    press(&mut app, &[key(KeyCode::Tab)]);
    let screen = frame(&app, 80, 24);
    assert!(
        screen.contains("▶ Devices · ≤ free · ↑↓ scroll"),
        "{screen}"
    );
    // The focused panel's border is thick.
    let gpu7 = |screen: &str| screen.contains("│gpu:7 ") || screen.contains("┃gpu:7 ");
    assert!(!gpu7(&screen), "{screen}");
    press(
        &mut app,
        &[
            key(KeyCode::Down),
            key(KeyCode::Down),
            key(KeyCode::Down),
            key(KeyCode::Down),
        ],
    );
    let screen = frame(&app, 80, 24);
    assert!(gpu7(&screen), "scrolled to the later devices:\n{screen}");
    // Back to the tree: ↓ moves the selection again.
    press(&mut app, &[key(KeyCode::Tab), key(KeyCode::Down)]);
    assert_ne!(app.selected(), selected);
}

#[test]
fn the_wheel_scrolls_the_panel_under_the_pointer() {
    let m = mixed_model();
    let mut app = ten_devices(&m);
    resized(&mut app, 80, 24);
    let areas = devmap::tui::layout::areas(
        ratatui::layout::Rect::new(0, 0, 80, 24),
        app.progress_rows(),
        app.device_rows(),
    );
    let wheel = |app: &mut App, column: u16, row: u16| {
        drive(
            app,
            [mouse(MouseEvent {
                kind: MouseEventKind::ScrollDown,
                column,
                row,
                modifiers: KeyModifiers::NONE,
            })],
        );
    };
    let selected = app.rows.selected;
    wheel(&mut app, areas.devices.x + 3, areas.devices.y + 2);
    assert_eq!(app.devices_scroll, 3, "the Devices panel scrolled");
    assert_eq!(app.rows.selected, selected, "not the tree");
    wheel(&mut app, areas.details.x + 3, areas.details.y + 2);
    assert_eq!(app.details_scroll, 3);
    wheel(&mut app, areas.tree.x + 3, areas.tree.y + 3);
    assert_eq!(
        app.rows.selected,
        selected + 3,
        "over the tree, the selection moves"
    );
}

#[test]
fn tab_completes_paths_then_moves_on() {
    let m = mixed_model();
    let base = m.out("places");
    std::fs::create_dir_all(base.join("alpha_dir")).expect("mkdir");
    std::fs::create_dir_all(base.join("beta")).expect("mkdir");
    std::fs::write(base.join("alpine.txt"), "x").expect("file");
    std::fs::write(base.join(".hidden"), "x").expect("file");
    let mut app = app_for(&m);
    press(&mut app, &[ch('s'), key(KeyCode::Tab), ctrl('u')]);
    let typed = format!("{}/al", base.display());
    press(&mut app, &text(&typed));
    let out = |app: &App| match &app.mode {
        Mode::SaveDialog(d) => (d.out.clone(), d.field),
        _ => panic!("dialog"),
    };
    press(&mut app, &[key(KeyCode::Tab)]);
    assert_eq!(
        out(&app),
        (format!("{}/alp", base.display()), Field::Output),
        "as far as they agree"
    );
    // Tab again on an ambiguous prefix: the candidates are named, and the keys after
    // it still land in this field.
    press(&mut app, &[key(KeyCode::Tab)]);
    assert_eq!(
        out(&app),
        (format!("{}/alp", base.display()), Field::Output)
    );
    let said = app
        .message
        .as_ref()
        .map(|m| m.text.clone())
        .unwrap_or_default();
    assert_eq!(said, "Tab: alpha_dir/  alpine.txt");
    // …on the screen, while the dialog is open (it once showed only after it closed).
    let screen = frame(&app, 120, 40);
    assert!(
        screen
            .lines()
            .last()
            .unwrap_or_default()
            .contains("Tab: alpha_dir/  alpine.txt"),
        "{screen}"
    );
    // Shift-Tab goes back a field, and Tab forward again.
    press(&mut app, &[key(KeyCode::BackTab)]);
    assert_eq!(out(&app).1, Field::ShardSize);
    press(&mut app, &[key(KeyCode::Tab)]);
    assert_eq!(out(&app).1, Field::Output);
    press(&mut app, &[ch('h'), key(KeyCode::Tab)]);
    assert_eq!(
        out(&app).0,
        format!("{}/alpha_dir/", base.display()),
        "one folder: with its slash"
    );
    // Nothing left to complete: Tab moves to the next field.
    press(&mut app, &[key(KeyCode::Tab)]);
    assert_eq!(out(&app).1, Field::Dtype);
    // The export path completes too; hidden entries only for a prefix with a dot.
    press(&mut app, &[key(KeyCode::Esc), ch('w'), ctrl('u')]);
    press(&mut app, &text(&format!("{}/b", base.display())));
    press(&mut app, &[key(KeyCode::Tab)]);
    let Mode::Export(d) = &app.mode else {
        panic!("export")
    };
    assert_eq!(d.path, format!("{}/beta/", base.display()));
    press(&mut app, &[ctrl('u')]);
    press(&mut app, &text(&format!("{}/.h", base.display())));
    press(&mut app, &[key(KeyCode::Tab)]);
    let Mode::Export(d) = &app.mode else {
        panic!("export")
    };
    assert_eq!(d.path, format!("{}/.hidden", base.display()));
}

/// A message takes the key bar's place for a few seconds of the App's clock, then
/// goes, and the key bar comes back, with no key pressed (issue 40).
#[test]
fn a_message_goes_after_a_few_seconds_and_the_key_bar_returns() {
    let m = mixed_model();
    let mut app = app_for(&m);
    let mut journey = Journey::start(&mut app);
    let said = journey.press(&mut app, &[ch('u')]);
    assert!(said.contains("nothing to undo"), "{said}");
    assert!(
        !said.contains("q quit"),
        "the message stands where the keys were"
    );
    let later = journey.steps(
        &mut app,
        [Step::Wait(
            devmap::tui::app::Message::LASTS + Duration::from_millis(100),
        )],
    );
    assert!(app.message.is_none());
    assert!(
        later.contains("q quit") && !later.contains("nothing to undo"),
        "{later}"
    );
    journey.end(&app);
}

/// `z` gives the focused panel the screen and takes it back; `+` opens every module
/// and `-` goes back to the top level, the selection kept (or moved to its top-level
/// module).
#[test]
fn zoom_and_expand_or_collapse_everything() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    resized(&mut app, 100, 30);
    let before = frame(&app, 100, 30);
    assert!(before.contains("Details") && before.contains("Devices"));
    press(&mut app, &[ch('z')]);
    let zoomed = frame(&app, 100, 30);
    assert!(
        !zoomed.contains("Details") && !zoomed.contains("Devices") && !zoomed.contains("Memory"),
        "{zoomed}"
    );
    // The tree has the rows the other panels had: more of it shows.
    let rows = |s: &str| s.lines().filter(|l| l.starts_with('┃')).count();
    assert!(rows(&zoomed) > rows(&before) + 5, "{zoomed}");
    press(&mut app, &[ch('z'), key(KeyCode::Tab), ch('z')]);
    let details = frame(&app, 100, 30);
    assert!(
        details.contains("▶ Details") && !details.contains("Modules"),
        "{details}"
    );
    press(&mut app, &[ch('z'), key(KeyCode::BackTab)]);
    // + opens everything: every tensor is a row.
    let shown_before = app.rows.visible().len();
    press(&mut app, &[ch('+')]);
    let tensors = app.ckpt.tensors().len();
    assert!(
        app.rows.visible().len() >= tensors,
        "{}",
        app.rows.visible().len()
    );
    assert!(app.rows.visible().len() > shown_before);
    // Deep in the tree, - closes everything and selects the top-level module.
    press(&mut app, &[ch('/')]);
    press(&mut app, &text("layers.3.proj"));
    press(&mut app, &[key(KeyCode::Enter), ch('-')]);
    assert_eq!(selected_name(&app), "model");
    assert!(app.rows.visible().len() < shown_before + 1);
}

/// The names of the tensors whose rows show.
fn shown_tensors(app: &App) -> Vec<String> {
    app.rows
        .visible()
        .iter()
        .filter_map(|&id| app.tree.nodes[id].tensor())
        .map(|t| app.ckpt.tensors()[t].name.to_string())
        .collect()
}

/// `f` filters the tree as it is typed: only the tensors that match show, with the
/// modules that hold them; words combine (name text, `dev:`, `dtype:`, `src:`, `tied`);
/// Enter keeps the filter (the header says so), a map edit re-applies it, Esc clears
/// it.
#[test]
fn filter_mode_hides_what_does_not_match() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    let all = app.rows.visible().len();
    press(&mut app, &[ch('f')]);
    press(&mut app, &text("dev:disk"));
    assert!(matches!(app.mode, Mode::Filter(_)));
    let disk = shown_tensors(&app);
    assert!(!disk.is_empty());
    for (t, tensor) in app.ckpt.tensors().iter().enumerate() {
        let shown = disk.iter().any(|n| **n == *tensor.name);
        assert_eq!(
            shown,
            tensor.placement == Placement::Disk,
            "{} ({}), node {}",
            tensor.name,
            tensor.placement,
            app.tree.node_of(t)
        );
    }
    // A second word narrows it: the layer of the first tensor on disk.
    let layer = disk
        .iter()
        .find_map(|n| {
            let at = n.find("layers.")?;
            let rest = &n[at + 7..];
            Some(format!("layers.{}.", &rest[..rest.find('.')?]))
        })
        .expect("a layer on disk");
    press(&mut app, &text(&format!(" {layer}")));
    let narrowed = shown_tensors(&app);
    assert!(
        !narrowed.is_empty() && narrowed.len() < disk.len(),
        "{narrowed:?}"
    );
    assert!(narrowed.iter().all(|n| n.contains(&layer)), "{narrowed:?}");
    press(&mut app, &[key(KeyCode::Enter)]);
    assert_eq!(app.mode, Mode::Browse);
    let screen = frame(&app, 120, 40);
    assert!(
        screen.contains(&format!("[filter: dev:disk {layer}]")),
        "{screen}"
    );
    // The filter stays through a map edit and follows it: the layer moved off disk
    // leaves nothing on disk under that name.
    press(&mut app, &[ch('g')]);
    let module = format!("model.{}", layer.trim_end_matches('.'));
    while selected_name(&app) != module {
        press(&mut app, &[ch('j')]);
    }
    press(&mut app, &[ch('D')]);
    assert!(
        app.rows
            .visible()
            .iter()
            .filter_map(|&id| app.tree.nodes[id].tensor())
            .all(|t| app.ckpt.tensors()[t].placement == Placement::Disk),
        "the filter follows the edited map"
    );
    // Esc clears it: the tree as its open modules say (undo opened the one it names).
    press(&mut app, &[ch('u'), key(KeyCode::Esc)]);
    assert!(app.filter.is_none() && !app.rows.filtered());
    assert!(app.rows.visible().len() >= all);
    assert!(frame(&app, 120, 40).contains("filter cleared"));
    // Words that match nothing: no row, and the message says so.
    press(&mut app, &[ch('f')]);
    press(&mut app, &text("dtype:f64"));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(app.rows.visible().is_empty());
    assert!(frame(&app, 120, 40).contains("0 rows"));
}

/// `o` lists siblings largest first, then by params, by name (layers by number), and
/// back in module order; the selection stays on its node, and the header says the
/// order. Works with a filter in place.
#[test]
fn sort_orders_siblings_and_keeps_the_selection() {
    let m = mixed_model();
    let mut app = app_for(&m);
    app.color = false;
    let top = |app: &App| -> Vec<String> {
        app.rows
            .visible()
            .iter()
            .filter(|&&id| app.tree.nodes[id].depth == 1)
            .map(|&id| app.tree.nodes[id].name.to_string())
            .collect()
    };
    let module_order = top(&app);
    press(&mut app, &[ch('j')]);
    let selected = selected_name(&app);
    press(&mut app, &[ch('o')]);
    assert_eq!(app.rows.sort(), devmap::tui::rows::Sort::Size);
    assert_eq!(
        selected_name(&app),
        selected,
        "the selection stays on its node"
    );
    let sizes: Vec<u64> = app
        .rows
        .visible()
        .iter()
        .filter(|&&id| app.tree.nodes[id].depth == 2)
        .map(|&id| app.tree.nodes[id].bytes())
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    assert!(frame(&app, 120, 40).contains("[by size]"));
    // By name: layers numerically (2 before 10), once they are open.
    press(&mut app, &[ch('o'), ch('o'), ch('+')]);
    assert_eq!(app.rows.sort(), devmap::tui::rows::Sort::Name);
    let layers: Vec<u64> = app
        .rows
        .visible()
        .iter()
        .filter(|&&id| {
            let n = &app.tree.nodes[id];
            n.depth == 3
                && n.parent()
                    .is_some_and(|p| &*app.tree.nodes[p].name == "layers")
        })
        .filter_map(|&id| app.tree.nodes[id].name.parse().ok())
        .collect();
    assert!(
        layers.len() > 10 && layers.windows(2).all(|w| w[0] < w[1]),
        "{layers:?}"
    );
    // A filter with a sort: still sorted, still filtered.
    press(&mut app, &[ch('f')]);
    press(&mut app, &text("dev:cpu"));
    press(&mut app, &[key(KeyCode::Enter)]);
    assert!(
        app.rows
            .visible()
            .iter()
            .filter_map(|&id| app.tree.nodes[id].tensor())
            .all(|t| app.ckpt.tensors()[t].placement == Placement::Cpu)
    );
    press(&mut app, &[key(KeyCode::Esc), ch('o'), ch('-')]);
    assert_eq!(app.rows.sort(), devmap::tui::rows::Sort::Module);
    assert_eq!(top(&app), module_order);
}
