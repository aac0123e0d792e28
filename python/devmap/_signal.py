"""Saving a live model when the job is told to stop (`devmap.save_on_signal`).

Preemptible machines warn before they kill: Slurm sends SIGTERM and SIGKILL `KillWait`
seconds later (30 by default), spot instances give 30 s to 2 min. A handler armed
here saves the model with devmap's writer (atomic: OUT holds the old folder or the
new one, never a mix) and lets the job exit. With the optimizer given, the save waits
for the end of the optimizer step the signal arrived in, so the weights are those of
a step boundary, never half-updated. A second signal, or the deadline, cancels the
save cleanly: OUT is left as it was.
"""

import os
import signal
import sys
import threading
import time


class SaveCancelled(Exception):
    """A second signal, or the deadline, stopped the save on signal."""


class Armed:
    """The handlers `save_on_signal` installed; `disarm()` puts the previous ones back.
    `saved` is the report of the save once it is done, `seconds` the time from the
    signal to the end of the save (the commit, or the cancellation)."""

    def __init__(self, model, out, signals, deadline_s, optimizer, exit, save_kwargs):
        self.model, self.out, self.signals = model, out, tuple(signals)
        self.deadline_s, self.exit, self.save_kwargs = deadline_s, exit, save_kwargs
        self.state, self.signum, self.saved, self.timer = "armed", None, None, None
        self.seconds = None
        self.previous = {s: signal.signal(s, self._on_signal) for s in self.signals}
        self.hook = optimizer.register_step_post_hook(self._after_step) if optimizer is not None else None

    def disarm(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        if self.hook is not None:
            self.hook.remove()
        if self.timer is not None:
            self.timer.cancel()

    def _on_signal(self, signum, frame):
        if self.state == "saving":
            raise SaveCancelled(f"signal {signum} arrived during the save")
        if self.state == "pending":
            # Told twice before the step ended (or the deadline passed): no save.
            self._finish(None, f"signal {signum} arrived again before the optimizer step ended")
            return
        if self.state != "armed":
            return
        self.signum, self.started = signum, time.monotonic()
        if self.deadline_s is not None:
            pid = os.getpid()
            self.timer = threading.Timer(self.deadline_s, lambda: os.kill(pid, signum))
            self.timer.daemon = True
            self.timer.start()
        if self.hook is None:
            self._save()
        else:
            self.state = "pending"

    def _after_step(self, optimizer, args, kwargs):
        if self.state == "pending":
            self._save()

    def _save(self):
        from . import DevmapError, save_pretrained

        self.state = "saving"
        kwargs = dict(progress=False, verify=False, force=True)
        kwargs.update(self.save_kwargs)
        try:
            report = save_pretrained(self.model, self.out, **kwargs)
        except (SaveCancelled, DevmapError) as err:
            self._finish(None, str(err))
            return
        self._finish(report, None)

    def _finish(self, report, why):
        self.state = "done"
        self.saved = report
        self.disarm()
        took = self.seconds = time.monotonic() - self.started
        if report is not None:
            sys.stderr.write(f"devmap: saved {self.out} on signal {self.signum} in {took:.2f} s\n")
        else:
            sys.stderr.write(f"devmap: no save on signal {self.signum} ({why}); {self.out} is as it was\n")
        sys.stderr.flush()
        if self.exit:
            raise SystemExit(0 if report is not None else 128 + self.signum)
