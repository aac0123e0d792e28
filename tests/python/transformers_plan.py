"""`devmap plan` against what `from_pretrained(device_map=...)` really does.

transformers' own `from_pretrained` runs on a small checkpoint of each family with
`device_map` "auto", "balanced_low_0" and "sequential", budgets that make it balance,
spill to the CPU and to disk, over one, two and three GPUs, and four dtype setups
(stored bfloat16 or float32, loaded as stored or in the other). The map it plans is
captured where it is made (its `_get_device_map`), before it dispatches anything, so
GPUs this machine lacks are no obstacle; `devmap plan --device-map MODE --dtype ...`
must place every tensor on the same device.

Usage: python transformers_plan.py PATH/TO/devmap
"""

from saved import workdir
import json
import os
import subprocess
import sys
import warnings

import torch
import transformers
import transformers.modeling_utils as modeling_utils

sys.path.insert(0, os.path.dirname(__file__))
from accelerate_plan import families, model_class, more_families, placement, wider_families  # noqa: E402

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

FAMILIES = ("llama", "qwen2", "mixtral", "gemma2", "gpt2", "t5")
MODES = ("auto", "balanced_low_0", "sequential")
# (stored, loaded as; None: as stored)
DTYPES = [
    (torch.bfloat16, None),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.bfloat16),
    (torch.float32, None),
]


def budgets(total):
    """Ten budgets as fractions of the loaded model's size."""
    k = lambda f: int(total * f)  # noqa: E731
    return [
        {0: k(1.2), 1: k(1.2), "cpu": k(2)},
        {0: k(0.6), 1: k(0.6), "cpu": k(1)},
        {0: k(0.3), 1: k(0.3), "cpu": k(1)},
        {0: k(0.3), 1: k(0.3), "cpu": k(0.2)},
        {0: k(2), "cpu": k(1)},
        {0: k(0.5), "cpu": k(0.3)},
        {0: k(0.4), 1: k(0.4), 2: k(0.4), "cpu": k(1)},
        {0: k(0.2), 1: k(0.9), "cpu": k(1)},
        {"cpu": k(0.5)},
        {0: k(0.7), 1: k(0.7), "cpu": k(0.5)},
    ]


class Captured(Exception):
    pass


def transformers_map(src, mode, max_memory, dtype):
    """The device map from_pretrained plans, captured before it loads anything."""
    seen = {}
    real = modeling_utils._get_device_map

    def capture(model, device_map, max_memory, hf_quantizer):
        seen["map"] = real(model, device_map, max_memory, hf_quantizer)
        seen["names"] = list(model.state_dict().keys())
        raise Captured()

    modeling_utils._get_device_map = capture
    try:
        kwargs = {"dtype": dtype} if dtype is not None else {}
        model_class_of(src).from_pretrained(src, device_map=mode, max_memory=dict(max_memory), **kwargs)
    except Captured:
        pass
    finally:
        modeling_utils._get_device_map = real
    return seen["map"], seen["names"]


CLASSES = {}


def model_class_of(src):
    return CLASSES[src]


def main(devmap):
    configs = configs_of()
    same = differ = keys_same = 0
    work = workdir(prefix="devmap-tf-plan-")
    for family in FAMILIES:
        config = configs[family]
        for stored, loaded in DTYPES:
            torch.manual_seed(0)
            src = os.path.join(work, f"{family}-{str(stored)[6:]}")
            if not os.path.exists(src):
                auto = model_class(config)
                auto.from_config(config).to(stored).save_pretrained(src)
                CLASSES[src] = auto
            as_dtype = loaded or stored
            with torch.device("meta"):
                meta = CLASSES[src].from_config(config, dtype=as_dtype)
            total = sum(p.numel() * p.element_size() for p in meta.parameters())
            for b in budgets(total):
                for mode in MODES:
                    theirs, names = transformers_map(src, mode, b, loaded)
                    spec = ",".join(f"{d}={v}" for d, v in b.items())
                    cmd = [devmap, "plan", src, "--max-memory", spec, "--device-map", mode, "--transformers", "none"]
                    if loaded is not None:
                        cmd += ["--dtype", str(loaded)[6:]]
                    ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                    diff = [(n, placement(theirs, n), placement(ours, n)) for n in names
                            if placement(theirs, n) != placement(ours, n)]
                    case = f"{family} stored {str(stored)[6:]} loaded {str(loaded)[6:] if loaded else 'as stored'} {mode} [{spec}]"
                    if dict(theirs) == ours:
                        keys_same += 1
                    elif os.environ.get("DEVMAP_SHOW_KEYS"):
                        print(f"KEYS {family} {mode} [{spec}]: transformers {dict(theirs)}\n  devmap {ours}")
                    if diff:
                        differ += 1
                        print(f"DIFFERS {case}: {len(diff)} tensors, e.g. {diff[:3]}\n  transformers: {dict(theirs)}\n  devmap:       {ours}")
                    else:
                        same += 1
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"{same} of {same + differ} cases place every tensor as from_pretrained does")
    print(f"{keys_same} of {same + differ} cases give from_pretrained's map key for key")
    differ += asked(devmap, work)
    sys.exit(1 if differ else 0)


def asked(devmap, work):
    """`devmap plan --transformers PYTHON` asks transformers' own planner and says
    whether it agrees: it does on a balanced two-GPU case (also with the budgets
    `--reserve-kv` lowers), and it names the tensors when devmap is told to plan
    otherwise (`--no-split none` splits layers)."""
    src = next(p for p in CLASSES if "llama" in p)
    failures = 0
    with torch.device("meta"):
        meta = CLASSES[src].from_config(configs_of()["llama"], dtype=torch.bfloat16)
    total = sum(p.numel() * p.element_size() for p in meta.parameters())
    spec = f"0={int(total * 0.3)},1={int(total * 0.3)},cpu={total}"
    # `--reserve-kv` plans the weights against budgets lowered by the cache: transformers
    # asked with those budgets (from_pretrained's max_memory for the map) must agree.
    for extra, want in ((["--dtype", "float32"], "plans every tensor where devmap does"),
                        (["--no-split", "none"], "elsewhere"),
                        (["--context", "256", "--reserve-kv"], "plans every tensor where devmap does")):
        cmd = [devmap, "plan", src, "--max-memory", spec, "--transformers", sys.executable, *extra]
        said = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
        line = next((l for l in said.splitlines() if "asked" in l), "")
        if want not in line:
            print(f"ASKED {extra}: want `{want}`, said: {said[-500:]}")
            failures += 1
        else:
            print(f"asked {extra}: {line}")
    return failures


def configs_of():
    configs = {}
    for gen in (families, more_families, wider_families):
        for family, config in gen():
            if family in FAMILIES and family not in configs:
                configs[family] = config
    return configs


if __name__ == "__main__":
    main(sys.argv[1])
