//! Reading a saved checkpoint folder as transformers would, noting every way its
//! index, shards, headers, totals and config disagree.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::VerifyError;
use super::report::{Finding, Kind};
use crate::formats::config::{ModelConfig, read_config};
use crate::formats::hf_index::{INDEX_FILE, SINGLE_FILE, parse_index, read_index_text};
use crate::formats::safetensors::read_header;
use crate::model::names::{HEAD_NAMES, input_embedding};
use crate::types::DType;
use crate::types::shape::Shape;

/// A shard whose header reads.
pub struct Shard {
    pub name: String,
    pub path: PathBuf,
}

/// One tensor as a shard's header has it.
pub struct WrittenTensor {
    pub name: String,
    /// Index into [`Written::shards`].
    pub shard: usize,
    pub dtype: DType,
    pub shape: Shape,
    /// Absolute offset in the shard file.
    pub offset: u64,
    pub len: u64,
}

impl WrittenTensor {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// The checkpoint in a folder: the shards that load and each tensor once (the first
/// shard holding a name wins, as it would for a reader that stops at the first).
pub struct Written {
    pub shards: Vec<Shard>,
    /// In shard order, then in the order the bytes lie in the file.
    pub tensors: Vec<WrittenTensor>,
    pub config: Option<ModelConfig>,
    pub config_present: bool,
}

/// Reads `out`'s weights and config; what is wrong goes to `findings`.
pub fn read(out: &Path, findings: &mut Vec<Finding>) -> Result<Written, VerifyError> {
    if !out.is_dir() {
        return Err(VerifyError::NotADirectory(out.to_path_buf()));
    }
    let present: Vec<String> = crate::formats::input::safetensors_files(out)?
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let index_path = out.join(INDEX_FILE);
    let has_index = std::fs::symlink_metadata(&index_path).is_ok();

    // Which files hold the weights, and which tensor the index puts in which file.
    let mut index: Option<HashMap<String, String>> = None;
    let mut totals = (None, None);
    let shard_names: Vec<String> = if has_index {
        match read_index(&index_path) {
            Ok((weight_map, total_size, total_parameters)) => {
                totals = (total_size, total_parameters);
                let named = named_shards(&weight_map, &present, findings);
                for file in &present {
                    if !named.contains(file) {
                        findings.push(Finding::difference(
                            Kind::StaleShard,
                            file,
                            if file == SINGLE_FILE {
                                "is here beside the index, and transformers loads it instead of the shards the index names: a leftover of an earlier save".to_owned()
                            } else {
                                format!("is not named by {INDEX_FILE}: a leftover of an earlier save (transformers ignores it)")
                            },
                        ));
                    }
                }
                index = Some(weight_map.into_iter().collect());
                named.into_iter().filter(|f| present.contains(f)).collect()
            }
            Err(e) => {
                findings.push(Finding::difference(
                    Kind::InvalidIndex,
                    INDEX_FILE,
                    e.to_string(),
                ));
                present.clone()
            }
        }
    } else if present.iter().any(|f| f == SINGLE_FILE) {
        for file in present.iter().filter(|f| *f != SINGLE_FILE) {
            findings.push(Finding::difference(
                Kind::StaleShard,
                file,
                format!("is not {SINGLE_FILE} and there is no index: transformers ignores it"),
            ));
        }
        vec![SINGLE_FILE.to_owned()]
    } else {
        if present.is_empty() {
            findings.push(Finding::difference(
                Kind::NoWeights,
                crate::text::path(out),
                format!("holds no weights ({SINGLE_FILE}, {INDEX_FILE} or shards)"),
            ));
        } else {
            findings.push(Finding::difference(
                Kind::MissingIndex,
                INDEX_FILE,
                format!(
                    "is missing, and without it transformers finds none of the {} here",
                    crate::text::count(present.len(), "shard file", "shard files")
                ),
            ));
        }
        present.clone()
    };

    let mut shards = Vec::new();
    let mut headers = Vec::new();
    let mut complete = true;
    for name in shard_names {
        let path = out.join(&name);
        let header = match read_header(&path) {
            Ok(h) => h,
            Err(e) => {
                findings.push(Finding::difference(
                    Kind::InvalidHeader,
                    &name,
                    e.to_string(),
                ));
                complete = false;
                continue;
            }
        };
        check_metadata(&name, header.metadata.as_ref(), findings);
        headers.push(header);
        shards.push(Shard { name, path });
    }
    // Every shard holding each name: a name in two is one finding, and the copy the
    // index points at (else the first) is the one checked further.
    let mut holders: HashMap<&str, Vec<usize>> = HashMap::new();
    for (shard, header) in headers.iter().enumerate() {
        for t in &header.tensors {
            holders.entry(&*t.name).or_default().push(shard);
        }
    }
    let indexed_shard = |tensor: &str| -> Option<usize> {
        let file = index.as_ref()?.get(tensor)?;
        shards.iter().position(|s| s.name == *file)
    };
    let mut tensors: Vec<WrittenTensor> = Vec::new();
    for (shard, header) in headers.iter().enumerate() {
        for t in &header.tensors {
            let all = &holders[&*t.name];
            if all.len() > 1 {
                let keep = indexed_shard(&t.name)
                    .filter(|s| all.contains(s))
                    .unwrap_or(all[0]);
                if shard != keep {
                    continue;
                }
                let names: Vec<&str> = all.iter().map(|&s| shards[s].name.as_str()).collect();
                findings.push(Finding::difference(
                    Kind::InTwoShards,
                    &*t.name,
                    format!("is in {}", names.join(" and ")),
                ));
            } else if let Some(index) = &index {
                let name = &shards[shard].name;
                match index.get(&*t.name) {
                    Some(f) if f == name => {}
                    Some(f) => findings.push(Finding::difference(
                        Kind::IndexMismatch,
                        &*t.name,
                        format!("is in {name}, but the index puts it in {f}"),
                    )),
                    None => findings.push(Finding::difference(
                        Kind::NotInIndex,
                        &*t.name,
                        format!("is in {name} but not in the index: transformers will not load it"),
                    )),
                }
            }
            tensors.push(WrittenTensor {
                name: t.name.to_string(),
                shard,
                dtype: t.dtype,
                shape: t.shape.clone(),
                offset: t.offset,
                len: t.len,
            });
        }
    }
    if let Some(index) = &index {
        let readable: HashSet<&str> = shards.iter().map(|s| s.name.as_str()).collect();
        let mut absent: Vec<(&String, &String)> = index
            .iter()
            .filter(|(t, f)| readable.contains(f.as_str()) && !holders.contains_key(t.as_str()))
            .collect();
        absent.sort();
        for (t, f) in absent {
            findings.push(Finding::difference(
                Kind::IndexMismatch,
                t,
                format!("the index puts it in {f}, which does not hold it"),
            ));
        }
        complete &= index.values().all(|f| readable.contains(f.as_str()));
    }
    drop(holders);
    drop(headers);
    // With a shard missing or unreadable the totals cannot agree; that shard is
    // already named.
    if complete {
        check_totals(&tensors, totals, findings);
    }

    let config_path = out.join("config.json");
    let config_present = std::fs::symlink_metadata(&config_path).is_ok();
    let config = if config_present {
        match read_config(&config_path) {
            Ok(c) => Some(c),
            Err(e) => {
                findings.push(Finding::difference(
                    Kind::InvalidConfig,
                    "config.json",
                    e.to_string(),
                ));
                None
            }
        }
    } else {
        None
    };
    Ok(Written {
        shards,
        tensors,
        config,
        config_present,
    })
}

/// `format: pt`, as transformers writes it and checks on load.
fn check_metadata(
    shard: &str,
    metadata: Option<&std::collections::BTreeMap<String, String>>,
    findings: &mut Vec<Finding>,
) {
    match metadata.and_then(|m| m.get("format")) {
        Some(f) if f == "pt" => {}
        Some(f) => findings.push(Finding::difference(
            Kind::Metadata,
            shard,
            format!("its metadata says format `{f}`; transformers loads PyTorch weights from `pt`"),
        )),
        None => findings.push(Finding::note(
            Kind::Metadata,
            shard,
            "its header has no `format: pt` metadata (transformers writes it; it loads without)",
        )),
    }
}

type IndexParts = (Vec<(String, String)>, Option<u64>, Option<u64>);

/// The weight map and `metadata.total_size` / `total_parameters` of an index.
fn read_index(path: &Path) -> Result<IndexParts, crate::formats::FormatError> {
    let text = read_index_text(path)?;
    let weight_map = parse_index(path, &text)?
        .weight_map
        .into_iter()
        .map(|(n, f)| (n.into_owned(), f.into_owned()))
        .collect();
    let metadata: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let field = |key: &str| metadata.get("metadata")?.get(key)?.as_u64();
    Ok((weight_map, field("total_size"), field("total_parameters")))
}

/// The shard files the index names, in order of first mention; missing ones and
/// names that are not plain file names are findings.
fn named_shards(
    weight_map: &[(String, String)],
    present: &[String],
    findings: &mut Vec<Finding>,
) -> Vec<String> {
    let mut named: Vec<String> = Vec::new();
    let mut count: HashMap<&str, (usize, &str)> = HashMap::new();
    for (tensor, file) in weight_map {
        let entry = count.entry(file).or_insert_with(|| {
            named.push(file.clone());
            (0, tensor)
        });
        entry.0 += 1;
    }
    named.retain(|file| {
        let plain = crate::formats::hf_index::is_shard_file_name(file);
        let (n, first) = count[file.as_str()];
        if !plain {
            findings.push(Finding::difference(
                Kind::InvalidIndex,
                file,
                format!("the index names it for {} (first `{first}`), but it is not a file name in this folder", crate::text::count(n, "tensor", "tensors")),
            ));
        } else if !present.contains(file) {
            findings.push(Finding::difference(
                Kind::MissingShard,
                file,
                format!("the index names it for {} (first `{first}`), but it is missing", crate::text::count(n, "tensor", "tensors")),
            ));
        }
        plain
    });
    named
}

/// The index's totals against the headers', as transformers computes them (bytes and
/// elements of every tensor written).
fn check_totals(
    tensors: &[WrittenTensor],
    (total_size, total_parameters): (Option<u64>, Option<u64>),
    findings: &mut Vec<Finding>,
) {
    let bytes: u64 = tensors.iter().map(|t| t.len).sum();
    let elements: u64 = tensors.iter().map(WrittenTensor::numel).sum();
    if let Some(size) = total_size
        && size != bytes
    {
        findings.push(Finding::difference(
            Kind::Totals,
            INDEX_FILE,
            format!("metadata.total_size is {size}, but the shards' tensors hold {bytes} bytes"),
        ));
    }
    if let Some(params) = total_parameters
        && params != elements
    {
        findings.push(Finding::difference(
            Kind::Totals,
            INDEX_FILE,
            format!(
                "metadata.total_parameters is {params}, but the shards' tensors hold {elements} elements"
            ),
        ));
    }
}

/// config.json against the tensors: present (unless the source had none either), its
/// dtype the tensors' dtype, and the output head written exactly when untied. A
/// dropped head is guessed from names only where the tensors are not checked against
/// the architecture (`names_checked`), which knows it: MISSING.
pub fn check_config(
    written: &Written,
    config_expected: bool,
    names_checked: bool,
    findings: &mut Vec<Finding>,
) {
    if !written.config_present {
        if config_expected {
            findings.push(Finding::difference(
                Kind::NoConfig,
                "config.json",
                "is missing: transformers cannot load the weights without it (saved with --weights-only? copy it from the source)",
            ));
        }
        return;
    }
    let Some(config) = &written.config else {
        return;
    };
    check_dtype(written, config, findings);
    check_head(written, config, !names_checked, findings);
}

fn check_dtype(written: &Written, config: &ModelConfig, findings: &mut Vec<Finding>) {
    let Some(name) = &config.torch_dtype else {
        return;
    };
    let Some(said) = DType::from_torch_name(name) else {
        return;
    };
    // A quantized checkpoint's FP8 weights are not what config.json's dtype describes:
    // the rest of its floating-point tensors are.
    let counted = |d: DType| {
        crate::save::cast::is_floating(d)
            && !(config.quantization.is_some() && matches!(d, DType::F8E4M3 | DType::F8E5M2))
    };
    let mut bytes: HashMap<DType, u64> = HashMap::new();
    for t in &written.tensors {
        if counted(t.dtype) {
            *bytes.entry(t.dtype).or_default() += t.len;
        }
    }
    let Some((&main, _)) = bytes.iter().max_by_key(|(d, b)| (**b, d.torch_name())) else {
        return;
    };
    if main != said {
        findings.push(Finding::difference(
            Kind::ConfigDtype,
            "config.json",
            format!(
                "says the model is {}, but its floating-point tensors are {} ({} of {} bytes)",
                said.torch_name(),
                main.torch_name(),
                bytes[&main],
                bytes.values().sum::<u64>()
            ),
        ));
    }
    let others: Vec<&WrittenTensor> = written
        .tensors
        .iter()
        .filter(|t| counted(t.dtype) && t.dtype != main)
        .collect();
    if let Some(first) = others.first() {
        let count = others.len();
        findings.push(Finding::note(
            Kind::ConfigDtype,
            &first.name,
            format!(
                "is {} while most floating-point tensors are {} ({} like it; models that keep some modules in float32 do this)",
                first.dtype.torch_name(),
                main.torch_name(),
                crate::text::count(count, "tensor", "tensors")
            ),
        ));
    }
}

fn check_head(
    written: &Written,
    config: &ModelConfig,
    guess_dropped: bool,
    findings: &mut Vec<Finding>,
) {
    let names: HashSet<&str> = written.tensors.iter().map(|t| &*t.name).collect();
    let Some(embedding) = input_embedding(written.tensors.iter().map(|t| &*t.name)) else {
        return;
    };
    let heads: Vec<&str> = HEAD_NAMES
        .iter()
        .copied()
        .filter(|h| names.contains(h))
        .collect();
    let causal_lm = config
        .architectures
        .iter()
        .any(|a| a.ends_with("ForCausalLM") || a.ends_with("LMHeadModel"));
    // An architecture the table knows ties its head only where its class says so
    // (transformers 5's BigBird-Pegasus causal LM keeps its own head whatever
    // `tie_word_embeddings` says).
    let arch = crate::model::arch::lookup(&config.architectures);
    let ties_head = |head: &str| {
        arch.is_none_or(|a| {
            let loaded = a.loaded_or_same(head);
            a.ties
                .iter()
                .any(|t| t.members.iter().any(|m| m == head || *m == loaded))
        })
    };
    if config.tie_word_embeddings {
        for head in heads.into_iter().filter(|h| ties_head(h)) {
            findings.push(Finding::difference(
                Kind::TieExtra,
                head,
                format!(
                    "is written, but config.json ties it to `{embedding}`: transformers writes a tied head once, as the embedding"
                ),
            ));
        }
    } else if guess_dropped && heads.is_empty() && causal_lm {
        findings.push(Finding::difference(
            Kind::TieDropped,
            HEAD_NAMES[0],
            format!(
                "is missing, and config.json does not tie it to `{embedding}` (tie_word_embeddings is false): transformers would leave the head uninitialised"
            ),
        ));
    }
}
