//! The check against what transformers expects, independent of how the checkpoint was
//! saved: the tensors config.json's architecture holds and their shapes
//! ([`crate::model::expect`], generated from transformers), and the modules it keeps in
//! float32. Names what transformers' loader would report: MISSING (it would be left
//! randomly initialised), UNEXPECTED (ignored), MISMATCHED (refused).

use std::collections::{BTreeSet, HashMap, HashSet};

use super::report::{Finding, Kind};
use super::written::{Written, WrittenTensor};
use crate::formats::config::ModelConfig;
use crate::model::expect::{self, Expect, ExpectedTensor, Form, List, Node, Tied, Values};
use crate::model::options;
use crate::types::DType;

/// What the check covered, for the report's summary.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Coverage {
    /// The architecture checked against, when the table has it.
    pub architecture: Option<String>,
    /// Where the expectations came from: "devmap's table of transformers 5.25.0", or
    /// "transformers 5.25.0, asked".
    pub source: Option<String>,
}

/// The architecture config.json's tensor names and shapes are checked against, and its
/// name: none for an architecture the table lacks, nor for quantized formats stored
/// under other names and shapes (all but fine-grained FP8).
pub fn checked_against(config: &ModelConfig) -> Option<(&str, &'static Expect)> {
    if config
        .quantization
        .as_ref()
        .is_some_and(|q| q.method != "fp8")
    {
        return None;
    }
    expect::lookup_named(&config.architectures)
}

/// What transformers' loader would say of the tensors `plan` would write from `ckpt`
/// (missing, unexpected, mismatched, float32 modules cast), before a byte is written:
/// the check `devmap verify` runs on a written folder, on the plan's names, dtypes and
/// shapes and the source's config. Only the differences; nothing when config.json
/// names no architecture devmap's table has.
pub fn of_plan(
    ckpt: &crate::model::checkpoint::Checkpoint,
    plan: &crate::save::SavePlan,
    answer: Option<&crate::oracle::Answer>,
) -> Vec<Finding> {
    let tensors = plan
        .shards
        .iter()
        .enumerate()
        .flat_map(|(shard, s)| {
            s.header_entries(ckpt).map(move |e| WrittenTensor {
                name: e.name.clone().into_owned(),
                shard,
                dtype: e.dtype,
                shape: crate::types::shape::Shape::new(&e.shape),
                offset: s.header_len + e.begin,
                len: e.end - e.begin,
            })
        })
        .collect();
    let written = Written {
        shards: Vec::new(),
        tensors,
        config: Some(ckpt.config.clone()),
        config_present: true,
    };
    let mut findings = Vec::new();
    match answer {
        Some(answer) => {
            super::asked::check(&written, answer, &mut findings);
        }
        None => {
            check(&written, &mut findings);
        }
    }
    findings.retain(|f| f.severity == super::report::Severity::Difference);
    findings
}

/// Checks `written` against its config's architecture; findings go to `findings`.
pub fn check(written: &Written, findings: &mut Vec<Finding>) -> Coverage {
    let Some(config) = &written.config else {
        return Coverage::default();
    };
    if let Some(q) = config.quantization.as_ref().filter(|q| q.method != "fp8") {
        findings.push(Finding::note(
            Kind::NotChecked,
            "config.json",
            format!(
                "the weights are quantized (`{}`), stored under other names and shapes than the architecture's: the checks of names and shapes were skipped",
                q.method
            ),
        ));
        return Coverage::default();
    }
    let Some((architecture, expect)) = checked_against(config) else {
        let what = config.architectures.first().map_or(
            "config.json names no architecture".to_owned(),
            |a| {
                format!(
                    "{a} is not in devmap's table of {} architectures",
                    expect::source()
                )
            },
        );
        findings.push(Finding::note(
            Kind::NotChecked,
            "config.json",
            format!("{what}: the checks of names and shapes against the architecture were skipped"),
        ));
        check_kept_float32(written, findings);
        return Coverage::default();
    };
    let values = expect.values(&config.raw);
    let present = Present::new(written);
    let saved = match_form(&expect.saved, &present, &values, &config.raw);
    let runtime = expect
        .runtime
        .as_ref()
        .map(|f| match_form(f, &present, &values, &config.raw));
    let (chosen, other) = match runtime {
        Some(r) if r.score(&present) < saved.score(&present) => (r, Some(saved)),
        Some(r) => (saved, Some(r)),
        None => (saved, None),
    };
    let mut names_and_shapes = Vec::new();
    report(
        config.quantization.is_some(),
        expect,
        &chosen,
        other.as_ref(),
        &present,
        architecture,
        &mut names_and_shapes,
    );
    if let Some(table) = options::lookup(&config.architectures) {
        let switched = table.switched(&config.raw);
        follow_options(&switched, &mut names_and_shapes);
    }
    findings.append(&mut names_and_shapes);
    check_kept_float32(written, findings);
    Coverage {
        architecture: Some(architecture.to_owned()),
        source: Some(format!(
            "devmap's table of {}",
            expect::source().split(',').next().unwrap_or_default()
        )),
    }
}

