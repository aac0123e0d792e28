"""The interpreter the real-library tests run their scripts in: it imports torch,
transformers and the other reference libraries once, then forks a child per script
(as multiprocessing's forkserver forks the training ranks: `saved.start_ranks`). A
fresh interpreter importing them costs 4-6 s of a core, some fifty times a CI run.

Started by tests/common/mod.rs (`run_hf_script_with`) with the environment every
script gets: a script whose environment differs in anything but DEVMAP_* variables
(read at run time, never at import) runs in a fresh interpreter instead. Each
request is a JSON line on a connection to the socket: the script, its arguments, its
working folder and environment, and the files for its stdout and stderr. The child
runs the script as `python script args…` would (`__main__`, its folder first on
`sys.path`, atexit handlers run) and answers `exit N` on the connection. The zygote
stays single-threaded (no lock held by another thread at a fork), and leaves when its
stdin closes (the test process has exited), removing its socket and the socket's folder.

Usage: python zygote.py SOCKET (prints `ready` once it listens)
"""

import atexit
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import traceback

# What most scripts import first: the libraries, and the model classes the tiny test
# models are made of (transformers loads them lazily).
import numpy  # noqa: F401
import safetensors.torch  # noqa: F401
import torch  # noqa: F401
import accelerate  # noqa: F401
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401


def run_child(connection, request):
    """In the forked child: the script, as `python script args…` runs it."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    # As `Command::output` starts a process: nothing to read on stdin.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    script = request["script"]
    os.execv = os.execve = refuse_exec
    sys.argv = [script, *request["args"]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        if exit.code is None:
            code = 0
        elif isinstance(exit.code, int):
            code = exit.code
        else:
            print(exit.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    sys.stdout.flush()
    sys.stderr.flush()
    connection.sendall(f"exit {code}\n".encode())
    connection.close()
    os._exit(code)


def refuse_exec(*_args):
    """A script that re-executes itself would end this child before it answers: it runs
    in a fresh interpreter when its test gives it the environment it needs up front."""
    raise RuntimeError(
        "this script re-executes its interpreter: its test should set the variables it "
        "needs (any but DEVMAP_* runs it in a fresh interpreter, not the zygote's child)"
    )


def read_request(connection):
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(1 << 16)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def main():
    path = sys.argv[1]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    # Children are reaped by the kernel; a child restores the default for its own.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ, "server")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    print("ready", flush=True)
    try:
        serve(server, selector)
    finally:
        # The folder is the zygote's to remove (the test process never drops it).
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def serve(server, selector):
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":
                if not sys.stdin.buffer.read1(1 << 10):
                    return
                continue
            connection, _ = server.accept()
            request = read_request(connection)
            if request is None:
                connection.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                # The child never returns into the loop (nor into main's clean-up).
                try:
                    selector.close()
                    server.close()
                    run_child(connection, request)
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(1)
            connection.close()


if __name__ == "__main__":
    main()
