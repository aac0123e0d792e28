"""What transformers itself says a model is, asked by devmap (src/oracle/mod.rs).

Usage: python ask.py CONFIG_DIR DTYPE TRUST_REMOTE_CODE
Reads CONFIG_DIR/config.json with the user's transformers, instantiates the
architecture it names on the `meta` device (no weights, no network: HF_HUB_OFFLINE is
set, and remote code only when TRUST_REMOTE_CODE is 1) in DTYPE (a torch dtype name,
or "config" for the config's own), and prints one JSON object on stdout, on a line that starts with "devmap-answer: ":

  transformers, torch: versions; architecture: the class used; dtype: the load dtype;
  saved: [[name, dtype, shape], ...] what save_pretrained writes, in its order
         (ties removed, weight conversions reverted), captured from save_pretrained
         itself with the file writer replaced;
  runtime: the same for the loaded model's own state dict (transformers 5's fused
           experts and renamed modules), when it differs;
  buffers: the non-persistent buffers, [[name, dtype, shape], ...];
  no_split: the class's _no_split_modules; kept_fp32: the names held in float32
            while the load dtype is another; tied: the second names of parameters
            held under two (not saved); empty_modules: the modules that hold no
            tensor a checkpoint has (rotary embeddings, activations); ignore_missing / ignore_unexpected: the
            class's _keys_to_ignore_on_load_* expressions.
Nothing is written but a temporary folder that is removed.
"""

import json
import os
import shutil
import sys
import tempfile

MARK = "devmap-answer: "
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _architectures(config_dir):
    try:
        with open(os.path.join(config_dir, "config.json")) as f:
            return list(json.load(f).get("architectures") or [])
    except (OSError, ValueError, AttributeError):
        return []


def main(config_dir, dtype_name, trust, plan=None):
    import torch
    import transformers
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(config_dir, trust_remote_code=trust)
    except Exception as e:  # noqa: BLE001 - the config classes' validators raise their own kinds
        # A model type this transformers does not know, remote code it may not run,
        # a file it cannot read: no verdict on the config.
        if isinstance(e, (ImportError, OSError)) or "Unrecognized model" in str(e) or "does not recognize" in str(e):
            raise
        # The config class refuses config.json itself: from_pretrained fails before
        # it loads a tensor. That is the answer.
        lines = [l.strip() for l in str(e).splitlines() if l.strip()]
        print(MARK + json.dumps({
            "transformers": transformers.__version__,
            "architecture": next(iter(_architectures(config_dir)), ""),
            "refused": f"{type(e).__name__}: {lines[-1] if lines else ''}",
        }))
        return
    names = list(getattr(config, "architectures", None) or [])
    cls = None
    for name in names:
        cls = getattr(transformers, name, None)
        if cls is not None:
            break
    if cls is None and trust and names:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        ref = (getattr(config, "auto_map", None) or {}).get("AutoModelForCausalLM")
        if ref:
            cls = get_class_from_dynamic_module(ref, config_dir)
    if cls is None:
        raise SystemExit(f"transformers {transformers.__version__} has no class {names or 'named by config.json'}")
    if dtype_name == "config":
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
    else:
        dtype = getattr(torch, dtype_name)
    with torch.device("meta"):
        model = cls._from_config(config, dtype=dtype)

    def entry(name, t):
        return [name, str(t.dtype).removeprefix("torch."), list(t.shape)]

    saved = []
    import transformers.modeling_utils as mu

    def capture(tensors, filename, metadata=None):
        saved.extend(entry(k, v) for k, v in tensors.items())

    mu.safe_save_file = capture
    folder = tempfile.mkdtemp(prefix="devmap-ask-")
    try:
        model.save_pretrained(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    state = model.state_dict()
    runtime = [entry(k, v) for k, v in state.items()]
    persistent = set(state)
    buffers = [entry(k, b) for k, b in model.named_buffers() if k not in persistent]
    seen, tied = set(), []
    for k, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.append(k)
        seen.add(id(p))
    kept = [k for k, p in model.named_parameters() if p.dtype == torch.float32 and dtype != torch.float32]
    kept += [k for k, b in model.named_buffers() if k in persistent and b.dtype == torch.float32
             and b.is_floating_point() and dtype != torch.float32]
    holding = set()
    for k in state:
        parts = k.split(".")
        holding.update(".".join(parts[:i]) for i in range(1, len(parts)))
    empty = sorted(name for name, _ in model.named_modules() if name and name not in holding)
    answer = {
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "architecture": cls.__name__,
        "dtype": str(dtype).removeprefix("torch."),
        "saved": saved,
        "runtime": runtime if [r[0] for r in runtime] != [s[0] for s in saved] else None,
        "buffers": buffers,
        "no_split": sorted(getattr(model, "_no_split_modules", None) or []),
        "kept_fp32": kept,
        "tied": tied,
        "empty_modules": empty,
        "ignore_missing": sorted(getattr(model, "_keys_to_ignore_on_load_missing", None) or []),
        "ignore_unexpected": sorted(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []),
    }
    if plan is not None:
        # What from_pretrained(device_map=MODE, max_memory=...) would plan for this
        # model, from its own planner on the same meta model.
        from transformers.integrations.accelerate import _get_device_map

        mode, budgets = plan
        budgets = {int(k) if k.isdigit() else k: v for k, v in budgets.items()}
        import logging

        logging.disable(logging.WARNING)
        planned = _get_device_map(model, mode, budgets, None)
        answer["plan"] = [[k, v] for k, v in planned.items()]
    # One marked line: imports may print to stdout too (DeepSpeed's logger does).
    sys.stdout.write("\n" + MARK + json.dumps(answer) + "\n")


if __name__ == "__main__":
    asked_plan = (sys.argv[4], json.loads(sys.argv[5])) if len(sys.argv) > 5 else None
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "1", asked_plan)
