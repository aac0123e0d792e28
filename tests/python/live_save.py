"""devmap.save_pretrained on live models, against transformers' save_pretrained of the
same model in the same session. Run by tests/real/python_bridge.rs with the devmap
package on PYTHONPATH; prints one `ok: ` line per case and exits non-zero on the first
failure.

Cases: a tied Llama on cpu + disk (transformers' safetensors-backed offload index),
loaded as bfloat16 from float32, with a parameter edited in place and a peft LoRA
merged in memory; a Mixtral with fused experts, one layer on disk (transformers
re-saves converted weights in its offload folder), in several shards; a GPT-2
dispatched by accelerate with `.dat` offload; a meta model refused; a tensor changed
during the save refused; Ctrl-C during the save; the GPU path's staging through a small
buffer, run on CPU tensors. Each save is compared tensor by
tensor (name, dtype, bytes) and config.json by value, and reloaded: its logits must
equal the live model's.
"""

from saved import workdir
import json
import os
import signal
import sys
import threading
import time

import torch
from safetensors import safe_open

import devmap

torch.manual_seed(0)
WORK = workdir(prefix="devmap-live-")


def tensors(folder):
    found = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(folder, name), "pt") as f:
                for key in f.keys():
                    if key in found:
                        raise SystemExit(f"{key} is in two shards of {folder}")
                    found[key] = f.get_tensor(key)
    return found


def same_bytes(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def compare(case, model, theirs, ours):
    """Transformers' save and devmap's: same tensors, bytes and config; and devmap's
    reloads to the live model's logits."""
    a, b = tensors(theirs), tensors(ours)
    if sorted(a) != sorted(b):
        raise SystemExit(
            f"{case}: names differ: transformers only {sorted(set(a) - set(b))}, devmap only {sorted(set(b) - set(a))}"
        )
    differ = [k for k in a if not same_bytes(a[k], b[k])]
    if differ:
        k = differ[0]
        raise SystemExit(f"{case}: {len(differ)} tensors differ, first {k}: {a[k].dtype} vs {b[k].dtype}")
    for name in ("config.json", "generation_config.json"):
        there = os.path.exists(os.path.join(theirs, name))
        if there != os.path.exists(os.path.join(ours, name)):
            raise SystemExit(f"{case}: {name} written by only one of the two")
        if there:
            with open(os.path.join(theirs, name)) as f, open(os.path.join(ours, name)) as g:
                if json.load(f) != json.load(g):
                    raise SystemExit(f"{case}: {name} differs")
    index = "model.safetensors.index.json"
    if os.path.exists(os.path.join(ours, index)):
        with open(os.path.join(ours, index)) as f:
            mapped = json.load(f)["weight_map"]
        if sorted(mapped) != sorted(b):
            raise SystemExit(f"{case}: the index maps other tensors than the shards hold")
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        want = model(ids).logits
        got = AutoModelForCausalLM.from_pretrained(ours, dtype=model.dtype)(ids).logits
    if not torch.equal(want, got):
        raise SystemExit(f"{case}: reloaded logits differ by {(want - got).abs().max().item()}")
    return len(a)


def llama_cpu_disk_edited_and_merged():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    src = os.path.join(WORK, "llama")
    LlamaForCausalLM(config).save_pretrained(src)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.layers.2": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    model = AutoModelForCausalLM.from_pretrained(src, device_map=device_map, dtype=torch.bfloat16,
                                                 offload_folder=os.path.join(WORK, "llama-offload"))
    if not any(p.device.type == "meta" for p in model.parameters()):
        raise SystemExit("llama: nothing was offloaded to disk")
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], layers_to_transform=[0],
                      init_lora_weights=False)
    model = get_peft_model(model, lora).merge_and_unload()
    theirs, ours = os.path.join(WORK, "llama-theirs"), os.path.join(WORK, "llama-ours")
    model.save_pretrained(theirs)
    report = devmap.save_pretrained(model, ours, progress=False)
    n = compare("llama", model, theirs, ours)
    if report["shard_files"] != ["model.safetensors"] or "0 problems" not in report["verify"]:
        raise SystemExit(f"llama: report {report}")
    # Saving over the folder the model was loaded from would replace the file its
    # disk-offloaded layers are read from.
    before = {n: os.path.getmtime(os.path.join(src, n)) for n in os.listdir(src)}
    try:
        devmap.save_pretrained(model, src, progress=False, force=True)
        raise SystemExit("llama: saving over the model's own folder was not refused")
    except devmap.DevmapError as err:
        if "which the save reads from" not in str(err):
            raise SystemExit(f"llama: unclear refusal for the model's own folder: {err}")
    if before != {n: os.path.getmtime(os.path.join(src, n)) for n in os.listdir(src)}:
        raise SystemExit("llama: the refused save changed the model's folder")
    print(f"ok: llama cpu+disk bf16-from-f32, edited, LoRA merged: {n} tensors as transformers writes them")


