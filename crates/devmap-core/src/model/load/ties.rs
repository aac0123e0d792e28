//! Tie inference: which tensors hold the same value. A save writes a tie group once,
//! so a tie needs evidence — the config (or the architecture's tie keys), one storage
//! for both names, or the user's `--tie` — never a name rule alone: with no
//! config.json, an untied head would otherwise be dropped (issue 38).

use super::LoadError;
use super::draft::Draft;
use crate::formats::config::ModelConfig;
use crate::model::checkpoint::{NO_KEY, NamedTie, Source, Tensor, TieEvidence};
use crate::model::names::{HEAD_NAMES, input_embedding};
use crate::model::warning::Warning;
use crate::types::placement::{DeviceMap, Placement};

/// The ties the config makes: `tie_word_embeddings` (the output head holds the input
/// embedding; the head is added when the weights lack it but the device map names
/// it, as transformers does not save the tied side), or the architecture table's.
/// With no config.json at all, [`evidence_ties`] decides instead.
pub(super) fn config_ties(
    config: &ModelConfig,
    draft: &mut Draft,
    map: Option<&DeviceMap>,
    warnings: &mut Vec<Warning>,
) -> Vec<NamedTie> {
    if !config.present {
        return evidence_ties(draft, map, warnings);
    }
    let by_config = |names: Vec<String>| NamedTie {
        names,
        evidence: TieEvidence::Config,
    };
    if let Some(arch) = crate::model::arch::lookup(&config.architectures) {
        return table_ties(arch, config, draft, warnings)
            .into_iter()
            .map(by_config)
            .collect();
    }
    if !config.tie_word_embeddings {
        return Vec::new();
    }
    let Some(embedding) =
        input_embedding(draft.tensors.iter().map(|t| t.name.as_ref())).map(str::to_owned)
    else {
        return Vec::new();
    };
    let mut ties = Vec::new();
    for head in HEAD_NAMES {
        let module = head.trim_end_matches(".weight");
        let Some(emb) = draft.find(&embedding) else {
            break;
        };
        if let Some(h) = draft.find(head) {
            if draft.tensors[h].shape == draft.tensors[emb].shape {
                ties.push(by_config(vec![embedding.clone(), head.to_owned()]));
            } else {
                warnings.push(Warning::TieShapesDiffer {
                    head: head.to_owned(),
                    head_shape: format!("{:?}", draft.tensors[h].shape),
                    embedding: embedding.clone(),
                    embedding_shape: format!("{:?}", draft.tensors[emb].shape),
                });
            }
        } else {
            // A causal LM has its head even when the checkpoint leaves the tied
            // copy out; a device map naming it says so too.
            let named = map.is_some_and(|m| m.get(module).is_some() || m.get(head).is_some());
            let lm = head == "lm_head.weight"
                && config
                    .architectures
                    .iter()
                    .any(|a| a.ends_with("ForCausalLM") || a.ends_with("LMHeadModel"));
            if named || lm {
                add_tied_copy(draft, head, emb);
                ties.push(by_config(vec![embedding.clone(), head.to_owned()]));
            }
        }
    }
    ties
}

