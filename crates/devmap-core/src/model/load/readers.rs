//! Which format a model folder is (the table of readers: a model's own weights, in
//! transformers' order, and at most one training format), and reading its weights
//! into the draft checkpoint the loader then places and ties.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::draft::Draft;
use super::{LoadError, LoadOptions};
use crate::formats::FormatError;
use crate::formats::Kind;
use crate::formats::hf_index::{INDEX_FILE, SINGLE_FILE, parse_index, read_index_text};
use crate::formats::safetensors::read_header;
use crate::model::checkpoint::{ByteRange, FileId, NO_KEY, Source, Tensor};
use crate::model::warning::Warning;
use crate::types::placement::Placement;

/// How a folder holds a model's weights: what [`detect_layout`] finds.
#[derive(Debug)]
enum Layout {
    /// `model.safetensors.index.json` or `pytorch_model.bin.index.json` and its shards.
    Index(PathBuf),
    /// Weight files read one by one: `model.safetensors`, other `*.safetensors`, or
    /// `pytorch_model.bin`.
    Files(Vec<PathBuf>),
    /// transformers 5's distributed checkpoint: every rank's safetensors files, the
    /// same names in each, put together from their blocks.
    RankFiles(Vec<PathBuf>),
    /// A torch.distributed.checkpoint folder (`.metadata` and its `.distcp` files).
    Dcp(PathBuf),
    /// A DeepSpeed ZeRO checkpoint (`latest` and its step folder, or the step folder).
    DeepSpeed,
    /// A Megatron-Core distributed checkpoint (a DCP folder with Megatron's
    /// `metadata.json` and `common.pt`).
    Megatron(PathBuf),
    /// A NeMo 2 checkpoint: a Megatron-Core checkpoint in `weights/` (its `.metadata`
    /// here), the model's configuration in `context/model.yaml`.
    Nemo(PathBuf),
    /// verl's FSDP checkpoint: every rank's `model_world_size_N_rank_K.pt`, in rank
    /// order.
    Verl(Vec<PathBuf>),
}

/// Whether a folder holds a format, and where: a row of [`READERS`].
type Detect = fn(&Path) -> Result<Option<Layout>, LoadError>;

/// The formats a folder is asked about, in the order transformers' loader takes them
/// (safetensors before `.bin`, an index before its files); the training formats come
/// after the model's and may not both be there. A new format is a row here and an
/// arm in [`read_layout`].
const READERS: &[(&str, Detect)] = &[
    ("a safetensors index", |dir| {
        let index = dir.join(INDEX_FILE);
        Ok(exists(&index).then_some(Layout::Index(index)))
    }),
    ("safetensors files", |dir| {
        let single = dir.join(SINGLE_FILE);
        if exists(&single) {
            return Ok(Some(Layout::Files(vec![single])));
        }
        let files = crate::formats::input::safetensors_files(dir)?;
        let is_rank_file = |p: &PathBuf| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(crate::formats::rank_files::is_rank_file_name)
        };
        Ok(match files.is_empty() {
            true => None,
            false if files.iter().all(is_rank_file) => Some(Layout::RankFiles(files)),
            false => Some(Layout::Files(files)),
        })
    }),
    ("a pytorch_model.bin index", |dir| {
        let index = dir.join(crate::formats::torch_bin::BIN_INDEX);
        Ok(exists(&index).then_some(Layout::Index(index)))
    }),
    ("pytorch_model.bin", |dir| {
        let bin = dir.join(crate::formats::torch_bin::SINGLE_BIN);
        Ok(exists(&bin).then(|| Layout::Files(vec![bin])))
    }),
];