def mixtral_experts_on_disk_in_shards():
    from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2)
    src = os.path.join(WORK, "mixtral")
    MixtralForCausalLM(config).save_pretrained(src)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    model = AutoModelForCausalLM.from_pretrained(src, device_map=device_map,
                                                 offload_folder=os.path.join(WORK, "mixtral-offload"))
    with torch.no_grad():
        model.model.layers[0].mlp.experts.gate_up_proj[1].add_(0.25)
    theirs, ours = os.path.join(WORK, "mixtral-theirs"), os.path.join(WORK, "mixtral-ours")
    model.save_pretrained(theirs)
    report = devmap.save_pretrained(model, ours, max_shard_size="40KB", progress=False)
    n = compare("mixtral", model, theirs, ours)
    if len(report["shard_files"]) < 3:
        raise SystemExit(f"mixtral: expected several shards at 40KB, got {report['shard_files']}")
    print(f"ok: mixtral fused experts (one layer on disk), {len(report['shard_files'])} shards: {n} tensors")


def gpt2_dispatched_with_dat_offload():
    from accelerate import dispatch_model
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=80, n_embd=32, n_layer=3, n_head=4, n_positions=32))
    model.eval()
    device_map = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu",
                  "transformer.h.0": "cpu", "transformer.h.1": "disk", "transformer.h.2": "disk",
                  "transformer.ln_f": "cpu", "lm_head": "cpu"}
    offload = os.path.join(WORK, "gpt2-offload")
    model = dispatch_model(model, device_map=device_map, offload_dir=offload)
    if not any(name.endswith(".dat") for name in os.listdir(offload)):
        raise SystemExit("gpt2: accelerate wrote no .dat files")
    theirs, ours = os.path.join(WORK, "gpt2-theirs"), os.path.join(WORK, "gpt2-ours")
    model.save_pretrained(theirs)
    devmap.save_pretrained(model, ours, progress=False)
    n = compare("gpt2", model, theirs, ours)
    print(f"ok: gpt2 dispatched by accelerate with .dat offload: {n} tensors")


