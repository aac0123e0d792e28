"""Time from SIGTERM to the commit of `devmap.save_on_signal`: a float32 Llama trained
on the CPU (AdamW, small batches) with a save armed at the step boundary; SIGTERM
arrives from another thread after a few steps. Prints one JSON line: the model's bytes
and the seconds from the signal to the end of the save.

Usage: signal_save_peer.py MODEL OUT
"""
import json
import os
import signal
import sys
import threading

import torch
from transformers import AutoModelForCausalLM

import devmap

model_dir, out = sys.argv[1:3]
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
armed = devmap.save_on_signal(model, out, optimizer=optimizer, exit=False)
threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
steps = 0
while armed.saved is None and steps < 1000:
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    steps += 1
size = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"bytes": size, "steps": steps, "seconds": armed.seconds}))
