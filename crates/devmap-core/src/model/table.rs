//! The generated per-architecture tables (`arch_table.txt`, `expect_table.txt`,
//! `buffer_table.txt`): a header
//! of `#` lines, then blocks each opened by `= ARCH [ARCH...]`. Blocks are parsed when
//! first looked up (a process needs one or two of hundreds) and kept for the process.

use std::collections::HashMap;
use std::sync::Mutex;

/// A table's index: which block each architecture is in.
pub struct Blocks {
    /// Each block's text (its lines after the `= …` line).
    pub bodies: Vec<&'static str>,
    pub by_name: HashMap<&'static str, usize>,
    /// The transformers version the table came from (its first line, up to `:`).
    pub source: &'static str,
}

pub fn index(text: &'static str) -> Blocks {
    let source = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# "))
        .and_then(|l| l.split(':').next())
        .unwrap_or("transformers");
    let mut blocks = Vec::new();
    let mut by_name = HashMap::new();
    // Split at every line that opens a block; the first piece is the header.
    for piece in text.split("\n= ").skip(1) {
        let (names, body) = piece.split_once('\n').unwrap_or((piece, ""));
        for name in names.split(' ') {
            by_name.insert(name, blocks.len());
        }
        blocks.push(body);
    }
    Blocks {
        bodies: blocks,
        by_name,
        source,
    }
}

impl Blocks {
    /// The block of the first of `architectures` (config.json's list) the table has.
    pub fn find(&self, architectures: &[String]) -> Option<usize> {
        architectures
            .iter()
            .find_map(|a| self.by_name.get(a.as_str()).copied())
    }
}

/// Blocks already parsed, each kept for the process (a handful at most).
pub struct Parsed<T: 'static>(Mutex<Vec<(usize, &'static T)>>);

impl<T> Parsed<T> {
    pub const fn new() -> Parsed<T> {
        Parsed(Mutex::new(Vec::new()))
    }

    /// Block `block` parsed by `parse`, once.
    pub fn get(&self, block: usize, parse: impl FnOnce() -> T) -> &'static T {
        let mut parsed = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(&(_, value)) = parsed.iter().find(|(b, _)| *b == block) {
            return value;
        }
        let value: &'static T = Box::leak(Box::new(parse()));
        parsed.push((block, value));
        value
    }
}
