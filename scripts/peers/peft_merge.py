"""The peft route the LoRA benchmark compares devmap with: load the base model, load
the adapter, merge_and_unload, save_pretrained (safetensors, 5GB shards).

Usage: python peft_merge.py BASE ADAPTER OUT
"""

import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def main(base, adapter, out):
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    model.save_pretrained(out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
