//! `devmap verify`'s check against what transformers expects, checked against
//! transformers itself (see tests/python/verify_expects.py): pristine `save_pretrained`
//! outputs of 12 architectures verify clean; 34 kinds of corruption each fail with the
//! right kind, and transformers' own loader names the same tensor. Then 5 architectures
//! the tables lack (dots1, lfm2_moe, hunyuan_v1_moe, nemotron, ministral), with
//! transformers asked: clean, and the 28 corruptions that apply to them caught. Ignored by a bare
//! `cargo test`; `.ci/run` runs it with `--include-ignored`.

#[test]
#[ignore = "needs torch, transformers: run .ci/run"]
fn verify_finds_what_transformers_loader_reports() {
    let (ok, out, err) = crate::common::run_hf_script("verify_expects.py");
    assert!(ok, "verify against transformers failed:\n{out}\n{err}");
    let summary = out
        .lines()
        .find(|l| l.contains("broken folders"))
        .unwrap_or_default();
    let number = |word: &str| -> usize {
        summary
            .split(", ")
            .find(|part| part.contains(word))
            .and_then(|part| part.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert!(number("architectures") >= 10, "{summary}");
    assert!(number("kinds of corruption") >= 30, "{summary}");
    assert!(number("cross-checked") >= 100, "{summary}");
    assert_eq!(
        out.matches("pristine verifies clean").count(),
        12 + 5,
        "{out}"
    );
    // The same corruptions on 5 architectures the tables lack, transformers asked.
    let asked = out
        .lines()
        .find(|l| l.starts_with("asked: "))
        .unwrap_or_default();
    assert!(
        asked.starts_with("asked: 5 architectures") && asked.contains("28 kinds"),
        "{asked}"
    );
}
