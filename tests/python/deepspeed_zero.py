"""devmap reads DeepSpeed ZeRO checkpoints as DeepSpeed's own zero_to_fp32 rebuilds
them. A tiny tied Llama (vocabulary 97, intermediate size 90: parameters that do not
split evenly) is trained one AdamW step by 2 CPU ranks (gloo on 127.0.0.1) under ZeRO
stage 1 (in float32, and in bfloat16, where DeepSpeed's bf16 optimizer writes
`bf16_zero_pp_rank_R_…` files), stage 2 and stage 3 — in float32 with the first layer
and the final norm frozen, as a fine-tune that trains part of a model does — and saved
with `engine.save_checkpoint(DIR)`. `devmap save DIR
--config CONFIG` must write, bit for bit, the fp32 state dict
`get_fp32_state_dict_from_zero_checkpoint(DIR)` gives (the tied head dropped, as
transformers saves a tied model) — and with `--dtype bfloat16`, that cast as torch's
`.to()` casts — except under ZeRO 1, where zero_to_fp32 leaves the frozen parameters
out and devmap writes them as the model states hold them (the model's own values); `from_pretrained(OUT)` gives the logits of the model holding
zero_to_fp32's state dict; `verify OUT --against DIR` is clean, names and shapes checked against LlamaForCausalLM; `inspect --json` names
the ranks each parameter's pieces come from. A folder missing a rank's optimizer states
is refused, naming the file, with nothing written.

Usage: python deepspeed_zero.py PATH/TO/devmap
"""

import json
import os
import subprocess
import sys

import torch
from saved import start_ranks, workdir

INPUT = torch.tensor([[1, 5, 9, 33, 2, 17, 60, 3]])
SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=90, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


