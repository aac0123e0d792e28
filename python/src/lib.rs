//! `devmap._devmap`: the Python package's one way into devmap's saver.
//!
//! Python describes the live model (a manifest: every tensor `save_pretrained` writes,
//! with where its bytes are); this module reads it into a checkpoint and runs the same
//! plan, pre-flight, writer threads, commit and verification as `devmap save`. The GIL
//! is released while the writers run; the waiting thread takes it back every 100 ms to
//! report progress and to notice Ctrl-C, which cancels the save (nothing committed).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use devmap::save::shards::DtypeChoice;
use devmap::save::stage::{Stage, StageRef};
use devmap::save::{CommitCheck, SaveEvent, SaveJob, SaveOptions};
use devmap::types::DType;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

create_exception!(
    _devmap,
    DevmapError,
    PyException,
    "devmap refused or failed the save; the message says why and names the tensor or file. Nothing is left in the output folder but what was there before."
);

/// How often the waiting thread looks at the save and at Ctrl-C.
const TICK: Duration = Duration::from_millis(100);

/// Saves the model a manifest describes into `out`; returns a JSON report
/// (`{"out", "shard_files", "tensors", "bytes", "verify"}`).
///
/// `progress(written, total)` is called as bytes are written; `check()` is called once
/// before the commit and refuses the save by raising; `stage=(fill, capacity)` fills
/// staged sources (GPU tensors), see `devmap::save::stage`.
#[pyfunction]
#[pyo3(signature = (manifest, out, *, max_shard_size, dtype, force, verify, jobs, fsync=true, progress=None, check=None, stage=None))]
#[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)]
fn save_manifest(
    py: Python<'_>,
    manifest: &str,
    out: PathBuf,
    max_shard_size: &str,
    dtype: &str,
    force: bool,
    verify: bool,
    jobs: usize,
    fsync: bool,
    progress: Option<Py<PyAny>>,
    check: Option<Py<PyAny>>,
    stage: Option<(Py<PyAny>, u64)>,
) -> PyResult<String> {
    let origin = Path::new("the live model's manifest");
    let parsed = devmap::formats::live::parse_manifest(manifest, origin).map_err(fail)?;
    let ckpt =
        Arc::new(devmap::model::load::load_live_saving_to(&parsed, origin, &out).map_err(fail)?);
    let mut options = options_of(&out, max_shard_size, dtype, force, fsync, check, stage)?;
    options.jobs = jobs.max(1);
    // The test hook `devmap save` takes from the same variable (see CONTRIBUTING.md).
    options.pause_file = std::env::var_os("DEVMAP_TEST_PAUSE").map(PathBuf::from);
    let stage = options.stage.clone();
    let plan = devmap::save::prepare(&ckpt, &options).map_err(fail)?;
    let planned = verify.then(|| plan.clone());
    let total = plan.total_size;
    let mut job = SaveJob::spawn(Arc::clone(&ckpt), plan, options).map_err(fail)?;
    // A receiver may not be shared with the thread that waits without the GIL; a mutex
    // around it may (only this thread ever locks it).
    let events = std::sync::Mutex::new(std::mem::replace(
        &mut job.events,
        std::sync::mpsc::sync_channel(0).1,
    ));
    let mut interrupted = None;
    loop {
        let next = py.detach(|| match events.lock() {
            Ok(rx) => rx.recv_timeout(TICK),
            Err(_) => Err(RecvTimeoutError::Disconnected),
        });
        match next {
            Ok(SaveEvent::Progress { total_written, .. }) => {
                if let (Some(p), None) = (&progress, &interrupted)
                    && let Err(err) = p.call1(py, (total_written, total))
                {
                    // A failing callback (or Ctrl-C inside it) stops the save too.
                    job.cancel();
                    interrupted = Some(err);
                }
            }
            Ok(SaveEvent::Finished(_) | SaveEvent::Failed(_) | SaveEvent::Cancelled)
            | Err(RecvTimeoutError::Disconnected) => break,
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
        }
        if interrupted.is_none()
            && let Err(err) = py.check_signals()
        {
            // Ctrl-C: stop the writers and wait for them to remove what they wrote.
            job.cancel();
            interrupted = Some(err);
        }
    }
    let result = py.detach(|| job.join());
    if let Some(err) = interrupted {
        return Err(err);
    }
    let report = result.map_err(fail)?;
    let mut verified = serde_json::Value::Null;
    if let Some(plan) = planned {
        let expected = devmap::verify::SaveReference::from_plan(&ckpt, plan).with_stage(stage);
        let checked = py.detach(|| {
            devmap::verify::verify(
                &report.out,
                Some(&expected),
                false,
                &devmap::verify::Progress::default(),
            )
        });
        let checked = checked.map_err(fail)?;
        if checked.differences() > 0 {
            return Err(DevmapError::new_err(format!(
                "the save finished, but checking it found problems:\n{}",
                checked.to_text()
            )));
        }
        verified = serde_json::Value::String(checked.to_text());
    }
    let summary = serde_json::json!({
        "out": report.out,
        "shard_files": report.shard_files,
        "tensors": report.tensors,
        "bytes": report.bytes,
        "verify": verified,
    });
    Ok(summary.to_string())
}

