"""Data-parallel training on several devices, started with torch's own launcher
(`torchrun --nproc_per_node 4 --no-python evoenv learner --resume`). Rank 0 is the whole
learner; every other rank only trains its share of each batch (see `DataParallel`). Without
the launcher's variables (WORLD_SIZE unset or 1) nothing here is used.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog
import torch
import torch.distributed as dist

log = structlog.get_logger(__name__)

BUCKET_ELEMENTS = 1 << 24
"""Gradients are all-reduced in flat buckets of about this many elements (64 MiB in fp32)."""


@dataclass(frozen=True, slots=True)
class DataParallel:
    """This process's place in a data-parallel group started by torchrun.

    Rank 0 is the learner exactly as in one process: orchestrator, consumer, weight pushes,
    checkpoints, evaluation. Every other rank only trains: it holds a replica of the policy and
    carries out rank 0's commands (train on these groups, load this checkpoint, stop). In a
    step every rank builds the same sequences from the same groups, runs its share of the
    micro-batches (round robin, `mine`), and the gradients are summed across ranks before
    clipping and the optimiser step, which every rank then takes on equal gradients: the
    replicas stay equal without weights ever being sent. The loss is normalised by the whole
    batch's token count on every rank, so a step equals the one-process step up to the order
    of floating-point sums.

    Gradients are summed with plain all-reduces after the backward passes (`sum_gradients`)
    rather than through DistributedDataParallel, whose per-backward hooks would deadlock when
    ranks run different numbers of micro-batches (a batch rarely divides evenly).

    Backend: NCCL with one GPU per rank (`cuda:LOCAL_RANK`), gloo on CPUs.
    """

    rank: int
    world: int
    local_rank: int

    @classmethod
    def from_env(cls, *, timeout_s: float = 3600.0) -> DataParallel | None:
        """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK,
        MASTER_ADDR, MASTER_PORT); None when there is none (one process). The timeout bounds how
        long a follower waits for rank 0's next command: an hour covers the longest step."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        if not dist.is_initialized():
            cuda = torch.cuda.is_available()
            if cuda:
                torch.cuda.set_device(local_rank)
            dist.init_process_group(
                "nccl" if cuda else "gloo",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=timeout_s),
            )
        log.info("data_parallel_joined", rank=rank, world=world, local_rank=local_rank)
        return cls(rank=rank, world=world, local_rank=local_rank)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def mine(self, count: int) -> range:
        """The indices (of `count` micro-batches) this rank runs."""
        return range(self.rank, count, self.world)

    def broadcast(self, value: Any = None) -> Any:
        """Rank 0's `value` on every rank (any picklable object)."""
        box = [value if self.leader else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def sum_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Replace every gradient with its sum over the ranks (a missing one counts as zero)."""
        grads = []
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grads.append(param.grad)
        for bucket in _buckets(grads, BUCKET_ELEMENTS):
            flat = torch.cat([grad.reshape(-1) for grad in bucket])
            dist.all_reduce(flat)
            offset = 0
            for grad in bucket:
                grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """`values` summed elementwise over the ranks."""
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return [float(v) for v in tensor.tolist()]


def _buckets(grads: Sequence[torch.Tensor], size: int) -> Iterable[list[torch.Tensor]]:
    """Consecutive runs of same-dtype gradients of about `size` elements each."""
    bucket: list[torch.Tensor] = []
    count = 0
    for grad in grads:
        if bucket and (count + grad.numel() > size or grad.dtype != bucket[0].dtype):
            yield bucket
            bucket, count = [], 0
        bucket.append(grad)
        count += grad.numel()
    if bucket:
        yield bucket


def follow(settings: Any, parallel: DataParallel) -> None:
    """A rank other than 0: build the replica from the folder rank 0 prepared, then carry out
    its commands until it says stop (`Trainer.follow`)."""
    from evoenv_learner.trainer import Trainer

    model_path = parallel.broadcast()
    trainer = Trainer(model_path, settings.grpo, device=parallel.device, parallel=parallel)
    trainer.follow()
    dist.destroy_process_group()
