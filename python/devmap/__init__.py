"""devmap from Python: save the model in this session with devmap's streaming saver.

    import devmap
    devmap.save_pretrained(model, "/data/out")      # what model.save_pretrained writes

CPU values are written from where they are in memory, disk-offloaded ones copied file
to file from where accelerate's or transformers' offload loader reads them: nothing is
onloaded, so memory stays flat whatever the model's size. In-memory edits (a merged
LoRA, a parameter changed in place) are saved as they are now.

`export(model, checkpoint_dir, offload_folder)` writes the device map and offload index
the `devmap` command needs to inspect or save the same model from its files.
"""

import json
import os
import sys
import tempfile
import warnings

from ._export import device_map, export, offload_index
from ._live import Refusal

__all__ = ["save_pretrained", "save_on_signal", "inspect", "export", "device_map", "offload_index",
           "DevmapError"]


class DevmapError(Exception):
    """devmap refused or failed the save; the message names the tensor or file and says
    why. The output folder holds only what it held before."""


def _check_model(model, call):
    """A model, not a state dict or a path: said in devmap's words."""
    if not (hasattr(model, "state_dict") and hasattr(model, "named_modules")):
        raise TypeError(
            f"devmap.{call} takes a model (a torch.nn.Module, as transformers loads it), not a "
            f"{type(model).__name__}; for a folder of weights use the devmap command "
            "(devmap save DIR --out OUT)"
        )


def _binding():
    try:
        from . import _devmap
    except ImportError as err:  # pragma: no cover - a source checkout without a build
        raise ImportError(
            "devmap's compiled module is missing: install the package with `pip install ./python` "
            "from a devmap checkout"
        ) from err
    return _devmap


def save_pretrained(
    model,
    out,
    max_shard_size="50GB",
    dtype="auto",
    verify=True,
    progress=True,
    force=False,
    jobs=2,
    fsync=True,
    group=None,
):
    """Saves `model` into the folder `out` as `model.save_pretrained(out)` would: the
    same tensor names (transformers' own tie removal and conversion reversal), dtypes,
    bytes, config.json and generation_config.json, sharded at `max_shard_size`.

    - `dtype`: "auto" writes each tensor in the dtype the model holds it in, as
      transformers does; "bfloat16", "float16" or "float32" casts every floating tensor.
    - `verify`: read the saved folder back and compare every tensor with the model
      (and with what transformers expects of the architecture); raises on a difference.
    - `progress`: a progress bar (tqdm if installed, else a line on stderr), or a
      callable `progress(written_bytes, total_bytes)`.
    - `fsync`: flush every shard to the disk before it is renamed into place, so a
      power loss leaves the old folder or the new one (transformers does not; False
      saves that time).
    - `force`: allow an `out` that already holds files (devmap replaces its own kind of
      files and leaves the rest); the default refuses a non-empty folder.
    - A model sharded over the ranks of a job (FSDP2's `fully_shard`, DTensor
      parameters): call this on every rank, with the same arguments. Each rank writes
      the blocks its shards hold straight into the shard files, rank 0 commits once all
      are done; nothing is gathered. `group` is the process group of the ranks (the
      default one when None). `verify`: each rank reads back the blocks it wrote and
      compares them with its shards before anything is committed; rank 0 checks each
      shard's header and that the ranks' blocks make up every tensor exactly once.

    Returns a dict: `out`, `shard_files`, `tensors`, `bytes`, `verify` (the report), and
    `warnings` (also issued with `warnings.warn`: layers a peft merge left as they
    were, because peft made their adapters on the meta device).
    Raises `DevmapError` with nothing committed when the save cannot be made or is
    interrupted (Ctrl-C included).
    """
    from . import _live, _ranks

    _check_model(model, "save_pretrained")
    binding = _binding()
    out = os.path.abspath(os.fspath(out))
    if isinstance(max_shard_size, int):
        max_shard_size = str(max_shard_size)
    if _ranks.is_sharded(model):
        # Every rank of the job writes its own shards; no rank gathers the model.
        report = _ranks.save(model, out, binding, group=group, max_shard_size=max_shard_size,
                             dtype=dtype, force=force, fsync=fsync, verify=verify)
        report["warnings"] = []
        return report
    with tempfile.TemporaryDirectory(prefix="devmap-config-") as config_dir:
        try:
            manifest, keep_alive, unchanged, stager, notes = _live.build(model, config_dir)
        except Refusal as refusal:
            raise DevmapError(f"cannot save; nothing was written: {refusal}") from None
        for note in notes:
            warnings.warn(note, stacklevel=2)
        bar = _progress_bar(progress)

        def check():
            try:
                unchanged()
            except Refusal as refusal:
                raise DevmapError(str(refusal)) from None

        try:
            text = binding.save_manifest(
                json.dumps(manifest),
                out,
                max_shard_size=max_shard_size,
                dtype=dtype,
                force=force,
                verify=verify,
                jobs=jobs,
                fsync=fsync,
                progress=bar.update if bar else None,
                check=check,
                stage=(stager.fill, stager.capacity) if stager.tensors else None,
            )
        except binding.DevmapError as err:
            # The Rust saver speaks the command line's flags; here they are arguments.
            raise DevmapError(str(err).replace("pass --force", "pass force=True")) from None
        finally:
            if bar:
                bar.close()
            del keep_alive, stager
    report = json.loads(text)
    report["warnings"] = notes
    return report


