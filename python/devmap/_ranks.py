"""Saving a model whose parameters are sharded over the ranks of a job (torchrun with
FSDP2's `fully_shard`, or any DTensor parameters), with no gather.

`devmap.save_pretrained(model, out)` is called on every rank. Each rank describes the
whole model — the names `save_pretrained` writes (transformers' own tie removal and
conversion reversal, run on data-less stand-ins of the global shapes) — and, as each
tensor's source, the blocks its local shards hold. Every rank then plans the same save
(its fingerprint is compared), rank 0 creates the shard files, every rank writes its
blocks straight into them at their final offsets, and rank 0 commits once every rank
is done (`devmap::save::ranks`). No rank holds more than its own shards and a fixed
buffer; a failure on any rank leaves `out` as it was, on every rank.
"""

import json
import math
import os
import tempfile

from . import _live
from ._live import Refusal


def is_sharded(model):
    """Whether any parameter of `model` is a DTensor (then every rank must save)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - a torch built without distributed
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


def _held_block(tensor, rank_of_group):
    """(global offsets, local shape, local tensor) of the block this rank writes of
    `tensor`, or None when another rank writes it: a DTensor's local shard (a
    replicated one by the ranks at coordinate 0 of each replicating mesh dimension),
    or a plain tensor (the same on every rank: rank 0 writes it)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Partial, Replicate

    if not isinstance(tensor, DTensor):
        if rank_of_group != 0:
            return None
        return (0,) * tensor.dim(), tuple(tensor.shape), tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if any(isinstance(p, Partial) for p in tensor.placements):
        raise Refusal("is a partial sum across ranks (a Partial placement): reduce it before saving")
    coordinate = tensor.device_mesh.get_coordinate()
    if coordinate is None:
        return None
    if any(isinstance(p, Replicate) and coordinate[i] != 0 for i, p in enumerate(tensor.placements)):
        return None
    local = tensor.to_local()
    shape, offsets = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    if tuple(local.shape) != tuple(shape):
        raise Refusal(f"has a local shard of shape {tuple(local.shape)}, where its placements give {tuple(shape)}")
    return tuple(offsets), tuple(shape), local


def _strip_ones(sizes):
    sizes = list(sizes)
    while sizes and sizes[0] == 1:
        sizes.pop(0)
    return sizes


def _piece(name, held, window, saved_shape):
    """The block of saved tensor `name` (of `saved_shape`, the `window` box of the
    stand-in) in this rank's `held` block: (offsets, sizes in the saved tensor, element
    offset in the local tensor), None when the rank holds none of it."""
    (l_off, l_size, _), (w_off, w_size) = held, window
    lo = [max(a, b) for a, b in zip(l_off, w_off)]
    hi = [min(a + s, b + t) for a, s, b, t in zip(l_off, l_size, w_off, w_size)]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    sizes = [h - l for l, h in zip(lo, hi)]
    # Contiguous in the local block: whole trailing dimensions, a range along one,
    # single indices before it.
    varying = [d for d in range(len(sizes)) if sizes[d] != l_size[d]]
    if varying and any(sizes[d] != 1 for d in range(varying[-1])):
        raise Refusal(f"`{name}` is saved as a part of a sharded tensor that is not contiguous in this "
                      "rank's shard: devmap cannot write it from the shards; gather it before saving")
    strides = [math.prod(l_size[d + 1:]) for d in range(len(l_size))]
    first = sum((lo[d] - l_off[d]) * strides[d] for d in range(len(sizes)))
    # The block in the saved tensor's coordinates: the window's own, less the single
    # indices before it.
    if _strip_ones(w_size) != _strip_ones(saved_shape):
        raise Refusal(f"`{name}` is saved reshaped from a sharded tensor: devmap cannot write it from "
                      "the shards; gather it before saving")
    inner = len(_strip_ones(w_size))
    offsets = [lo[d] - w_off[d] for d in range(len(lo))][len(lo) - inner:] if inner else []
    block = sizes[len(sizes) - inner:] if inner else []
    pad = len(saved_shape) - inner
    return [0] * pad + offsets, [1] * pad + block, first


