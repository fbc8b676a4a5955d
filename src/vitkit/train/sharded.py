"""Sharded training (`--fsdp`): PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`; Zhao et
al., "PyTorch FSDP", VLDB 2023) around each transformer block, then the whole model.

Each process keeps 1/N of every parameter, gradient and optimiser state; a block's weights are
all-gathered for its forward and backward and freed after, and gradients are reduce-scattered.
The training state is written through `torch.distributed.checkpoint` (DCP): every rank writes
its shard into a folder `state-<epoch>-<batch>.dcp` beside `state.pt` (which names it), and DCP
reshards on load, so a run resumes on another number of processes. The model files
(`model.safetensors`, `encoder.safetensors`) are gathered whole and written by rank 0 as from
an unsharded run, so `predict` / `export` read them as any other.

Evaluation runs the sharded model too, so every rank must run the same number of forward
passes (each one all-gathers): `lockstep` repeats a rank's last batch, uncounted, while
another rank still has batches.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .distributed import all_reduce, barrier, world

log = logging.getLogger(__name__)

# The plain twin of each sharded model, on the meta device (no memory): what its gathered
# weights are loaded into to write an ordinary checkpoint.
_twins: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def _fsdp_module() -> Any:
    """`torch.distributed.fsdp` when it has FSDP2's `fully_shard` (public since torch 2.6),
    else None."""
    try:
        from torch.distributed import fsdp

        fsdp.fully_shard, fsdp.MixedPrecisionPolicy, fsdp.FSDPModule  # noqa: B018
    except (ImportError, AttributeError):
        return None
    return fsdp


def require_fsdp() -> Any:
    """`torch.distributed.fsdp` with `fully_shard`, or one error that says what to do."""
    fsdp = _fsdp_module()
    if fsdp is None:
        raise ValueError(
            f"fsdp needs torch.distributed.fsdp.fully_shard, which torch {torch.__version__} "
            "lacks; upgrade torch (>= 2.6) or train without fsdp"
        )
    return fsdp


def is_sharded(module: nn.Module) -> bool:
    """Whether `fully_shard` was applied to `module` (its parameters are DTensor shards);
    False where torch has no FSDP2."""
    fsdp = _fsdp_module()
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


def precision_policy(amp: str) -> Any:
    """FSDP's mixed precision for the run's `amp`: bf16 parameters for the forward and backward
    with gradients reduced in fp32 for 'bf16' (the default on a GPU); fp32 throughout for
    'none' (the default on the CPU, where few processors compute bf16 natively and gloo gains
    nothing from halving a message on one machine)."""
    fsdp = require_fsdp()
    if amp == "bf16":
        return fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return fsdp.MixedPrecisionPolicy()


def shard(model: nn.Module, *, amp: str, device: torch.device) -> nn.Module:
    """`fully_shard` each block (the children of every `*blocks` list: the encoder's, an MAE
    decoder's), then `model` itself (embeddings, norms, head); in place, returns `model`.
    Call it after freezing and gradient checkpointing are set and before the optimiser takes
    the parameters (they become DTensor shards)."""
    fsdp = require_fsdp()
    if not dist.is_initialized():
        raise RuntimeError(
            "fsdp shards over a process group: run it through run_job (it joins one, also "
            "alone) or call torch.distributed.init_process_group first"
        )
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (world()[1],))
    _twins[model] = _meta_copy(model)
    policy = precision_policy(amp)
    blocks = [
        block
        for name, module in model.named_modules()
        if name.split(".")[-1].endswith("blocks")
        and isinstance(module, nn.Sequential | nn.ModuleList)
        for block in module
    ]
    for block in blocks:
        fsdp.fully_shard(block, mesh=mesh, mp_policy=policy)
    fsdp.fully_shard(model, mesh=mesh, mp_policy=policy)
    log.info(
        "FSDP: %d blocks and the root sharded over %d process(es), %s",
        len(blocks),
        world()[1],
        "bf16 parameters, fp32 reduction" if amp == "bf16" else "fp32",
    )
    return model


def _meta_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters are on the meta device (nothing is allocated): the
    module tree, its config and data config. Buffers are copied (small; a non-persistent one,
    a position table, is in no state dict to be loaded back)."""
    memo = {id(p): nn.Parameter(p.detach().to("meta"), p.requires_grad) for p in model.parameters()}
    return copy.deepcopy(model, memo)


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of a sharded `model`, on the CPU, on rank 0 (empty elsewhere); every
    rank must call it (it all-gathers)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def plain_copy(model: nn.Module) -> nn.Module | None:
    """An ordinary (unsharded, CPU) copy of a sharded `model` with its gathered weights on rank
    0, None on the other ranks; every rank must call it."""
    weights = full_state(model)
    if world()[0] != 0:
        return None
    twin = copy.deepcopy(_twins[model])
    twin.load_state_dict(weights, assign=True)
    return twin


@contextlib.contextmanager
def whole_model(task: Any) -> Iterator[None]:
    """For the block, `task.model` is an ordinary copy of its sharded model on rank 0 (what
    `save_files` writes and draws with); unchanged when it is not sharded. Every rank enters."""
    model = task.model
    if not is_sharded(model):
        yield
        return
    twin = plain_copy(model)
    if twin is not None:
        task.model = twin
    try:
        yield
    finally:
        task.model = model


def load_full(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Put whole weights (a model file's) into `model`, sharded or not."""
    if not is_sharded(model):
        model.load_state_dict(weights)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))


def lockstep(batches: Iterable, model: nn.Module) -> Iterator[tuple[Any, bool]]:
    """(batch, counted) pairs: `batches` as they come; for a sharded model, while another rank
    still has batches, this rank's last one again with counted=False (every forward pass
    all-gathers, so every rank runs as many)."""
    if not is_sharded(model) or world()[1] == 1:
        yield from ((batch, True) for batch in batches)
        return
    device = next(model.parameters()).device
    items, last = iter(batches), None
    while True:
        batch = next(items, None)
        if all_reduce([float(batch is not None)], device)[0] == 0:
            return
        if batch is None and last is None:
            raise ValueError(
                f"rank {world()[0]} has no evaluation images: the split is smaller than the "
                "number of processes; use fewer processes or a larger split"
            )
        if batch is not None:
            last = batch
        yield (last, batch is not None)


def save_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, out: Path, name: str) -> bool:
    """Write the model's and optimiser's shards into `out/name` (a DCP folder) from every
    rank; returns whether the optimiser's state went in. An optimiser that has not stepped yet
    is left out: torch's sharded state dict would make its state by a step of zero gradients,
    which counts a step (Adam's bias correction) the run never took."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    stepped = bool(optimizer.state)
    if stepped:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
    else:
        state = {"model": get_model_state_dict(model)}
    folder = out / name
    if world()[0] == 0 and folder.exists():  # a save of the same point that was cut short
        shutil.rmtree(folder)
    barrier()
    dcp.save(state, checkpoint_id=folder)
    return stepped


def load_sharded(
    model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, *, stepped: bool = True
) -> None:
    """Read a DCP folder of `save_sharded` into the sharded model and (when it `stepped`)
    optimiser, on however many processes (DCP reshards)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import state_dict as dicts

    if not (folder / ".metadata").is_file():
        raise FileNotFoundError(
            f"the sharded training state {folder} is missing or incomplete; start again with "
            "--overwrite"
        )
    if not stepped:
        state = {"model": dicts.get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=folder)
        dicts.set_model_state_dict(model, state["model"])
        return
    model_state, optim_state = dicts.get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=folder)
    dicts.set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def prune_sharded(out: Path, keep: str) -> None:
    """Remove the run's `state-*.dcp` folders but `keep` (rank 0, after `state.pt` names it)."""
    for folder in out.glob("state-*.dcp"):
        if folder.name != keep and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)


def sharded_folders(out: Path) -> list[Path]:
    """The run's DCP folders (what --overwrite removes)."""
    return sorted(p for p in out.glob("state-*.dcp") if p.is_dir() and not p.is_symlink())
