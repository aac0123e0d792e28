//! Command-line arguments. Every user-facing flag and its help text lives here.

use std::path::PathBuf;

use clap::{Args as ClapArgs, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "devmap",
    args_conflicts_with_subcommands = true,
    version,
    about = "See where every weight of a Hugging Face model lives (GPU, CPU, disk, meta), and re-save offloaded models as clean sharded safetensors.",
    long_about = "devmap reads a Hugging Face model directory — safetensors weights, config.json, an accelerate \
device_map.json and an offload folder — and shows where every parameter is placed and where its bytes come from. \
A model can also be a repo id in the Hugging Face cache (org/name[@revision]) or, to inspect and plan before \
downloading, hf://org/name (only the headers are fetched).\n\n\
With no subcommand it opens the interactive inspector on MODEL (the bundled demo model when MODEL is omitted); \
when standard output is not a terminal it prints the inspect report instead. Press ? inside for the keys.",
    after_help = "Examples:\n  devmap inspect ./llama --offload-folder ./offload\n  devmap inspect Qwen/Qwen2-7B          (from the Hugging Face cache)\n  devmap plan hf://Qwen/Qwen2-7B --max-memory 0=24GiB,cpu=64GiB   (headers only, no download)\n  devmap inspect ./llama --json > placement.json\n  devmap save ./llama --out ./llama-merged --max-shard-size 2GB"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Model to open in the inspector: a folder, a repo id in the Hugging Face cache
    /// (org/name[@revision]), or hf://org/name / an https:// URL (headers only).
    /// Default: the bundled demo model.
    #[arg(value_name = "MODEL")]
    pub dir: Option<PathBuf>,
    /// The inspector's budgets: DEVICE=SIZE pairs as `devmap plan` takes them (e.g.
    /// 0=22GiB,cpu=64GiB). The Devices panel measures each device against them and
    /// `p` starts from them. Default: what each device has free.
    #[arg(long, value_name = "SPEC", value_parser = parse_max_memory)]
    pub max_memory: Option<Budgets>,
    /// The inspector's Devices panel adds to each device's weights the KV cache its
    /// layers hold after N tokens, as `devmap plan --context` counts it.
    #[arg(long, value_name = "N")]
    pub context: Option<u64>,
    /// Sequences at once, for --context.
    #[arg(long, value_name = "B", default_value_t = 1)]
    pub batch: u64,
    /// The Devices panel also names the largest GPU of a vLLM server with N tensor
    /// ranks (and --ep, --pp), as `devmap plan --tp` counts it.
    #[arg(long, value_name = "N")]
    pub tp: Option<u64>,
    /// Expert-parallel ranks, with --tp (see `devmap plan --help`).
    #[arg(long, value_name = "N")]
    pub ep: Option<u64>,
    /// Pipeline stages, with --tp (see `devmap plan --help`).
    #[arg(long, value_name = "N")]
    pub pp: Option<u64>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    /// The inspector over a live model `devmap.inspect` describes (see src/cli/live.rs):
    /// started by the Python package, not typed.
    #[arg(long, value_name = "FILE", hide = true, conflicts_with = "dir")]
    pub live_manifest: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the module tree, placements, device totals, ties and warnings.
    Inspect(InspectArgs),
    /// Write the model's current weights as a sharded safetensors checkpoint.
    Save(SaveArgs),
    /// Compute the device map from_pretrained(device_map="auto") makes for budgets.
    Plan(PlanArgs),
    /// Check a saved checkpoint: its files as transformers reads them, its tensors,
    /// shapes, float32 modules and values against what config.json's architecture
    /// expects (from transformers' own classes), and with --against every tensor
    /// against the model it was saved from. Exit 0: all is well; 1: differences; 2:
    /// the input cannot be used.
    Verify(VerifyArgs),
}