def build(model, config_dir, group=None, stage_bytes=64 << 20):
    """The manifest of this rank's share of `model` (see `_live.build` for what the
    other values are): every tensor `save_pretrained` writes, with its whole shape, its
    source the blocks this rank holds."""
    import torch
    import torch.distributed as dist
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    _live.check_saveable(model)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    full = model.state_dict()
    for key in getattr(model, "_keys_to_ignore_on_save", None) or []:
        full.pop(key, None)
    # Stand-ins of the global shapes: transformers finds ties among them by parameter
    # object (its path for tensors with no data), which a sharded model keeps.
    stand_ins, origin = {}, {}
    for name, tensor in full.items():
        if tensor.device.type == "meta":
            raise Refusal(f"`{name}` is on the meta device: a sharded save writes the ranks' shards, "
                          "and this tensor has none")
        stand_in = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="meta")
        stand_ins[name], origin[id(stand_in)] = stand_in, name
    state_dict = remove_tied_weights_from_state_dict(dict(stand_ins), model)
    tied_to = _live._ties(model, stand_ins, state_dict)

    stager = _live.Stager(int(os.environ.get("DEVMAP_TEST_STAGE_BYTES", stage_bytes)),
                          everything=os.environ.get("DEVMAP_TEST_STAGE_CPU") == "1")
    held, keep, watched, devices = {}, [], [], {}
    for name in [*state_dict, *tied_to]:
        try:
            block = _held_block(full[name], rank)
        except Refusal as refusal:
            raise Refusal(f"`{name}` {refusal}") from None
        held[name] = block
        tensor = full[name]
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        devices[name] = _live._device_of(local)
        if block is not None:
            watched.append((name, block[2], block[2]._version))

    copies = _live._Copies()
    with copies:
        reverted = revert_weight_conversion(model, {n: stand_ins[n] for n in [*state_dict, *tied_to]})
    saved_name_of = {}
    for saved_name, view in reverted.items():
        found = _live._locate(view, origin, copies.made)
        if found is not None and found[1] == 0 and view.numel() == stand_ins[found[0]].numel():
            saved_name_of[found[0]] = saved_name
    ties = [(saved_name_of[kept], saved_name_of[name], name) for name, kept in tied_to.items()
            if kept in saved_name_of and name in saved_name_of]
    untraced = {saved_name_of.get(name) for name in tied_to} - {t[1] for t in ties}

    keys = {}
    entries = []
    for saved_name, view in reverted.items():
        if saved_name in untraced:
            continue
        entry = {"name": saved_name, "dtype": _live._torch_name(view.dtype), "shape": list(view.shape)}
        tie = next((t for t in ties if t[1] == saved_name), None)
        if tie is not None:
            entries.append({**entry, "device": devices[tie[2]], "source": {"kind": "tied", "to": tie[0]}})
            continue
        found = _live._locate(view, origin, copies.made) if view.numel() else None
        if view.numel() and found is None:
            raise Refusal(
                f"transformers saves `{saved_name}` by combining or reshaping the model's tensors in a "
                "way devmap cannot stream yet; gather the model and save it with save_pretrained")
        pieces = []
        if found is not None and held[found[0]] is not None:
            from_name, first = found
            window = _live.window_box(tuple(stand_ins[from_name].shape), first, view.numel())
            if window is None:
                raise Refusal(f"`{saved_name}` is saved from a part of `{from_name}` that is not one block "
                              "of it; gather the model and save it with save_pretrained")
            piece = _piece(saved_name, held[from_name], window, tuple(view.shape))
            if piece is not None:
                offsets, sizes, at = piece
                local = held[from_name][2]
                if local.device.type != "cpu" or stager.everything or not local.is_contiguous():
                    if id(local) not in keys:
                        keys[id(local)] = stager.add(local)
                    place = {"key": keys[id(local)], "first": at}
                else:
                    keep.append(local)
                    place = {"address": local.data_ptr() + at * local.element_size()}
                pieces.append({"offsets": offsets, "sizes": sizes, **place})
        device = devices[found[0]] if found is not None else "cpu"
        entries.append({**entry, "device": device, "source": {"kind": "pieces", "pieces": pieces}})

    _live._write_config(model, config_dir)
    manifest = {
        "format": _live.FORMAT,
        "config_dir": os.path.abspath(config_dir),
        "total_parameters": model.num_parameters() if hasattr(model, "num_parameters") else None,
        "title": f"{model.__class__.__name__} in this Python session (rank {rank} of {world})",
        "rank": {"rank": rank, "world": world},
        "tensors": entries,
    }

    def unchanged():
        changed = [name for name, tensor, version in watched if tensor._version != version]
        if changed:
            raise Refusal(
                f"{', '.join(f'`{n}`' for n in changed[:5])} changed on rank {rank} while devmap was "
                "saving (an optimizer step on another thread?): nothing was committed; save again")

    return manifest, keep, unchanged, stager


