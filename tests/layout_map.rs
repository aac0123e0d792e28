//! CONTRIBUTING's layout map names every source file, and no file that is gone: a
//! module added or renamed without a word in the map fails here (the map once omitted
//! seven readers and kernels a newcomer had to find by grep); and no source file is
//! over 600 lines.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every crate's source folder: this package's (the command line) and the library's
/// two crates.
fn source_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    ["src", "crates/devmap-core/src", "crates/devmap-tui/src"]
        .iter()
        .map(|d| root.join(d))
        .collect()
}

fn rust_files(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("src").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.insert(entry.file_name().to_string_lossy().into_owned());
        }
    }
}

#[test]
fn the_layout_map_names_every_source_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("CONTRIBUTING.md")).expect("CONTRIBUTING");
    let start = text.find("## Layout").expect("a Layout section");
    let section = &text[start..];
    let section = match section[3..].find("\n## ") {
        Some(end) => &section[..end + 3],
        None => section,
    };
    let mut files = BTreeSet::new();
    for dir in source_dirs() {
        rust_files(&dir, &mut files);
    }
    // The crate roots and module files are named by their folders.
    let unnamed: Vec<&String> = files
        .iter()
        .filter(|f| !matches!(f.as_str(), "lib.rs" | "main.rs" | "mod.rs"))
        .filter(|f| {
            !section
                .match_indices(f.as_str())
                .any(|(at, _)| at == 0 || !is_name_char(section.as_bytes()[at - 1]))
        })
        .collect();
    assert!(
        unnamed.is_empty(),
        "CONTRIBUTING's layout map does not name {unnamed:?}: say in a few words what each holds"
    );
    // Every `name.rs` the map names is a file (src/, or the Python binding's lib.rs).
    let named: BTreeSet<&str> = section
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .filter(|w| w.len() > 3 && Path::new(w).extension().is_some_and(|e| e == "rs"))
        .map(|w| w.trim_start_matches('.'))
        .collect();
    let gone: Vec<&&str> = named
        .iter()
        .filter(|n| !files.contains(**n) && **n != "lib.rs" && !n.starts_with("layout_map"))
        .filter(|n| !root.join("tests").join(n).exists())
        .collect();
    assert!(
        gone.is_empty(),
        "the layout map names files that are gone: {gone:?}"
    );
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// No source file outgrows one screen of thought: over 600 lines, it is split (its
/// tests into `tests.rs` beside it, its parts into modules), as CONTRIBUTING asks.
#[test]
fn no_source_file_is_over_600_lines() {
    fn walk(dir: &Path, long: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, long);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let lines = std::fs::read_to_string(&path)
                    .expect("source")
                    .lines()
                    .count();
                if lines > 600 {
                    long.push(format!("{} ({lines} lines)", path.display()));
                }
            }
        }
    }
    let mut long = Vec::new();
    for dir in source_dirs() {
        walk(&dir, &mut long);
    }
    assert!(long.is_empty(), "split these: {long:?}");
}

/// Platform code stays behind devmap-core's `crates/devmap-core/src/sys/`: no other source file calls libc or rustix,
/// or reads a `/proc` file by its path (a doc comment may name one).
#[test]
fn platform_code_is_only_in_sys() {
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "sys") {
                    walk(&path, found);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source");
                for (n, line) in text.lines().enumerate() {
                    let code = line.trim_start();
                    if code.starts_with("//") {
                        continue;
                    }
                    if ["libc::", "rustix::", "\"/proc"]
                        .iter()
                        .any(|p| code.contains(p))
                    {
                        found.push(format!("{}:{}: {code}", path.display(), n + 1));
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    for dir in source_dirs() {
        walk(&dir, &mut found);
    }
    assert!(
        found.is_empty(),
        "platform code outside crates/devmap-core/src/sys/ (move it there, with its fallback):\n{}",
        found.join("\n")
    );
}
