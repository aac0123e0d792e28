//! The real library as the oracle: what the user's transformers says a model is.
//!
//! devmap's tables (`model/expect_table.txt`, `model/arch_table.txt`) are a snapshot
//! of one transformers version, fitted on the configs that generated them; a boolean
//! or null that switches modules on, an architecture they lack or the next release
//! makes them wrong. Users nearly always have transformers installed — it is how they
//! loaded the model — so devmap asks it: `ask.py` instantiates the exact config on
//! the `meta` device (no weights, no network, no remote code unless allowed) and
//! reports what `save_pretrained` writes (names, dtypes, shapes: ties removed,
//! conversions reverted), the loaded model's own names, its non-persistent buffers,
//! its no-split classes and what it keeps in float32. Answers are cached per (config,
//! dtype, transformers version) in the user's cache folder.
//!
//! Which Python: `--transformers PYTHON`, else `DEVMAP_PYTHON`, else `python3` when it
//! imports transformers ([`Oracle::find`]). Where none does, the callers use the table
//! and say so; where neither knows, they say "not checked".

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::types::DType;

/// The script run by the user's Python (kept beside this file so it reads as Python).
const ASK: &str = include_str!("ask.py");
/// The line of the script's output that carries the answer.
const MARK: &str = "devmap-answer: ";
/// Bumped when the script's answer changes meaning, so cached answers are not reused.
const ASK_VERSION: u32 = 2;

/// Where the Python that answers comes from, for the one line that says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// `--transformers PYTHON`.
    Flag,
    /// The `DEVMAP_PYTHON` environment variable.
    Environment,
    /// `python3` on the PATH imports transformers.
    Path,
}

/// A Python that imports transformers, and its version.
#[derive(Debug, Clone)]
pub struct Oracle {
    pub python: PathBuf,
    pub version: String,
    pub found: Found,
    /// `--trust-remote-code`: the config's own modelling code may run.
    pub trust_remote_code: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum OracleError {
    #[error("{}: cannot run it: {error}", python.display())]
    Run {
        python: PathBuf,
        error: std::io::Error,
    },
    #[error("{} does not import transformers{}", python.display(), detail(.stderr))]
    NoTransformers { python: PathBuf, stderr: String },
    #[error("transformers ({}) could not instantiate the model of {}: {}", python.display(), config.display(), last_line(.stderr))]
    Failed {
        python: PathBuf,
        config: PathBuf,
        stderr: String,
    },
    #[error("transformers' answer could not be read: {0}")]
    Answer(String),
}

fn detail(stderr: &str) -> String {
    match last_line(stderr) {
        "" => String::new(),
        line => format!(" ({line})"),
    }
}

fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

/// One tensor as transformers holds or writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// `None` for a dtype safetensors has no name for.
    pub dtype: Option<DType>,
    pub shape: Vec<u64>,
}

/// What transformers says of one config at one load dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub transformers: String,
    pub architecture: String,
    /// The dtype the model was instantiated in.
    pub dtype: Option<DType>,
    /// What `save_pretrained` writes, in its order.
    pub saved: Vec<Entry>,
    /// The loaded model's own state dict, where its names differ from `saved`.
    pub runtime: Option<Vec<Entry>>,
    /// Non-persistent buffers: held by the model, never saved.
    pub buffers: Vec<Entry>,
    pub no_split: Vec<String>,
    /// Runtime names held in float32 although the load dtype is another.
    pub kept_fp32: Vec<String>,
    /// Second names of parameters held under two (tied: `save_pretrained` drops them,
    /// loading ties them).
    pub tied: Vec<String>,
    /// Modules holding no tensor a checkpoint has (`hf_device_map` still names them),
    /// sorted.
    pub empty_modules: Vec<String>,
    /// The class's `_keys_to_ignore_on_load_missing` / `_unexpected` (regular
    /// expressions transformers searches names with, leaving them out of its report).
    pub ignore_missing: Vec<String>,
    pub ignore_unexpected: Vec<String>,
    /// Why transformers' config class refuses config.json itself (`from_pretrained`
    /// fails before it loads a tensor); the rest of the answer is then empty.
    pub refused: Option<String>,
}

#[derive(Deserialize)]
struct RawAnswer {
    transformers: String,
    architecture: String,
    #[serde(default)]
    dtype: String,
    #[serde(default)]
    saved: Vec<(String, String, Vec<u64>)>,
    runtime: Option<Vec<(String, String, Vec<u64>)>>,
    #[serde(default)]
    buffers: Vec<(String, String, Vec<u64>)>,
    #[serde(default)]
    no_split: Vec<String>,
    #[serde(default)]
    kept_fp32: Vec<String>,
    #[serde(default)]
    refused: Option<String>,
    #[serde(default)]
    tied: Vec<String>,
    #[serde(default)]
    empty_modules: Vec<String>,
    #[serde(default)]
    ignore_missing: Vec<String>,
    #[serde(default)]
    ignore_unexpected: Vec<String>,
}

fn entries(raw: Vec<(String, String, Vec<u64>)>) -> Vec<Entry> {
    raw.into_iter()
        .map(|(name, dtype, shape)| Entry {
            name,
            dtype: DType::from_torch_name(&dtype),
            shape,
        })
        .collect()
}