def _together(group, what, work):
    """Runs `work()` on this rank, then tells every rank how every rank fared: the
    values, in rank order, or a DevmapError naming the first rank that failed and why.
    Every rank reaches the exchange whatever happened, so none waits forever."""
    import torch.distributed as dist

    from . import DevmapError

    try:
        result = (None, work())
    except (Refusal, DevmapError) as err:
        result = (str(err), None)
    except Exception as err:  # noqa: BLE001 - told to every rank, then raised there
        # The compiled module's DevmapError speaks for itself; anything else is named.
        named = type(err).__name__ == "DevmapError"
        result = (str(err) if named else f"{type(err).__name__}: {err}", None)
    results = [None] * dist.get_world_size(group)
    dist.all_gather_object(results, result, group=group)
    failed = [(rank, error) for rank, (error, _) in enumerate(results) if error is not None]
    if failed:
        rank, error = failed[0]
        more = f" (and {len(failed) - 1} more ranks failed)" if len(failed) > 1 else ""
        raise _Failed(f"rank {rank} failed to {what}{more}: {error}")
    return [value for _, value in results]


class _Failed(Exception):
    """A step failed on some rank; every rank raises it."""


def save(model, out, binding, *, group=None, max_shard_size, dtype, force, fsync, verify=True):
    """Every rank's part of `devmap.save_pretrained` of a sharded model (see the
    module's text); returns the report rank 0's commit made, on every rank."""
    import torch.distributed as dist

    from . import DevmapError

    rank = dist.get_rank(group)
    state = {}
    with tempfile.TemporaryDirectory(prefix="devmap-config-") as config_dir:
        def plan():
            manifest, keep, unchanged, stager = build(model, config_dir, group)

            def check():
                try:
                    unchanged()
                except Refusal as refusal:
                    raise DevmapError(str(refusal)) from None

            state["keep"], state["stager"] = keep, stager
            state["save"] = binding.RankSave(
                json.dumps(manifest), out, max_shard_size=max_shard_size, dtype=dtype, force=force,
                fsync=fsync, check=check,
                stage=(stager.fill, stager.capacity) if stager.tensors else None)
            return state["save"].fingerprint()

        def abandon():
            if rank == 0 and "save" in state:
                state["save"].abandon()

        try:
            fingerprints = _together(group, "plan the save", plan)
            if len(set(fingerprints)) > 1:
                other = next(r for r, f in enumerate(fingerprints) if f != fingerprints[0])
                raise _Failed(f"ranks 0 and {other} planned different saves (another model, shard size or "
                              "dtype on some rank): every rank must save the same model the same way")
            _together(group, "create the shard files", lambda: state["save"].create() if rank == 0 else None)
            _together(group, "write its shards", lambda: state["save"].write(verify))
            reports = _together(group, "commit", lambda: state["save"].commit() if rank == 0 else None)
        except _Failed as failed:
            abandon()
            message = str(failed).replace("pass --force", "pass force=True")
            raise DevmapError(f"cannot save; nothing was committed: {message}") from None
        finally:
            state.pop("keep", None)
            state.pop("stager", None)
    return json.loads(reports[0])
