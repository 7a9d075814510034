"""Sharded data-parallel training (torch's FSDP2) on several devices, started with torchrun
(`torchrun --nproc_per_node 4 --no-python evoenv learner --resume`, or `learner.ranks` under
`evoenv up`). Rank 0 is the whole learner; every other rank only trains its share of each batch
(see `DataParallel`). Without the launcher's variables (WORLD_SIZE unset or 1) nothing here is used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog
import torch
import torch.distributed as dist

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class DataParallel:
    """This process's place in a sharded data-parallel group started by torchrun.

    Rank 0 is the learner exactly as in one process: orchestrator, consumer, weight pushes,
    checkpoints, evaluation. Every other rank only trains: it carries out rank 0's commands
    (train on these groups, write or load a checkpoint, gather the weights, stop). Parameters,
    gradients and AdamW's state are sharded across the ranks with FSDP2 (`shard`): each rank
    holds 1/world of each, and gathers a layer's weights only while it runs it. In a step every
    rank builds the same sequences from the same groups and runs its share of the micro-batches
    (round robin, `mine`), padded with empty ones so that every rank runs as many (FSDP2's
    collectives would wait forever otherwise); the gradients are summed across the ranks as
    the backward passes end (reduce-scatter), and each rank steps AdamW on its shard. The loss
    is normalised by the whole batch's token count on every rank, so a step equals the
    one-process step up to the order of floating-point sums.

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

    def shard(self, root: torch.nn.Module, blocks: Sequence[torch.nn.Module]) -> None:
        """Shard `root`'s parameters across the ranks (FSDP2's `fully_shard`): each of `blocks`
        (the decoder layers) is its own unit, gathered only while it runs; `root` holds the rest
        (embeddings, final norm, head). Gradients are summed across the ranks, not averaged,
        with plain sums on the wire (gloo has no pre-multiplied sum)."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        mesh = init_device_mesh(self.device.type, (self.world,))
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(root, mesh=mesh)
        for module in root.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)

    def rounds(self, count: int) -> int:
        """Micro-batches every rank runs when a batch has `count`: the largest share."""
        return -(-count // self.world)

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """`values` summed elementwise over the ranks."""
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return [float(v) for v in tensor.tolist()]


def follow(settings: Any, parallel: DataParallel) -> None:
    """A rank other than 0: load the model from the folder rank 0 prepared and take its shard,
    then carry out rank 0's commands until it says stop (`Trainer.follow`)."""
    from evoenv_learner.trainer import Trainer

    model_path = parallel.broadcast()
    trainer = Trainer(model_path, settings.grpo, device=parallel.device, parallel=parallel)
    trainer.follow()
    dist.destroy_process_group()