#[derive(Debug, ClapArgs)]
#[command(
    after_help = "Examples:\n  devmap verify ./llama-merged\n  devmap verify ./llama-merged --against ./llama --offload-folder ./offload\n  devmap verify ./llama-merged --json"
)]
pub struct VerifyArgs {
    /// The saved checkpoint folder.
    pub out: PathBuf,
    /// Also compare every tensor with what `devmap save DIR` writes, read with the
    /// same options (--device-map, --offload-folder, --tie, --dtype, --keep-tied).
    #[arg(long, value_name = "DIR")]
    pub against: Option<PathBuf>,
    /// The --dtype the save used (with --against).
    #[arg(long, default_value = "auto", value_name = "DTYPE", value_parser = parse_save_dtype)]
    pub dtype: devmap::save::shards::DtypeChoice,
    /// The save used --keep-tied (with --against).
    #[arg(long)]
    pub keep_tied: bool,
    /// The --quantize the save used (with --against).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub quantize: Option<QuantizeFormat>,
    /// Print the report as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, ClapArgs)]
pub struct PlanArgs {
    /// Model: a folder (safetensors, pytorch_model*.bin, a dcp.save checkpoint, a
    /// transformers 5 distributed checkpoint, a DeepSpeed ZeRO checkpoint), a repo id in the Hugging Face cache (org/name[@revision]), or
    /// hf://org/name[@revision] / an https:// URL of a .safetensors file or index
    /// (only the headers are fetched).
    #[arg(value_name = "MODEL")]
    pub dir: PathBuf,
    /// Budgets: DEVICE=SIZE pairs, e.g. 0=22GiB,1=22GiB,cpu=64GiB. disk takes the rest;
    /// a disk=SIZE is accepted, as accelerate's max_memory accepts it, and does not cap
    /// it. Default: the free memory of each GPU found and the available RAM.
    #[arg(long, value_name = "SPEC", value_parser = parse_max_memory)]
    pub max_memory: Option<Budgets>,
    /// A module never split across devices; `*` matches one name component
    /// (e.g. model.layers.*). Repeatable. Default: the modules of the architecture's
    /// _no_split_modules classes (devmap's table from transformers; else the repeated
    /// decoder block); `none` lets every module be split.
    #[arg(long, value_name = "PATTERN")]
    pub no_split: Vec<String>,
    /// The dtype the model will be loaded as (from_pretrained's dtype, e.g. bfloat16):
    /// floating-point tensors count at its size, larger or smaller than stored, but
    /// those transformers keeps in float32. Default: as stored.
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub dtype: Option<devmap::types::DType>,
    /// Write the map to FILE instead of standard output (never over the input map).
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Also print, on standard error, why each module was split or moved on, and
    /// where the module order came from (transformers' class, or name heuristics).
    #[arg(long)]
    pub explain: bool,
    /// Print (or write with --out) the plan as JSON: the mode, dtype, budgets, the
    /// device map, each device's bytes as transformers counts them against its budget,
    /// and the reasons. With --context, the KV cache per layer and per device;
    /// activations are not counted yet, and the JSON says so.
    #[arg(long)]
    pub json: bool,
    /// Also count the KV cache after N tokens (prompt and generated), as transformers'
    /// DynamicCache holds it: full, sliding-window, chunked and MLA layers, in the
    /// dtype the model computes in, and an estimate of one forward's activations
    /// (see --prefill). Each device's weights + KV + activations are held against its
    /// budget (the map itself places the weights alone).
    #[arg(long, value_name = "N")]
    pub context: Option<u64>,
    /// Sequences at once, for --context.
    #[arg(long, value_name = "B", default_value_t = 1)]
    pub batch: u64,
    /// Tokens read in one forward, for the activations' estimate with --context.
    /// Default: the whole --context (a prompt that long, read at once, as generate
    /// does).
    #[arg(long, value_name = "N", requires = "context")]
    pub prefill: Option<u64>,
    /// Place the weights so that each device also has room for the KV cache of
    /// --context and the activations of one forward (the layers it holds; those of
    /// layers on cpu or disk are made on the first GPU). Prints the lowered budgets:
    /// from_pretrained's max_memory for this map.
    #[arg(long, requires = "context")]
    pub reserve_kv: bool,
    /// Instead of a device map, each GPU's bytes under vLLM's tensor parallelism over N
    /// ranks: column/row splits, the vocabulary padded to 64 and split, norms and
    /// routers replicated, key/value heads split (replicated when fewer than N). With
    /// --context, each rank's share of the KV cache. --max-memory's GPU budgets hold
    /// rank by rank (one GPU budget: every rank's).
    #[arg(long, value_name = "N", conflicts_with = "reserve_kv")]
    pub tp: Option<u64>,
    /// Expert parallelism over N ranks (vLLM's --enable-expert-parallel: N = tp × dp;
    /// SGLang's --ep-size, which divides tp): each rank holds E/N experts.
    #[arg(long, value_name = "N", conflicts_with = "reserve_kv")]
    pub ep: Option<u64>,
    /// Pipeline stages: the layers split as vLLM's get_pp_indices splits them.
    #[arg(long, value_name = "N", conflicts_with = "reserve_kv")]
    pub pp: Option<u64>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// How to read the model directory; shared by every subcommand.
#[derive(Debug, Clone, ClapArgs)]
pub struct ModelArgs {
    /// Device map JSON (module prefix -> GPU index, "cpu", "disk", ...). Default: DIR/device_map.json. For `plan`: auto (the default), balanced, balanced_low_0 or sequential, as from_pretrained's device_map.
    #[arg(long, value_name = "FILE", global = true)]
    pub device_map: Option<PathBuf>,
    /// accelerate/transformers offload folder. Default: DIR/offload when it exists.
    #[arg(long, value_name = "DIR", global = true)]
    pub offload_folder: Option<PathBuf>,
    /// A folder with config.json, the tokenizer and the other small files, for a
    /// checkpoint folder that has no config.json (a training checkpoint): the model is
    /// read with them (and `save` copies them beside the weights it writes).
    #[arg(long = "config", value_name = "DIR", global = true)]
    pub config_dir: Option<PathBuf>,
    /// The part of a nested training checkpoint that is the model (a
    /// torch.distributed.checkpoint folder saved as {"model": ..., "optimizer": ...}).
    /// Default: model, when there is one; optimizer state is never written.
    #[arg(long, value_name = "KEY", global = true)]
    pub state_dict_key: Option<String>,
    /// Tie two tensors: TIED=KEPT (KEPT is the name written on save). Repeatable.
    #[arg(long = "tie", value_name = "TIED=KEPT", global = true, value_parser = parse_tie)]
    pub ties: Vec<(String, String)>,
    /// Merge a peft LoRA adapter folder (adapter_config.json + adapter_model.safetensors)
    /// into the weights, as peft's merge_and_unload does; repeatable, applied in order.
    /// save writes the merged model; inspect shows what it changes.
    #[arg(long = "merge-lora", value_name = "ADAPTER", global = true)]
    pub merge_lora: Vec<PathBuf>,
    /// Accept NaN and infinite values: adapters (--merge-lora) that hold them, and
    /// merges whose result overflows the output dtype, are merged as peft would merge
    /// them (by default they are refused, naming the tensor); `verify` reports the
    /// NaNs and infinities it finds as notes, not differences.
    #[arg(long, global = true)]
    pub allow_nonfinite: bool,
    /// A Python whose transformers is asked what the model is (names, shapes and dtypes
    /// save_pretrained writes, modules kept in float32), for verify and the save's
    /// checks; "none" to use devmap's table alone. Default: $DEVMAP_PYTHON, else
    /// python3 when it imports transformers. The model is built on the meta device: no
    /// weights, no network.
    #[arg(long, value_name = "PYTHON", global = true)]
    pub transformers: Option<PathBuf>,
    /// Let transformers run the model's own code (auto_map) when asked about it.
    #[arg(long, global = true)]
    pub trust_remote_code: bool,
    /// Set from the command's `--max-remote-shards` (only the commands that read a
    /// remote model offer it: the inspector, `inspect`, `plan`).
    #[arg(skip = devmap::remote::DEFAULT_MAX_SHARDS)]
    pub max_remote_shards: usize,
}

impl ModelArgs {
    /// These arguments with the remote-model limit a command was given.
    pub fn reading(&self, remote: RemoteArgs) -> ModelArgs {
        ModelArgs {
            max_remote_shards: remote.max_remote_shards,
            ..self.clone()
        }
    }
}

/// The flag of the commands that read a remote model's headers.
#[derive(Debug, Clone, Copy, ClapArgs)]
pub struct RemoteArgs {
    /// Most shard headers to fetch for a remote model (two requests each); an index
    /// naming more is refused before any request for them.
    #[arg(long, value_name = "N", default_value_t = devmap::remote::DEFAULT_MAX_SHARDS)]
    pub max_remote_shards: usize,
}

#[derive(Debug, ClapArgs)]
pub struct InspectArgs {
    /// Model: a folder (safetensors, pytorch_model*.bin, a dcp.save checkpoint, a
    /// transformers 5 distributed checkpoint, a DeepSpeed ZeRO checkpoint), a repo id in the Hugging Face cache (org/name[@revision]), or
    /// hf://org/name[@revision] / an https:// URL of a .safetensors file or index
    /// (only the headers are fetched).
    #[arg(value_name = "MODEL")]
    pub dir: PathBuf,
    /// Print the stable JSON report instead of text.
    #[arg(long)]
    pub json: bool,
    /// Module levels always opened in the text tree (mixed modules open further).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub depth: usize,
    /// Budgets to check the map against, e.g. 0=22GiB,cpu=64GiB.
    #[arg(long, value_name = "SPEC", value_parser = parse_max_memory)]
    pub max_memory: Option<Budgets>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// What `save --quantize` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QuantizeFormat {
    /// DeepSeek/transformers fine-grained FP8 (`quant_method: fp8`, 128×128 blocks).
    #[value(name = "fp8-block")]
    Fp8Block,
}

#[derive(Debug, ClapArgs)]
pub struct SaveArgs {
    /// Model: a folder, or a repo id in the Hugging Face cache (org/name[@revision]).
    #[arg(value_name = "MODEL")]
    pub dir: PathBuf,
    /// Output folder (created if missing; must be empty unless --force).
    #[arg(long, short, value_name = "OUT")]
    pub out: PathBuf,
    /// Largest shard: 5GB = 5·10^9 bytes, 5GiB = 5·2^30, 500MB, 800KB, or bytes. The
    /// default, 50GB, is what transformers 5's save_pretrained writes (transformers 4
    /// wrote 5GB: pass --max-shard-size 5GB for that).
    #[arg(long, default_value = devmap::save::DEFAULT_MAX_SHARD_SIZE_TEXT, value_name = "SIZE", value_parser = parse_shard_size)]
    pub max_shard_size: ShardSize,
    /// Write every name of each tie group instead of once under the embedding's name.
    #[arg(long)]
    pub keep_tied: bool,
    /// Write into a non-empty output folder, replacing earlier weight files there.
    #[arg(long)]
    pub force: bool,
    /// Only write weights; do not copy config.json, tokenizer and other files.
    #[arg(long)]
    pub weights_only: bool,
    /// Threads writing at once: shards in parallel, and the parts of a big shard (64 MiB
    /// or more) among the threads no other shard needs. A merge, dequantization or
    /// quantization also splits each big weight among the cores (at most 8 threads); all
    /// jobs together compute on no more threads than there are cores.
    #[arg(long, short, default_value_t = devmap::save::shards::DEFAULT_JOBS, value_name = "N")]
    pub jobs: usize,
    /// Skip the fsync of each shard before it is renamed into place: faster, like cp,
    /// but a power loss right after the save can leave shards incomplete.
    #[arg(long)]
    pub no_fsync: bool,
    /// Page cache of copied input: drop it when the model is over half the available
    /// RAM (auto), always (drop), or leave it to the kernel (keep).
    #[arg(long, value_enum, default_value_t = Cache::Auto)]
    pub cache: Cache,
    /// dtype of the floating-point tensors written: auto (the dtype the model was
    /// loaded in, when its offload folder shows one unlike the checkpoint's, as
    /// save_pretrained writes; else as stored), keep, float32, bfloat16 or float16.
    /// Casts round as torch's .to() does; config.json records the result.
    #[arg(long, default_value = "auto", value_name = "DTYPE", value_parser = parse_save_dtype)]
    pub dtype: devmap::save::shards::DtypeChoice,
    /// Quantize on the way out. fp8-block: the linear layers' weights as fine-grained
    /// FP8 (F8_E4M3 in 128×128 tiles with float32 `weight_scale_inv`), computed as
    /// transformers' FP8 quantizer computes them; embeddings, the head, routers, norms
    /// and weights whose shape is not whole tiles stay in --dtype, and config.json's
    /// quantization_config names them, so from_pretrained loads the result.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub quantize: Option<QuantizeFormat>,
    /// Save even when device-map entries cover no tensor with data, i.e. the weights
    /// of those modules exist nowhere and the output will lack them.
    #[arg(long)]
    pub allow_partial: bool,
    /// After the save, read every tensor back and compare it with its source, as
    /// `devmap verify OUT --against DIR` does; exit 1 on any difference.
    #[arg(long, conflicts_with = "part")]
    pub verify: bool,
    /// Write only part K of N of the save (K/N, or auto: the rank and world size of
    /// Slurm, torchrun or Open MPI), for N processes that share a filesystem: the
    /// whole plan is computed as a plain save does, this part's shards are written
    /// under OUT/.devmap-parts/, and nothing is published until --commit N.
    #[arg(long, value_name = "K/N", value_parser = devmap::save::parts::Part::parse, conflicts_with = "commit")]
    pub part: Option<devmap::save::parts::Part>,
    /// Publish a save written by N parts (--part K/N): checks that every part
    /// finished for this same plan, then writes the index and config and puts it all
    /// in place at once, as a plain save does (--verify included).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub commit: Option<u32>,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

fn parse_tie(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_owned(), b.to_owned())),
        _ => Err(format!(
            "`{text}` is not TIED=KEPT, e.g. lm_head.weight=model.embed_tokens.weight"
        )),
    }
}

