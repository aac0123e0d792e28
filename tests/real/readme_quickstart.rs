//! The README's quick start from a Python session, run as written against real
//! transformers (see tests/python/readme_quickstart.py). Ignored by a bare `cargo test`;
//! `.ci/run` runs it with `--include-ignored`.

#[test]
#[ignore = "needs torch, transformers, accelerate: run .ci/run"]
fn the_readme_quick_start_runs_as_written() {
    // The quick start imports the devmap package (`pip install ./python`): built here.
    let package = crate::common::python_package();
    let (ok, out, err) = crate::common::run_hf_script_with("readme_quickstart.py", &package.env());
    assert!(ok, "the README's quick start failed:\n{out}\n{err}");
    assert_eq!(out.matches("ok: ").count(), 4, "{out}");
}
