//! What `devmap verify` found, as text for people and JSON for scripts.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::text::escaped;

/// Findings of one kind the text report lists before it only counts them.
pub const SHOWN_PER_KIND: usize = 20;

/// Whether a finding makes the checkpoint wrong or is only worth a look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The checkpoint is not what it should be: `devmap verify` exits 1.
    Difference,
    /// Legitimate but worth knowing (an all-zero tensor): reported, not failed.
    Note,
}

/// Every kind of problem verify names. The JSON report carries [`Kind::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No weight files at all.
    NoWeights,
    /// Shard files without the index that names them.
    MissingIndex,
    /// The index cannot be read or parsed.
    InvalidIndex,
    /// The index names a shard that is not there.
    MissingShard,
    /// A weight file nothing points at: a leftover of another save.
    StaleShard,
    /// A shard whose header fails the reader's validation.
    InvalidHeader,
    /// A shard's `__metadata__` lacks `format: pt` or says another format.
    Metadata,
    /// A tensor of a shard that the index does not list.
    NotInIndex,
    /// The index puts a tensor in another shard than the one holding it.
    IndexMismatch,
    /// One name in two shards.
    InTwoShards,
    /// `metadata.total_size` or `total_parameters` disagrees with the headers.
    Totals,
    /// A tensor with no elements (a note: some models hold empty buffers).
    EmptyTensor,
    /// Every element is zero (a note: biases are often zero).
    AllZero,
    /// Every element holds the same non-zero value (a note: fresh norms are ones).
    AllSame,
    /// No config.json beside the weights.
    NoConfig,
    /// config.json cannot be read.
    InvalidConfig,
    /// config.json's dtype is not the tensors' dtype.
    ConfigDtype,
    /// The config unties the head but the head is not written.
    TieDropped,
    /// The config ties the head to the embedding but both are written.
    TieExtra,
    /// `--against`: a tensor the save writes is missing.
    MissingTensor,
    /// `--against`: a tensor the save does not write is present.
    ExtraTensor,
    /// `--against`: the dtype differs.
    Dtype,
    /// `--against`: the shape differs.
    Shape,
    /// `--against`: the bytes differ.
    Content,
    /// `--against --quantize`: how far the quantized values lie from their source,
    /// within the bound the rounding allows (a note).
    RoundTrip,
    /// `--against`: a name the save drops as a tied copy holds other values than the
    /// name it keeps, in the source itself: the drop loses them.
    TieLostValues,
    /// A file could not be read to the end.
    Unreadable,
    /// NaN or infinite elements (a difference unless `--allow-nonfinite`).
    NonFinite,
    /// The architecture has a tensor the checkpoint lacks (transformers: MISSING).
    Missing,
    /// The checkpoint has a tensor the architecture lacks (transformers: UNEXPECTED).
    Unexpected,
    /// A tensor whose shape is not what config.json gives (transformers: MISMATCHED).
    Mismatched,
    /// A tensor in the other layout (fused experts, runtime names) than the rest.
    MixedLayout,
    /// transformers' config class refuses config.json (asked): nothing loads.
    ConfigRefused,
    /// A tensor transformers keeps in float32 written in another dtype.
    KeptFloat32,
    /// The architecture is not in devmap's table: names and shapes not checked (a note).
    NotChecked,
}

/// Which of verify's checks a finding comes from; each proves something else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The files read as transformers reads them, every byte read once.
    Files,
    /// The names, shapes, dtypes and values transformers expects of the architecture.
    Expects,
    /// `--against`: what devmap's saver writes from the source.
    Against,
}

