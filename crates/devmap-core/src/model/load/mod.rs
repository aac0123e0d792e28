//! Reading a model directory: weights, config, device map, offload folder and ties.

mod draft;
mod experts;
mod live;
mod readers;
mod ties;

use readers::read_weights;

use crate::formats::Kind;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::formats::FormatError;
use crate::formats::config::{ModelConfig, read_config};
use crate::formats::device_map::{DEVICE_MAP_FILE, read_device_map};
use crate::formats::offload::{OffloadForm, read_offload_folder};
use crate::formats::safetensors::HeaderCache;
use crate::model::checkpoint::{
    ByteRange, Checkpoint, FileId, NO_KEY, Parts, Source, SourceFile, Tensor, place,
};
use crate::model::warning::Warning;
use crate::types::DType;
use crate::types::placement::Placement;
use draft::Draft;
pub use live::{load_live, load_live_saving_to};
use ties::{config_ties, explicit_tie, merge_groups};

/// What the user told devmap beyond the directory.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub device_map: Option<PathBuf>,
    pub offload_folder: Option<PathBuf>,
    /// `--tie A=B`: `A` is the tied copy, `B` the name kept on save.
    pub ties: Vec<(String, String)>,
    /// `--config DIR`: where `config.json` and the other small files come from when
    /// the checkpoint folder has no `config.json` (a training checkpoint).
    pub config_dir: Option<PathBuf>,
    /// `--state-dict-key KEY`: the part of a nested training state dict that is the
    /// model (a torch.distributed.checkpoint folder's `{"model": …, "optimizer": …}`);
    /// `None`: `model` when there is one.
    pub state_dict_key: Option<String>,
    /// Open a model whose weight files are not all readable (a shard cut short): the
    /// tensors a broken shard should hold are kept without data, with a
    /// [`Warning::BrokenFile`], instead of the open failing. For looking (the
    /// inspector, `inspect`); a save refuses tensors without data.
    pub open_broken: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{}", crate::text::not_a_folder(.0))]
    NotADirectory(PathBuf),
    #[error(
        "no weights in {}: expected model.safetensors, model.safetensors.index.json, *.safetensors, pytorch_model.bin, pytorch_model.bin.index.json or a torch.distributed.checkpoint folder (.metadata)",
        .0.display()
    )]
    NoWeights(PathBuf),
    #[error("{}: {}", crate::text::path(path), crate::text::escaped(message))]
    Conflict { path: PathBuf, message: String },
    #[error("--tie {tied}={kept}: {message}")]
    BadTie {
        tied: String,
        kept: String,
        message: String,
    },
}