def staged_like_a_gpu():
    """The GPU path on the CPU: every in-memory tensor staged through a 1000-byte buffer
    (DEVMAP_TEST_STAGE_CPU), so tensors span several fills and casts cross them; what
    differs on a GPU is only the device torch copies from."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    src = os.path.join(WORK, "staged")
    LlamaForCausalLM(config).save_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.add_(0.5)
        # A strided parameter (stride (1, rows)): staged a block of rows at a time.
        weight = model.model.layers[0].mlp.down_proj.weight
        model.model.layers[0].mlp.down_proj.weight = torch.nn.Parameter(weight.t().contiguous().t())
    if model.model.layers[0].mlp.down_proj.weight.is_contiguous():
        raise SystemExit("staged: the strided parameter came out contiguous")
    theirs = os.path.join(WORK, "staged-theirs")
    model.save_pretrained(theirs)
    os.environ["DEVMAP_TEST_STAGE_CPU"], os.environ["DEVMAP_TEST_STAGE_BYTES"] = "1", "1000"
    calls = []
    try:
        import devmap._live as live

        fill = live.Stager.fill

        def counted(self, key, offset, length):
            calls.append(length)
            if length > 1000:
                raise SystemExit(f"staged: a fill of {length} bytes, over the buffer")
            return fill(self, key, offset, length)

        live.Stager.fill = counted
        ours, wide = os.path.join(WORK, "staged-ours"), os.path.join(WORK, "staged-f32")
        devmap.save_pretrained(model, ours, progress=False)
        devmap.save_pretrained(model, wide, dtype="float32", progress=False)
    finally:
        live.Stager.fill = fill
        del os.environ["DEVMAP_TEST_STAGE_CPU"], os.environ["DEVMAP_TEST_STAGE_BYTES"]
    n = compare("staged", model, theirs, ours)
    a, b = tensors(theirs), tensors(wide)
    differ = [k for k in a if b[k].dtype != torch.float32 or not torch.equal(a[k].float(), b[k])]
    if differ:
        raise SystemExit(f"staged: float32 cast through the stage differs for {differ[:3]}")
    print(f"ok: staged through a 1000-byte buffer ({len(calls)} fills, copies and casts, a strided weight): {n} tensors")


def meta_model_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2))
    out = os.path.join(WORK, "meta-out")
    try:
        devmap.save_pretrained(model, out, progress=False)
    except devmap.DevmapError as err:
        message = str(err)
        if "meta device" not in message or "model.embed_tokens.weight" not in message:
            raise SystemExit(f"meta: unclear refusal: {message}")
        if os.path.exists(out):
            raise SystemExit("meta: the refused save created its output folder")
        print(f"ok: meta tensors refused before writing: {message.splitlines()[0][:90]}")
        return
    raise SystemExit("meta: a model with no values was saved")


def paused_save(model, out, action, hold=0.3):
    """Runs devmap.save_pretrained with the save held after its first tensor (the
    saver's DEVMAP_TEST_PAUSE hook) while `action` runs on another thread, then lets it go
    on after `hold` seconds, or as soon as the save has returned (a cancelled save ends
    while held). Returns the exception the save raised (None if it finished)."""
    pause = os.path.join(WORK, "pause")
    open(pause, "w").close()
    os.environ["DEVMAP_TEST_PAUSE"] = pause
    returned = threading.Event()

    def helper():
        while not os.path.exists(pause + ".reached"):
            time.sleep(0.005)
        action()
        returned.wait(hold)
        os.remove(pause)

    thread = threading.Thread(target=helper)
    thread.start()
    try:
        devmap.save_pretrained(model, out, progress=False)
        return None
    except BaseException as err:  # KeyboardInterrupt included
        return err
    finally:
        returned.set()
        thread.join()
        del os.environ["DEVMAP_TEST_PAUSE"]
        os.remove(pause + ".reached")


def small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=2))


def no_shards(out):
    return not os.path.exists(out) or not any(n.endswith(".safetensors") for n in os.listdir(out))


def mapped_from_its_files_and_saved_over_them():
    """A model loaded as stored: transformers maps its weights from model.safetensors,
    and devmap copies the unwritten ones from that file (the rest from memory). Saved
    elsewhere: as transformers saves it. Saved over the folder it was loaded from
    (force=True): read from memory instead, since the commit replaces that file; the
    folder then holds what the model held."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    own = os.path.join(WORK, "own-folder")
    small_llama().save_pretrained(own)
    model = AutoModelForCausalLM.from_pretrained(own, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)  # one tensor written since it was mapped
    held = {k: v.clone() for k, v in model.state_dict().items()}
    theirs, ours = os.path.join(WORK, "mapped-theirs"), os.path.join(WORK, "mapped-ours")
    model.save_pretrained(theirs)
    devmap.save_pretrained(model, ours, progress=False)
    compare("mapped from its files", model, theirs, ours)
    devmap.save_pretrained(model, own, force=True, progress=False)
    saved = tensors(own)
    differ = [k for k in saved if not same_bytes(saved[k], held[k])]
    if differ or not saved:
        raise SystemExit(f"saved over its own folder: {differ[:3]} differ from what the model held")
    print(f"ok: mapped weights copied from their file, {len(saved)} tensors; saved over its own folder too")


def change_during_save_refused():
    model = small_llama()
    out = os.path.join(WORK, "changed-out")

    def edit():
        with torch.no_grad():
            model.model.norm.weight.add_(1.0)

    err = paused_save(model, out, edit)
    if not isinstance(err, devmap.DevmapError) or "model.norm.weight" not in str(err) or "changed" not in str(err):
        raise SystemExit(f"changed: expected a refusal naming model.norm.weight, got {err!r}")
    if not no_shards(out):
        raise SystemExit(f"changed: the refused save left {os.listdir(out)}")
    print("ok: a tensor edited during the save refuses it, nothing committed")


def ctrl_c_cancels():
    # Python raises KeyboardInterrupt on SIGINT only when it found SIGINT's default
    # action at start; a process started as a background job of a non-interactive shell
    # (as CI may start the tests) inherits SIGINT ignored. A user's session has Python's
    # handler: install it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    model = small_llama()
    out = os.path.join(WORK, "interrupted-out")
    # Held until the save returns (at most 10 s), so the signal certainly reaches a
    # save still under way.
    err = paused_save(model, out, lambda: os.kill(os.getpid(), signal.SIGINT), hold=10)
    if not isinstance(err, KeyboardInterrupt):
        raise SystemExit(f"ctrl-c: expected KeyboardInterrupt, got {err!r}")
    if not no_shards(out):
        raise SystemExit(f"ctrl-c: the cancelled save left {os.listdir(out)}")
    left = [n for n in os.listdir(out)] if os.path.exists(out) else []
    if any("devmap" in n for n in left):
        raise SystemExit(f"ctrl-c: temporary files left: {left}")
    print("ok: Ctrl-C during the save cancels it, nothing left")


if __name__ == "__main__":
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, python {sys.version.split()[0]}")
    if sys.argv[1:] == ["--installed"]:
        # .ci/run after `pip install ./python`: the installed package, one case.
        if "site-packages" not in devmap.__file__:
            raise SystemExit(f"devmap was imported from {devmap.__file__}, not from the installed package")
        llama_cpu_disk_edited_and_merged()
        sys.exit(0)
    llama_cpu_disk_edited_and_merged()
    mixtral_experts_on_disk_in_shards()
    gpt2_dispatched_with_dat_offload()
    staged_like_a_gpu()
    meta_model_refused()
    mapped_from_its_files_and_saved_over_them()
    change_during_save_refused()
    ctrl_c_cancels()