impl Answer {
    fn parse(stdout: &str) -> Result<Answer, OracleError> {
        let raw: RawAnswer = marked_answer(stdout)?;
        Ok(Answer {
            transformers: raw.transformers,
            architecture: raw.architecture,
            dtype: DType::from_torch_name(&raw.dtype),
            saved: entries(raw.saved),
            runtime: raw.runtime.map(entries),
            buffers: entries(raw.buffers),
            no_split: raw.no_split,
            kept_fp32: raw.kept_fp32,
            tied: raw.tied,
            empty_modules: raw.empty_modules,
            ignore_missing: raw.ignore_missing,
            ignore_unexpected: raw.ignore_unexpected,
            refused: raw.refused,
        })
    }

    /// How reports name this source of expectations.
    pub fn source(&self) -> String {
        format!("transformers {}, asked", self.transformers)
    }

    /// Whether transformers leaves a missing `name` out of its load report.
    pub fn ignores_missing(&self, name: &str) -> bool {
        self.ignore_missing
            .iter()
            .any(|r| crate::model::expect::regex_search(r, name) == Some(true))
    }

    /// Whether transformers drops an unexpected `name` without a word.
    pub fn ignores_unexpected(&self, name: &str) -> bool {
        self.ignore_unexpected
            .iter()
            .any(|r| crate::model::expect::regex_search(r, name) == Some(true))
    }

    /// Whether transformers holds runtime name `name` in float32 at this load dtype.
    pub fn keeps_fp32(&self, name: &str) -> bool {
        self.kept_fp32.iter().any(|k| k == name)
    }
}

impl Oracle {
    /// The Python to ask: `flag` (`--transformers`), else `DEVMAP_PYTHON`, else
    /// `python3` when it imports transformers. `Ok(None)`: none to ask (an
    /// environment variable or `python3` without transformers is no error; the flag
    /// is: the user asked for it). `flag` = `none` turns asking off.
    pub fn find(
        flag: Option<&Path>,
        trust_remote_code: bool,
    ) -> Result<Option<Oracle>, OracleError> {
        if let Some(python) = flag {
            if python == Path::new("none") {
                return Ok(None);
            }
            return Oracle::at(python, Found::Flag, trust_remote_code).map(Some);
        }
        if let Some(python) = std::env::var_os("DEVMAP_PYTHON") {
            if python.is_empty() || python == "none" {
                return Ok(None);
            }
            return Ok(Oracle::at(Path::new(&python), Found::Environment, trust_remote_code).ok());
        }
        Ok(Oracle::at(Path::new("python3"), Found::Path, trust_remote_code).ok())
    }

