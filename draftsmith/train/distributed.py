"""Data parallelism for the trainer, by hand: every rank holds the whole draft, computes gradients on
its shard of each global batch, and the gradients are summed across ranks before the optimizer step.

Why not DDP: the loss of a global batch is normalised by global counts (all-reduced before the
loss), so summing per-rank gradients gives exactly the single-process gradient of that batch,
whatever the shard sizes (an empty shard contributes zeros). DDP's averaging and its bucketing
hooks would need the same correction and add nothing on two CPU processes.

`torchrun` sets WORLD_SIZE/RANK/LOCAL_RANK; a plain run is world 1 and never touches
torch.distributed. gloo on CPU, nccl on CUDA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init(device: torch.device) -> World:
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World(0, 1, device)
    rank = int(os.environ["RANK"])
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return World(rank, size, device)


def shutdown(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def all_sum(world: World, t: torch.Tensor) -> torch.Tensor:
    """Sum of a tensor over ranks (a copy on the world's device; the input is left as it was)."""
    t = t.detach().clone().to(world.device)
    if world.size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def sum_gradients(world: World, params: list[torch.nn.Parameter]) -> None:
    """Replace each parameter's gradient by its sum over ranks (missing gradients count as zeros)."""
    if world.size <= 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])  # one collective instead of one per tensor
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    at = 0
    for p in params:
        n = p.numel()
        p.grad = flat[at : at + n].view_as(p).clone()
        at += n


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()