/// The checkpoint's tensors by name, and sorted for prefix scans.
struct Present<'a> {
    by_name: HashMap<&'a str, &'a WrittenTensor>,
    sorted: BTreeSet<&'a str>,
}

impl<'a> Present<'a> {
    fn new(written: &'a Written) -> Present<'a> {
        let by_name: HashMap<&str, &WrittenTensor> = written
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        let sorted = by_name.keys().copied().collect();
        Present { by_name, sorted }
    }

    /// The names that start with `prefix`, in order.
    fn under<'p>(&self, prefix: &'p str) -> impl Iterator<Item = &'a str> + use<'a, '_, 'p> {
        self.sorted
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .copied()
            .take_while(move |n| n.starts_with(prefix))
    }

    /// The indices present under `prefix` (which ends in `.`): `model.layers.` gives
    /// the numbers after it.
    fn indices(&self, prefix: &str) -> BTreeSet<u64> {
        self.under(prefix)
            .filter_map(|n| n[prefix.len()..].split('.').next()?.parse().ok())
            .collect()
    }
}

/// One thing a form's tree says is wrong.
#[derive(Debug, Clone)]
enum Problem {
    Missing { name: String, shape: String },
    Mismatched { name: String, shape: String },
}

/// A match of a form against the checkpoint.
#[derive(Default)]
struct Matched<'a> {
    claimed: HashSet<&'a str>,
    problems: Vec<Problem>,
    /// Tensors whose expected shape has an unknown dimension, by the expectation they
    /// met (its address): members of a list must agree with each other.
    unknown: Vec<(usize, &'a str)>,
}

impl<'a> Matched<'a> {
    /// Problems plus the tensors left unclaimed: the smaller, the better the fit.
    fn score(&self, present: &Present<'_>) -> usize {
        self.problems.len() + present.by_name.len() - self.claimed.len()
    }

    fn absorb(&mut self, other: Matched<'a>) {
        self.claimed.extend(other.claimed);
        self.problems.extend(other.problems);
        self.unknown.extend(other.unknown);
    }
}

fn match_form<'a>(
    form: &Form,
    present: &Present<'a>,
    values: &Values<'_>,
    config: &serde_json::Value,
) -> Matched<'a> {
    let mut matched = match_node(&form.root, "", present, values);
    consistent(&mut matched, present, config);
    matched
}

fn match_node<'a>(
    node: &Node,
    prefix: &str,
    present: &Present<'a>,
    values: &Values<'_>,
) -> Matched<'a> {
    let mut m = Matched::default();
    for t in &node.tensors {
        let name = t.full_name(prefix);
        if let Some((&key, written)) = present.by_name.get_key_value(name.as_str()) {
            m.claimed.insert(key);
            if let Some(want) = mismatch(t, written, values) {
                m.problems.push(Problem::Mismatched { name, shape: want });
            } else if t.dims.iter().any(|d| values.eval(d).is_none()) {
                m.unknown.push((std::ptr::from_ref(t) as usize, key));
            }
            continue;
        }
        let optional = match t.tied {
            Tied::Always | Tied::Optional => true,
            Tied::IfTiedWords => values.ties_words(),
            Tied::No => false,
        };
        if !optional && !values.expect().ignores_missing(&name) {
            m.problems.push(Problem::Missing {
                name,
                shape: shape_text(t, values),
            });
        }
    }
    for list in &node.lists {
        match_list(list, prefix, present, values, &mut m);
    }
    m
}

fn match_list<'a>(
    list: &List,
    prefix: &str,
    present: &Present<'a>,
    values: &Values<'_>,
    m: &mut Matched<'a>,
) {
    let base = format!("{prefix}{}.", list.path);
    let seen = present.indices(&base);
    let count = values
        .eval(&list.count)
        .unwrap_or_else(|| seen.last().map_or(0, |i| i + 1));
    for i in 0..count {
        let member = format!("{base}{i}.");
        let pinned: Vec<_> = list
            .variants
            .iter()
            .filter(|v| v.pinned.as_ref().is_some_and(|p| p.contains(&i)))
            .collect();
        let candidates = if pinned.is_empty() {
            list.variants
                .iter()
                .filter(|v| v.pinned.is_none())
                .collect()
        } else {
            pinned
        };
        let best = candidates
            .iter()
            .map(|v| match_node(&v.node, &member, present, values))
            .min_by_key(|c| c.problems.len() + present.unclaimed_under(&member, &c.claimed));
        if let Some(best) = best {
            m.absorb(best);
        }
    }
}

