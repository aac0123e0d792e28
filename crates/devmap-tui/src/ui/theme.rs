//! Colours, in one place. With `NO_COLOR` every style is plain; selection still shows
//! through reversed video, which is not colour.

use ratatui::style::{Color, Modifier, Style};

use devmap_core::types::placement::Placement;

#[derive(Debug, Clone, Copy)]
pub struct Theme {
    pub color: bool,
}

impl Theme {
    fn pick(self, style: Style) -> Style {
        if self.color { style } else { Style::default() }
    }

    pub fn device(self, p: Placement) -> Style {
        self.pick(Style::default().fg(device_color(p)))
    }

    pub fn mixed(self) -> Style {
        self.pick(Style::default().fg(Color::LightBlue))
    }

    pub fn dim(self) -> Style {
        self.pick(Style::default().fg(Color::DarkGray))
    }

    pub fn title(self) -> Style {
        Style::default().add_modifier(Modifier::BOLD)
    }

    pub fn selected(self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED)
    }

    /// A row whose name matches the search: underlined and bold, so it shows without
    /// colour too.
    pub fn matched(self) -> Style {
        let style = Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
        if self.color {
            style.fg(Color::Yellow)
        } else {
            style
        }
    }

    pub fn good(self) -> Style {
        self.pick(Style::default().fg(Color::Green))
    }

    pub fn bad(self) -> Style {
        self.pick(Style::default().fg(Color::Red))
    }

    pub fn warn(self) -> Style {
        self.pick(Style::default().fg(Color::Yellow))
    }

    pub fn tie(self) -> Style {
        self.pick(Style::default().fg(Color::LightMagenta))
    }

    pub fn gauge(self) -> Style {
        self.pick(Style::default().fg(Color::Cyan))
    }
}

fn device_color(p: Placement) -> Color {
    match p {
        Placement::Gpu(i) => [
            Color::Green,
            Color::LightGreen,
            Color::Cyan,
            Color::LightCyan,
        ][i as usize % 4],
        Placement::Mps => Color::Green,
        Placement::Cpu => Color::Yellow,
        Placement::Disk => Color::Magenta,
        Placement::Meta => Color::DarkGray,
        Placement::Unmapped => Color::Red,
    }
}