def rank_main(rank, world, port, stage, bf16, folder, config_dir, frozen=False):
    """One rank: the model, one AdamW step under ZeRO `stage` (in bfloat16 with
    fp32 master weights when `bf16`; with the first layer and the final norm frozen,
    as a fine-tune that trains part of a model does, when `frozen`), and the save."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      DS_ACCELERATOR="cpu")
    import deepspeed
    from transformers import AutoModelForCausalLM, LlamaConfig

    # DeepSpeed would compile a shared-memory all-reduce for CPU ranks; gloo's is enough.
    # (The submodule by sys.modules: `deepspeed.comm.torch` is torch itself.)
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SMALL))
    if rank == 0:
        # As a model's own save writes it: naming the architecture is what lets verify
        # check the names and shapes against it.
        model.config.architectures = [type(model).__name__]
        model.config.save_pretrained(config_dir)
    if frozen:
        for p in [*model.model.layers[0].parameters(), model.model.norm.weight]:
            p.requires_grad_(False)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16}}
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      optimizer=torch.optim.AdamW(
                                          [p for p in model.parameters() if p.requires_grad], lr=1e-2))
    loss = engine(INPUT, labels=INPUT).loss
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(folder)


def train(name, ports, stage, bf16, src, config, frozen=False):
    """The 2-rank training run that writes checkpoint `src`. A rank of it sometimes aborts
    in gloo's teardown on this VM (SIGABRT, "terminate called without an active
    exception"): the run is made once more, on the second port. devmap has not been
    called yet."""
    import shutil

    for attempt, port in enumerate(ports):
        try:
            start_ranks(rank_main, (2, port, stage, bf16, src, config, frozen), 2,
                        preload=("torch", "transformers.models.llama.modeling_llama"))
            return
        except torch.multiprocessing.ProcessExitedException as e:
            if attempt + 1 == len(ports):
                raise
            print(f"the {name} training run failed ({e}); running it again")
            shutil.rmtree(src, ignore_errors=True)
            shutil.rmtree(config, ignore_errors=True)


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def case(devmap, work, stage, port, bf16=False, frozen=False):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from saved import first_unequal, tensors
    from transformers import AutoModelForCausalLM, LlamaConfig

    name = f"zero{stage}" + ("-bf16" if bf16 else "") + ("-frozen" if frozen else "")
    src, config = os.path.join(work, f"{name}-src"), os.path.join(work, f"{name}-config")
    train(name, (port, port + 5), stage, bf16, src, config, frozen)
    want = get_fp32_state_dict_from_zero_checkpoint(src)
    want = {k: v.contiguous() for k, v in want.items()}
    # The ranks' model as it started (same seed): what frozen parameters still hold.
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(LlamaConfig(**SMALL))
    frozen_names = {n for n, _ in reference.named_parameters()
                    if n.startswith("model.layers.0.") or n == "model.norm.weight"} if frozen else set()
    if stage == 1:
        # ZeRO 1 records no frozen parameters: zero_to_fp32 leaves them out (a model
        # loaded from its output initialises them afresh); devmap reads them from the
        # model states' module, as they were.
        if frozen_names & set(want):
            sys.exit(f"FAIL {name}: zero_to_fp32 now gives ZeRO 1's frozen parameters; devmap's reading is the same as its")
        want.update({k: v.detach().clone() for k, v in reference.state_dict().items() if k in frozen_names})
    reference.load_state_dict(want, strict=False)
    with torch.no_grad():
        want_logits = reference(INPUT).logits
    for dtype in (None, torch.bfloat16):
        ours = os.path.join(work, f"{name}-{dtype}")
        extra = ["--dtype", "bfloat16"] if dtype else []
        r = run([devmap, "save", src, "--config", config, "--out", ours, "--quiet", *extra])
        if r.returncode != 0:
            sys.exit(f"FAIL {name}: devmap save: {r.stderr}")
        got = tensors(ours)
        # transformers drops the tied head on save; zero_to_fp32 keeps it as the
        # embedding's copy.
        dropped = set(want) - set(got)
        if dropped != {"lm_head.weight"} or set(got) - set(want):
            sys.exit(f"FAIL {name}: names differ from zero_to_fp32's: only it {dropped}, only devmap {set(got) - set(want)}")
        unequal = first_unequal(got, {k: want[k] for k in got}, dtype)
        if unequal:
            sys.exit(f"FAIL {name}: {unequal} differs from zero_to_fp32's")
        if not dtype:
            with torch.no_grad():
                logits = AutoModelForCausalLM.from_pretrained(ours)(INPUT).logits
            if not torch.equal(logits, want_logits):
                sys.exit(f"FAIL {name}: logits differ by {float((logits - want_logits).abs().max())}")
        r = run([devmap, "verify", ours, "--against", src, "--config", config, "--quiet", *extra])
        if r.returncode != 0 or "as transformers expects (LlamaForCausalLM, " not in r.stdout + r.stderr or "): 0 problems" not in r.stdout + r.stderr:
            sys.exit(f"FAIL {name}: verify --against: {r.stdout[-600:]} {r.stderr[-600:]}")
    r = run([devmap, "inspect", src, "--config", config, "--json"])
    report = json.loads(r.stdout)
    ranks = {c["rank"] for t in report["tensors"] if t["source"]["kind"] == "pieces"
             for c in t["source"]["chunks"]}
    if ranks != {0, 1}:
        sys.exit(f"FAIL {name}: inspect --json does not name both ranks' pieces: {ranks}")
    what = ""
    if frozen:
        what = (f", {len(frozen_names)} frozen parameters among them"
                + (" (read from the model states: zero_to_fp32 leaves them out)" if stage == 1 else ""))
    print(f"ok: {name}: {len(got)} tensors from 2 ranks{what}, bit for bit zero_to_fp32's fp32 state dict "
          f"(and its bfloat16 cast); logits equal; verify --against clean; inspect names both ranks")
    return src, config


def main(devmap):
    import shutil

    work = workdir(prefix="devmap-deepspeed-")
    case(devmap, work, 1, 29543, frozen=True)
    case(devmap, work, 1, 29544, bf16=True)
    case(devmap, work, 2, 29541, frozen=True)
    src, config = case(devmap, work, 3, 29542, frozen=True)
    broken = os.path.join(work, "rank-missing")
    shutil.copytree(src, broken)
    step = os.path.join(broken, open(os.path.join(broken, "latest")).read().strip())
    os.remove(os.path.join(step, "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    out = os.path.join(work, "rank-missing-out")
    r = run([devmap, "save", broken, "--config", config, "--out", out, "--quiet"])
    if r.returncode == 0 or "zero_pp_rank_0_mp_rank_00_optim_states.pt" not in r.stderr \
            or "2 ranks" not in r.stderr or os.path.exists(out):
        sys.exit(f"FAIL rank-missing: must be refused naming the ranks, nothing written: {r.stderr}")
    print("ok: rank-missing: a folder without rank 1's optimizer states refused; nothing written")


if __name__ == "__main__":
    main(sys.argv[1])
