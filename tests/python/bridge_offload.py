"""devmap.save_pretrained of a model whose layers peft touched while they sat on disk
(issue 37): a float32 Llama, layers 0–1 on cpu and 2–5 on disk through
`offload_folder`, a LoRA on q_proj/v_proj of every layer, then
`get_peft_model(...).merge_and_unload()`. peft creates the adapters of disk-offloaded
layers on the meta device, so its merge leaves those layers as they were, and its
`onload_layer` swaps each such module's `_hf_hook.weights_map` for a plain dict of CPU
tensors holding the layer's values; `model.save_pretrained` writes those values.
devmap must find them by what they hold (a dict of tensors, a PrefixedDataset, an
offload loader's state_dict or index), write what `save_pretrained` writes byte for
byte, and say which layers peft's merge did not change, naming the way that merges them
(`devmap save --merge-lora`, from the files) — which is then run on the same flow and
compared with peft's merge of the same adapter into the model held in RAM.

Also: DoRA merged into the cpu layers of the same model (peft's DoRA merge fails on a
meta adapter before any save), `modules_to_save`, and a model loaded with
`offload_buffers=True`; each identical to `save_pretrained`.

Usage: python bridge_offload.py PATH/TO/devmap   (the devmap package importable)
"""

import os
import subprocess
import sys
import tempfile
import warnings

import torch

import devmap

WORK = tempfile.mkdtemp(prefix="devmap-bridge-")
LAYERS = 6
DISK = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
        **{f"model.layers.{i}": "disk" for i in range(2, LAYERS)},
        "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}


def source_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    src = os.path.join(WORK, "llama")
    if not os.path.isdir(src):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
        LlamaForCausalLM(config).save_pretrained(src)
    return src


def loaded(name, **extra):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(source_model(), device_map=DISK, dtype=torch.float32,
                                                offload_folder=os.path.join(WORK, f"{name}-offload"), **extra)


def tensors(folder):
    from saved import tensors as read

    return read(folder)


def same(case, theirs, ours):
    a, b = tensors(theirs), tensors(ours)
    assert sorted(a) == sorted(b), f"{case}: names differ: {sorted(set(a) ^ set(b))[:5]}"
    differ = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
    assert not differ, f"{case}: {len(differ)} tensors differ, first {differ[0]}"
    return a