/// The training formats: at most one of them may be in a folder without model
/// weights (both is an error naming them).
const TRAINING_READERS: &[(&str, Detect)] = &[
    (
        "a Megatron-Core distributed checkpoint (metadata.json)",
        |dir| {
            let metadata = dir.join(crate::formats::dcp::METADATA);
            Ok(
                (exists(&metadata) && crate::formats::megatron::is_megatron(dir))
                    .then_some(Layout::Megatron(metadata)),
            )
        },
    ),
    (
        "a NeMo 2 checkpoint (weights/ and context/model.yaml)",
        |dir| {
            Ok(crate::formats::nemo::is_nemo(dir).then(|| {
                Layout::Nemo(
                    dir.join(crate::formats::nemo::WEIGHTS)
                        .join(crate::formats::dcp::METADATA),
                )
            }))
        },
    ),
    ("a torch.distributed.checkpoint (.metadata)", |dir| {
        let metadata = dir.join(crate::formats::dcp::METADATA);
        // Megatron's is read by its own row.
        Ok(
            (exists(&metadata) && !crate::formats::megatron::is_megatron(dir))
                .then_some(Layout::Dcp(metadata)),
        )
    }),
    ("a DeepSpeed ZeRO checkpoint", |dir| {
        Ok(crate::formats::deepspeed::step_folder(dir).map(|_| Layout::DeepSpeed))
    }),
    (
        "verl's FSDP rank files (model_world_size_N_rank_K.pt)",
        |dir| Ok(crate::formats::verl::rank_files(dir)?.map(Layout::Verl)),
    ),
];

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// How `dir` holds its weights: the first of [`READERS`] that finds them, else the one
/// training format that does; `None`: none.
fn detect_layout(dir: &Path) -> Result<Option<Layout>, LoadError> {
    for (_, detect) in READERS {
        if let Some(layout) = detect(dir)? {
            return Ok(Some(layout));
        }
    }
    let mut found = Vec::new();
    for (name, detect) in TRAINING_READERS {
        if let Some(layout) = detect(dir)? {
            found.push((*name, layout));
        }
    }
    if let [(first, _), (second, _), ..] = found.as_slice() {
        return Err(LoadError::Conflict {
            path: dir.to_path_buf(),
            message: format!(
                "holds both {first} and {second}: which one is the model is not clear; move one of them to its own folder"
            ),
        });
    }
    Ok(found.pop().map(|(_, layout)| layout))
}

/// What reading the weights gives: the files that make them up (shards and index),
/// and the config.json a training checkpoint's reader wrote, when it wrote one.
type Weights = (Vec<PathBuf>, Option<String>);

/// Finds and reads the checkpoint's weights. `config` is the config.json read (the
/// folder's or `--config`'s), when there is one.
pub(super) fn read_weights(
    dir: &Path,
    options: &LoadOptions,
    config: Option<&serde_json::Value>,
    draft: &mut Draft,
    warnings: &mut Vec<Warning>,
) -> Result<Weights, LoadError> {
    match detect_layout(dir)? {
        Some(layout) => read_layout(dir, layout, (options, config), draft, warnings),
        None => Ok((Vec::new(), None)),
    }
}

/// A Megatron-Core checkpoint's split added to the draft: its files are `.metadata`,
/// the `.distcp` files, Megatron's own files in `weights` (the checkpoint's folder)
/// and `extra` (NeMo 2's model.yaml) where they exist; the config.json it wrote.
fn megatron_files(
    draft: &mut Draft,
    warnings: &mut Vec<Warning>,
    (metadata, read): (PathBuf, crate::formats::megatron::Read),
    weights: &Path,
    extra: Option<PathBuf>,
) -> Weights {
    let mut files = add_split(draft, (&metadata, read.split), warnings);
    files.insert(0, metadata);
    files.extend(
        crate::formats::megatron::OWN_FILES
            .iter()
            .map(|f| weights.join(f))
            .chain(extra)
            .filter(|p| exists(p)),
    );
    (files, read.config)
}

