//! The examples run as written: every `devmap …` line of the README's "Examples" block
//! and of docs/examples.md's "One example per command" block (output folders moved
//! into a temporary folder; the Hub example left out, as it needs the network) must
//! succeed on the bundled demo.

mod common;

use std::process::Command;

#[test]
fn every_readme_example_runs() {
    for (file, heading, at_least) in [
        ("README.md", "## Examples", 4),
        ("docs/examples.md", "## One example per command", 6),
    ] {
        let text =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
                .expect(file);
        let block = text
            .split(heading)
            .nth(1)
            .and_then(|rest| rest.split("```sh\n").nth(1))
            .and_then(|rest| rest.split("```").next())
            .expect("the examples block");
        // Each file's examples in a folder of their own (both save to /tmp/demo-saved).
        let tmp = tempfile::tempdir().expect("tmp");
        let ran = run_block(block, tmp.path());
        assert!(ran >= at_least, "{file}: only {ran} examples found");
    }
}

/// Runs every `devmap …` line of `block`; returns how many ran.
fn run_block(block: &str, tmp: &std::path::Path) -> usize {
    let mut ran = 0;
    for line in block.lines() {
        let command = line.split('#').next().unwrap_or("").trim();
        let Some(args) = command.strip_prefix("devmap ") else {
            continue;
        };
        if args.contains("hf://") {
            continue;
        }
        let args: Vec<String> = args
            .split_whitespace()
            .map(|a| a.replace("/tmp/", &format!("{}/", tmp.display())))
            .collect();
        let o = Command::new(env!("CARGO_BIN_EXE_devmap"))
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("devmap");
        assert!(
            o.status.success(),
            "`{command}` failed:\n{}",
            common::stderr(&o)
        );
        ran += 1;
    }
    ran
}
