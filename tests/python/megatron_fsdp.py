"""devmap converts Megatron-LM's `fsdp_dtensor` checkpoints (`--ckpt-format
fsdp_dtensor`, what Megatron-FSDP training saves) to the checkpoint transformers loads,
checked against the Megatron model's own parameters and forward.

Such a checkpoint is a plain torch.distributed.checkpoint folder (no `metadata.json`,
no `common.pt`): Megatron-LM's `generate_state_dict` puts `args`, `iteration`,
`checkpoint_version`, the model's state dict (`model`, names after the wrappers'
`module.`) and the optimizer's state in one dict; `preprocess_fsdp_dtensor_state_dict`
cuts each gated `linear_fc1` into `…weight_w` (gate) and `…weight_v` (up), numbers the
experts globally, and `torch.distributed.checkpoint.save` writes it, `args` pickled
as a bytes entry.

Megatron-FSDP itself needs CUDA, so no model is trained sharded here. What
Megatron-FSDP would hold is built from megatron-core 0.16.1's own pieces on CPU with
gloo:
- a GPTModel loaded by megatron-core from the TP=1 torch_dist checkpoint of
  megatron_dist.py, at TP=2 on a (dp=2, tp=2) CPU device mesh (Llama-shaped), or at
  TP=2 × EP=2 (Qwen3-MoE-shaped, its experts on an (edp=1, ep=2, tp=2) mesh);
- each dense parameter's rows cut between the two data-parallel ranks where one flat
  buffer of all of them is cut (the cut put off the middle, so one matrix is split
  unevenly and others lie whole on one rank), made a DTensor by Megatron-FSDP's own
  `make_fsdp_dtensor`;
- the optimizer's state keyed by megatron-core's `get_global_unique_param_name`;
- then megatron-core's own `handle_fp8_extra_state_case`, `handle_swiglu_in_state_dict`,
  `handle_experts_in_state_dict` and `preprocess_state_dict_for_uneven_dtensor`, in
  the order Megatron-LM's `preprocess_fsdp_dtensor_state_dict` calls them (that
  function lives in Megatron-LM's training code, which is not a package), and torch's
  `dcp.save`.
Megatron-FSDP's uneven-DTensor checks move their chunk tables with `.cuda()`, made a
no-op here (gloo gathers on the CPU). The flat form Megatron-LM's converter from
torch_dist writes (`model.module.…` keys, `args` pickled with protocol 4) is made from
the same checkpoint by one process.

Checked:
- `devmap save DIR --out OUT` of each writes, bit for bit, the Megatron model's own
  parameters cut and renamed as transformers names them, identical to devmap's
  conversion of the torch_dist checkpoint of the same weights; `verify OUT` is clean;
  config.json comes from the `args` entry and `from_pretrained(OUT)` gives the logits
  of Megatron's forward;
- the second expert-parallel rank's experts are saved under global numbers;
- the optimizer's state and `rng_state` are named as left out;
- a missing rank file, and an `args` entry whose pickle names a callable, are refused
  by name with nothing written.

Usage: python megatron_fsdp.py PATH/TO/devmap
"""

import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_dist as base  # noqa: E402
import megatron_moe  # noqa: E402
import saved  # noqa: E402

DP, TP = 2, 2


def dp_rows(params, cut=0.6):
    """Each parameter's rows on each of the two data-parallel ranks: the parameters
    laid end to end in one flat buffer (in order), as Megatron-FSDP lays them, cut at
    `cut` of its length, moved to the nearest row boundary of the parameter it falls
    in. Megatron-FSDP cuts its buffers evenly; the cut is placed off the middle here so
    that a matrix is split unevenly. {name: [(first, end) on rank 0, on rank 1]}."""
    sizes = [(name, p.shape[0] if p.dim() else 1, p[0].numel() if p.dim() > 1 else 1) for name, p in params]
    total = sum(rows * cols for _, rows, cols in sizes)
    at, out, start = int(total * cut), {}, 0
    for name, rows, cols in sizes:
        split = min(max(round((at - start) / cols), 0), rows)
        out[name] = [(0, split), (split, rows)]
        start += rows * cols
    return out