/// One rank's share of a sharded job's save (`devmap::save::ranks`): planned when made
/// (the whole plan, from the global shapes), then its steps run in turn by the Python
/// side between barriers: `create` (rank 0), `write` (every rank), `commit` (rank 0),
/// or `abandon` after a failure anywhere.
#[pyclass(module = "devmap._devmap")]
struct RankSave {
    ckpt: devmap::model::Checkpoint,
    plan: devmap::save::SavePlan,
    options: SaveOptions,
    part: devmap::formats::live::RankOf,
}

#[pymethods]
impl RankSave {
    #[new]
    #[pyo3(signature = (manifest, out, *, max_shard_size, dtype, force, fsync=true, check=None, stage=None))]
    #[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)]
    fn new(
        manifest: &str,
        out: PathBuf,
        max_shard_size: &str,
        dtype: &str,
        force: bool,
        fsync: bool,
        check: Option<Py<PyAny>>,
        stage: Option<(Py<PyAny>, u64)>,
    ) -> PyResult<RankSave> {
        let origin = Path::new("the live model's manifest");
        let parsed = devmap::formats::live::parse_manifest(manifest, origin).map_err(fail)?;
        let part = parsed.rank.ok_or_else(|| {
            PyValueError::new_err("the manifest names no rank: save it with save_manifest")
        })?;
        let ckpt = devmap::model::load::load_live_saving_to(&parsed, origin, &out).map_err(fail)?;
        let mut options = options_of(&out, max_shard_size, dtype, force, fsync, check, stage)?;
        options.distributed = Some(devmap::save::parts::Distributed::Ranks(part));
        let plan = devmap::save::prepare(&ckpt, &options).map_err(fail)?;
        Ok(RankSave {
            ckpt,
            plan,
            options,
            part,
        })
    }

    /// The plan's fingerprint: equal on every rank, or the ranks disagree on the model.
    fn fingerprint(&self) -> String {
        devmap::save::ranks::fingerprint(&self.ckpt, &self.plan)
    }

    /// Bytes the save writes in all (every rank's together).
    fn total_bytes(&self) -> u64 {
        self.plan.total_size
    }

    /// Rank 0: the shared shard files, created with their headers.
    fn create(&self, py: Python<'_>) -> PyResult<String> {
        let dir = py
            .detach(|| {
                devmap::save::ranks::create(&self.ckpt, &self.plan, &self.options, self.part.world)
            })
            .map_err(fail)?;
        Ok(dir.display().to_string())
    }

    /// Every rank: its blocks, written into the shared files (and, with `verify`, read
    /// back and compared with the model); returns the bytes written.
    #[pyo3(signature = (verify=true))]
    fn write(&self, py: Python<'_>, verify: bool) -> PyResult<u64> {
        let cancel = std::sync::atomic::AtomicBool::new(false);
        py.detach(|| {
            devmap::save::ranks::write_held(
                &self.ckpt,
                &self.plan,
                &self.options,
                (self.part, verify),
                &cancel,
                &mut |_| {},
            )
        })
        .map_err(fail)
    }

