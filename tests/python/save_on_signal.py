"""devmap.save_on_signal on a real training loop (issue 37): a tiny Llama trained with
AdamW on CPU, one thread, in a child process that arms `save_on_signal(model, out,
optimizer=opt)`; the parent waits for a few steps, then sends SIGTERM at a random
moment, 20 times. The child saves at the end of the step the signal arrived in and
exits 0; the output, loaded with `from_pretrained`, must equal the weights after
exactly that many steps, recomputed here. Then a save cancelled by a second signal
(the save held after its first tensor by DEVMAP_TEST_PAUSE): exit 143, nothing written.

The children are forked from a server process that has imported torch, transformers
and devmap once (multiprocessing's forkserver with those preloaded): each is a process
of its own, signalled as a job scheduler signals one, without 20 imports of torch.

Usage: python save_on_signal.py            (the devmap package importable)
"""

import os
import random
import signal
import sys
import tempfile
import time

import torch

# The parent's work folder, made in main(): the children this file starts import it
# too, and made one each at import (252 empty folders over a few CI runs).
WORK = None
RUNS = 20


def model_and_optimizer():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model, optimizer, step):
    g = torch.Generator().manual_seed(step)
    batch = torch.randint(0, 97, (2, 8), generator=g)
    loss = model(batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def child(out, steps_file, err_file, pause):
    """Trains until told to stop; the step counter is written before the save hook
    runs (hooks run in the order they were registered). Its stderr goes to `err_file`."""
    import devmap

    err = os.open(err_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(err, 2)
    if pause is not None:
        os.environ["DEVMAP_TEST_PAUSE"] = pause
    torch.set_num_threads(1)
    model, optimizer = model_and_optimizer()
    done = [0]

    def count(opt, args, kwargs):
        done[0] += 1
        with open(steps_file, "w") as f:
            f.write(str(done[0]))

    optimizer.register_step_post_hook(count)
    devmap.save_on_signal(model, out, optimizer=optimizer)
    step = 0
    while True:
        step += 1
        train_step(model, optimizer, step)


def expected_after(steps):
    torch.set_num_threads(1)
    model, optimizer = model_and_optimizer()
    for step in range(1, steps + 1):
        train_step(model, optimizer, step)
    return model.state_dict()


class Child:
    """A training child forked from the server, its stderr in a file."""

    def __init__(self, context, out, steps_file, pause=None):
        self.steps_file, self.err_file = steps_file, steps_file + ".err"
        self.proc = context.Process(target=child, args=(out, steps_file, self.err_file, pause))
        self.proc.start()

    def wait_for_step(self, n):
        """Returns once `n` steps are done (the child writes its count after each)."""
        for _ in range(6000):
            try:
                if int(open(self.steps_file).read() or 0) >= n:
                    return
            except FileNotFoundError:
                pass
            if not self.proc.is_alive():
                raise AssertionError(f"the child stopped before step {n}: {self.stderr()}")
            time.sleep(0.01)
        raise AssertionError(f"the child did not reach step {n} in 60 s")

    def stderr(self):
        with open(self.err_file) as f:
            return f.read()

    def finish(self, timeout=120):
        """The child's exit code and stderr once it exits."""
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            self.proc.kill()
            raise AssertionError(f"the child did not exit in {timeout} s: {self.stderr()}")
        return self.proc.exitcode, self.stderr()


def main():
    import multiprocessing

    from transformers import AutoModelForCausalLM

    global WORK
    WORK = tempfile.mkdtemp(prefix="devmap-signal-")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "transformers.models.llama.modeling_llama", "devmap"])

    rng = random.Random(11)
    seen = set()
    for run in range(RUNS):
        out, steps_file = os.path.join(WORK, f"out-{run}"), os.path.join(WORK, f"steps-{run}")
        proc = Child(context, out, steps_file)
        proc.wait_for_step(2)
        time.sleep(rng.uniform(0, 0.15))
        os.kill(proc.proc.pid, signal.SIGTERM)
        code, err = proc.finish()
        assert code == 0, f"run {run}: exit {code}: {err}"
        assert "devmap: saved" in err, err
        steps = int(open(steps_file).read())
        seen.add(steps)
        want = expected_after(steps)
        got = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
        differ = [k for k in want if not torch.equal(want[k], got[k])]
        assert not differ, f"run {run}: saved after step {steps}, but {differ[:3]} differ"
    print(f"ok: {RUNS} of {RUNS} SIGTERMs at random moments saved the weights of the step boundary "
          f"(steps {min(seen)}-{max(seen)}), loaded by from_pretrained")

    # A second signal during the save cancels it: nothing written.
    out, steps_file = os.path.join(WORK, "cancelled"), os.path.join(WORK, "steps-cancelled")
    pause = os.path.join(WORK, "pause")
    open(pause, "w").close()
    proc = Child(context, out, steps_file, pause=pause)
    proc.wait_for_step(2)
    os.kill(proc.proc.pid, signal.SIGTERM)
    for _ in range(600):
        if os.path.exists(pause + ".reached"):
            break
        time.sleep(0.05)
    assert os.path.exists(pause + ".reached"), "the save never started"
    os.kill(proc.proc.pid, signal.SIGTERM)
    # The paused save stops by itself once it sees the second signal; the pause is
    # lifted only after 30 s (on a busy machine the signal may take a while to reach
    # the saving thread), when the save, going on, fails the check below.
    proc.proc.join(30)
    os.remove(pause)
    code, err = proc.finish()
    assert code == 128 + signal.SIGTERM, f"exit {code}: {err}"
    assert "no save" in err and not os.path.exists(out), err
    print("ok: a second SIGTERM during the save cancels it; nothing written, exit 143")
    import shutil

    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
