"""Ties are decided by evidence, never by a name (issue 38): a sweep over every input
kind devmap reads — safetensors as `save_pretrained` writes it, `pytorch_model.bin` as
`torch.save(model.state_dict())` writes it, a one-process `dcp.save`, transformers 5's
rank files (torch's HuggingFaceStorageWriter), DeepSpeed ZeRO 2 (2 CPU ranks) and a
live model (`devmap.save_pretrained`) — for a tied and an untied tiny Llama, with and
without config.json beside the weights.

The oracle is the model itself: transformers loads each output (with the model's
config) and every parameter must equal the model's own — an untied head dropped as
"tied" would come back as the embedding. Beside that, the names written follow the
evidence: a head is dropped only when the config ties it, the source lacks it, or it
shares the embedding's storage; identical copies without a config are kept. Each
output verifies clean against its source, and a wrong drop (the untied model saved
with `--tie lm_head.weight=model.embed_tokens.weight`) is flagged by `verify
--against`, with and without that `--tie`.

Usage: python tie_sweep.py PATH/TO/devmap   (the devmap package importable for `live`)
"""

import json
import os
import shutil
import subprocess
import sys

import torch
from saved import start_ranks, workdir

# Made by the checking process only (the ranks import this file again), and removed
# when it exits.
WORK = workdir(prefix="devmap-ties-") if __name__ == "__main__" else None
SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=90, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"


def model_for(tied):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SMALL, tie_word_embeddings=tied))
    model.config.architectures = [type(model).__name__]
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) == tied
    return model