/// Parsed `--max-memory`: one value holding every device's budget.
#[derive(Debug, Clone)]
pub struct Budgets(pub Vec<(devmap::model::Placement, u64)>);

fn parse_max_memory(text: &str) -> Result<Budgets, devmap::plan::BudgetError> {
    devmap::plan::parse_max_memory(text).map(Budgets)
}

fn parse_dtype(text: &str) -> Result<devmap::types::DType, String> {
    devmap::types::DType::from_torch_name(text)
        .or_else(|| devmap::types::DType::from_safetensors_name(text))
        .ok_or_else(|| format!("`{text}` is not a dtype: use e.g. bfloat16, float16, float32"))
}

fn parse_save_dtype(text: &str) -> Result<devmap::save::shards::DtypeChoice, String> {
    use devmap::save::shards::DtypeChoice;
    use devmap::types::DType;
    match text {
        "auto" => Ok(DtypeChoice::Auto),
        "keep" => Ok(DtypeChoice::Keep),
        "float32" | "fp32" => Ok(DtypeChoice::To(DType::F32)),
        "bfloat16" | "bf16" => Ok(DtypeChoice::To(DType::BF16)),
        "float16" | "fp16" | "half" => Ok(DtypeChoice::To(DType::F16)),
        _ => Err(format!(
            "`{text}` is not a save dtype: use auto, keep, float32, bfloat16 or float16"
        )),
    }
}

/// `--max-shard-size` as parsed, with the text typed (for the hint a bare number gets).
#[derive(Debug, Clone)]
pub struct ShardSize {
    pub bytes: u64,
    pub text: String,
}

fn parse_shard_size(text: &str) -> Result<ShardSize, devmap::formats::size::SizeError> {
    Ok(ShardSize {
        bytes: devmap::formats::size::parse_size(text)?,
        text: text.to_owned(),
    })
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Cache {
    Auto,
    Drop,
    Keep,
}

impl From<Cache> for devmap::save::shards::CachePolicy {
    fn from(c: Cache) -> Self {
        match c {
            Cache::Auto => Self::Auto,
            Cache::Drop => Self::Drop,
            Cache::Keep => Self::Keep,
        }
    }
}
