"""The Python bridge's GPU path on real hardware: run on a machine with an NVIDIA GPU
(the device machine, when one is lent), with torch, transformers and the devmap
package installed. A Llama with layers on cuda:0, the CPU and disk, one GPU weight
edited in place, saved by devmap.save_pretrained and by transformers' save_pretrained:
the outputs must be identical tensor by tensor, and the GPU memory torch has allocated
must not grow during devmap's save (it copies GPU tensors through a pinned host buffer
a chunk at a time). Prints one JSON line with what it measured.

Usage: python scripts/device_check_gpu.py WORKDIR
"""
import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import devmap

# The test suite's reader of a saved folder, shared rather than written again here.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from saved import tensors  # noqa: E402


work = sys.argv[1]
os.makedirs(work, exist_ok=True)
torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=6,
                     num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False)
src = os.path.join(work, "src")
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(src)
device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": "cpu",
              "model.layers.3": "cpu", "model.layers.4": "disk", "model.layers.5": "disk",
              "model.norm": 0, "model.rotary_emb": 0, "lm_head": 0}
model = AutoModelForCausalLM.from_pretrained(src, device_map=device_map, dtype=torch.bfloat16,
                                             offload_folder=os.path.join(work, "offload"))
with torch.no_grad():
    model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
theirs, ours = os.path.join(work, "theirs"), os.path.join(work, "ours")
model.save_pretrained(theirs)
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
before = torch.cuda.memory_allocated()
start = time.perf_counter()
report = devmap.save_pretrained(model, ours, progress=False)
seconds = time.perf_counter() - start
torch.cuda.synchronize()
growth = torch.cuda.max_memory_allocated() - before
a, b = tensors(theirs), tensors(ours)
same = sorted(a) == sorted(b) and all(
    a[k].dtype == b[k].dtype and torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8))
    for k in a)
print(json.dumps({
    "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
    "tensors": len(a), "identical_to_transformers": same, "verify": report["verify"].splitlines()[0],
    "gpu_bytes_on_cuda0": sum(p.numel() * p.element_size() for p in model.parameters() if p.device.type == "cuda"),
    "gpu_memory_growth_during_save": growth, "seconds": seconds,
}))
sys.exit(0 if same and growth == 0 else 1)
