//! Where everything goes on a screen of a given size. Pure geometry, shared by the
//! App (which needs to know how many tree rows a page holds) and the views.

use ratatui::layout::{Constraint, Direction, Layout, Rect};

/// Below this the screen shows a message instead of a squeezed layout.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 16;

/// Where everything goes on a screen of a given size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Areas {
    pub title: Rect,
    pub tree: Rect,
    pub details: Rect,
    pub progress: Option<Rect>,
    pub devices: Rect,
    pub memory: Rect,
    pub status: Rect,
    /// Tree rows that fit (inside the border, below the header).
    pub tree_rows: usize,
}

/// The panel that takes the screen between the title and the status line (`z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zoomed {
    Tree,
    Details,
    Devices,
}

/// Below this width the Memory panel gives its place to Devices (its gauges need
/// more room than is left to be read).
pub const MEMORY_MIN_WIDTH: u16 = 72;

/// Where everything goes. `progress_rows` is how many lines the save panel would like
/// (one per shard and its headings; 0: no save panel), `device_rows` how many the
/// Devices panel would: each grows to hold them, the save panel up to a quarter of the
/// screen and the bottom row up to a third.
pub fn areas(area: Rect, progress_rows: usize, device_rows: usize) -> Areas {
    areas_zoomed(area, progress_rows, device_rows, None)
}

/// [`areas`] with one panel zoomed: it takes the tree's and the bottom row's room,
/// the others none (the save panel, when shown, stays).
pub fn areas_zoomed(
    area: Rect,
    progress_rows: usize,
    device_rows: usize,
    zoomed: Option<Zoomed>,
) -> Areas {
    let mut a = layout(area, progress_rows, device_rows);
    let Some(zoomed) = zoomed else {
        return a;
    };
    let body = a.tree.union(a.details).union(a.devices).union(a.memory);
    let body = match a.progress {
        // The save panel sits between the tree and the bottom row: the zoomed panel
        // takes the room above it and below it is left to the bottom row's height.
        Some(p) => Rect::new(body.x, body.y, body.width, p.y.saturating_sub(body.y)),
        None => body,
    };
    let (tree, details, devices) = match zoomed {
        Zoomed::Tree => (body, Rect::default(), Rect::default()),
        Zoomed::Details => (Rect::default(), body, Rect::default()),
        Zoomed::Devices => (Rect::default(), Rect::default(), body),
    };
    a.tree = tree;
    a.details = details;
    a.devices = devices;
    a.memory = Rect::default();
    a.tree_rows = tree.height.saturating_sub(3) as usize;
    a
}

fn layout(area: Rect, progress_rows: usize, device_rows: usize) -> Areas {
    let with_progress = progress_rows > 0;
    let base = if area.height >= 30 { 8 } else { 6 };
    let wanted = u16::try_from(device_rows + 2).unwrap_or(u16::MAX);
    let bottom = wanted.clamp(base, (area.height / 3).max(base));
    let progress = if with_progress {
        u16::try_from(progress_rows + 2)
            .unwrap_or(u16::MAX)
            .clamp(6, (area.height / 4).max(6))
    } else {
        0
    };
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(1),
            Constraint::Min(5),
            Constraint::Length(progress),
            Constraint::Length(bottom),
            Constraint::Length(1),
        ])
        .split(area);
    let middle = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(62), Constraint::Percentage(38)])
        .split(rows[1]);
    let memory_share = if area.width < MEMORY_MIN_WIDTH { 0 } else { 45 };
    let lower = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([
            Constraint::Percentage(100 - memory_share),
            Constraint::Percentage(memory_share),
        ])
        .split(rows[3]);
    Areas {
        title: rows[0],
        tree: middle[0],
        details: middle[1],
        progress: with_progress.then_some(rows[2]),
        devices: lower[0],
        memory: lower[1],
        status: rows[4],
        tree_rows: middle[0].height.saturating_sub(3) as usize,
    }
}
