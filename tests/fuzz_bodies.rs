//! The fuzz targets at every CI run, on stable Rust: each target's body
//! (`devmap::fixtures::fuzz`) over its seeds in fuzz/seeds (where a crash found by
//! hand is added) and a few thousand seeded mutations of them. A panic names the
//! target, the mutation's seed and the file the failing input was written to.
//! `cargo fuzz` runs the same bodies for longer (scripts/fuzz.sh, nightly).

use std::path::{Path, PathBuf};

use devmap::fixtures::fuzz::{Mutator, TARGETS, clear_scratch};

/// Mutations per target: what fits CI's time with room (each body reads a few KB;
/// those that write files take ~0.1 ms more an input).
const MUTATIONS: usize = 10_000;

/// The seeds of `target`, by file name: inputs that read, and `crash-*` files, inputs
/// that once made a reader panic (kept so the fix stays; they may be refused).
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name.unwrap_or_default(), bytes)
        })
        .collect()
}

/// Runs `body` on `input`: whether the reader accepted it; a panic is turned into one
/// naming the input's file.
fn run(target: &str, body: fn(&[u8]) -> bool, input: &[u8], what: &str) -> bool {
    let outcome = std::panic::catch_unwind(|| body(input));
    let Ok(accepted) = outcome else {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
        let _ = std::fs::create_dir_all(&dir);
        let file = dir.join(format!("{target}-{:016x}.bin", xxhash_like(input)));
        let _ = std::fs::write(&file, input);
        panic!(
            "fuzz target {target} panicked on {what}; the input is in {} (add it to fuzz/seeds/{target} once fixed)",
            file.display()
        );
    };
    accepted
}

/// A stable name for an input (FNV-1a).
fn xxhash_like(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Runs target `target`. `reads`: its seeds read, and so must some mutations (the
/// offload index's do not: its `.dat` files are not there, so only its refusals and
/// its parser are exercised).
fn fuzz(target: &str, reads: bool) {
    let body = TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, body)| *body)
        .expect("a target");
    let named = seeds(target);
    assert!(!named.is_empty(), "fuzz/seeds/{target} has no seed");
    for (name, seed) in &named {
        let read = run(target, body, seed, &format!("seed {name}"));
        assert!(
            read || !reads || name.starts_with("crash-"),
            "{target}: seed {name} is refused; a seed should read"
        );
    }
    let seeds: Vec<Vec<u8>> = named.into_iter().map(|(_, bytes)| bytes).collect();
    let mut mutator = Mutator::new(0x5eed ^ target.len() as u64);
    let mut last = seeds[0].clone();
    let mut accepted = 0;
    for n in 0..MUTATIONS {
        // Mostly fresh mutations of a seed; every fourth builds on the last input, so
        // a few edits pile up.
        let base = if n % 4 == 3 {
            last.clone()
        } else {
            seeds[n % seeds.len()].clone()
        };
        let input = mutator.mutate(&base, &seeds);
        accepted += usize::from(run(target, body, &input, &format!("mutation {n}")));
        last = input;
    }
    clear_scratch();
    // Mutations that never get past the first check would test only that: some must
    // read, and be checked, and most must be refused.
    eprintln!("{target}: {accepted} of {MUTATIONS} mutations read");
    assert!(
        (accepted > 0 || !reads) && accepted < MUTATIONS / 2,
        "{target}: {accepted} of {MUTATIONS} mutations read: the mutator does not reach both sides"
    );
}

#[test]
fn every_target_has_a_test_below() {
    let source = include_str!("fuzz_bodies.rs");
    for (name, _) in TARGETS {
        assert!(
            source.contains(&format!("fn {name}()")),
            "fuzz target {name} has no test in tests/fuzz_bodies.rs"
        );
    }
}

#[test]
fn safetensors_header() {
    fuzz("safetensors_header", true);
}

#[test]
fn offload_index() {
    fuzz("offload_index", false);
}

#[test]
fn device_map() {
    fuzz("device_map", true);
}

#[test]
fn torch_bin() {
    fuzz("torch_bin", true);
}

#[test]
fn dcp_metadata() {
    fuzz("dcp_metadata", true);
}

#[test]
fn zip_members() {
    fuzz("zip_members", true);
}

#[test]
fn rank_files() {
    fuzz("rank_files", true);
}

#[test]
fn deepspeed_states() {
    fuzz("deepspeed_states", true);
}

#[test]
fn quantization_config() {
    fuzz("quantization_config", true);
}
