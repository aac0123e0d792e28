"""The README's quick start, run as written: its Python block in a fresh folder that
holds a small saved model as `my-model` (the devmap package importable, as after
`pip install ./python`), then its shell commands with this devmap; both saved models
must load back with every value the original had.

Usage: python readme_quickstart.py PATH/TO/devmap
"""

from saved import workdir
import os
import shlex
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def blocks(readme):
    """The Python block and the shell block after it, in the quick start section."""
    section = readme.split("## Quick start from a Python session", 1)[1].split("\n## ", 1)[0]
    python = section.split("```python\n", 1)[1].split("```", 1)[0]
    shell = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return python, shell


def main(devmap):
    with open(os.path.join(ROOT, "README.md")) as f:
        python, shell = blocks(f.read())
    work = workdir(prefix="devmap-quickstart-")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    original = LlamaForCausalLM(config).to(torch.bfloat16)
    original.save_pretrained(os.path.join(work, "my-model"))
    os.chdir(work)
    exec(compile(python, "README.md (quick start)", "exec"), {})
    for line in shell.strip().splitlines():
        args = shlex.split(line)
        if args[0] != "devmap":
            raise SystemExit(f"not a devmap command: {line}")
        run = subprocess.run([devmap, *args[1:]], capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"`{line}` failed:\n{run.stderr}")
        print(f"ok: {line}")
    want = original.state_dict()
    for saved in ("my-model-saved", "my-model-from-files"):
        back = AutoModelForCausalLM.from_pretrained(os.path.join(work, saved), dtype=torch.bfloat16)
        for name, value in back.state_dict().items():
            if not torch.equal(value, want[name]):
                raise SystemExit(f"{name} differs in {saved}")
        print(f"ok: {saved} loads back with all {len(want)} values")


if __name__ == "__main__":
    main(sys.argv[1])
