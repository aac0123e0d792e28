//! `devmap inspect`: the same picture as the TUI, as plain text or stable JSON.

mod json;
mod text;

pub use json::{to_json, to_json_string, write_json};
pub use text::{TextOptions, to_text};

/// Parameter counts as people say them: `1.24B`, `350M`, `12.5K`, `900`.
pub fn human_count(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1_000_000_000_000, "T"),
        (1_000_000_000, "B"),
        (1_000_000, "M"),
        (1_000, "K"),
    ];
    for (scale, unit) in UNITS {
        if n >= scale {
            let v = n as f64 / scale as f64;
            return if v >= 100.0 {
                format!("{v:.0}{unit}")
            } else if v >= 10.0 {
                format!("{v:.1}{unit}")
            } else {
                format!("{v:.2}{unit}")
            };
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::human_count;

    #[test]
    fn counts() {
        assert_eq!(human_count(999), "999");
        assert_eq!(human_count(1_240_000_000), "1.24B");
        assert_eq!(human_count(350_000_000), "350M");
        assert_eq!(human_count(12_500), "12.5K");
    }
}
