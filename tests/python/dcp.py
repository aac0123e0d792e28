"""devmap reads torch.distributed.checkpoint folders as `dcp.save` writes them (the
default FileSystemWriter: `.metadata` and `__R_S.distcp`). A tiny tied bfloat16 Llama
is saved by `dcp.save` from one process, nested as training loops save it
(`{"model": …, "optimizer": …, "epoch": …}`, an AdamW state after one step, plus the
train state and dataloader bytes torchtitan keeps, which inspect names as left out) and flat;
`devmap save DIR --config CONFIG` must write what transformers' `save_pretrained`
writes for the model (names, dtypes, every byte) and `from_pretrained(OUT)` must give
the logits of transformers' own save, and `verify OUT --against DIR` is clean; the
optimizer state is never written. A folder whose `.distcp` file is gone or cut short
is refused, naming the file and a tensor stored there, with nothing written; a
`.metadata` whose pickle names `os.system` is refused by name and never run.
Checkpoints several ranks wrote: dcp_ranks.py.

Usage: python dcp.py PATH/TO/devmap
"""

from saved import workdir
import io
import os
import pickle
import subprocess
import sys

import torch
import torch.distributed.checkpoint as dcp
from saved import differences, tensors
from transformers import AutoModelForCausalLM, LlamaConfig

WORK = workdir(prefix="devmap-dcp-")
INPUT = torch.tensor([[1, 5, 9, 33, 2, 17, 60, 3]])


def devmap_save(devmap, src, out, config, extra=()):
    return subprocess.run([devmap, "save", src, "--config", config, "--out", out, "--quiet", *extra],
                          capture_output=True, text=True)


def case(devmap, name, model, nested):
    src, ref, ours = (os.path.join(WORK, f"{name}-{d}") for d in ("src", "ref", "devmap"))
    model.save_pretrained(ref)
    if nested:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(INPUT).logits.float().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        model.save_pretrained(ref)
        # What torchtitan keeps beside the model: its train state (a step tensor and
        # a BytesIO of logged steps) and the dataloader's pickled state, stored as bytes.
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3,
                 "train_state": {"step": torch.tensor(10), "log_steps": io.BytesIO(b"\x80\x04]\x94.")},
                 "dataloader": {"dp_rank_0": b"\x80\x04}\x94."}}
    else:
        state = model.state_dict()
    dcp.save(state, checkpoint_id=src)
    with torch.no_grad():
        want_logits = AutoModelForCausalLM.from_pretrained(ref)(INPUT).logits
    r = devmap_save(devmap, src, ours, ref)
    if r.returncode != 0:
        sys.exit(f"FAIL {name}: devmap save: {r.stderr}")
    why = differences(ours, ref)
    if why:
        sys.exit(f"FAIL {name}: {why}")
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(ours)(INPUT).logits
    if not torch.equal(logits, want_logits):
        sys.exit(f"FAIL {name}: logits differ by {float((logits - want_logits).abs().max())}")
    r = subprocess.run([devmap, "verify", ours, "--against", src, "--config", ref, "--quiet"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL {name}: verify --against: {r.stdout[-600:]} {r.stderr[-600:]}")
    if nested:
        # What is not the model's is said to be left out.
        r = subprocess.run([devmap, "inspect", src, "--config", ref], capture_output=True, text=True)
        said = r.stdout + r.stderr
        if "left out" not in said or any(n not in said for n in ("`optimizer` (", "`epoch`", "`train_state", "`dataloader")):
            sys.exit(f"FAIL {name}: inspect does not say the optimizer state, epoch, train state and dataloader are left out: {r.stdout[-800:]}")
    kind = "nested with its optimizer state (said to be left out)" if nested else "flat"
    print(f"ok: {name}: {len(tensors(ref))} tensors from a one-process dcp.save ({kind}), identical to transformers' save; logits equal; verify --against clean")


def refused(devmap, name, folder, config, needles, extra=()):
    out = os.path.join(WORK, f"{name}-out")
    r = devmap_save(devmap, folder, out, config, extra)
    if r.returncode == 0 or any(n not in r.stderr for n in needles) or os.path.exists(out):
        sys.exit(f"FAIL {name}: must be refused naming {needles} with nothing written: {r.returncode} {r.stderr}")
    print(f"ok: {name}: refused, naming {', '.join(needles)}; nothing written")


def main(devmap):
    small = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    case(devmap, "llama-nested", AutoModelForCausalLM.from_config(LlamaConfig(**small)).to(torch.bfloat16), True)
    torch.manual_seed(1)
    case(devmap, "llama-flat", AutoModelForCausalLM.from_config(LlamaConfig(**small)), False)
    config = os.path.join(WORK, "llama-flat-ref")
    refused(devmap, "unknown-state-dict-key", os.path.join(WORK, "llama-nested-src"), config,
            ["`params`", "model, optimizer"], ["--state-dict-key", "params"])

    # Damaged copies of the flat checkpoint: its .distcp file gone, then cut short.
    import shutil

    flat = os.path.join(WORK, "llama-flat-src")
    for damage in ("missing", "truncated"):
        folder = os.path.join(WORK, f"{damage}-distcp")
        shutil.copytree(flat, folder)
        data = os.path.join(folder, "__0_0.distcp")
        if damage == "missing":
            os.remove(data)
        else:
            os.truncate(data, os.path.getsize(data) // 2)
        refused(devmap, f"{damage}-distcp", folder, config, ["__0_0.distcp", "tensor `model."])

    # A .metadata that would run os.system if loaded: never run, refused by name.
    evil = os.path.join(WORK, "evil")
    os.makedirs(evil)

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + os.path.join(WORK, "pwned"),))

    with open(os.path.join(evil, ".metadata"), "wb") as f:
        pickle.dump(Evil(), f, protocol=4)
    refused(devmap, "forbidden-global", evil, config, ["posix.system"])
    if os.path.exists(os.path.join(WORK, "pwned")):
        sys.exit("FAIL: the pickle ran")


if __name__ == "__main__":
    main(sys.argv[1])