impl Check {
    pub fn as_str(self) -> &'static str {
        match self {
            Check::Files => "files",
            Check::Expects => "expects",
            Check::Against => "against",
        }
    }
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::NoWeights => "no-weights",
            Kind::MissingIndex => "missing-index",
            Kind::InvalidIndex => "invalid-index",
            Kind::MissingShard => "missing-shard",
            Kind::StaleShard => "stale-shard",
            Kind::InvalidHeader => "invalid-header",
            Kind::Metadata => "metadata",
            Kind::NotInIndex => "not-in-index",
            Kind::IndexMismatch => "index-mismatch",
            Kind::InTwoShards => "in-two-shards",
            Kind::Totals => "totals",
            Kind::EmptyTensor => "empty-tensor",
            Kind::AllZero => "all-zero",
            Kind::AllSame => "all-same",
            Kind::NoConfig => "no-config",
            Kind::InvalidConfig => "invalid-config",
            Kind::ConfigDtype => "config-dtype",
            Kind::TieDropped => "tie-dropped",
            Kind::TieExtra => "tie-extra",
            Kind::MissingTensor => "missing-tensor",
            Kind::ExtraTensor => "extra-tensor",
            Kind::Dtype => "dtype",
            Kind::Shape => "shape",
            Kind::Content => "content",
            Kind::RoundTrip => "round-trip",
            Kind::TieLostValues => "tie-lost-values",
            Kind::Unreadable => "unreadable",
            Kind::NonFinite => "non-finite",
            Kind::Missing => "missing",
            Kind::Unexpected => "unexpected",
            Kind::Mismatched => "mismatched",
            Kind::MixedLayout => "mixed-layout",
            Kind::ConfigRefused => "config-refused",
            Kind::KeptFloat32 => "kept-float32",
            Kind::NotChecked => "not-checked",
        }
    }

    pub fn check(self) -> Check {
        match self {
            Kind::MissingTensor
            | Kind::ExtraTensor
            | Kind::Dtype
            | Kind::Shape
            | Kind::Content
            | Kind::RoundTrip
            | Kind::TieLostValues => Check::Against,
            Kind::ConfigDtype
            | Kind::TieDropped
            | Kind::TieExtra
            | Kind::NonFinite
            | Kind::Missing
            | Kind::Unexpected
            | Kind::Mismatched
            | Kind::MixedLayout
            | Kind::ConfigRefused
            | Kind::KeptFloat32
            | Kind::NotChecked => Check::Expects,
            _ => Check::Files,
        }
    }
}

/// One thing verify found, about one tensor or one file (`subject`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub kind: Kind,
    pub subject: String,
    pub message: String,
}

impl Finding {
    pub fn difference(kind: Kind, subject: impl Into<String>, message: impl Into<String>) -> Self {
        Finding {
            severity: Severity::Difference,
            kind,
            subject: subject.into(),
            message: message.into(),
        }
    }

    pub fn note(kind: Kind, subject: impl Into<String>, message: impl Into<String>) -> Self {
        Finding {
            severity: Severity::Note,
            ..Finding::difference(kind, subject, message)
        }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", escaped(&self.subject), escaped(&self.message))
    }
}

/// The outcome of one verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub out: PathBuf,
    /// The model folder the content was compared with.
    pub against: Option<PathBuf>,
    pub shards: usize,
    /// Tensors in the checkpoint's headers.
    pub tensors: usize,
    /// Tensors whose content was compared with `--against`'s.
    pub compared: usize,
    /// Bytes read: the checkpoint's tensors, and with `--against` the sources too.
    pub bytes_read: u64,
    /// What the check against the architecture covered.
    pub coverage: super::Coverage,
    pub findings: Vec<Finding>,
}

impl VerifyReport {
    pub fn differences(&self) -> usize {
        self.count(Severity::Difference)
    }

    pub fn notes(&self) -> usize {
        self.count(Severity::Note)
    }

    fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }

    /// Differences found by `check`.
    pub fn differences_in(&self, check: Check) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Difference && f.kind.check() == check)
            .count()
    }

    /// One clause per check: what it found, so a reader sees which proof failed.
    fn verdicts(&self) -> String {
        let problems = |n| crate::text::count(n, "problem", "problems");
        let mut parts = vec![format!(
            "files: {}",
            problems(self.differences_in(Check::Files))
        )];
        let expects = problems(self.differences_in(Check::Expects));
        parts.push(match &self.coverage.architecture {
            Some(arch) => match &self.coverage.source {
                Some(source) => format!("as transformers expects ({arch}, {source}): {expects}"),
                None => format!("as transformers expects ({arch}): {expects}"),
            },
            // Nothing knew the architecture: no verdict on its names and shapes.
            None if self.differences_in(Check::Expects) == 0 => {
                "as transformers expects: not checked".to_owned()
            }
            None => format!("as transformers expects (names and shapes not checked): {expects}"),
        });
        if let Some(dir) = &self.against {
            parts.push(format!(
                "as saved from {}: {}",
                crate::text::path(dir),
                crate::text::count(
                    self.differences_in(Check::Against),
                    "difference",
                    "differences"
                )
            ));
        }
        parts.join("; ")
    }

    /// Every difference, then every note, one per line, and a summary.
    /// A kind with more findings than `SHOWN_PER_KIND` shows that many and counts
    /// the rest (a config.json for another model makes hundreds; `--json` has all).
    pub fn to_text(&self) -> String {
        let mut text = String::new();
        for severity in [Severity::Difference, Severity::Note] {
            let label = match severity {
                Severity::Difference => "difference",
                Severity::Note => "note",
            };
            let mut shown: Vec<(Kind, usize)> = Vec::new();
            for f in self.findings.iter().filter(|f| f.severity == severity) {
                let at = shown
                    .iter()
                    .position(|(k, _)| *k == f.kind)
                    .unwrap_or_else(|| {
                        shown.push((f.kind, 0));
                        shown.len() - 1
                    });
                shown[at].1 += 1;
                if shown[at].1 <= SHOWN_PER_KIND {
                    let _ = writeln!(text, "{label}: {f}");
                }
            }
            for (kind, n) in shown.into_iter().filter(|(_, n)| *n > SHOWN_PER_KIND) {
                let _ = writeln!(
                    text,
                    "{label}: … and {} more of kind {} (--json lists every one)",
                    n - SHOWN_PER_KIND,
                    kind.as_str()
                );
            }
        }
        let against = self.against.as_ref().map_or(String::new(), |dir| {
            format!(
                ", {} compared with a save of {}",
                self.compared,
                crate::text::path(dir)
            )
        });
        let verdict = match (self.differences(), self.notes()) {
            (0, 0) => "no differences".to_owned(),
            (0, n) => format!("no differences, {}", crate::text::count(n, "note", "notes")),
            (d, n) => format!(
                "{}, {}",
                crate::text::count(d, "difference", "differences"),
                crate::text::count(n, "note", "notes")
            ),
        };
        let _ = writeln!(
            text,
            "{}: {} in {} checked{against}; {} read; {verdict}",
            crate::text::path(&self.out),
            crate::text::count(self.tensors, "tensor", "tensors"),
            crate::text::count(self.shards, "shard", "shards"),
            crate::human_bytes(self.bytes_read),
        );
        let _ = writeln!(text, "{}", self.verdicts());
        text
    }

    /// The stable JSON form: the summary and every finding with its kind.
    pub fn to_json(&self) -> String {
        let findings: Vec<_> = self
            .findings
            .iter()
            .map(|f| {
                serde_json::json!({
                    "severity": match f.severity {
                        Severity::Difference => "difference",
                        Severity::Note => "note",
                    },
                    "kind": f.kind.as_str(),
                    "check": f.kind.check().as_str(),
                    "subject": f.subject,
                    "message": f.message,
                })
            })
            .collect();
        let value = serde_json::json!({
            "out": self.out.to_string_lossy(),
            "against": self.against.as_ref().map(|p| p.to_string_lossy()),
            "shards": self.shards,
            "tensors": self.tensors,
            "compared": self.compared,
            "bytes_read": self.bytes_read,
            "differences": self.differences(),
            "notes": self.notes(),
            "checks": {
                "files": self.differences_in(Check::Files),
                "expects": self.differences_in(Check::Expects),
                "against": self.against.as_ref().map(|_| self.differences_in(Check::Against)),
            },
            "architecture": self.coverage.architecture,
            "expectations": self.coverage.source,
            "findings": findings,
        });
        let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
        text.push('\n');
        text
    }
}