    fn at(python: &Path, found: Found, trust_remote_code: bool) -> Result<Oracle, OracleError> {
        let out = Command::new(python)
            .args([
                "-c",
                // The installed version without importing it (importing torch and
                // transformers takes seconds; a cached answer should cost nothing).
                "import importlib.metadata as m; m.version('torch'); print(m.version('transformers'))",
            ])
            .env("TRANSFORMERS_VERBOSITY", "error")
            .output()
            .map_err(|error| OracleError::Run {
                python: python.to_path_buf(),
                error,
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let version = last_line(&stdout).to_owned();
        if !out.status.success() || version.is_empty() {
            return Err(OracleError::NoTransformers {
                python: python.to_path_buf(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(Oracle {
            python: python.to_path_buf(),
            version,
            found,
            trust_remote_code,
        })
    }

    /// The one line that says which transformers answers, and where it was found.
    pub fn said(&self) -> String {
        format!(
            "expectations from transformers {} ({}), asked",
            self.version,
            self.found_where()
        )
    }

    /// Where this Python was found, and its path: `--transformers: /usr/bin/python3`.
    pub fn found_where(&self) -> String {
        let how = match self.found {
            Found::Flag => "--transformers",
            Found::Environment => "DEVMAP_PYTHON",
            Found::Path => "python3 on the PATH",
        };
        format!("{how}: {}", self.python.display())
    }

    /// What transformers says of the model `config_dir/config.json` describes, loaded
    /// in `dtype` (`None`: the config's own). Cached per (config, dtype, version).
    pub fn ask(&self, config_dir: &Path, dtype: Option<DType>) -> Result<Answer, OracleError> {
        let config_path = config_dir.join("config.json");
        let config = std::fs::read(&config_path).map_err(|error| OracleError::Run {
            python: config_path.clone(),
            error,
        })?;
        let dtype_name = dtype.map_or("config", DType::torch_name);
        let key = xxhash_rust::xxh3::xxh3_128(
            &[
                config.as_slice(),
                dtype_name.as_bytes(),
                self.version.as_bytes(),
                &ASK_VERSION.to_le_bytes(),
                &[u8::from(self.trust_remote_code)],
            ]
            .concat(),
        );
        let cached = cache_dir().map(|d| d.join(format!("{key:032x}.json")));
        if let Some(text) = cached
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            && let Ok(answer) = Answer::parse(&text)
        {
            return Ok(answer);
        }
        let stdout = self.run_ask(config_dir, dtype_name, &[])?;
        let answer = Answer::parse(&stdout)?;
        if let Some(path) = cached {
            // A cache that cannot be written only costs the next run the question.
            let line = stdout.lines().rev().find(|l| l.starts_with(MARK));
            if let (Some(dir), Some(line)) = (path.parent(), line) {
                let _ = std::fs::create_dir_all(dir);
                let _ = std::fs::write(&path, line);
            }
        }
        Ok(answer)
    }
}

impl Oracle {
    /// What `from_pretrained(device_map=mode, max_memory=budgets)` plans for the model
    /// of `config_dir` loaded in `dtype` (`None`: config.json's), from transformers'
    /// own planner on the meta model ([`Oracle::ask`] builds): `(key, device)` in its
    /// order. Not cached: budgets change from run to run.
    pub fn plan(
        &self,
        config_dir: &Path,
        dtype: Option<DType>,
        mode: &str,
        budgets: &[(crate::types::placement::Placement, u64)],
    ) -> Result<Vec<(String, crate::types::placement::Placement)>, OracleError> {
        use crate::types::placement::Placement;
        let budgets: serde_json::Map<String, serde_json::Value> = budgets
            .iter()
            .map(|(p, b)| {
                let key = match p {
                    Placement::Gpu(i) => i.to_string(),
                    other => other.to_string(),
                };
                (key, serde_json::Value::from(*b))
            })
            .collect();
        let budgets = serde_json::Value::Object(budgets).to_string();
        let stdout = self.run_ask(
            config_dir,
            dtype.map_or("config", DType::torch_name),
            &[mode, &budgets],
        )?;
        #[derive(Deserialize)]
        struct Planned {
            plan: Vec<(String, serde_json::Value)>,
        }
        let planned: Planned = marked_answer(&stdout)?;
        planned
            .plan
            .into_iter()
            .map(|(key, device)| {
                let placement = match &device {
                    serde_json::Value::Number(n) => n
                        .as_u64()
                        .and_then(|i| u32::try_from(i).ok())
                        .map(Placement::Gpu),
                    serde_json::Value::String(s) => Placement::parse_device(s),
                    _ => None,
                };
                placement
                    .map(|p| (key.clone(), p))
                    .ok_or_else(|| OracleError::Answer(format!("{key}: device {device}")))
            })
            .collect()
    }
}

impl Oracle {
    /// Runs the question script on `config_dir` at `dtype_name`, with `extra`
    /// arguments (a plan's mode and budgets); its standard output.
    fn run_ask(
        &self,
        config_dir: &Path,
        dtype_name: &str,
        extra: &[&str],
    ) -> Result<String, OracleError> {
        let out = Command::new(&self.python)
            .args(["-c", ASK])
            .arg(config_dir)
            .arg(dtype_name)
            .arg(if self.trust_remote_code { "1" } else { "0" })
            .args(extra)
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_VERBOSITY", "error")
            .output()
            .map_err(|error| OracleError::Run {
                python: self.python.clone(),
                error,
            })?;
        if !out.status.success() {
            return Err(OracleError::Failed {
                python: self.python.clone(),
                config: config_dir.join("config.json"),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The question script's answer: the last line of its output that starts with
/// [`MARK`] (imports may print to stdout too), read as JSON.
fn marked_answer<T: serde::de::DeserializeOwned>(stdout: &str) -> Result<T, OracleError> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(MARK))
        .ok_or_else(|| OracleError::Answer("the script printed no answer".into()))?;
    serde_json::from_str(line).map_err(|e| OracleError::Answer(e.to_string()))
}

/// `$XDG_CACHE_HOME/devmap/transformers`, else `~/.cache/devmap/transformers`.
fn cache_dir() -> Option<PathBuf> {
    let var = |k| std::env::var_os(k).filter(|v| !v.is_empty());
    let base = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("devmap").join("transformers"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_the_marked_line_whatever_else_was_printed() {
        let stdout = "[WARNING] a library's logger\n{\"not\": \"this\"}\ndevmap-answer: {\"transformers\": \"5.25.0\", \"torch\": \"2.15.0\", \"architecture\": \"LlamaForCausalLM\", \"dtype\": \"bfloat16\", \"saved\": [[\"model.norm.weight\", \"float32\", [8]]], \"runtime\": null, \"buffers\": [[\"model.rotary_emb.inv_freq\", \"float32\", [4]]], \"no_split\": [\"LlamaDecoderLayer\"], \"kept_fp32\": [\"model.norm.weight\"]}\n";
        let answer = Answer::parse(stdout).expect("parsed");
        assert_eq!(answer.source(), "transformers 5.25.0, asked");
        assert_eq!(answer.dtype, Some(DType::BF16));
        assert_eq!(
            answer.saved,
            vec![Entry {
                name: "model.norm.weight".into(),
                dtype: Some(DType::F32),
                shape: vec![8]
            }]
        );
        assert!(answer.keeps_fp32("model.norm.weight"));
        assert!(matches!(
            Answer::parse("no answer here"),
            Err(OracleError::Answer(_))
        ));
    }
}
