"""devmap.inspect on a live model (cpu + disk) for tests/real/python_bridge.rs: in a
terminal (tmux) the inspector (the devmap command, $DEVMAP_BIN) takes the screen until
`q`, then `INSPECTOR CLOSED` is printed; a save made there into $LIVE_INSPECT_OUT (the
command reading this process's memory) is then checked against the checkpoint loaded
whole. With `--report` (stdout not a terminal) the text report is printed instead and
checked here.
"""
from saved import workdir
import os
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import devmap

work = workdir(prefix="devmap-inspect-")
torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2)
LlamaForCausalLM(config).save_pretrained(os.path.join(work, "src"))
device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
              "model.layers.2": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
# Loaded as bfloat16 from a float32 checkpoint: the offload folder may keep the stored
# float32, and the report must count what the model holds.
model = AutoModelForCausalLM.from_pretrained(os.path.join(work, "src"), device_map=device_map,
                                             offload_folder=os.path.join(work, "offload"),
                                             dtype=torch.bfloat16)
if sys.argv[1:] == ["--report"]:
    import contextlib
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        devmap.inspect(model)
    report = text.getvalue()
    for want in ("LlamaForCausalLM in this Python session", "device map: 7 keys", "disk", "cpu",
                 "layers"):
        if want not in report:
            raise SystemExit(f"the report lacks {want!r}:\n{report}")
    # The disk's share of the bytes, as the model holds them (every tensor bfloat16).
    numel = {name: p.numel() for name, p in model.named_parameters()}
    on_disk = sum(n for name, n in numel.items() if name.startswith(("model.layers.1.", "model.layers.2.")))
    share = f"{on_disk * 100 / sum(numel.values()):.1f}%"
    disk_line = next((line for line in report.splitlines() if line.strip().startswith("disk ")), "")
    if not disk_line.endswith(share):
        raise SystemExit(f"the disk's share is not {share} (bfloat16 as held):\n{report}")
    if "no offload folder" in report:
        raise SystemExit(f"the report warns of a missing offload folder:\n{report}")
    print("ok: the report outside a terminal")
elif sys.argv[1:] == ["--no-command"]:
    # A terminal (a pseudo-terminal here) with no devmap command to start: the report,
    # and a line on stderr saying where the interactive inspector comes from.
    import contextlib
    import io
    import pty
    import threading

    os.environ.pop("DEVMAP_BIN", None)
    os.environ["PATH"] = work
    leader, follower = pty.openpty()
    shown = []
    reader = threading.Thread(target=lambda: shown.extend(iter(lambda: _read(leader), b"")))

    def _read(fd):
        try:
            return os.read(fd, 65536)
        except OSError:
            return b""

    reader.start()
    kept = os.dup(1)
    sys.stdout.flush()
    os.dup2(follower, 1)
    said = io.StringIO()
    # A devmap command from before --live-manifest (a stand-in answering as clap does).
    old = os.path.join(work, "old-devmap")
    with open(old, "w") as f:
        f.write("#!/bin/sh\necho \"error: unexpected argument '--live-manifest' found\" >&2\nexit 2\n")
    os.chmod(old, 0o755)
    too_old = None
    try:
        with contextlib.redirect_stderr(said):
            devmap.inspect(model)
            os.environ["DEVMAP_BIN"] = old
            try:
                devmap.inspect(model)
            except devmap.DevmapError as err:
                too_old = str(err)
        sys.stdout.flush()
    finally:
        os.dup2(kept, 1)
        os.close(follower)
    reader.join(timeout=10)
    report = b"".join(shown).decode(errors="replace")
    if "cargo install devmap" not in said.getvalue() or "device map: 7 keys" not in report:
        raise SystemExit(f"no note or no report:\n{said.getvalue()}\n{report}")
    print("ok: a terminal without the devmap command gets the report and a note")
    if too_old is None or "older than this package" not in too_old:
        raise SystemExit(f"an old devmap command is not named as such: {too_old!r}")
    print("ok: a devmap command without --live-manifest is named as older than the package")
else:
    devmap.inspect(model)
    print("INSPECTOR CLOSED")
    out = os.environ.get("LIVE_INSPECT_OUT")
    if out:
        from safetensors.torch import load_file

        saved = {}
        for name in sorted(os.listdir(out)):
            if name.endswith(".safetensors"):
                saved.update(load_file(os.path.join(out, name)))
        whole = AutoModelForCausalLM.from_pretrained(os.path.join(work, "src"), dtype=torch.bfloat16)
        want = whole.state_dict()
        wrong = [n for n in want if n not in saved or not torch.equal(saved[n].to(torch.bfloat16), want[n])]
        print(f"SAVE CHECKED: {len(saved)} tensors, wrong: {wrong}")