class Wrapper(torch.nn.Module):
    """What Megatron-LM's `model[0]` is around the GPTModel (the data-parallel wrapper,
    then Megatron-FSDP's module): names in its state dict carry `module.`, its
    parameters `module.module.`."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.config = getattr(module, "config", None)


def fsdp_state(model, rank, world, parallel, args, experts, with_optimizer=True):
    """The state dict Megatron-LM's training loop would save, as `fsdp_dtensor`, of the
    megatron-core `model` this rank holds (the ranks in `init_process_group`,
    megatron-core's parallel state set to `parallel` = (TP, EP)), with `args` and
    `experts` experts a layer (None: dense); `with_optimizer`: with the optimizer's state."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer import make_fsdp_dtensor
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import (
        preprocess_state_dict_for_uneven_dtensor)
    from megatron.core.distributed.fsdp.src.megatron_fsdp.utils import FSDPDistributedIndex
    from megatron.core.transformer import fsdp_dtensor_checkpoint as fsdp_ckpt
    from torch.distributed.device_mesh import DeviceMesh

    # Megatron-FSDP's uneven-DTensor checks gather their chunk tables with NCCL, on the
    # GPU: gloo gathers them on the CPU.
    torch.Tensor.cuda = lambda self, *a, **k: self
    tp, ep = parallel
    # megatron-core's ranks: tensor parallel innermost, then (for experts) expert
    # parallel, then data parallel.
    mesh = DeviceMesh("cpu", torch.arange(world).reshape(world // tp, tp), mesh_dim_names=("dp", "tp"))
    experts_mesh = DeviceMesh("cpu", torch.arange(world).reshape(world // (tp * ep), ep, tp),
                              mesh_dim_names=("dp", "ep", "tp"))
    index = FSDPDistributedIndex(device_mesh=mesh, dp_shard_dim="dp", tp_dim="tp",
                                 expt_device_mesh=experts_mesh)
    params = list(model.named_parameters())
    dense = [(n, p) for n, p in params if "mlp.experts" not in n]
    rows = dp_rows(dense)
    model_state = {}
    for name, p in params:
        # Experts run here at EP = world / TP: their data-parallel group is one rank,
        # which holds them whole.
        expert = "mlp.experts" in name
        assert not expert or world == tp * ep, "experts are sharded only at EP = world / TP here"
        first, end = (0, p.shape[0]) if expert else rows[name][rank // tp]
        cols = p[0].numel() if p.dim() > 1 else 1
        # What Megatron-FSDP records on each parameter: its slice of the flat buffer
        # this rank holds, and the meshes.
        p.megatron_fsdp_slice = slice(first * cols, end * cols)
        p.megatron_fsdp_dist_index = index
        local = p.detach().reshape(-1)[first * cols:end * cols].clone()
        model_state[f"module.{name}"] = make_fsdp_dtensor(
            local, p, index, is_expert_param=expert, run_check=True,
            update_uneven_dtensor_chunk_meta=True)
    wrapper = Wrapper(Wrapper(model))
    # The optimizer's state (its moments stand in as the weights' own values), keyed
    # as Megatron-LM keys it: `module.` and the parameter's global name (megatron-core's
    # get_global_unique_param_name: experts numbered globally).
    optimizer = {"state": {
        "module." + fsdp_ckpt.get_global_unique_param_name([wrapper], p): {
            "exp_avg": model_state[f"module.{name}"], "exp_avg_sq": model_state[f"module.{name}"]}
        for name, p in params}}
    # Then Megatron-LM's preprocess_fsdp_dtensor_state_dict, call by call.
    state = {"args": args, "checkpoint_version": 3.0,
             "iteration": 1, "model": model_state, **({"optimizer": optimizer} if with_optimizer else {}),
             "rng_state": {f"(0, {rank % tp})": [{"random_rng_state": torch.get_rng_state()}]}}
    fsdp_ckpt.handle_fp8_extra_state_case(state["model"])
    state["model"], moments = fsdp_ckpt.handle_swiglu_in_state_dict(wrapper, state["model"], state.get("optimizer"))
    if with_optimizer:
        state["optimizer"] = moments
    if experts:
        state["model"] = fsdp_ckpt.handle_experts_in_state_dict(state["model"], experts)
    preprocess_state_dict_for_uneven_dtensor(state)
    return state


def rank_main(rank, world, port, job):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    base.cpu_only()
    dist.init_process_group("gloo")
    tp, ep = job["tp"], job.get("ep", 1)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    dtype = getattr(torch, job["dtype"])
    model = base.build(dtype, tp, 1, moe=job.get("moe"), ep=ep)
    state = dist_checkpointing.load({"model": model.sharded_state_dict()}, job["load"])
    model.load_state_dict(state["model"])
    state = fsdp_state(model, rank, world, (tp, ep), base.megatron_args(dtype, moe=job.get("moe")),
                       base.EXPERTS if job.get("moe") else None)
    if rank == 0:
        os.makedirs(job["out"], exist_ok=True)
    dist.barrier()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(job["out"]))
    dist.barrier()
    dist.destroy_process_group()


def run_job(job, world, ports):
    base.run_job(job, world, ports, rank_main, ("megatron.core.transformer.fsdp_dtensor_checkpoint",))


def flat_copy(folder, flat):
    """The same checkpoint as Megatron-LM's own converter from torch_dist
    (`checkpoint_inspector.py convert-torch-dist-to-fsdp-dtensor`) writes it: one flat
    dict, `model.module.…` and `optimizer.state.module.module.module.NAME.exp_avg`,
    `args` pickled with protocol 4; saved by one process."""
    import io

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = os.path.join(os.path.dirname(flat), "whole.pt")
    dcp_to_torch_save(folder, whole)
    nested = torch.load(whole, weights_only=False)
    args = io.BytesIO()
    torch.save(nested["args"], args, pickle_protocol=4)
    args.seek(0)
    state = {f"model.{k}": v for k, v in nested["model"].items()}
    for name, moments in nested["optimizer"]["state"].items():
        state.update({f"optimizer.state.{name}.{m}": t for m, t in moments.items()})
    state.update(args=args, iteration=1, checkpoint_version=3.0)

    class Planner(dcp.DefaultSavePlanner):
        """The converter's: a pickle already made is written as it is."""

        def transform_object(self, write_item, obj):
            return obj if isinstance(obj, io.BytesIO) else super().transform_object(write_item, obj)

    dcp.save(state, storage_writer=dcp.FileSystemWriter(flat), planner=Planner())
    os.remove(whole)


def uneven(folder):
    """Whether some tensor of the checkpoint is stored in chunks of different sizes."""
    from torch.distributed.checkpoint import FileSystemReader

    entries = FileSystemReader(folder).read_metadata().state_dict_metadata.values()
    return any(len({tuple(c.sizes) for c in getattr(e, "chunks", [])}) > 1 for e in entries)


def main():
    exe = os.path.abspath(sys.argv[1])
    work = saved.workdir("devmap-megatron-fsdp-")
    tp1 = os.path.join(work, "tp1")
    state_file = os.path.join(work, "state.pt")
    ref_logits = os.path.join(work, "logits.pt")
    base.run_job({"tp": 1, "pp": 1, "dtype": "float32", "out": tp1, "state": state_file,
                  "logits": ref_logits}, 1, [29991, 29992])
    folder = os.path.join(work, "fsdp-dp2-tp2")
    run_job({"tp": TP, "dtype": "float32", "out": folder, "load": tp1}, DP * TP, [29993, 29994])
    assert not os.path.exists(os.path.join(folder, "metadata.json")), "not the fsdp_dtensor layout"
    assert uneven(folder), "no tensor is split unevenly between the data-parallel ranks"
    flat = os.path.join(work, "fsdp-flat")
    flat_copy(folder, flat)
    want = base.hf_names(torch.load(state_file))
    # Each converted bit for bit, identical to the torch_dist checkpoint's conversion,
    # logits equal to Megatron's forward.
    base.converts_bit_for_bit(exe, work, "fsdp_dtensor", {"TP=1": tp1, "DP=2 TP=2": folder, "flat": flat},
                              want, "LlamaForCausalLM", ref_logits)
    # Qwen3-MoE-shaped, its experts spread over two expert-parallel ranks (each saves
    # its two under their global numbers) and split over two tensor-parallel ones.
    moe = {"qk_norm": True}
    moe_tp1 = os.path.join(work, "moe-tp1")
    moe_state, moe_logits = os.path.join(work, "moe-state.pt"), os.path.join(work, "moe-logits.pt")
    base.run_job({"tp": 1, "pp": 1, "dtype": "float32", "out": moe_tp1, "state": moe_state,
                  "logits": moe_logits, "moe": moe}, 1, [29995, 29996])
    moe_folder = os.path.join(work, "moe-fsdp")
    run_job({"tp": TP, "ep": 2, "moe": moe, "dtype": "float32", "out": moe_folder, "load": moe_tp1},
            DP * TP, [29997, 29998])
    from torch.distributed.checkpoint import FileSystemReader

    names = FileSystemReader(moe_folder).read_metadata().state_dict_metadata
    assert any(".local_experts.3.linear_fc1.weight_w" in k for k in names), \
        "the second expert-parallel rank's experts are not numbered globally"
    base.converts_bit_for_bit(exe, work, "fsdp_dtensor qwen3_moe", {"TP=1": moe_tp1, "TP=2 EP=2": moe_folder},
                              megatron_moe.hf_names(torch.load(moe_state), "qwen3_moe"),
                              "Qwen3MoeForCausalLM", moe_logits)

    out = os.path.join(work, "said")
    r = base.devmap(exe, "save", folder, "--out", out)
    said = r.stdout + r.stderr
    assert r.returncode == 0 and all(w in said for w in ("`optimizer` (", "`rng_state`", "left out")), said
    assert "`args`" not in said, f"the save calls the arguments it read left out:\n{said}"
    print("fsdp_dtensor: the optimizer's state and rng_state are named as left out")

    def variant(name, change):
        copy = os.path.join(work, name)
        shutil.copytree(folder, copy)
        change(copy)
        return copy

    base.refused(exe, variant("missing-rank", lambda f: os.remove(os.path.join(f, "__3_0.distcp"))),
                 work, "fsdp_dtensor: a missing rank file", "__3_0.distcp")

    def hostile_args(f):
        # `args` replaced by a pickle naming a callable, where Megatron-LM keeps it.
        import io

        from torch.distributed.checkpoint import FileSystemReader

        meta = FileSystemReader(f).read_metadata()
        at = next(v for k, v in meta.storage_data.items() if k.fqn == "args")
        evil = io.BytesIO()
        torch.save({"args": os.system}, evil)
        data = open(os.path.join(f, at.relative_path), "rb").read()
        assert len(evil.getvalue()) <= at.length, "the hostile pickle does not fit"
        blob = evil.getvalue().ljust(at.length, b"\0")
        with open(os.path.join(f, at.relative_path), "wb") as out_file:
            out_file.write(data[:at.offset] + blob + data[at.offset + at.length:])

    base.refused(exe, variant("callable-args", hostile_args), work,
                 "fsdp_dtensor: args naming a callable", "system")
    print("megatron fsdp_dtensor: all checks passed")


if __name__ == "__main__":
    main()
