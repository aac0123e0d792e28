//! Untrusted text on its way to a terminal. Tensor names, device-map keys and file
//! names come from files anyone can write; a name holding `ESC ] 0 ;` can retitle the
//! terminal, one holding a newline can forge an `error:` line, a bidi override can
//! reorder what is read. Every such name shown to a person goes through [`escaped`].

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` must not reach a terminal raw: C0 and C1 controls, DEL, and the
/// Unicode bidirectional formatting characters.
fn is_dangerous(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with every dangerous character written as an escape (`\n`, `\t`, `\x1b`,
/// `\u{202e}`); a backslash stays a backslash. Borrowed when nothing needs escaping,
/// which is every real name.
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_dangerous) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_dangerous(c) && (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_dangerous(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A path for a message: its lossy text, escaped.
pub fn path(p: &std::path::Path) -> String {
    escaped(&p.to_string_lossy()).into_owned()
}

/// `1 tensor`, `2 tensors`: a count with its noun, singular or plural (`plural` for
/// nouns that do not just add an `s`: `entry`/`entries`).
pub fn count<N: std::fmt::Display + PartialEq + From<u8>>(
    n: N,
    singular: &str,
    plural: &str,
) -> String {
    if n == N::from(1) {
        format!("1 {singular}")
    } else {
        format!("{n} {plural}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_are_escaped_and_the_rest_kept() {
        assert!(matches!(escaped("model.layers.0.weight"), Cow::Borrowed(_)));
        assert_eq!(escaped("héllo/名前"), "héllo/名前");
        assert_eq!(escaped("a\x1b]0;pwned\x07b"), "a\\x1b]0;pwned\\x07b");
        assert_eq!(escaped("x\nerror: fake"), "x\\nerror: fake");
        assert_eq!(escaped("\u{202e}txt.exe"), "\\u{202e}txt.exe");
        assert_eq!(escaped("\u{9b}31m"), "\\x9b31m");
        assert_eq!(escaped("tab\there\r"), "tab\\there\\r");
    }
}

/// Why `path` cannot be read as a folder, in words: it is not there, or it is a file
/// (and then the folder that holds it).
pub fn not_a_folder(path: &std::path::Path) -> String {
    match std::fs::metadata(path) {
        Err(_) => format!("no such folder: {}", self::path(path)),
        Ok(_) => format!(
            "{} is a file, not a folder{}",
            self::path(path),
            path.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map(|p| format!(" (the folder that holds it: {})", self::path(p)))
                .unwrap_or_default()
        ),
    }
}

/// Levenshtein distance between two short words (a mistyped subcommand or folder), in
/// characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod edit_distance_tests {
    use super::edit_distance;

    #[test]
    fn counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("inspct", "inspect"), 1);
        assert_eq!(edit_distance("sav", "save"), 1);
        assert_eq!(edit_distance("verfiy", "verify"), 2);
        assert_eq!(edit_distance("", "plan"), 4);
        assert_eq!(edit_distance("plan", "plan"), 0);
    }
}