def zero_rank(rank, world, port, tied, folder):
    """One rank of a ZeRO 2 run: the model, one AdamW step, the save."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      DS_ACCELERATOR="cpu")
    import deepspeed

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    model = model_for(tied)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 2}}
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    batch = torch.tensor([[1, 5, 9, 33, 2, 17, 60, 3]])
    engine.backward(engine(batch, labels=batch).loss)
    engine.step()
    engine.save_checkpoint(folder)


def write_source(kind, model, tied, src, port):
    """`model` written as `kind` into `src`; returns the state dict the source holds
    (what "nothing lost" is measured against)."""
    os.makedirs(src, exist_ok=True)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if kind == "safetensors":
        model.save_pretrained(src)
        os.remove(os.path.join(src, "config.json"))
    elif kind == "bin":
        torch.save(model.state_dict(), os.path.join(src, "pytorch_model.bin"))
    elif kind == "dcp":
        import torch.distributed.checkpoint as dcp

        dcp.save(dict(model.state_dict()), checkpoint_id=src)
    elif kind == "rank-files":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

        # The writer refuses two names of one storage (safetensors does), so a tied
        # model reaches it as two equal tensors.
        writer = HuggingFaceStorageWriter(path=src, save_distributed=True, enable_consolidation=False)
        dcp.save({k: v.clone() for k, v in model.state_dict().items()}, storage_writer=writer)
    elif kind == "zero2":
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        start_ranks(zero_rank, (2, port, tied, src), 2, preload=("torch", "transformers.models.llama.modeling_llama"))
        state = get_fp32_state_dict_from_zero_checkpoint(src)
        if tied:
            state.setdefault(HEAD, state[EMBED])
    else:
        raise ValueError(kind)
    return state


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def loaded_state(out, model):
    """Every parameter of the model transformers loads from `out` (with `model`'s
    config when the output has none)."""
    from transformers import AutoModelForCausalLM

    folder = out
    if not os.path.exists(os.path.join(out, "config.json")):
        folder = out + "-with-config"
        shutil.copytree(out, folder)
        model.config.save_pretrained(folder)
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return dict(loaded.state_dict())


def expect_head_written(kind, tied, with_config):
    """Where the evidence is: the config ties it, the source lacks it
    (save_pretrained drops the tied head), or one storage holds both (torch.save,
    DeepSpeed's shared_params). Otherwise the head is kept."""
    if not tied:
        return True
    if with_config:
        return False
    return kind not in ("safetensors", "bin", "zero2")


def case(devmap, kind, tied, with_config, port):
    from saved import tensors

    name = f"{kind}-{'tied' if tied else 'untied'}-{'config' if with_config else 'no-config'}"
    model = model_for(tied)
    src = os.path.join(WORK, f"{name}-src")
    state = write_source(kind, model, tied, src, port)
    if with_config:
        model.config.save_pretrained(src)
    out = os.path.join(WORK, f"{name}-out")
    r = run([devmap, "save", src, "--out", out])
    assert r.returncode == 0, f"{name}: {r.stderr}"
    if not with_config and expect_head_written(kind, tied, with_config):
        assert "no config.json" in r.stderr and "--config" in r.stderr, \
            f"{name}: a save without config.json says why it keeps the head: {r.stderr}"
    saved = tensors(out)
    for k, t in saved.items():
        assert torch.equal(t, state[k].to(t.dtype)), f"{name}: {k} differs from the source's"
    assert (HEAD in saved) == expect_head_written(kind, tied, with_config), \
        f"{name}: head written: {HEAD in saved}; {r.stderr}"
    lost = [k for k in state if k not in saved and not (k == HEAD and torch.equal(state[HEAD], state[EMBED]))]
    assert not lost, f"{name}: lost {lost}"
    # The oracle: what transformers loads is the model, head included.
    loaded = loaded_state(out, model)
    for k, t in state.items():
        assert torch.equal(loaded[k], t), f"{name}: transformers loads another {k}"
    r = run([devmap, "verify", out, "--against", src])
    assert r.returncode == 0, f"{name}: verify --against: {r.stdout}{r.stderr}"
    if not tied:
        # A wrong drop: saved with a --tie the source does not bear out.
        bad = os.path.join(WORK, f"{name}-bad")
        tie = f"{HEAD}={EMBED}"
        r = run([devmap, "save", src, "--out", bad, "--tie", tie, "--quiet"])
        assert r.returncode == 0, f"{name}: {r.stderr}"
        assert HEAD not in tensors(bad)
        r = run([devmap, "verify", bad, "--against", src, "--json"])
        assert r.returncode == 1 and HEAD in r.stdout, f"{name}: verify missed the drop: {r.stdout}"
        r = run([devmap, "verify", bad, "--against", src, "--tie", tie, "--json"])
        kinds = [f["kind"] for f in json.loads(r.stdout)["findings"] if f["subject"] == HEAD]
        assert r.returncode == 1 and "tie-lost-values" in kinds, \
            f"{name}: verify with the same --tie missed the lost values: {r.stdout}"
    print(f"ok: {name}: head {'written' if HEAD in saved else 'dropped'}, "
          f"transformers loads the model's values, verify clean"
          + ("" if tied else ", a wrong --tie flagged"))


def live_case(tied):
    """A live model: devmap.save_pretrained writes what save_pretrained writes."""
    import devmap
    from saved import differences

    model = model_for(tied)
    ours, ref = (os.path.join(WORK, f"live-{tied}-{d}") for d in ("devmap", "ref"))
    devmap.save_pretrained(model, ours, progress=False)
    model.save_pretrained(ref)
    diff = differences(ours, ref)
    assert diff is None, f"live {tied}: {diff}"
    print(f"ok: live-{'tied' if tied else 'untied'}: as save_pretrained writes it")


def main(devmap):
    port = 29900
    for kind in ("safetensors", "bin", "dcp", "rank-files", "zero2"):
        for tied in (True, False):
            configs = (False,) if kind == "zero2" else (True, False)
            for with_config in configs:
                port += 1
                case(devmap, kind, tied, with_config, port)
    for tied in (True, False):
        live_case(tied)
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(os.path.abspath(sys.argv[1]))
