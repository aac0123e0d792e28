//! The generated tables and the transformers CI checks against must be one version:
//! the tables are exact only for the release they were generated from. After a
//! transformers upgrade this fails, naming both versions and how to regenerate.
//! Ignored by a bare `cargo test`; `.ci/run` runs it with the reference libraries.

use std::process::Command;

const TABLES: [&str; 5] = [
    "crates/devmap-core/src/model/arch_table.txt",
    "crates/devmap-core/src/model/expect_table.txt",
    "crates/devmap-core/src/model/buffer_table.txt",
    "crates/devmap-core/src/model/option_table.txt",
    "crates/devmap-core/src/formats/tie_defaults.txt",
];

#[test]
#[ignore = "needs transformers: run .ci/run"]
fn the_tables_come_from_the_installed_transformers() {
    let python = crate::common::hf_python().unwrap_or_else(|why| panic!("{why}"));
    let out = Command::new(python)
        .args(["-c", "import transformers; print(transformers.__version__)"])
        .output()
        .expect("python");
    let installed = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && !installed.is_empty(),
        "no transformers"
    );
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for table in TABLES {
        let text = std::fs::read_to_string(root.join(table)).expect(table);
        let first = text.lines().next().unwrap_or_default();
        let version = first
            .strip_prefix("# transformers ")
            .and_then(|rest| rest.split([',', ':']).next())
            .unwrap_or_default();
        assert_eq!(
            version, installed,
            "{table} was generated from transformers {version}, but CI's is {installed}: \
             regenerate the tables (CONTRIBUTING.md, \"Regenerating after a transformers \
             upgrade\") or pin TRANSFORMERS in .ci/run back to {version}"
        );
    }
}