impl Present<'_> {
    /// Tensors under `prefix` a match left unclaimed.
    fn unclaimed_under(&self, prefix: &str, claimed: &HashSet<&str>) -> usize {
        self.under(prefix).filter(|n| !claimed.contains(n)).count()
    }
}

/// The expected shape when the written one differs from it in rank or in a known
/// dimension.
fn mismatch(t: &ExpectedTensor, written: &WrittenTensor, values: &Values<'_>) -> Option<String> {
    let dims: Vec<Option<u64>> = t.dims.iter().map(|d| values.eval(d)).collect();
    let differs = dims.len() != written.shape.len()
        || dims
            .iter()
            .zip(written.shape.iter())
            .any(|(want, have)| want.is_some_and(|w| w != have));
    differs.then(|| shape_text(t, values))
}

fn shape_text(t: &ExpectedTensor, values: &Values<'_>) -> String {
    let dims: Vec<String> = t
        .dims
        .iter()
        .map(|d| {
            values
                .eval(d)
                .map_or_else(|| d.to_string(), |v| v.to_string())
        })
        .collect();
    format!("[{}]", dims.join(", "))
}

/// Members that met one expectation with an unknown dimension must agree: the shape
/// most of them have is taken as right, the others are MISMATCHED. Members that
/// config.json's per-layer lists set apart (`layer_types`' sliding and full attention
/// layers, `conv_kernel`'s sizes) are compared only with their own kind.
fn consistent(m: &mut Matched<'_>, present: &Present<'_>, config: &serde_json::Value) {
    let mut by_expectation: HashMap<usize, Vec<&str>> = HashMap::new();
    for (k, name) in &m.unknown {
        by_expectation.entry(*k).or_default().push(name);
    }
    let mut groups: HashMap<(usize, String), Vec<&str>> = HashMap::new();
    for (k, names) in by_expectation {
        let indices: Vec<Option<usize>> = names.iter().map(|n| first_index(n)).collect();
        let count = indices.iter().flatten().max().map_or(0, |i| i + 1);
        let lists = per_layer_lists(config, count);
        for (name, index) in names.into_iter().zip(indices) {
            let kind = index.map_or_else(String::new, |i| {
                lists
                    .iter()
                    .map(|l| l[i].to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            });
            groups.entry((k, kind)).or_default().push(name);
        }
    }
    for names in groups.values() {
        let shape = |n: &str| -> Vec<u64> { present.by_name[n].shape.iter().collect() };
        let mut counts: HashMap<Vec<u64>, usize> = HashMap::new();
        for n in names {
            *counts.entry(shape(n)).or_default() += 1;
        }
        let Some((common, _)) = counts.iter().max_by_key(|(s, c)| (**c, s.len())) else {
            continue;
        };
        if counts.len() < 2 {
            continue;
        }
        let example = names
            .iter()
            .find(|n| &shape(n) == common)
            .copied()
            .unwrap_or_default();
        for n in names {
            if &shape(n) != common {
                m.problems.push(Problem::Mismatched {
                    name: (*n).to_owned(),
                    shape: format!("{common:?} like `{example}`"),
                });
            }
        }
    }
}

/// The first list index in a name (`model.layers.2.…` gives 2).
fn first_index(name: &str) -> Option<usize> {
    name.split('.').find_map(|c| c.parse().ok())
}

/// config.json's lists of `count` plain values, at the top level and one sub-config
/// down (`text_config.layer_types`): per-layer settings.
fn per_layer_lists(config: &serde_json::Value, count: usize) -> Vec<&Vec<serde_json::Value>> {
    let Some(top) = config.as_object() else {
        return Vec::new();
    };
    let nested = top.values().filter_map(serde_json::Value::as_object);
    std::iter::once(top)
        .chain(nested)
        .flat_map(|o| o.values())
        .filter_map(serde_json::Value::as_array)
        .filter(|l| {
            count > 1 && l.len() == count && l.iter().all(|v| !v.is_object() && !v.is_array())
        })
        .collect()
}

fn report(
    quantized: bool,
    expect: &Expect,
    chosen: &Matched<'_>,
    other: Option<&Matched<'_>>,
    present: &Present<'_>,
    arch: &str,
    findings: &mut Vec<Finding>,
) {
    for p in &chosen.problems {
        match p {
            Problem::Missing { name, shape } => findings.push(Finding::difference(
                Kind::Missing,
                name,
                format!(
                    "MISSING: {arch} has it (shape {shape} by config.json) but the checkpoint does not; transformers would leave it randomly initialised"
                ),
            )),
            Problem::Mismatched { name, shape } => {
                let have = &present.by_name[name.as_str()].shape;
                findings.push(Finding::difference(
                    Kind::Mismatched,
                    name,
                    format!(
                        "MISMATCHED: shape {have:?}, but {arch} expects {shape}; transformers refuses to load it"
                    ),
                ));
            }
        }
    }
    let mut unexpected: Vec<&str> = present
        .sorted
        .iter()
        .copied()
        .filter(|n| {
            let companion = quantized && crate::save::fp8::is_companion(n);
            !(chosen.claimed.contains(n) || expect.ignores_unexpected(n) || companion)
        })
        .collect();
    unexpected.sort_unstable();
    for name in unexpected {
        if other.is_some_and(|o| o.claimed.contains(name)) {
            findings.push(Finding::difference(
                Kind::MixedLayout,
                name,
                format!(
                    "UNEXPECTED: {arch}'s checkpoint holds this tensor in the other layout (fused experts or renamed modules) than the rest; a mix of the two does not load as one model"
                ),
            ));
        } else {
            findings.push(Finding::difference(
                Kind::Unexpected,
                name,
                format!(
                    "UNEXPECTED: {arch} has no such tensor for this config.json; transformers would ignore it"
                ),
            ));
        }
    }
}

/// Follows the options config.json sets otherwise than the defaults the expect table
/// was fitted on (see [`crate::model::options`]): what a value the option table tried
/// removes is not MISSING, what it adds is not UNEXPECTED, what it reshapes is not
/// MISMATCHED; what a value it never tried could change is not checked, said once per
/// option. (An added tensor that is absent is not reported: the table does not say
/// which members of a list hold it, as a hybrid model's layer kinds differ.)
fn follow_options(switched: &options::Switched, findings: &mut Vec<Finding>) {
    let mut unchecked: Vec<(&str, Vec<String>)> = switched
        .unexplored
        .iter()
        .map(|(option, _)| (option.as_str(), Vec::new()))
        .collect();
    findings.retain(|f| {
        let excused = match f.kind {
            Kind::Missing => switched.removes(&f.subject),
            Kind::Unexpected | Kind::MixedLayout => switched.adds(&f.subject),
            Kind::Mismatched => switched.reshapes(&f.subject),
            _ => return true,
        };
        if excused.is_some() {
            return false;
        }
        match switched.unexplored_for(&f.subject) {
            Some(option) => {
                if let Some((_, names)) = unchecked.iter_mut().find(|(o, _)| *o == option) {
                    names.push(f.subject.clone());
                }
                false
            }
            None => true,
        }
    });
    for (option, names) in unchecked {
        let what = match names.as_slice() {
            [] => "no tensor it could change differs from the table".to_owned(),
            [one] => format!("`{one}` differs from the table and was not checked"),
            [first, rest @ ..] => format!(
                "`{first}` and {} more tensors differ from the table and were not checked",
                rest.len()
            ),
        };
        findings.push(Finding::note(
            Kind::NotChecked,
            "config.json",
            format!(
                "sets {option}, a value devmap's table of {} never tried: {what} (`--transformers PYTHON` asks transformers itself)",
                options::source().split(',').next().unwrap_or_default()
            ),
        ));
    }
}

/// Tensors transformers keeps in float32 (`_keep_in_fp32_modules(_strict)`) when it
/// loads the model in config.json's dtype, written in another floating dtype.
fn check_kept_float32(written: &Written, findings: &mut Vec<Finding>) {
    let Some(config) = &written.config else {
        return;
    };
    let Some(dtype) = config
        .torch_dtype
        .as_deref()
        .and_then(DType::from_torch_name)
    else {
        return;
    };
    let Some(arch) = crate::model::arch::lookup(&config.architectures) else {
        return;
    };
    kept_float32_findings(
        written,
        dtype,
        |name| {
            arch.kept_in_fp32(&arch.loaded_or_same(name), dtype)
                .map(|pattern| format!("`{pattern}` is in the architecture's keep-in-float32 list"))
        },
        findings,
    );
}

/// Every floating tensor written in another dtype than float32 that transformers holds
/// in float32 when it loads the model in `dtype` — `keeps` says so for a name, with the
/// reason in words — as a MISMATCHED-like difference: its values lost precision.
pub(super) fn kept_float32_findings(
    written: &Written,
    dtype: DType,
    keeps: impl Fn(&str) -> Option<String>,
    findings: &mut Vec<Finding>,
) {
    for t in &written.tensors {
        if t.dtype == DType::F32 || !crate::save::cast::is_floating(t.dtype) {
            continue;
        }
        if let Some(why) = keeps(&t.name) {
            findings.push(Finding::difference(
                Kind::KeptFloat32,
                &t.name,
                format!(
                    "is {}, but transformers keeps it in float32 when it loads the model in {} ({why}): the values it holds lost precision",
                    t.dtype.torch_name(),
                    dtype.torch_name()
                ),
            ));
        }
    }
}
