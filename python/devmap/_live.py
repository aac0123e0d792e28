"""What devmap's saver needs to know about a model in this Python session.

Every tensor `save_pretrained` would write, under the name it would write, with where
its current value is: in this process's memory (a CPU tensor: its address), in a file
accelerate's or transformers' offload loader reads (a `.dat`, a safetensors entry), or
in the loader's own memory. Names, ties and the conversion back to the checkpoint's
layout are transformers' own functions (`remove_tied_weights_from_state_dict`,
`revert_weight_conversion`), run on stand-ins that carry no data: devmap decides none
of them itself. The Rust saver then reads each value where it is, one buffer at a time.
"""

import copy
import math
import os

FORMAT = "devmap-live/1"


class Refusal(Exception):
    """The model cannot be saved as it is; the message says which tensor and why."""


def _torch_name(dtype):
    return str(dtype).removeprefix("torch.")


def _offload_loaders(model):
    """(module name, weights map) of every accelerate hook that holds offloaded values."""
    found = {}
    for name, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        weights_map = getattr(hook, "weights_map", None)
        if weights_map is not None:
            found[name] = weights_map
    return found


def _holds_in_memory(mapping):
    """Whether `mapping` keeps its values in memory: a plain mapping of tensors (peft's
    `onload_layer` leaves one as a hook's `weights_map`; an offload loader's
    `state_dict`). Found by what it is, not by class: a loader (`index`) or a view of
    one (`dataset`: accelerate's PrefixedDataset) reads a value from its file, whole,
    when asked, so it is never asked — the file is the source."""
    import collections.abc

    return (isinstance(mapping, collections.abc.Mapping)
            and not hasattr(mapping, "index") and not hasattr(mapping, "dataset"))


def _tensor_held(holder, key):
    """The tensor `holder` keeps in memory under `key` (see `_holds_in_memory`)."""
    import torch

    if not _holds_in_memory(holder):
        return None
    try:
        value = holder.get(key)
    except Exception:  # a mapping that reads on access and fails: not a holder
        return None
    if torch.is_tensor(value) and value.device.type != "meta":
        return value
    return None


