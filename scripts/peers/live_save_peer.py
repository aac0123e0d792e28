"""One save of a live model, measured: loads the bench model with half its layers on
disk and the rest on the CPU (loaded as it is stored), edits one parameter in place,
then saves it with `devmap.save_pretrained` or transformers' `save_pretrained` and
prints one JSON line: seconds, the RSS before the save and its growth to the peak
during the save (the peak is reset after loading, through /proc/self/clear_refs).

Usage: live_save_peer.py MODEL OFFLOAD OUT devmap|transformers [--no-fsync]
"""
import json
import os
import subprocess
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"no {key} in /proc/self/status")


model_dir, offload, out, who = sys.argv[1:5]
fsync = sys.argv[5:] != ["--no-fsync"]
layers = AutoConfig.from_pretrained(model_dir).num_hidden_layers
device_map = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
for i in range(layers):
    device_map[f"model.layers.{i}"] = "disk" if i >= layers // 2 else "cpu"
model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=device_map, offload_folder=offload,
                                             dtype="auto")
with torch.no_grad():
    model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
if who == "devmap":
    import devmap

    def save():
        devmap.save_pretrained(model, out, progress=False, verify=False, force=True, fsync=fsync)
else:
    def save():
        model.save_pretrained(out)
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current RSS
# Anonymous memory (what a save allocates, apart from file pages it reads through a
# mapping, which count in RSS once touched) is sampled every 5 ms from another process:
# a thread here would not run while transformers' save holds the GIL.
SAMPLER = """
import sys, time
pid, peak = sys.argv[1], 0
def anon():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
print("ready", flush=True)
while True:
    peak = max(peak, anon())
    if sys.stdin in __import__("select").select([sys.stdin], [], [], 0.005)[0]:
        break
print(max(peak, anon()), flush=True)
"""
anon_before = status("RssAnon")
sampler = subprocess.Popen([sys.executable, "-c", SAMPLER, str(os.getpid())], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
sampler.stdout.readline()
start = time.perf_counter()
save()
seconds = time.perf_counter() - start
anon_peak = int(sampler.communicate("stop\n")[0].strip())
print(json.dumps({"who": who, "seconds": seconds, "rss_before": before, "growth": status("VmHWM") - before,
                  "anon_growth": anon_peak - anon_before}))
