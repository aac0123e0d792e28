//! The expect table never cries wolf (tests/python/option_sweep.py): pristine
//! `save_pretrained` outputs with a config option switched — the cases users hit
//! (flan-T5, DeepSeek-V2-Lite, OPT-350m, Falcon-40b, Llama's biases, GPT-2's
//! cross-attention) and every option value crates/devmap-core/src/model/option_table.txt records, built
//! tiny by transformers — verify clean and save without a warning, using devmap's
//! tables alone; a value the table never tried is verified with a "not checked" note.
//! Ignored by a bare `cargo test`; `.ci/run` runs it with the reference libraries.

#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn pristine_outputs_with_switched_options_verify_clean_from_the_table() {
    let (ok, out, err) = crate::common::run_hf_script("option_sweep.py");
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.matches("verifies clean, saves without a warning")
            .count(),
        7,
        "{out}"
    );
    assert_eq!(out.matches("untried ").count(), 1, "{out}");
    let summary = out
        .lines()
        .find(|l| l.contains(" false alarms"))
        .unwrap_or_default();
    let clean: usize = summary
        .split(", ")
        .find_map(|p| p.strip_suffix(" clean"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(clean >= 100, "too few cases built and verified: {summary}");
}