/// Ties with no config.json: only a head that shares the embedding's storage (a
/// `torch.save` of a tied model pickles one storage under both names). A head with
/// bytes of its own is kept, with a warning that says whether they are identical; a
/// head the device map places but the checkpoint lacks gets no value (a save
/// refuses, naming `--config` and `--tie`).
fn evidence_ties(
    draft: &Draft,
    map: Option<&DeviceMap>,
    warnings: &mut Vec<Warning>,
) -> Vec<NamedTie> {
    let Some(embedding) =
        input_embedding(draft.tensors.iter().map(|t| t.name.as_ref())).map(str::to_owned)
    else {
        return Vec::new();
    };
    let Some(emb) = draft.find(&embedding) else {
        return Vec::new();
    };
    let mut ties = Vec::new();
    for head in HEAD_NAMES {
        let Some(h) = draft.find(head) else {
            let module = head.trim_end_matches(".weight");
            if map.is_some_and(|m| m.get(module).is_some() || m.get(head).is_some()) {
                warnings.push(Warning::HeadTieUnknown {
                    head: head.to_owned(),
                    embedding: embedding.clone(),
                });
            }
            continue;
        };
        let (held, embedded) = (&draft.tensors[h], &draft.tensors[emb]);
        if held.shape != embedded.shape || held.dtype != embedded.dtype {
            // Another shape is another tensor: nothing to decide.
            continue;
        }
        let same_storage = match (held.source, embedded.source) {
            (Source::Checkpoint(x), Source::Checkpoint(y)) => x == y,
            // DeepSpeed's `shared_params`: the alias reads the same blocks.
            (Source::Pieces(x), Source::Pieces(y)) => {
                draft.pieces.get(x as usize) == draft.pieces.get(y as usize)
            }
            _ => false,
        };
        if same_storage {
            ties.push(NamedTie {
                names: vec![embedding.clone(), head.to_owned()],
                evidence: TieEvidence::SameStorage,
            });
            continue;
        }
        warnings.push(Warning::HeadKeptWithoutConfig {
            head: head.to_owned(),
            embedding: embedding.clone(),
            identical: same_bytes(draft, held, embedded),
        });
    }
    ties
}

/// Whether two tensors stored as one byte range each hold the same bytes (read
/// until the first difference); `None` when either is stored otherwise or cannot be
/// read (the warning then says "may or may not be tied").
fn same_bytes(draft: &Draft, a: &Tensor, b: &Tensor) -> Option<bool> {
    let range = |t: &Tensor| match t.source {
        Source::Checkpoint(r) | Source::Offload(r) => Some(r),
        _ => None,
    };
    let (x, y) = (range(a)?, range(b)?);
    if x.len != y.len {
        return Some(false);
    }
    crate::formats::input::ranges_equal(
        (&draft.files[x.file].path, x.offset),
        (&draft.files[y.file].path, y.offset),
        x.len,
    )
    .ok()
}

/// The ties transformers' class makes (from the architecture table): every group with
/// a member in the checkpoint, the members the checkpoint leaves out added as tied
/// copies (transformers saves one name of each group). A group that needs
/// `tie_word_embeddings` applies only when the config ties them.
fn table_ties(
    arch: &crate::model::arch::Arch,
    config: &ModelConfig,
    draft: &mut Draft,
    warnings: &mut Vec<Warning>,
) -> Vec<Vec<String>> {
    let mut groups = Vec::new();
    for tie in &arch.ties {
        if tie.needs_tied_word_embeddings && !config.tie_word_embeddings {
            continue;
        }
        // Ties inside repeated blocks (`*`) are not expanded: no shipped model saves
        // them apart.
        if tie.members.iter().any(|m| m.split('.').any(|c| c == "*")) {
            continue;
        }
        let names: Vec<String> = tie
            .members
            .iter()
            .map(|m| checkpoint_name(arch, m, draft))
            .collect();
        // The tensor kept on save: the first member the checkpoint holds (the table
        // lists the one transformers keeps first).
        let Some(kept) = names.iter().find_map(|n| draft.find(n)) else {
            continue;
        };
        let kept_name = draft.tensors[kept].name.to_string();
        // Shapes first: a group with a member of another shape is no tie (and gets no
        // tied copies).
        let mismatched: Vec<&String> = names
            .iter()
            .filter(|n| {
                draft
                    .find(n)
                    .is_some_and(|t| draft.tensors[t].shape != draft.tensors[kept].shape)
            })
            .collect();
        if !mismatched.is_empty() {
            for name in mismatched {
                let t = draft.find(name).unwrap_or(kept);
                warnings.push(Warning::TieShapesDiffer {
                    head: name.clone(),
                    head_shape: format!("{:?}", draft.tensors[t].shape),
                    embedding: kept_name.clone(),
                    embedding_shape: format!("{:?}", draft.tensors[kept].shape),
                });
            }
            continue;
        }
        let mut group = vec![kept_name.clone()];
        for name in names.iter().filter(|n| **n != kept_name) {
            if draft.find(name).is_none() {
                // Inserting shifts ids: find the kept tensor again each time.
                let of = draft.find(&kept_name).unwrap_or(kept);
                add_tied_copy(draft, name, of);
            }
            if !group.contains(name) {
                group.push(name.clone());
            }
        }
        groups.push(group);
    }
    groups
}