    /// Rank 0, after every rank wrote: the check and the commit; a JSON report.
    fn commit(&self, py: Python<'_>) -> PyResult<String> {
        let cancel = std::sync::atomic::AtomicBool::new(false);
        let report = py
            .detach(|| {
                devmap::save::ranks::commit(
                    &self.ckpt,
                    &self.plan,
                    &self.options,
                    self.part.world,
                    &cancel,
                )
            })
            .map_err(fail)?;
        Ok(serde_json::json!({
            "out": report.out,
            "shard_files": report.shard_files,
            "tensors": report.tensors,
            "bytes": report.bytes,
            "verify": serde_json::Value::Null,
        })
        .to_string())
    }

    /// After a failure on any rank: the shared folder removed; OUT is as it was.
    fn abandon(&self) {
        devmap::save::ranks::abandon(&self.ckpt, &self.plan, &self.options.out);
    }
}

/// The options `save_manifest` and `RankSave` share.
#[allow(clippy::needless_pass_by_value)]
fn options_of(
    out: &Path,
    max_shard_size: &str,
    dtype: &str,
    force: bool,
    fsync: bool,
    check: Option<Py<PyAny>>,
    stage: Option<(Py<PyAny>, u64)>,
) -> PyResult<SaveOptions> {
    let mut options = SaveOptions::new(out);
    options.max_shard_size = devmap::formats::size::parse_size(max_shard_size)
        .map_err(|e| PyValueError::new_err(format!("max_shard_size={max_shard_size:?}: {e}")))?;
    options.dtype = dtype_choice(dtype)?;
    options.force = force;
    options.fsync = fsync;
    options.available_ram = devmap::monitor::available_ram();
    options.commit_check = check.map(|check| {
        CommitCheck(Arc::new(move || {
            Python::attach(|py| match check.call0(py) {
                Ok(_) => Ok(()),
                Err(err) => Err(err.value(py).to_string()),
            })
        }))
    });
    options.stage =
        stage.map(|(fill, capacity)| StageRef::new(Arc::new(PyStage { fill, capacity })));
    Ok(options)
}

/// GPU tensors, staged by the Python side: `fill(key, offset, len)` copies those bytes
/// into its pinned buffer (torch's own copy) and returns the buffer's address.
struct PyStage {
    fill: Py<PyAny>,
    capacity: u64,
}

impl Stage for PyStage {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn fill(&self, key: u64, offset: u64, len: u64) -> Result<u64, String> {
        Python::attach(|py| {
            self.fill
                .call1(py, (key, offset, len))
                .and_then(|address| address.extract::<u64>(py))
                .map_err(|err| err.value(py).to_string())
        })
    }
}

/// `dtype=`: `auto` writes each tensor as the model holds it, as `save_pretrained`
/// does; a float dtype casts every floating tensor.
fn dtype_choice(dtype: &str) -> PyResult<DtypeChoice> {
    match dtype {
        "auto" => Ok(DtypeChoice::AsLoaded),
        "keep" => Ok(DtypeChoice::Keep),
        other => match DType::from_torch_name(other.trim_start_matches("torch.")) {
            Some(d) if devmap::save::cast::is_castable(d) => Ok(DtypeChoice::To(d)),
            _ => Err(PyValueError::new_err(format!(
                "dtype={other:?}: expected \"auto\", \"keep\", \"bfloat16\", \"float16\" or \"float32\""
            ))),
        },
    }
}

/// The checkpoint a manifest (JSON text) describes.
fn checkpoint_of(manifest: &str) -> PyResult<devmap::model::Checkpoint> {
    let origin = Path::new("the live model's manifest");
    let manifest = devmap::formats::live::parse_manifest(manifest, origin).map_err(fail)?;
    devmap::model::load::load_live(&manifest, origin).map_err(fail)
}

fn fail(err: impl std::fmt::Display) -> PyErr {
    DevmapError::new_err(err.to_string())
}

/// The text report `devmap inspect` prints, of the model a manifest describes. (The
/// interactive inspector is the `devmap` command's: `devmap.inspect` starts it.)
#[pyfunction]
fn inspect_report(manifest: &str) -> PyResult<String> {
    let ckpt = checkpoint_of(manifest)?;
    let options = devmap::inspect::TextOptions::default();
    Ok(devmap::inspect::to_text(&ckpt, options))
}

#[pymodule]
fn _devmap(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(save_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_report, m)?)?;
    m.add_class::<RankSave>()?;
    m.add("DevmapError", m.py().get_type::<DevmapError>())?;
    m.add("FORMAT", devmap::formats::live::FORMAT)?;
    Ok(())
}
