//! The tests' zygote (tests/python/zygote.py, `common::zygote`) passes on what a script
//! did as a fresh interpreter would: its stdout and stderr, its exit status (a
//! `sys.exit(3)` and an exception are failures, with the traceback), its atexit
//! handlers; a script that re-executes itself fails naming why. Without these, a
//! script's failure could read as a pass in every real-library test.

use crate::common::run_hf_script_with;

fn run(mode: &str) -> (bool, String, String) {
    run_hf_script_with("zygote_check.py", &[("DEVMAP_ZYGOTE_CHECK", mode.into())])
}

#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn the_zygote_passes_on_what_a_script_did() {
    let (ok, out, err) = run("ok");
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("main __main__"), "{out}");
    assert!(out.contains(env!("CARGO_BIN_EXE_devmap")), "{out}");
    assert!(out.contains("reached the end"), "{out}");
    assert!(err.contains("to stderr"), "{err}");

    let (ok, out, err) = run("exit3");
    assert!(!ok, "sys.exit(3) passed:\n{out}\n{err}");
    assert!(!out.contains("reached the end"), "{out}");

    let (ok, _, err) = run("raise");
    assert!(!ok, "an exception passed:\n{err}");
    assert!(err.contains("ValueError: raised on purpose"), "{err}");

    let (ok, out, _) = run("atexit");
    assert!(ok, "{out}");
    assert!(out.contains("atexit ran"), "{out}");

    // A fresh interpreter (the zygote turned off) would run what it execs.
    if std::env::var_os("DEVMAP_TEST_NO_ZYGOTE").is_some_and(|v| v == "1") {
        return;
    }
    let (ok, _, err) = run("exec");
    assert!(!ok, "a script that re-executes itself passed:\n{err}");
    assert!(
        err.contains("re-executes its interpreter") || err.contains("fresh interpreter"),
        "{err}"
    );
}
