//! Everything devmap warns about, as data: a kind, the names involved and the facts
//! the sentence needs. The one place that turns a warning into words is the
//! `Display` impl below; the TUI, `inspect` and `save` all print through it, and
//! `--json` carries the kind and the names as well.

use std::fmt;
use std::path::PathBuf;

use crate::text::count;
use crate::types::DType;
use crate::types::placement::Placement;

/// Names listed in a message before "and N more".
const LIST_LIMIT: usize = 5;

/// Up to `LIST_LIMIT` names in backticks, then how many more.
pub fn name_list<S: AsRef<str>>(names: &[S]) -> String {
    let mut out = names
        .iter()
        .take(LIST_LIMIT)
        .map(|n| format!("`{}`", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > LIST_LIMIT {
        out.push_str(&format!(" and {} more", names.len() - LIST_LIMIT));
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// Transformers offload entries stored in one dtype that the model loads as
    /// another: one warning for each (stored, loaded) pair, naming every entry.
    OffloadLoadDtype {
        tensors: Vec<String>,
        stored: DType,
        load: DType,
        folder: PathBuf,
    },
    /// A shard holds a tensor the index maps to another shard.
    IndexPointsElsewhere { file: PathBuf, tensor: String },
    /// A shard holds a tensor the index does not list.
    NotInIndex { file: PathBuf, tensor: String },
    /// The config ties the embeddings, but the head's shape differs.
    TieShapesDiffer {
        head: String,
        head_shape: String,
        embedding: String,
        embedding_shape: String,
    },
    /// Inputs read through symlinks that leave the model directory.
    SymlinksOutside { dir: PathBuf, files: Vec<String> },
    /// Tensors no device-map entry covers.
    Unmapped { tensors: Vec<String> },
    /// Members of one tie group on different devices.
    TiedAcrossDevices { members: Vec<(String, Placement)> },
    /// Offload entries of tensors the map does not put on disk.
    OffloadNotOnDisk { tensors: Vec<(String, Placement)> },
    /// Tensors on disk with no offload entry.
    DiskWithoutOffload {
        tensors: Vec<String>,
        offload_dir: Option<PathBuf>,
    },
    /// Tensors with no data anywhere.
    NoData { tensors: Vec<(String, Placement)> },
    /// Device-map keys that match no tensor.
    UnusedMapKeys { keys: Vec<String> },
    /// Tensors transformers 5's key matching places elsewhere than accelerate's.
    Transformers5Placement {
        count: usize,
        key: String,
        ours: Placement,
        theirs: Placement,
        their_key: String,
    },
    /// An offload entry's shape differs from the checkpoint's for the same tensor.
    OffloadShapeDiffers {
        tensor: String,
        offload_shape: String,
        checkpoint_shape: String,
    },
    /// Offload entries that point at the same bytes, with no tie between them.
    SharedOffloadBytes { tensors: Vec<String> },
    /// An offload entry in transformers 5's fused-expert layout, read back as the
    /// checkpoint's per-expert tensors (a note: nothing is wrong).
    ExpertsUnfused { fused: String, experts: Vec<String> },
    /// A config.json key whose value has the wrong type (`"torch_dtype": 5`): ignored,
    /// as transformers would not read it either.
    ConfigValue {
        file: PathBuf,
        key: String,
        found: String,
        expected: &'static str,
    },
    /// Offload entries in transformers 5's converted layout (fused experts under runtime
    /// names) where the checkpoint stores experts one by one: a save would write both.
    ConvertedLayout { tensors: Vec<String> },
    /// What a training checkpoint holds besides the model's weights, left out of the
    /// model (a note: nothing is wrong).
    LeftOut { file: PathBuf, entries: Vec<String> },
    /// A weight file that cannot be read whole (cut short by a download, overwritten):
    /// the model opened without the tensors it should hold (`unreadable`, no data),
    /// which a save refuses.
    BrokenFile {
        file: PathBuf,
        problem: String,
        unreadable: Vec<String>,
    },
    /// A tensor stored in chunks across ranks that do not make it up exactly once.
    PiecesDoNotTile {
        tensor: String,
        chunks: usize,
        problem: String,
    },
    /// No config.json, and the checkpoint holds both an output head and an input
    /// embedding of one shape: nothing says they are tied, so both are kept.
    /// `identical`: whether their bytes are the same (`None`: not compared).
    HeadKeptWithoutConfig {
        head: String,
        embedding: String,
        identical: Option<bool>,
    },
    /// No config.json, and the device map places an output head the checkpoint does
    /// not hold: only a tie to the embedding could give it a value, and nothing says
    /// so. A save refuses.
    HeadTieUnknown { head: String, embedding: String },
    /// The folder's device_map.json cannot be read: the model opened without a map.
    DeviceMapUnreadable { file: PathBuf, why: String },
    /// A device holds more than its budget.
    OverBudget {
        device: Placement,
        bytes: u64,
        budget: u64,
    },
}

impl Warning {
    /// A stable name for `--json`.
    pub fn kind(&self) -> &'static str {
        match self {
            Warning::OffloadLoadDtype { .. } => "offload_load_dtype",
            Warning::IndexPointsElsewhere { .. } => "index_points_elsewhere",
            Warning::NotInIndex { .. } => "not_in_index",
            Warning::TieShapesDiffer { .. } => "tie_shapes_differ",
            Warning::SymlinksOutside { .. } => "symlinks_outside",
            Warning::Unmapped { .. } => "unmapped",
            Warning::TiedAcrossDevices { .. } => "tied_across_devices",
            Warning::OffloadNotOnDisk { .. } => "offload_not_on_disk",
            Warning::DiskWithoutOffload { .. } => "disk_without_offload",
            Warning::NoData { .. } => "no_data",
            Warning::UnusedMapKeys { .. } => "unused_map_keys",
            Warning::Transformers5Placement { .. } => "transformers5_placement",
            Warning::OverBudget { .. } => "over_budget",
            Warning::OffloadShapeDiffers { .. } => "offload_shape_differs",
            Warning::SharedOffloadBytes { .. } => "shared_offload_bytes",
            Warning::ConvertedLayout { .. } => "converted_layout",
            Warning::ExpertsUnfused { .. } => "experts_unfused",
            Warning::ConfigValue { .. } => "config_value",
            Warning::PiecesDoNotTile { .. } => "pieces_do_not_tile",
            Warning::LeftOut { .. } => "left_out",
            Warning::BrokenFile { .. } => "broken_file",
            Warning::HeadKeptWithoutConfig { .. } => "head_kept_without_config",
            Warning::HeadTieUnknown { .. } => "head_tie_unknown",
            Warning::DeviceMapUnreadable { .. } => "device_map_unreadable",
        }
    }

    /// Every tensor, key, file or device the warning is about (the text lists only
    /// the first few).
    pub fn names(&self) -> Vec<String> {
        let paired = |v: &[(String, Placement)]| v.iter().map(|(n, _)| n.clone()).collect();
        match self {
            Warning::IndexPointsElsewhere { tensor, .. }
            | Warning::NotInIndex { tensor, .. }
            | Warning::OffloadShapeDiffers { tensor, .. }
            | Warning::PiecesDoNotTile { tensor, .. } => vec![tensor.clone()],
            Warning::TieShapesDiffer {
                head, embedding, ..
            }
            | Warning::HeadKeptWithoutConfig {
                head, embedding, ..
            }
            | Warning::HeadTieUnknown { head, embedding } => vec![head.clone(), embedding.clone()],
            Warning::SymlinksOutside { files, .. } => files.clone(),
            Warning::Unmapped { tensors }
            | Warning::OffloadLoadDtype { tensors, .. }
            | Warning::DiskWithoutOffload { tensors, .. }
            | Warning::SharedOffloadBytes { tensors }
            | Warning::ConvertedLayout { tensors } => tensors.clone(),
            Warning::ConfigValue { key, .. } => vec![key.clone()],
            Warning::LeftOut { entries, .. } => entries.clone(),
            Warning::BrokenFile { unreadable, .. } => unreadable.clone(),
            Warning::ExpertsUnfused { fused, experts } => std::iter::once(fused.clone())
                .chain(experts.iter().cloned())
                .collect(),
            Warning::TiedAcrossDevices { members } => paired(members),
            Warning::OffloadNotOnDisk { tensors } | Warning::NoData { tensors } => paired(tensors),
            Warning::UnusedMapKeys { keys } => keys.clone(),
            Warning::Transformers5Placement { key, their_key, .. } => {
                vec![key.clone(), their_key.clone()]
            }
            Warning::OverBudget { device, .. } => vec![device.to_string()],
            Warning::DeviceMapUnreadable { file, .. } => vec![file.display().to_string()],
        }
    }
}

fn with_device(items: &[(String, Placement)]) -> Vec<String> {
    items.iter().map(|(n, p)| format!("{n} ({p})")).collect()
}

impl fmt::Display for Warning {
    /// A warning is one line; the names in it come from files, so the whole line is
    /// escaped (see [`crate::text`]) before it reaches anyone.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = String::new();
        self.write_raw(&mut line)?;
        f.write_str(&crate::text::escaped(&line))
    }
}

impl Warning {
    fn write_raw(&self, f: &mut String) -> fmt::Result {
        use std::fmt::Write;
        match self {
            Warning::OffloadLoadDtype {
                tensors,
                stored,
                load,
                folder,
            } => write!(
                f,
                "{} in {} {} stored as {stored} but the index says the model holds {} as {}: {} (devmap reads the stored {stored}; the save's dtype lines say what is written)",
                count(tensors.len(), "offload entry", "offload entries"),
                folder.display(),
                if tensors.len() == 1 { "is" } else { "are" },
                if tensors.len() == 1 { "it" } else { "them" },
                load.torch_name(),
                name_list(tensors)
            ),
            Warning::IndexPointsElsewhere { file, tensor } => write!(
                f,
                "{} also holds `{tensor}`, which the index maps to another shard; using the index's",
                file.display()
            ),
            Warning::NotInIndex { file, tensor } => write!(
                f,
                "{} holds `{tensor}`, which {} does not list; transformers loads it anyway, so devmap keeps it",
                file.display(),
                crate::formats::hf_index::INDEX_FILE
            ),
            Warning::TieShapesDiffer {
                head,
                head_shape,
                embedding,
                embedding_shape,
            } => write!(
                f,
                "config.json ties word embeddings, but `{head}` {head_shape} and `{embedding}` {embedding_shape} differ in shape; not tied"
            ),
            Warning::SymlinksOutside { dir, files } => write!(
                f,
                "{} outside {}, reached through symlinks, and read from there: {}",
                count(files.len(), "input lies", "inputs lie"),
                dir.display(),
                name_list(files)
            ),
            Warning::Unmapped { tensors } => write!(
                f,
                "{} covered by no device-map entry (unmapped): {}; accelerate would fail to dispatch them, add a key for their module or \"\"",
                count(tensors.len(), "tensor is", "tensors are"),
                name_list(tensors)
            ),
            Warning::TiedAcrossDevices { members } => {
                let parts: Vec<String> = members
                    .iter()
                    .map(|(n, p)| format!("`{n}` on {p}"))
                    .collect();
                write!(
                    f,
                    "tied weights are on different devices: {}; accelerate warns and copies them, put their modules on one device",
                    parts.join(", ")
                )
            }
            Warning::OffloadNotOnDisk { tensors } => write!(
                f,
                "{} to tensors the device map does not put on disk: {}; devmap still treats the offload value as current",
                count(
                    tensors.len(),
                    "offload-folder entry belongs",
                    "offload-folder entries belong"
                ),
                name_list(&with_device(tensors))
            ),
            Warning::DiskWithoutOffload {
                tensors,
                offload_dir,
            } => {
                let folder = match offload_dir {
                    Some(d) => format!("the offload folder {} has no entry for them", d.display()),
                    None => "there is no offload folder (give --offload-folder)".to_owned(),
                };
                write!(
                    f,
                    "{} placed on disk but {folder}: {}; their checkpoint bytes are used",
                    count(tensors.len(), "tensor is", "tensors are"),
                    name_list(tensors)
                )
            }
            Warning::NoData { tensors } => write!(
                f,
                "{} no data anywhere, neither in the checkpoint, the offload folder nor a tie partner: {}; they can be inspected but not loaded or saved",
                count(tensors.len(), "tensor has", "tensors have"),
                name_list(&with_device(tensors))
            ),
            Warning::UnusedMapKeys { keys } => write!(
                f,
                "{} no tensor: {}; check for typos or a map from another model",
                count(
                    keys.len(),
                    "device-map key matches",
                    "device-map keys match"
                ),
                name_list(keys)
            ),
            Warning::Transformers5Placement {
                count: count_of,
                key,
                ours,
                theirs,
                their_key,
            } => write!(
                f,
                "transformers 5 puts {} that key `{key}` places on {ours} on {theirs} instead, by key `{their_key}`: it matches keys as regex prefixes with no dot boundary; rename or add keys so both agree",
                count(*count_of, "tensor", "tensors")
            ),
            Warning::OffloadShapeDiffers {
                tensor,
                offload_shape,
                checkpoint_shape,
            } => write!(
                f,
                "offload entry `{tensor}` has shape {offload_shape} but the checkpoint's is {checkpoint_shape}; devmap saves the offload value with its shape"
            ),
            Warning::SharedOffloadBytes { tensors } => write!(
                f,
                "{} offload entries point at the same bytes: {}; they are not tied unless config.json or --tie says so, so each is saved (tie them with --tie to write one)",
                tensors.len(),
                name_list(tensors)
            ),
            Warning::ConfigValue {
                file,
                key,
                found,
                expected,
            } => write!(
                f,
                "{}: `{key}` is {found}, not {expected}; it is ignored",
                file.display()
            ),
            Warning::ExpertsUnfused { fused, experts } => write!(
                f,
                "offload entry `{fused}` is transformers 5's fused layout of {} checkpoint tensors ({}): each takes its current value from its slice of it",
                experts.len(),
                name_list(experts)
            ),
            Warning::ConvertedLayout { tensors } => write!(
                f,
                "{} offload entries hold fused experts under transformers 5's runtime names ({}) while the checkpoint stores its experts one by one: devmap cannot convert them back yet, so they count twice in the totals and a save is refused (save with transformers, or without this offload folder)",
                tensors.len(),
                name_list(tensors)
            ),
            Warning::BrokenFile {
                file,
                problem,
                unreadable,
            } => write!(
                f,
                "{} cannot be read whole ({problem}): opened without its {} (no data: a save refuses them until the file is downloaded again): {}",
                file.display(),
                count(unreadable.len(), "tensor", "tensors"),
                name_list(unreadable)
            ),
            Warning::LeftOut { file, entries } => write!(
                f,
                "{} also holds what is not the model's weights, left out (never written): {}",
                file.display(),
                entries.join(", ")
            ),
            Warning::PiecesDoNotTile {
                tensor,
                chunks,
                problem,
            } => write!(
                f,
                "`{tensor}` is stored in {} across ranks that do not make it up: {problem}; a save refuses it",
                count(*chunks, "chunk", "chunks")
            ),
            Warning::HeadKeptWithoutConfig {
                head,
                embedding,
                identical,
            } => {
                let how = match identical {
                    Some(true) => "holds the same bytes as",
                    Some(false) => "differs from",
                    None => "may or may not be tied to",
                };
                write!(
                    f,
                    "no config.json: `{head}` {how} `{embedding}`, and nothing says they are tied, so both are kept; --config DIR reads the model's config.json (its tie_word_embeddings decides), --tie {head}={embedding} writes one"
                )
            }
            Warning::DeviceMapUnreadable { file, why } => write!(
                f,
                "{} cannot be read, so the model is shown without a device map (everything on cpu): {why}; fix the file, or name another with --device-map",
                file.display()
            ),
            Warning::HeadTieUnknown { head, embedding } => write!(
                f,
                "the device map places `{}` but the checkpoint holds no `{head}`, and there is no config.json to say it is tied to `{embedding}`; a save refuses: pass --config DIR (the model's config.json) or --tie {head}={embedding}",
                head.trim_end_matches(".weight")
            ),
            Warning::OverBudget {
                device,
                bytes,
                budget,
            } => write!(
                f,
                "{device} holds {} but its budget is {}: {} over; move modules off it (d in the TUI) or re-plan",
                crate::human_bytes(*bytes),
                crate::human_bytes(*budget),
                crate::human_bytes(bytes.saturating_sub(*budget))
            ),
        }
    }
}