/// Reads the weights `layout` says `dir` holds.
fn read_layout(
    dir: &Path,
    layout: Layout,
    (options, config): (&LoadOptions, Option<&serde_json::Value>),
    draft: &mut Draft,
    warnings: &mut Vec<Warning>,
) -> Result<Weights, LoadError> {
    let paths = match layout {
        Layout::Index(index) => {
            let files = read_indexed(dir, &index, draft, warnings, options.open_broken)?;
            return Ok((files, None));
        }
        Layout::DeepSpeed => {
            let split = crate::formats::deepspeed::read_deepspeed(dir)?;
            let mut files = add_split(draft, (dir, split), warnings);
            files.extend(
                crate::formats::deepspeed::OWN_FILES
                    .iter()
                    .map(|f| dir.join(f))
                    .filter(|p| exists(p)),
            );
            return Ok((files, None));
        }
        Layout::Dcp(metadata) => {
            let key = options.state_dict_key.as_deref();
            let read = crate::formats::dcp::read_dcp_objects(dir, key)?;
            // Megatron-LM's `fsdp_dtensor` format is a plain DCP folder of
            // megatron-core's names: converted by the Megatron map.
            use crate::formats::megatron::fsdp_dtensor;
            if let Some(prefix) = fsdp_dtensor::prefix(&read.split).filter(|_| key.is_none()) {
                let read = fsdp_dtensor::read_fsdp_dtensor(dir, read, prefix, config)?;
                return Ok(megatron_files(draft, warnings, (metadata, read), dir, None));
            }
            let split = read.split;
            let mut files = add_split(draft, (&metadata, split), warnings);
            files.insert(0, metadata);
            return Ok((files, None));
        }
        Layout::Megatron(metadata) => {
            // The weights of a NeMo 2 checkpoint, named on their own: its names and
            // configuration are the folder above's.
            if let Some(parent) = dir.parent().filter(|p| {
                dir.file_name() == Some(crate::formats::nemo::WEIGHTS.as_ref())
                    && crate::formats::nemo::is_nemo(p)
            }) {
                return Err(FormatError::invalid_as(
                    Kind::Unsupported,
                    dir,
                    format!(
                        "is the weights/ folder of a NeMo 2 checkpoint, whose configuration is in its context/: give the checkpoint's folder, {}",
                        parent.display()
                    ),
                )
                .into());
            }
            let read = crate::formats::megatron::read_megatron(dir, config)?;
            return Ok(megatron_files(draft, warnings, (metadata, read), dir, None));
        }
        Layout::Nemo(metadata) => {
            let read = crate::formats::nemo::read_nemo(dir, config)?;
            let context = dir
                .join(crate::formats::nemo::CONTEXT)
                .join(crate::formats::nemo::MODEL_YAML);
            let weights = dir.join(crate::formats::nemo::WEIGHTS);
            return Ok(megatron_files(
                draft,
                warnings,
                (metadata, read),
                &weights,
                Some(context),
            ));
        }
        Layout::Verl(paths) => {
            let split = crate::formats::verl::read_verl(&paths)?;
            let files = add_split(draft, (dir, split), warnings);
            // The model's config.json is in huggingface/ beside the rank files.
            let hf_config = dir
                .join(crate::formats::verl::HF_FOLDER)
                .join("config.json");
            let generated = match config {
                None if exists(&hf_config) => Some(
                    std::fs::read_to_string(&hf_config)
                        .map_err(|e| FormatError::io(&hf_config, e))?,
                ),
                _ => None,
            };
            return Ok((files, generated));
        }
        Layout::RankFiles(paths) => {
            let split = crate::formats::rank_files::read_rank_files(&paths)?;
            return Ok((add_split(draft, (dir, split), warnings), None));
        }
        Layout::Files(paths) => paths,
    };
    for path in &paths {
        let (header, strided) = read_weight_file(path)?;
        let id = draft.file_id(path, &header);
        let mut read = header.tensors;
        // Taken from the end, the header's list giving its memory back as the
        // checkpoint's grows, a step at a time: at a million tensors the two would
        // otherwise be held whole at once (64 and 88 MB). The order is restored by the
        // sort into module order.
        const STEP: usize = 1 << 16;
        while !read.is_empty() {
            draft.tensors.reserve_exact(STEP.min(read.len()));
            for t in read.drain(read.len().saturating_sub(STEP)..).rev() {
                add_checkpoint_tensor(draft, id, t);
            }
            read.shrink_to_fit();
        }
        add_pieced(draft, &[id], strided, warnings);
    }
    Ok((paths, None))
}

