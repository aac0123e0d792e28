//! The real-library tests' scripts run in children forked from one Python that has
//! imported torch and transformers (tests/python/zygote.py): a fresh interpreter
//! importing them costs 4-6 s of a core, and the real-library binary runs some fifty
//! scripts. Started on the first script; it leaves when this test process exits (its
//! stdin closes). A script whose environment differs from the zygote's in anything
//! but `DEVMAP_*` variables (read at run time; `PYTHONPATH` or `HF_*` are read at
//! start or import) runs in a fresh interpreter, as does every script where the
//! zygote cannot start (`DEVMAP_TEST_NO_ZYGOTE=1` asks for that).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// A running zygote: where it listens (a folder it removes when it leaves), and the
/// pipe whose closing ends it.
struct Zygote {
    socket: PathBuf,
    _stdin: Mutex<ChildStdin>,
    _child: Mutex<Child>,
}

/// What a script wrote and how it ended.
pub struct Ran {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// The environment the zygote starts with, and every script gets (forked or fresh).
fn base_env() -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| k != "HF_HUB_OFFLINE")
        .collect();
    env.push(("HF_HUB_OFFLINE".into(), "1".into()));
    env
}

fn zygote(python: &Path) -> Option<&'static Zygote> {
    static ZYGOTE: OnceLock<Option<Zygote>> = OnceLock::new();
    ZYGOTE
        .get_or_init(|| {
            if std::env::var_os("DEVMAP_TEST_NO_ZYGOTE").is_some_and(|v| v == "1") {
                return None;
            }
            start(python)
                .map_err(|why| {
                    eprintln!("the script zygote did not start ({why}): fresh interpreters");
                })
                .ok()
        })
        .as_ref()
}

fn start(python: &Path) -> Result<Zygote, String> {
    let dir = tempfile::Builder::new()
        .prefix("devmap-zygote-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let socket = dir.path().join("socket");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/zygote.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg(&socket)
        .env_clear()
        .envs(base_env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.trim() != "ready" {
        let _ = child.kill();
        return Err(format!("it said {line:?}"));
    }
    // The zygote removes the folder when it leaves: a static is never dropped.
    let _ = dir.keep();
    Ok(Zygote {
        socket,
        _stdin: Mutex::new(stdin),
        _child: Mutex::new(child),
    })
}

/// Runs `python script args` with `extra` environment variables, in a child of the
/// zygote where it may (see the module's note), else in a fresh interpreter.
pub fn run_script(
    python: &Path,
    script: &Path,
    args: &[OsString],
    extra: &[(&str, OsString)],
) -> Ran {
    let forkable = extra.iter().all(|(k, _)| k.starts_with("DEVMAP_"));
    if forkable && let Some(zygote) = zygote(python) {
        match run_forked(zygote, script, args, extra) {
            Ok(ran) => return ran,
            Err(why) => eprintln!("the script zygote failed ({why}): a fresh interpreter"),
        }
    }
    let o = Command::new(python)
        .arg(script)
        .args(args)
        .env_clear()
        .envs(base_env())
        .envs(extra.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("python");
    Ran {
        ok: o.status.success(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn run_forked(
    zygote: &Zygote,
    script: &Path,
    args: &[OsString],
    extra: &[(&str, OsString)],
) -> Result<Ran, String> {
    let text = |s: &std::ffi::OsStr| s.to_str().map(str::to_owned).ok_or("not UTF-8");
    let mut env = serde_json::Map::new();
    for (k, v) in base_env()
        .into_iter()
        .chain(extra.iter().map(|(k, v)| (OsString::from(k), v.clone())))
    {
        env.insert(text(&k)?, text(&v)?.into());
    }
    let outputs = tempfile::Builder::new()
        .prefix("devmap-script-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let (stdout, stderr) = (outputs.path().join("stdout"), outputs.path().join("stderr"));
    let request = serde_json::json!({
        "script": text(script.as_os_str())?,
        "args": args.iter().map(|a| text(a)).collect::<Result<Vec<_>, _>>()?,
        "cwd": text(std::env::current_dir().map_err(|e| e.to_string())?.as_os_str())?,
        "env": env,
        "stdout": text(stdout.as_os_str())?,
        "stderr": text(stderr.as_os_str())?,
    });
    let mut connection = UnixStream::connect(&zygote.socket).map_err(|e| e.to_string())?;
    connection
        .write_all(format!("{request}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    connection
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    let read = |path: &Path| {
        String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
    };
    let (stdout, mut stderr) = (read(&stdout), read(&stderr));
    let status = answer.trim().strip_prefix("exit ");
    if status.is_none() {
        // The child died before it could answer (a signal): a failure, said so.
        stderr.push_str("\n(the script's forked interpreter ended without an exit status)\n");
    }
    let ok = status == Some("0");
    Ok(Ran { ok, stdout, stderr })
}