/// Reads the model directory `dir`.
pub fn load(dir: &Path, options: &LoadOptions) -> Result<Checkpoint, LoadError> {
    if !dir.is_dir() {
        return Err(LoadError::NotADirectory(dir.to_path_buf()));
    }
    let mut warnings = Vec::new();
    let own_config = dir.join("config.json");
    // Present in any form (a folder or FIFO named config.json is an error, not absent).
    let exists = |p: &Path| std::fs::symlink_metadata(p).is_ok();
    // `--config DIR` stands in for a checkpoint folder without a config.json.
    let mut config_dir = options.config_dir.clone().filter(|_| !exists(&own_config));
    let config_path = match &config_dir {
        Some(other) => {
            let path = other.join("config.json");
            if !exists(&path) {
                return Err(LoadError::Format(FormatError::invalid_as(
                    Kind::Missing,
                    other,
                    "has no config.json; --config names the folder a model's config.json is in",
                )));
            }
            path
        }
        None => own_config,
    };
    let mut config = if exists(&config_path) {
        read_config(&config_path)?
    } else {
        ModelConfig::absent()
    };
    for (key, found, expected) in &config.mistyped {
        warnings.push(Warning::ConfigValue {
            file: config_path.clone(),
            key: key.clone(),
            found: found.clone(),
            expected,
        });
    }

    let mut draft = Draft {
        replaced: Vec::new(),
        tensors: Vec::new(),
        files: Vec::new(),
        file_ids: HashMap::new(),
        pieces: Vec::new(),
    };
    let offload_dir = match &options.offload_folder {
        Some(p) if !p.is_dir() => Err(LoadError::NotADirectory(p.clone())),
        Some(p) => Ok(Some(p.clone())),
        None => Ok(Some(dir.join("offload")).filter(|p| p.is_dir())),
    };
    // The offload folder is read on a thread of its own while the checkpoint's headers
    // are read here: both are mostly system calls on one core each (listing, index,
    // one look at each of 23,000 `.dat` files), and neither needs the other.
    let (weight_files, offload) = std::thread::scope(|scope| {
        let offload = match &offload_dir {
            Ok(Some(folder)) => Some(
                scope.spawn(move || read_offload_folder(folder, dir, &mut HeaderCache::default())),
            ),
            _ => None,
        };
        let given = config.present.then_some(&config.raw);
        let weights = read_weights(dir, options, given, &mut draft, &mut warnings);
        let offload = offload.map(|reading| {
            reading
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        (weights, offload)
    });
    let (weight_files, generated) = weight_files?;
    // A training checkpoint's own config.json, written by its reader (a Megatron-Core
    // checkpoint's, from its training arguments): read as if the folder held it.
    let mut generated_config = None;
    if let Some(text) = generated {
        let folder = crate::model::checkpoint::GeneratedConfig::write(&text)
            .map_err(|e| FormatError::io(std::env::temp_dir(), e))?;
        config = read_config(&folder.dir.join("config.json"))?;
        config_dir = Some(folder.dir.clone());
        generated_config = Some(std::sync::Arc::new(folder));
    }
    draft.resort()?;
    let offload_dir = offload_dir?;

    let mut shared_offload: HashMap<(FileId, u64), Vec<String>> = HashMap::new();
    let mut offload_links = None;
    let arch = crate::model::arch::lookup(&config.architectures);
    if let Some(read) = offload.transpose()? {
        offload_links = Some(read.links);
        let sorted = in_module_order(read.entries);
        // Both lists are in module order: walk them together (a search per entry is
        // a second per 100k entries on a big offload folder).
        let mut at = 0;
        let mut added = Vec::new();
        // Entries stored in one dtype that the model holds in another, grouped by
        // that pair: an export writes every tensor so, and one line says it.
        let mut load_dtypes: BTreeMap<(DType, DType), Vec<String>> = BTreeMap::new();
        for mut entry in sorted {
            while at < draft.tensors.len()
                && super::names::module_order(&draft.tensors[at].name, &entry.name).is_lt()
            {
                at += 1;
            }
            let held = if draft
                .tensors
                .get(at)
                .is_some_and(|t| *t.name == *entry.name)
            {
                Some(at)
            } else {
                // transformers 5 offloads under the names the loaded model has: an
                // entry for a tensor the checkpoint saves under another name is that
                // tensor's value.
                arch.and_then(|arch| arch.checkpoint_name(&entry.name))
                    .and_then(|name| Some((draft.find(&name)?, name)))
                    .map(|(i, name)| {
                        entry.name = name;
                        i
                    })
            };
            let file = match (entry.form, entry.file_stat) {
                // One `.dat` per tensor: no other entry shares its file.
                (OffloadForm::Dat, Some((len, modified))) => {
                    draft.push_file(&entry.file, len, modified)
                }
                _ => draft.plain_file_id(&entry.file),
            };
            let range = ByteRange {
                file,
                offset: entry.offset,
                len: entry.len,
            };
            if entry.form == OffloadForm::IndexedSafetensors {
                shared_offload
                    .entry((file, entry.offset))
                    .or_default()
                    .push(entry.name.clone());
            }
            if let Some(load_dtype) = entry.load_dtype {
                load_dtypes
                    .entry((entry.dtype, load_dtype))
                    .or_default()
                    .push(entry.name.clone());
            }
            if let Some(i) = held {
                let t = &mut draft.tensors[i];
                if let Source::Checkpoint(old) = t.source {
                    draft.replaced.push((t.name.to_string(), old, t.dtype));
                }
                if !t.shape.iter().eq(entry.shape.iter().copied()) {
                    warnings.push(Warning::OffloadShapeDiffers {
                        tensor: t.name.to_string(),
                        offload_shape: format!("{:?}", entry.shape),
                        checkpoint_shape: format!("{:?}", t.shape),
                    });
                }
                t.dtype = entry.dtype;
                t.shape = entry.shape.into();
                t.source = Source::Offload(range);
                t.load_dtype = entry.load_dtype;
            } else if let Some(pieces) = experts::unfuse(
                &mut draft,
                (&entry.name, &|n: &str| {
                    arch.and_then(|a| a.checkpoint_name(n))
                }),
                &entry.shape,
                entry.dtype,
                range,
                entry.load_dtype,
            ) {
                warnings.push(Warning::ExpertsUnfused {
                    fused: entry.name.clone(),
                    experts: pieces,
                });
            } else {
                added.push(Tensor {
                    name: entry.name.into(),
                    dtype: entry.dtype,
                    shape: entry.shape.into(),
                    placement: Placement::Cpu,
                    map_key: NO_KEY,
                    source: Source::Offload(range),
                    load_dtype: entry.load_dtype,
                });
            }
        }
        for ((stored, load), tensors) in load_dtypes {
            warnings.push(Warning::OffloadLoadDtype {
                tensors,
                stored,
                load,
                folder: offload_dir.clone().unwrap_or_else(|| dir.to_path_buf()),
            });
        }
        if !added.is_empty() {
            let converted = converted_experts(&draft.tensors, &added);
            if !converted.is_empty() {
                warnings.push(Warning::ConvertedLayout { tensors: converted });
            }
            draft.tensors.append(&mut added);
            draft.resort()?;
        }
    }
    if draft.tensors.is_empty() {
        return Err(LoadError::NoWeights(dir.to_path_buf()));
    }

    let device_map_path = options
        .device_map
        .clone()
        .or_else(|| Some(dir.join(DEVICE_MAP_FILE)).filter(|p| exists(p)));
    // The map is optional: one found beside the weights that cannot be read is a
    // warning, and the model opens without it; one the user named is an error.
    let (device_map, device_map_path) = match device_map_path {
        Some(p) => match read_device_map(&p) {
            Ok(map) => (Some(map), Some(p)),
            Err(e) if options.device_map.is_none() => {
                warnings.push(Warning::DeviceMapUnreadable {
                    file: p,
                    why: e.to_string(),
                });
                (None, None)
            }
            Err(e) => return Err(e.into()),
        },
        None => (None, None),
    };

    let mut ties = config_ties(&config, &mut draft, device_map.as_ref(), &mut warnings);
    for (tied, kept) in &options.ties {
        ties.push(explicit_tie(tied, kept, &mut draft)?);
    }
    let ties = merge_groups(ties);
    // A --tie answers what a missing config.json left open.
    warnings.retain(|w| match w {
        Warning::HeadTieUnknown { head, .. } | Warning::HeadKeptWithoutConfig { head, .. } => {
            !ties.iter().any(|g| g.names.contains(head))
        }
        _ => true,
    });
    // Offload entries that point at the same bytes are a hint, not a tie: zeros are
    // identical without being tied. Unless the config or --tie ties them, both are
    // saved, with a warning.
    let mut shared: Vec<Vec<String>> = shared_offload
        .into_values()
        .filter(|names| names.len() > 1)
        .filter(|names| {
            !ties
                .iter()
                .any(|g| names.iter().all(|n| g.names.contains(n)))
        })
        .collect();
    shared.sort();
    for tensors in shared {
        warnings.push(Warning::SharedOffloadBytes { tensors });
    }

    for t in &mut draft.tensors {
        let (placement, key) = place(device_map.as_ref(), &t.name, arch);
        t.placement = placement;
        t.map_key = key;
    }

    let listed = offload_dir.as_deref().zip(offload_links.as_ref());
    note_symlinks(
        dir,
        &draft.files,
        offload_dir.as_deref(),
        listed,
        &mut warnings,
    );
    let mut ckpt = Checkpoint::assemble(Parts {
        dir: dir.to_path_buf(),
        files: draft.files,
        tensors: draft.tensors,
        ties,
        device_map,
        device_map_path,
        offload_dir,
        config,
        weight_files,
        config_dir,
        warnings,
        replaced: draft.replaced,
        pieces: draft.pieces,
    });
    ckpt.generated_config = generated_config;
    ckpt.side_dirs = crate::formats::nemo::side_dirs(dir);
    Ok(ckpt)
}

/// Offload-only entries in transformers 5's fused-expert layout (`….experts.gate_up_proj`,
/// 3-D, no expert index) when the checkpoint stores experts one by one
/// (`….experts.7.w1.weight`): the same weights under two layouts.
fn converted_experts(checkpoint: &[Tensor], added: &[Tensor]) -> Vec<String> {
    let per_expert = |name: &str| {
        name.split(".experts.")
            .nth(1)
            .and_then(|rest| rest.split('.').next())
            .is_some_and(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))
    };
    if !checkpoint.iter().any(|t| per_expert(&t.name)) {
        return Vec::new();
    }
    added
        .iter()
        .filter(|t| t.shape.len() == 3 && t.name.contains(".experts.") && !per_expert(&t.name))
        .map(|t| t.name.to_string())
        .collect()
}

/// Inputs reached through a symlink that leads outside the model directory are
/// followed (that is how HF caches lay models out) but named, so a user knows which
/// files the save reads.
/// `listed`: a folder whose symlinks are known already (the offload folder, from the
/// listing its reader made).
fn note_symlinks(
    dir: &Path,
    files: &[SourceFile],
    offload: Option<&Path>,
    listed: Option<(&Path, &HashSet<std::ffi::OsString>)>,
    warnings: &mut Vec<Warning>,
) {
    let Ok(root) = dir.canonicalize() else { return };
    // A Hugging Face cache snapshot is made of symlinks into the repo's own `blobs/`:
    // that is its layout, not news.
    let snapshot = crate::formats::hub_cache::is_snapshot(dir);
    let blobs = snapshot
        .then(|| dir.join("../../blobs").canonicalize().ok())
        .flatten();
    let mut outside = Vec::new();
    // The snapshot folder itself a symlink out of its repo's cache folder: followed,
    // and said (the files then come from wherever it points).
    let repo_folder = dir.parent().and_then(Path::parent);
    if snapshot
        && std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink())
        && let Some(repo) = repo_folder.and_then(|f| f.canonicalize().ok())
        && !root.starts_with(&repo)
    {
        outside.push(format!(
            "{} -> {} (the cache snapshot itself, outside {})",
            dir.display(),
            root.display(),
            repo.display()
        ));
    }
    let candidates = files.iter().map(|f| f.path.as_path()).chain(offload);
    // Whether a folder inside the model leads outside it, resolved once per folder:
    // an offload folder holds tens of thousands of files, and resolving a path is a
    // dozen system calls.
    // (Keyed by the folder's bytes: hashing a `Path` walks its components.)
    let mut leads_out: HashMap<&std::ffi::OsStr, bool> = HashMap::new();
    // The links in each folder, from one listing of it (the listing says which entries
    // are links without a system call per file).
    let mut links_in: HashMap<&std::ffi::OsStr, Option<HashSet<std::ffi::OsString>>> =
        HashMap::new();
    let known = listed.map(|(folder, links)| (folder.as_os_str(), links));
    // The folder of the path before, and what was found of it: files come folder by
    // folder (23,000 `.dat` files in a row), so most paths need no lookup at all.
    let mut last: Option<(&std::ffi::OsStr, bool)> = None;
    for path in candidates {
        let Some((folder, name)) = path.parent().zip(path.file_name()) else {
            continue;
        };
        let folder_key = folder.as_os_str();
        let parent_link = match last {
            Some((f, leads)) if f == folder_key => leads,
            _ => {
                let leads = *leads_out.entry(folder_key).or_insert_with(|| {
                    folder.canonicalize().is_ok_and(|c| !c.starts_with(&root))
                        && folder.starts_with(dir)
                });
                last = Some((folder_key, leads));
                leads
            }
        };
        let links = match known {
            Some((f, links)) if f == folder_key => Some(links),
            _ => links_in
                .entry(folder_key)
                .or_insert_with(|| symlinks_in(folder))
                .as_ref(),
        };
        let is_link = match links {
            Some(links) => links.contains(name),
            None => std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()),
        };
        if !(is_link || parent_link) {
            continue;
        }
        if let Ok(target) = path.canonicalize()
            && !target.starts_with(&root)
            && !blobs.as_ref().is_some_and(|b| target.starts_with(b))
        {
            outside.push(format!("{} -> {}", path.display(), target.display()));
        }
    }
    if !outside.is_empty() {
        warnings.push(Warning::SymlinksOutside {
            dir: dir.to_path_buf(),
            files: outside,
        });
    }
}

/// Offload entries in module order (as the checkpoint's tensors are).
fn in_module_order(
    mut entries: Vec<crate::formats::offload::OffloadEntry>,
) -> Vec<crate::formats::offload::OffloadEntry> {
    // accelerate writes its index in the order of the state dict: usually sorted.
    if entries.is_sorted_by(|a, b| super::names::module_order(&a.name, &b.name).is_le()) {
        return entries;
    }
    let keys: Vec<_> = entries
        .iter()
        .map(|e| super::names::order_key(&e.name))
        .collect();
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
    drop(keys);
    let mut slots: Vec<Option<_>> = entries.drain(..).map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

/// The names of the symlinks in `folder`, or `None` when it cannot be listed.
fn symlinks_in(folder: &Path) -> Option<std::collections::HashSet<std::ffi::OsString>> {
    let mut links = std::collections::HashSet::new();
    for entry in std::fs::read_dir(folder).ok()? {
        let entry = entry.ok()?;
        if entry.file_type().ok()?.is_symlink() {
            links.insert(entry.file_name());
        }
    }
    Some(links)
}