def with_lora(model, **lora):
    """A LoRA (non-zero B, seed 5) on q_proj/v_proj of every layer."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(5)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False, **lora)
    return get_peft_model(model, config)


def merged_offloaded(devmap_bin, name, **lora):
    from transformers import AutoModelForCausalLM

    model = loaded(name)
    assert any(p.device.type == "meta" for p in model.parameters()), "nothing went to disk"
    merged = with_lora(model, **lora).merge_and_unload()
    theirs, ours = os.path.join(WORK, f"{name}-theirs"), os.path.join(WORK, f"{name}-ours")
    merged.save_pretrained(theirs)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        report = devmap.save_pretrained(merged, ours, progress=False)
    saved = same(name, theirs, ours)
    # Disk layers peft did not touch are still copied from their files, never read
    # into memory (the loader's `[key]` would read them whole).
    from devmap import _live

    with tempfile.TemporaryDirectory() as config_dir:
        manifest = _live.build(merged, config_dir)[0]
    kinds = {t["name"]: t["source"]["kind"] for t in manifest["tensors"]}
    assert kinds["model.layers.3.mlp.up_proj.weight"] in ("safetensors", "file"), kinds
    assert kinds["model.layers.3.self_attn.q_proj.weight"] == "memory", kinds
    notes = " ".join(str(w.message) for w in said if "devmap" in str(w.message))
    unmerged = [f"model.layers.{i}" for i in range(2, LAYERS)]
    assert "--merge-lora" in notes and all(f"`{layer}.self_attn.q_proj`" in notes for layer in unmerged) \
        and "model.layers.0." not in notes and report.get("warnings"), \
        f"{name}: devmap did not name the layers peft's merge left as they were: {notes!r} {report}"
    # The way that merges them: from the files, streamed. The adapter peft makes on the
    # model held in RAM (where every layer is merged) is the reference.
    ram_model = AutoModelForCausalLM.from_pretrained(source_model(), dtype=torch.float32)
    ram_peft = with_lora(ram_model, **lora)
    adapter_dir = os.path.join(WORK, f"{name}-adapter")
    ram_peft.save_pretrained(adapter_dir)
    ram = os.path.join(WORK, f"{name}-ram")
    ram_peft.merge_and_unload().save_pretrained(ram)
    streamed = os.path.join(WORK, f"{name}-streamed")
    r = subprocess.run([devmap_bin, "save", source_model(), "--out", streamed, "--merge-lora", adapter_dir,
                        "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, f"{name}: devmap save --merge-lora: {r.stderr}"
    a, b = tensors(ram), tensors(streamed)
    assert sorted(a) == sorted(b), f"{name}: --merge-lora names differ"
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, f"{name}: --merge-lora differs from peft's merge by {worst}"
    moved = [k for k in b if ".layers.3.self_attn.q_proj" in k and not torch.equal(saved[k], b[k])]
    assert moved, f"{name}: --merge-lora left the disk layers unmerged too"
    print(f"ok: {name}: LoRA on every layer of a cpu+disk model, merged by peft: saved as save_pretrained "
          f"writes it, the {len(unmerged)} disk layers peft left unmerged named; --merge-lora from the "
          f"files merges them (within {worst:.1e} of peft's merge in RAM)")


def modules_to_save(devmap_bin):
    from peft import LoraConfig, get_peft_model

    model = loaded("mts")
    torch.manual_seed(5)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["lm_head"],
                        init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        peft_model.base_model.model.lm_head.modules_to_save["default"].weight.add_(0.5)
    merged = peft_model.merge_and_unload()
    theirs, ours = os.path.join(WORK, "mts-theirs"), os.path.join(WORK, "mts-ours")
    merged.save_pretrained(theirs)
    devmap.save_pretrained(merged, ours, progress=False)
    same("modules_to_save", theirs, ours)
    print("ok: modules_to_save: the trained head saved as save_pretrained writes it")


def offload_buffers():
    model = loaded("buffers", offload_buffers=True)
    theirs, ours = os.path.join(WORK, "buffers-theirs"), os.path.join(WORK, "buffers-ours")
    model.save_pretrained(theirs)
    devmap.save_pretrained(model, ours, progress=False)
    same("offload_buffers", theirs, ours)
    print("ok: offload_buffers=True: saved as save_pretrained writes it")


def dora_on_cpu_layers():
    """DoRA into the cpu layers of the same model (peft's DoRA merge cannot run on a
    meta adapter at all: it fails in `get_weight_norm`, before any save)."""
    model = loaded("dora")
    merged = with_lora(model, use_dora=True, layers_to_transform=[0, 1]).merge_and_unload()
    theirs, ours = os.path.join(WORK, "dora-theirs"), os.path.join(WORK, "dora-ours")
    merged.save_pretrained(theirs)
    report = devmap.save_pretrained(merged, ours, progress=False)
    same("dora", theirs, ours)
    assert not report["warnings"], report["warnings"]
    print("ok: dora: merged into the cpu layers of a cpu+disk model, saved as save_pretrained writes it")


def misuse():
    """A state dict for a model, and a folder that is not empty: said in Python's terms."""
    try:
        devmap.save_pretrained({"w": torch.ones(2)}, os.path.join(WORK, "dict"))
        raise AssertionError("a dict was taken for a model")
    except TypeError as err:
        assert "takes a model" in str(err) and "dict" in str(err), err
    model = loaded("misuse")
    full = os.path.join(WORK, "full")
    os.makedirs(full)
    open(os.path.join(full, "notes.txt"), "w").close()
    try:
        devmap.save_pretrained(model, full, progress=False)
        raise AssertionError("a non-empty folder was written into")
    except devmap.DevmapError as err:
        assert "force=True" in str(err) and "--force" not in str(err), err
    print("ok: a dict for a model and a non-empty folder are refused in Python's terms")


def main(devmap_bin):
    misuse()
    merged_offloaded(devmap_bin, "lora")
    dora_on_cpu_layers()
    modules_to_save(devmap_bin)
    offload_buffers()
    import shutil

    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(os.path.abspath(sys.argv[1]))