def _offloaded_source(model, loaders, name, tensor):
    """Where the value of meta tensor `name` is, and the dtype it has (which
    `save_pretrained` writes), as transformers' `load_offloaded_parameter` finds the
    hook: the innermost module that has one. Returns (file source or None, dtype,
    tensor held in memory or None); a source `{"kind": "none"}` when nothing holds it.
    Every form accelerate, transformers and peft keep a value in is read: a plain dict
    of tensors, a `PrefixedDataset` over a loader or over a dict, an
    `OffloadedWeightsLoader`'s `state_dict` and its index (`.dat` files or safetensors
    entries)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        owner = ".".join(parts[:cut])
        if owner in loaders:
            weights_map = loaders[owner]
            break
    else:
        return {"kind": "none"}, tensor.dtype, None
    rest = name[len(owner) + 1:] if owner else name
    prefix = getattr(weights_map, "prefix", "")
    loader = getattr(weights_map, "dataset", weights_map)
    key = prefix + rest
    for holder, k in ((weights_map, rest), (loader, key), (getattr(loader, "state_dict", None), key)):
        value = _tensor_held(holder, k)
        if value is not None:
            return None, value.dtype, value
    index = getattr(loader, "index", None)
    if not isinstance(index, dict) or key not in index:
        return {"kind": "none"}, tensor.dtype, None
    info = index[key]
    dtype = info.get("dtype", _torch_name(tensor.dtype))
    if info.get("safetensors_file") is not None:
        source = {
            "kind": "safetensors",
            "path": os.path.abspath(info["safetensors_file"]),
            "tensor": info.get("weight_name", key),
        }
    else:
        folder = getattr(loader, "save_folder", None)
        if folder is None:
            return {"kind": "none"}, tensor.dtype, None
        source = {
            "kind": "file",
            "path": os.path.abspath(os.path.join(folder, f"{key}.dat")),
            "dtype": dtype,
        }
    import torch

    return source, getattr(torch, dtype), None


def _peft_onloaded(loaders):
    """Modules whose hook holds a plain dict of tensors: peft's `onload_layer` put it
    there when it merged (or tried to merge) an adapter into a disk-offloaded layer."""
    return sorted(owner for owner, weights_map in loaders.items() if _holds_in_memory(weights_map))


def _original_first_row(loaders, full_name):
    """The first row of `full_name` as the offload folder still holds it (any hook's
    loader shares the one index), read from the file without loading the tensor; None
    when no loader has it."""
    import torch

    for weights_map in loaders.values():
        loader = getattr(weights_map, "dataset", None)
        index = getattr(loader, "index", None)
        if not isinstance(index, dict) or full_name not in index:
            continue
        info = index[full_name]
        if info.get("safetensors_file") is not None:
            from safetensors import safe_open

            with safe_open(info["safetensors_file"], "pt") as f:
                return f.get_slice(info.get("weight_name", full_name))[0:1]
        folder = getattr(loader, "save_folder", None)
        shape = tuple(info.get("shape", ()))
        if folder is None or not shape:
            return None
        # accelerate's `.dat`: raw little-endian values, bfloat16 as its int16 view.
        dtype = getattr(torch, info["dtype"])
        row = math.prod(shape[1:]) if len(shape) > 1 else 1
        size = torch.empty((), dtype=dtype).element_size()
        with open(os.path.join(folder, f"{full_name}.dat"), "rb") as f:
            data = bytearray(f.read(row * size))
        if len(data) < row * size:
            return None
        return torch.frombuffer(data, dtype=dtype).reshape(1, *shape[1:])
    return None


def unmerged_layers(model, loaders):
    """The modules peft onloaded whose weights came back as they were in the offload
    folder: a merge into them did nothing (peft makes the adapters of offloaded layers
    on the meta device), though the save writes what the model computes with."""
    import torch

    unchanged = []
    for owner in _peft_onloaded(loaders):
        weight = loaders[owner].get("weight")
        if not torch.is_tensor(weight) or weight.dim() < 2:
            continue
        first = _original_first_row(loaders, f"{owner}.weight")
        if first is not None and torch.equal(first.to(weight.dtype), weight[0:1]):
            unchanged.append(owner)
    return unchanged


class Stager:
    """GPU tensors, copied into one reusable host buffer (pinned where CUDA is) a chunk
    at a time when the saver asks (`fill`), with torch's own copy: GPU memory does not
    grow, host memory by the buffer."""

    def __init__(self, capacity, everything=False):
        self.capacity, self.tensors, self.buffer = capacity, [], None
        # Tests stage CPU tensors too: the GPU path but for the device torch copies from.
        self.everything = everything

    def add(self, tensor):
        import torch

        if tensor.is_contiguous():
            self.tensors.append(tensor.reshape(-1).view(torch.uint8))
        else:
            # A strided view (a transposed weight): made contiguous a block of rows at
            # a time in `fill`, so no copy of the whole tensor is ever held.
            self.tensors.append(tensor)
        return len(self.tensors) - 1

    def fill(self, key, offset, length):
        import torch

        if self.buffer is None:
            self.buffer = torch.empty(self.capacity, dtype=torch.uint8,
                                      pin_memory=torch.cuda.is_available())
        tensor = self.tensors[key]
        if tensor.dtype == torch.uint8 and tensor.dim() == 1 and tensor.is_contiguous():
            part = tensor[offset:offset + length]
        else:
            part = self._rows(tensor, offset, length)
        # A synchronous copy: the bytes are in the buffer when this returns.
        self.buffer[:length].copy_(part)
        return self.buffer.data_ptr()

    def _rows(self, tensor, offset, length):
        """Bytes `offset..offset + length` of a strided tensor as laid out contiguous:
        the rows they fall in, made contiguous (on the tensor's device: a few rows
        more than the chunk), then cut to the range."""
        import torch

        row = tensor[0].numel() * tensor.element_size() if tensor.shape[0] else 1
        if row > self.capacity:
            # Rows longer than the buffer: the whole tensor once (said in the guide).
            whole = tensor.contiguous().reshape(-1).view(torch.uint8)
            return whole[offset:offset + length]
        first, last = offset // row, -(-(offset + length) // row)
        block = tensor[first:last].contiguous().reshape(-1).view(torch.uint8)
        start = offset - first * row
        return block[start:start + length]


def _memory_source(tensor, keep, stager):
    """A tensor in this process's memory, read where it is; a GPU tensor or a strided
    view staged."""
    if tensor.device.type != "cpu" or stager.everything or not tensor.is_contiguous():
        # A GPU tensor, or a strided view: through the stager's buffer.
        return {"kind": "staged", "key": stager.add(tensor)}
    keep.append(tensor)
    return {"kind": "memory", "address": tensor.data_ptr()}


class _Copies:
    """Records the copies an operation makes (`clone`, a same-dtype `to`), each with
    the tensor it copied, so a slice of a copy can be traced back to its source."""

    def __new__(cls):
        from torch.utils._python_dispatch import TorchDispatchMode

        class Mode(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.made, self.kept = {}, []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                import torch

                out = func(*args, **(kwargs or {}))
                copying = (torch.ops.aten.clone.default, torch.ops.aten._to_copy.default)
                if func in copying and isinstance(out, torch.Tensor):
                    source = args[0]
                    if source.dtype == out.dtype and source.shape == out.shape:
                        self.made[id(out)] = source
                        self.kept.append(out)  # ids stay unique while the map lives
                return out

        return Mode()


def window_box(shape, first, count):
    """The box (offsets, sizes) of a tensor of `shape` that elements `first` to
    `first + count` make up (whole trailing dimensions, a range along one, single
    indices before it: the widest trailing block the run is made of), or None when
    they are not one box."""
    dims = len(shape)
    dim = dims
    while dim > 0:
        inner = math.prod(shape[dim - 1:])
        if count % inner or first % inner:
            break
        dim -= 1
    inner = math.prod(shape[dim:])
    if dim == 0:
        return ((0,) * dims, tuple(shape)) if first == 0 and count == inner else None
    block, blocks = first // inner, count // inner
    at = block % shape[dim - 1]
    if at + blocks > shape[dim - 1]:
        return None
    prefix, rest = [], block // shape[dim - 1]
    for size in reversed(shape[:dim - 1]):
        prefix.append(rest % size)
        rest //= size
    offsets = tuple(reversed(prefix)) + (at,) + (0,) * (dims - dim)
    sizes = (1,) * (dim - 1) + (blocks,) + tuple(shape[dim:])
    return offsets, sizes


def _locate(t, origin, made, depth=0):
    """(stand-in name, element offset) of a contiguous tensor whose elements are a
    contiguous run of one stand-in's, or None. A slice of a copy is mapped onto the
    copied tensor: the run must be whole trailing dimensions of the copy (a box of
    it), and that box must be contiguous in what was copied."""
    if depth > 16 or not t.is_contiguous() or t.numel() == 0:
        return None
    base = t._base if t._base is not None else t
    if id(base) in origin:
        return origin[id(base)], t.storage_offset()
    source = made.get(id(base))
    if source is None or not base.is_contiguous():
        return None
    start, count = t.storage_offset() - base.storage_offset(), t.numel()
    box = window_box(tuple(base.shape), start, count)
    if box is None:
        return None
    region = source[tuple(slice(o, o + n) for o, n in zip(*box))]
    return _locate(region, origin, made, depth + 1)


def _ties(model, full, kept):
    """{dropped name: kept name} for the names transformers' tie removal dropped: the
    kept name holding the same parameter (by object for meta tensors, by storage for
    the rest), as transformers found them."""
    def identity(name, tensor):
        if tensor.device.type == "meta":
            return id(model.get_parameter_or_buffer(name))
        return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))

    holders = {identity(name, full[name]): name for name in kept}
    ties = {}
    for name in full:
        if name not in kept:
            holder = holders.get(identity(name, full[name]))
            if holder is not None:
                ties[name] = holder
    return ties


def _device_of(tensor):
    """Where the manifest says a tensor lives: `cuda:N`, `cpu`, or `disk` for a meta
    tensor an offload loader holds."""
    kind = tensor.device.type
    return str(tensor.device) if kind == "cuda" else "disk" if kind == "meta" else "cpu"


def check_saveable(model):
    """Refuses what devmap does not save from a live model: unmerged peft adapters (with
    the streamed merge to use instead) and quantized models (saved from their files)."""
    if getattr(model, "_hf_peft_config_loaded", False) or hasattr(model, "peft_config"):
        on_meta = sorted({n.split(".lora_")[0] for n, p in model.named_parameters()
                          if ".lora_" in n and p.device.type == "meta"})
        where = ""
        if on_meta:
            shown = ", ".join(f"`{n}`" for n in on_meta[:3])
            more = f" and {len(on_meta) - 3} more" if len(on_meta) > 3 else ""
            where = (f"; peft made the adapters of {shown}{more} on the meta device (their layers are "
                     "offloaded), so merge_and_unload would leave those layers unmerged: save the adapter "
                     "(model.save_pretrained(ADAPTER)) and merge it from the files with "
                     "`devmap save MODEL --out OUT --merge-lora ADAPTER`, streamed")
        raise Refusal(
            "the model has peft adapters attached: merge them first "
            f"(model = model.merge_and_unload()) to save the merged weights{where}"
        )
    if getattr(model, "hf_quantizer", None) is not None:
        raise Refusal("the model is quantized; devmap saves quantized models from their files (devmap save)")


def build(model, config_dir, stage_bytes=64 << 20, allow_missing=False):
    """The manifest for `model` (a dict), the tensors it points into (to keep alive
    while the saver reads them), a check that none changed meanwhile, the stager of
    its GPU tensors (`stage_bytes` of host buffer), and notes for the user (layers a
    peft merge left as they were). `allow_missing` lets meta tensors
    with no value through (the inspector shows them as `meta`)."""
    import torch
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    check_saveable(model)

    full = model.state_dict()
    for key in getattr(model, "_keys_to_ignore_on_save", None) or []:
        full.pop(key, None)
    state_dict = remove_tied_weights_from_state_dict(dict(full), model)
    tied_to = _ties(model, full, state_dict)

    loaders = _offload_loaders(model)
    stager = Stager(int(os.environ.get("DEVMAP_TEST_STAGE_BYTES", stage_bytes)),
                    everything=os.environ.get("DEVMAP_TEST_STAGE_CPU") == "1")
    keep, watched, sources, held_dtypes, devices = [], [], {}, {}, {}
    for name, tensor in state_dict.items():
        if tensor.device.type == "meta":
            source, dtype, value = _offloaded_source(model, loaders, name, tensor)
            if value is not None:
                source = _memory_source(value, keep, stager)
                watched.append((name, value, value._version, None))
            devices[name] = "disk" if source["kind"] != "none" else "meta"
        else:
            source, dtype = _memory_source(tensor, keep, stager), tensor.dtype
            live = model.get_parameter_or_buffer(name) if hasattr(model, "get_parameter_or_buffer") else None
            pointer = live.data_ptr() if live is not None else None
            watched.append((name, tensor, tensor._version, pointer))
            devices[name] = _device_of(tensor)
        sources[name], held_dtypes[name] = source, dtype

    notes = []
    unmerged = unmerged_layers(model, loaders)
    if unmerged:
        shown = ", ".join(f"`{n}`" for n in unmerged[:8])
        more = f" and {len(unmerged) - 8} more" if len(unmerged) > 8 else ""
        notes.append(
            f"devmap: {shown}{more} came back from peft unchanged: peft makes the adapters of "
            "disk-offloaded layers on the meta device, so its merge did nothing there. They are "
            "saved as the model holds them (unmerged, as save_pretrained writes them); to merge "
            "them, save the adapter and run `devmap save MODEL --out OUT --merge-lora ADAPTER`, "
            "which merges every layer from the files, streamed")

    missing = [n for n, s in sources.items() if s["kind"] == "none"]
    if missing and not allow_missing:
        shown = ", ".join(f"`{n}`" for n in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise Refusal(
            f"{shown}{more} {'is' if len(missing) == 1 else 'are'} on the meta device with no "
            "value anywhere (no offload loader holds them): nothing was written; load the "
            "model with its weights (a device_map with an offload_folder) before saving"
        )

    # transformers' own reversal of its load-time conversions (renamed modules, fused
    # experts), run on data-less stand-ins: each result is a slice of one stand-in's
    # value, found through the views and copies the reversal made (see `_locate`).
    # The names transformers drops as ties go through it too, to learn their saved names.
    stand_ins, origin = {}, {}
    for name in [*state_dict, *tied_to]:
        dtype = held_dtypes.get(name, full[name].dtype)
        stand_in = torch.empty(tuple(full[name].shape), dtype=dtype, device="meta")
        stand_ins[name], origin[id(stand_in)] = stand_in, name
    copies = _Copies()
    with copies:
        reverted = revert_weight_conversion(model, dict(stand_ins))
    saved_name_of = {}
    for saved_name, view in reverted.items():
        found = _locate(view, origin, copies.made)
        if found is not None and found[1] == 0 and view.numel() == stand_ins[found[0]].numel():
            saved_name_of[found[0]] = saved_name
    ties = [(saved_name_of[kept], saved_name_of[name], name) for name, kept in tied_to.items()
            if kept in saved_name_of and name in saved_name_of]
    untraced = {saved_name_of.get(name) for name in tied_to} - {t[1] for t in ties}

    entries = []
    for saved_name, view in reverted.items():
        if saved_name in untraced:
            continue  # a dropped tie devmap cannot name: left out, as transformers leaves it
        tie = next((t for t in ties if t[1] == saved_name), None)
        if tie is not None:
            # Written once, under the kept name, as transformers writes it; listed so
            # the inspector shows the tie and where each side lives.
            entries.append({"name": saved_name, "dtype": _torch_name(view.dtype), "shape": list(view.shape),
                            "device": _device_of(full[tie[2]]), "source": {"kind": "tied", "to": tie[0]}})
            continue
        if view.numel() == 0:
            # No bytes to read: any source will do.
            entries.append({"name": saved_name, "dtype": _torch_name(view.dtype), "shape": list(view.shape),
                            "device": "cpu", "source": {"kind": "memory", "address": 0}})
            continue
        found = _locate(view, origin, copies.made)
        if found is None:
            raise Refusal(
                f"transformers saves `{saved_name}` by combining or reshaping the model's "
                "tensors in a way devmap cannot stream yet (it is not a contiguous slice of one "
                "tensor); save this model with model.save_pretrained"
            )
        from_name, first = found
        source = dict(sources[from_name])
        if source["kind"] == "memory":
            source["address"] += first * view.element_size()
        elif first:
            source["first"] = source.get("first", 0) + first
        entries.append({
            "name": saved_name,
            "dtype": _torch_name(view.dtype),
            "shape": list(view.shape),
            "device": devices[from_name],
            "source": source,
        })

    _write_config(model, config_dir)
    manifest = {
        "format": FORMAT,
        "config_dir": os.path.abspath(config_dir),
        "total_parameters": model.num_parameters() if hasattr(model, "num_parameters") else None,
        "title": f"{model.__class__.__name__} in this Python session",
        "device_map": _device_map_value(getattr(model, "hf_device_map", None)),
        "tensors": entries,
    }

    def unchanged():
        changed = []
        for name, tensor, version, pointer in watched:
            if tensor._version != version:
                changed.append(name)
            elif pointer is not None and model.get_parameter_or_buffer(name).data_ptr() != pointer:
                changed.append(name)
        if changed:
            raise Refusal(
                f"{', '.join(f'`{n}`' for n in changed[:5])} changed while devmap was saving "
                "(an in-place edit from another thread?): nothing was committed; save again"
            )

    return manifest, keep, unchanged, stager, notes


def _device_map_value(mapped):
    """`hf_device_map` as device_map.json holds it (devices as ints or strings)."""
    if not mapped:
        return None
    def value(device):
        if isinstance(device, int):
            return device
        device = str(device)
        return int(device.split(":")[1]) if device.startswith("cuda:") else device
    return {key: value(device) for key, device in mapped.items()}


def _write_config(model, folder):
    """config.json and generation_config.json as `save_pretrained` writes them, from a
    copy: the model's own config is left as it is."""
    config = copy.deepcopy(model.config)
    config.dtype = _torch_name(model.dtype)
    config.architectures = [model.__class__.__name__.removeprefix("FSDP")]
    config.save_pretrained(folder)
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate) and can_generate():
        model.generation_config.save_pretrained(folder)
