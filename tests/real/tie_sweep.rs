//! Ties by evidence across every input kind (tests/python/tie_sweep.py): safetensors,
//! `pytorch_model.bin`, DCP, transformers 5 rank files, DeepSpeed ZeRO 2 and a live
//! model, tied and untied, with and without config.json; transformers loads every
//! output as the model itself, and `verify --against` flags a wrong drop. Ignored by a
//! bare `cargo test`; `.ci/run` runs it with the reference libraries installed.

#[test]
#[ignore = "needs torch, transformers, deepspeed: run .ci/run"]
fn every_input_kind_keeps_an_untied_head_and_drops_a_tie_only_on_evidence() {
    let (ok, out, err) = crate::common::run_package_script("tie_sweep.py");
    assert!(ok, "{out}\n{err}");
    // 4 kinds x tied/untied x with/without config, ZeRO 2 without, live 2.
    assert_eq!(out.matches("ok: ").count(), 4 * 2 * 2 + 2 + 2, "{out}");
}