def save_on_signal(model, out, signals=None, deadline_s=None, optimizer=None, exit=True, **save_kwargs):
    """Arms a handler that saves `model` into `out` when the job is told to stop
    (SIGTERM from Slurm or a spot instance's notice, SIGUSR1 by default), then exits.

    - `optimizer`: save at the end of the optimizer step the signal arrived in (its
      step post-hook), so the weights are a step boundary's; without it the save runs
      at once, between two Python statements of the training loop.
    - `deadline_s`: past this many seconds after the signal, the save is cancelled.
      A second signal cancels it too. A cancelled save leaves `out` as it was.
    - `exit`: raise SystemExit after the save (0 when saved, 128 + the signal when
      not); False returns to the training loop (the returned object's `saved`).
    - `save_kwargs` go to `save_pretrained` (defaults here: `verify=False`,
      `force=True` so a folder an earlier preemption wrote is replaced whole,
      `progress=False`).

    Returns the armed handlers (`.disarm()` puts the previous ones back)."""
    import signal as _signal

    from ._signal import Armed

    _check_model(model, "save_on_signal")
    if signals is None:
        signals = (_signal.SIGTERM, _signal.SIGUSR1)
    return Armed(model, os.path.abspath(os.fspath(out)), signals, deadline_s, optimizer, exit, save_kwargs)


def inspect(model):
    """Opens devmap's inspector on `model` as it is now: every tensor under the name
    `save_pretrained` gives it, where it lives (`gpu:N`, `cpu`, `disk`, `meta`), sizes
    and per-device totals, RAM and GPU memory gauges. In a terminal it takes the screen
    until you quit (`q`); elsewhere (a notebook, a pipe) it prints the report
    `devmap inspect` prints. `s` in the inspector saves the model as
    `save_pretrained` above does (CPU and disk values; GPU tensors need
    `devmap.save_pretrained`). A model sharded over the ranks of a job shows this
    rank's view: every tensor at its whole shape, with the blocks this rank holds.

    The interactive inspector is the `devmap` command's (`cargo install devmap`),
    found as $DEVMAP_BIN or on PATH and started in this terminal; without it a
    terminal gets the report too, with a line saying so."""
    from . import _inspector, _live, _ranks

    _check_model(model, "inspect")
    binding = _binding()
    with tempfile.TemporaryDirectory(prefix="devmap-config-") as config_dir:
        try:
            if _ranks.is_sharded(model):
                # This rank's view: every tensor whole in shape, the blocks it holds.
                manifest, keep_alive, _, stager = _ranks.build(model, config_dir)
                notes = []
            else:
                manifest, keep_alive, _, stager, notes = _live.build(model, config_dir, allow_missing=True)
            for note in notes:
                warnings.warn(note, stacklevel=2)
        except Refusal as refusal:
            raise DevmapError(f"cannot inspect: {refusal}") from None
        try:
            program = _inspector.command() if _inspector.in_terminal() else None
            if program is not None:
                # The command reads the tensors' memory in this process.
                manifest["pid"] = os.getpid()
                path = os.path.join(config_dir, "manifest.json")
                with open(path, "w") as f:
                    json.dump(manifest, f)
                failed = _inspector.run(program, path)
                if failed is not None:
                    raise DevmapError(f"the inspector ({program}) failed: {failed}")
                return
            report = binding.inspect_report(json.dumps(manifest))
        except FileNotFoundError as err:
            raise DevmapError(str(err)) from None
        except binding.DevmapError as err:
            raise DevmapError(str(err)) from None
        finally:
            del keep_alive, stager
    if _inspector.in_terminal():
        print("devmap: the interactive inspector is the devmap command's (cargo install devmap, "
              "or DEVMAP_BIN=/path/to/devmap); here is its report", file=sys.stderr)
    print(report, end="")


class _Line:
    """A progress line on stderr where tqdm is not installed."""

    def __init__(self):
        self.shown = -1

    def update(self, written, total):
        percent = int(100 * written / total) if total else 100
        if percent != self.shown:
            self.shown = percent
            sys.stderr.write(f"\rdevmap: saving {percent:3d}% ({written >> 20} of {total >> 20} MiB)")
            sys.stderr.flush()

    def close(self):
        if self.shown >= 0:
            sys.stderr.write("\n")


class _Tqdm:
    def __init__(self, tqdm):
        self.tqdm, self.bar, self.done = tqdm, None, 0

    def update(self, written, total):
        if self.bar is None:
            self.bar = self.tqdm(total=total, unit="B", unit_scale=True, desc="devmap: saving")
        self.bar.update(written - self.done)
        self.done = written

    def close(self):
        if self.bar is not None:
            self.bar.close()


class _Calls:
    """A progress callable of the caller's: `progress(written, total)`."""

    def __init__(self, call):
        self.update = call

    def close(self):
        pass


def _progress_bar(progress):
    if not progress:
        return None
    if callable(progress):
        return _Calls(progress)
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Line()
    return _Tqdm(tqdm)
