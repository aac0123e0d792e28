//! The README's examples run as written: every `devmap …` line of its "One example
//! per command" block (output folders moved into a temporary folder; the Hub example
//! left out, as it needs the network) must succeed on the bundled demo.

mod common;

use std::process::Command;

#[test]
fn every_readme_example_runs() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let block = readme
        .split("## One example per command")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the examples block");
    let tmp = tempfile::tempdir().expect("tmp");
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
            .map(|a| a.replace("/tmp/", &format!("{}/", tmp.path().display())))
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
    assert!(ran >= 6, "only {ran} examples found");
}
