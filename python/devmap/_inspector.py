"""The interactive inspector `devmap.inspect` opens: the `devmap` command's, started in
this terminal over a manifest of the model (the package itself links no terminal
code). The manifest names this process, whose memory the command reads when the
inspector saves (`s`)."""

import os
import shutil
import subprocess
import sys

# prctl(2)'s PR_SET_PTRACER ("Yama" in ASCII).
_PR_SET_PTRACER = 0x59616D61


def in_terminal():
    """Whether standard output is a terminal that can show the inspector (TERM=dumb has
    no cursor addressing)."""
    try:
        return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def command():
    """The `devmap` command to start: $DEVMAP_BIN, else `devmap` on PATH; None when
    there is neither. A $DEVMAP_BIN that is no program is an error naming it."""
    named = os.environ.get("DEVMAP_BIN")
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise FileNotFoundError(f"DEVMAP_BIN={named!r} is not an executable file")
        return named
    return shutil.which("devmap")


def run(program, manifest_path):
    """Runs the inspector in this terminal until it quits. Returns None, or what went
    wrong in the command's words."""
    sys.stdout.flush()
    sys.stderr.flush()
    child = subprocess.Popen([program, "--live-manifest", manifest_path], stderr=subprocess.PIPE)
    _let_read_memory(child.pid)
    try:
        _, err = child.communicate()
    finally:
        _let_read_memory(0)
    err = err.decode(errors="replace").strip()
    if child.returncode != 0 and "--live-manifest" in err:
        # A command from before devmap.inspect started it: it does not know the flag.
        return f"{err}\n{program} is older than this package: install the devmap command from the same checkout"
    if child.returncode != 0:
        return err or f"{program} exited with status {child.returncode}"
    if err:
        print(err, file=sys.stderr)
    return None


def _let_read_memory(pid):
    """Where Yama's ptrace_scope 1 lets only a process's ancestors read its memory, lets
    `pid` (the inspector, a child) read this one's, and 0 takes that back. Best effort:
    without Yama nothing is needed, under a stricter scope nothing helps, and a save from
    the inspector then says it cannot read."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(pid), ctypes.c_ulong(0), ctypes.c_ulong(0),
                   ctypes.c_ulong(0))
    except (OSError, AttributeError):
        pass