/// A weight file's tensors: a safetensors header, or a `torch.save` archive's state
/// dict described the same way, with the views it stores with strides (pieces of
/// this file, index 0).
fn read_weight_file(
    path: &Path,
) -> Result<
    (
        crate::formats::safetensors::Header,
        Vec<crate::formats::split::PiecedTensor>,
    ),
    FormatError,
> {
    if path.extension().is_some_and(|e| e == "bin") {
        crate::formats::torch_bin::read_bin(path)
    } else {
        read_header(path).map(|h| (h, Vec::new()))
    }
}

/// The shards an index (`model.safetensors.index.json` or
/// `pytorch_model.bin.index.json`) lists, each holding the tensors it maps to it.
fn read_indexed(
    dir: &Path,
    index_path: &Path,
    draft: &mut Draft,
    warnings: &mut Vec<Warning>,
    open_broken: bool,
) -> Result<Vec<PathBuf>, LoadError> {
    let index_text = read_index_text(index_path)?;
    let index = parse_index(index_path, &index_text)?;
    // Names per shard file, in the index's order of first mention.
    let mut by_file: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut order = Vec::new();
    for (name, file) in &index.weight_map {
        let (name, file): (&str, &str) = (name, file);
        if !crate::formats::hf_index::is_shard_file_name(file) {
            return Err(FormatError::tensor_as(
                Kind::Unsafe,
                index_path,
                name,
                format!("shard `{file}` is not a file name in the model directory"),
            )
            .into());
        }
        by_file
            .entry(file)
            .or_insert_with(|| {
                order.push(file);
                Vec::new()
            })
            .push(name);
    }
    let file_of: HashMap<&str, &str> = index
        .weight_map
        .iter()
        .map(|(n, f)| (n.as_ref(), f.as_ref()))
        .collect();
    let mut files = vec![index_path.to_path_buf()];
    for file in order {
        let path = dir.join(file);
        let names = &by_file[file];
        if std::fs::symlink_metadata(&path).is_err() {
            return Err(FormatError::tensor(
                index_path,
                names[0],
                format!(
                    "is mapped to shard {file}, which is missing ({} there)",
                    crate::text::count(names.len(), "tensor points", "tensors point")
                ),
            )
            .into());
        }
        let (header, strided) = match read_weight_file(&path) {
            Ok(read) => read,
            Err(problem) if open_broken => {
                add_broken_shard(draft, &path, names, problem, warnings);
                files.push(path);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let id = draft.file_id(&path, &header);
        let present: HashSet<&str> = header
            .tensors
            .iter()
            .map(|t| &*t.name)
            .chain(strided.iter().map(|t| &*t.name))
            .collect();
        let missing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| !present.contains(n))
            .collect();
        if let Some(first) = missing.first() {
            return Err(FormatError::tensor(
                index_path,
                *first,
                format!(
                    "is mapped to {file}, which does not hold it ({} such tensors)",
                    missing.len()
                ),
            )
            .into());
        }
        // Grown once, not by doubling: at a million tensors a doubling copy is
        // the peak of the whole open.
        draft.tensors.reserve(header.tensors.len());
        for t in header.tensors {
            match file_of.get(&*t.name) {
                Some(&f) if f == file => {}
                Some(_) => {
                    warnings.push(Warning::IndexPointsElsewhere {
                        file: path.clone(),
                        tensor: t.name.to_string(),
                    });
                    continue;
                }
                None => warnings.push(Warning::NotInIndex {
                    file: path.clone(),
                    tensor: t.name.to_string(),
                }),
            }
            add_checkpoint_tensor(draft, id, t);
        }
        add_pieced(draft, &[id], strided, warnings);
        files.push(path);
    }
    Ok(files)
}

/// A shard that cannot be read whole, opened for looking ([`LoadOptions::open_broken`]):
/// when its header is whole (a download cut in the data), the tensors whose bytes are
/// there are read as usual and the others kept without data; otherwise every tensor
/// the index maps to it is kept without data, its dtype and shape unknown (`U8 [0]`).
fn add_broken_shard(
    draft: &mut Draft,
    path: &Path,
    names: &[&str],
    problem: FormatError,
    warnings: &mut Vec<Warning>,
) {
    let cut = path
        .extension()
        .is_some_and(|e| e == "safetensors")
        .then(|| crate::formats::safetensors::read_header_of_cut_file(path).ok())
        .flatten();
    let mut unreadable = Vec::new();
    match cut {
        Some(header) => {
            let id = draft.file_id(path, &header);
            let end = header.file_len;
            for t in header.tensors {
                if t.offset.saturating_add(t.len) <= end {
                    add_checkpoint_tensor(draft, id, t);
                } else {
                    unreadable.push(t.name.to_string());
                    push_tensor(draft, t.name, t.dtype, t.shape, Source::None);
                }
            }
        }
        None => {
            for name in names {
                unreadable.push((*name).to_owned());
                push_tensor(
                    draft,
                    (*name).into(),
                    crate::types::DType::U8,
                    crate::types::shape::Shape::new(&[0]),
                    Source::None,
                );
            }
        }
    }
    warnings.push(Warning::BrokenFile {
        file: path.to_path_buf(),
        problem: problem.to_string(),
        unreadable,
    });
}

/// The tensors of a checkpoint split across ranks: those its files hold whole, and
/// those stored in pieces, each checked to make up its tensor exactly once (a warning
/// here; a save refuses it). Returns the data files.
fn add_split(
    draft: &mut Draft,
    (source, split): (&Path, crate::formats::split::Split),
    warnings: &mut Vec<Warning>,
) -> Vec<PathBuf> {
    if !split.left_out.is_empty() {
        warnings.push(Warning::LeftOut {
            file: source.to_path_buf(),
            entries: split.left_out,
        });
    }
    let mut ids = Vec::with_capacity(split.files.len());
    let mut paths = Vec::with_capacity(split.files.len());
    for (path, header) in split.files {
        let id = draft.file_id(&path, &header);
        ids.push(id);
        for t in header.tensors {
            add_checkpoint_tensor(draft, id, t);
        }
        paths.push(path);
    }
    add_pieced(draft, &ids, split.pieced, warnings);
    paths
}

/// Tensors stored in pieces, whose pieces' files index `ids` (the draft's file ids),
/// each checked to make up its tensor exactly once (a warning here; a save refuses).
fn add_pieced(
    draft: &mut Draft,
    ids: &[FileId],
    pieced: Vec<crate::formats::split::PiecedTensor>,
    warnings: &mut Vec<Warning>,
) {
    for mut t in pieced {
        for piece in &mut t.pieces {
            piece.range.file = ids[piece.range.file];
        }
        if let Err(problem) = crate::types::pieces::tiling(&t.shape.to_vec(), &t.pieces) {
            warnings.push(Warning::PiecesDoNotTile {
                tensor: t.name.clone(),
                chunks: t.pieces.len(),
                problem: problem.to_string(),
            });
        }
        let source = Source::Pieces(draft.pieces.len() as u32);
        push_tensor(draft, t.name.into(), t.dtype, t.shape, source);
        draft.pieces.push(t.pieces.into_boxed_slice());
    }
}

fn add_checkpoint_tensor(
    draft: &mut Draft,
    file: FileId,
    t: crate::formats::safetensors::HeaderTensor,
) {
    let range = ByteRange {
        file,
        offset: t.offset,
        len: t.len,
    };
    push_tensor(draft, t.name, t.dtype, t.shape, Source::Checkpoint(range));
}

/// A checkpoint tensor as read, on the CPU until a device map places it.
fn push_tensor(
    draft: &mut Draft,
    name: Box<str>,
    dtype: crate::types::DType,
    shape: crate::types::shape::Shape,
    source: Source,
) {
    draft.tensors.push(Tensor {
        name,
        dtype,
        shape,
        placement: Placement::Cpu,
        map_key: NO_KEY,
        source,
        load_dtype: None,
    });
}