/// A runtime name from the architecture table as this checkpoint writes it.
fn checkpoint_name(arch: &crate::model::arch::Arch, runtime: &str, draft: &Draft) -> String {
    if draft.find(runtime).is_some() {
        return runtime.to_owned();
    }
    // The name the architecture saves it under (Gemma 3's head tie is
    // `model.language_model.embed_tokens.weight` at run time,
    // `language_model.model.embed_tokens.weight` in the checkpoint): found there, or
    // the name of the tied copy that stands for it.
    arch.checkpoint_name(runtime)
        .unwrap_or_else(|| runtime.to_owned())
}

fn add_tied_copy(draft: &mut Draft, name: &str, of: usize) {
    let src = &draft.tensors[of];
    let copy = Tensor {
        name: name.into(),
        dtype: src.dtype,
        shape: src.shape.clone(),
        placement: Placement::Cpu,
        map_key: NO_KEY,
        source: Source::None,
        load_dtype: None,
    };
    // Inserted where module order puts it; the caller knows the name is new.
    let at = crate::model::checkpoint::search(&draft.tensors, name).unwrap_or_else(|pos| pos);
    draft.tensors.insert(at, copy);
}

pub(super) fn explicit_tie(
    tied: &str,
    kept: &str,
    draft: &mut Draft,
) -> Result<NamedTie, LoadError> {
    let bad = |message: String| LoadError::BadTie {
        tied: tied.to_owned(),
        kept: kept.to_owned(),
        message,
    };
    if tied == kept {
        return Err(bad("a tensor cannot be tied to itself".into()));
    }
    let Some(k) = draft.find(kept) else {
        return Err(bad(format!("no tensor is named `{kept}`")));
    };
    match draft.find(tied) {
        None => add_tied_copy(draft, tied, k),
        Some(t) => {
            let (a, b) = (&draft.tensors[t], &draft.tensors[k]);
            if a.shape != b.shape || a.dtype != b.dtype {
                return Err(bad(format!(
                    "`{tied}` is {} {:?} but `{kept}` is {} {:?}; tied tensors must match",
                    a.dtype, a.shape, b.dtype, b.shape
                )));
            }
        }
    }
    Ok(NamedTie {
        names: vec![kept.to_owned(), tied.to_owned()],
        evidence: TieEvidence::User,
    })
}

/// Joins groups that share a name; the first group's first name stays first, and so
/// does its evidence.
pub(super) fn merge_groups(groups: Vec<NamedTie>) -> Vec<NamedTie> {
    let mut evidence = Vec::new();
    let mut merged: Vec<Vec<String>> = Vec::new();
    for NamedTie {
        names: group,
        evidence: said,
    } in groups
    {
        let hits: Vec<usize> = merged
            .iter()
            .enumerate()
            .filter(|(_, m)| group.iter().any(|n| m.contains(n)))
            .map(|(i, _)| i)
            .collect();
        if hits.is_empty() {
            let mut g = Vec::new();
            for n in group {
                if !g.contains(&n) {
                    g.push(n);
                }
            }
            merged.push(g);
            evidence.push(said);
            continue;
        }
        let first = hits[0];
        for &i in hits[1..].iter().rev() {
            evidence.remove(i);
            let other = merged.remove(i);
            for n in other {
                if !merged[first].contains(&n) {
                    merged[first].push(n);
                }
            }
        }
        for n in group {
            if !merged[first].contains(&n) {
                merged[first].push(n);
            }
        }
    }
    merged
        .into_iter()
        .zip(evidence)
        .map(|(names, evidence)| NamedTie { names, evidence })
        .collect()
}
