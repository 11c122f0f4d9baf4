"""spgate.torch.GroupDecider: one decision per (TP group, step), identical on every rank,
broadcast over the group's own torch.distributed process group (docs/design.md §4).

This is the C++ GroupDecider (worker/client/group_decider.h) with a torch.distributed
broadcast plugged in, so the semantics are the same code: the leader (rank 0 of the group)
asks its Client - the daemon's answer, or past the deadline the fail-static local one -
and broadcasts the 24-byte DecisionWire before the batch's first collective; the other
ranks only receive. A leader that cannot decide broadcasts the failure's status code, so
every rank raises the same spgate.Error instead of one rank waiting alone in the
broadcast. On gloo the 24 bytes travel in a CPU tensor, on NCCL in a device tensor on the
current CUDA device. The GIL is released while the leader waits.

Invariant: decide(step) is a collective - every rank of the group calls it for every
step, in the same order.

Usage:
    launch = spgate.torch.agree_on_launch()          # every rank, once (launch.py)
    client = spgate.Client(controller=addr, job_id="llama", incarnation=launch.incarnation,
                           launch_credential=launch.launch_credential, group=g,
                           rank_in_group=r, group_size=t, global_rank=dist.get_rank())
    decider = spgate.torch.GroupDecider(client, tp_group)
    decider.submit_plan(step + 1, next_lengths)      # leader only; no-op elsewhere
    d = decider.decide(step)                         # every rank
    y = block(x, PackedBatch.make(lengths, tp, d.mode))
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist

import spgate

WIRE_BYTES = 24


def _global_rank(group, group_rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return group_rank
    fn = getattr(dist, "get_global_rank", None)
    if fn is None:  # torch < 1.13
        fn = dist.distributed_c10d._get_global_rank
    return fn(group, group_rank)


def _error(cls, code: int, code_name: str, message: str):
    e = cls(message)
    e.code, e.code_name, e.message = code, code_name, message
    return e


def _invalid(message: str):
    return _error(spgate.InvalidArgumentError, 3, "INVALID_ARGUMENT", message)


def _make_broadcast(group, device: torch.device):
    def broadcast(buf: bytearray, root: int) -> None:
        # Called by the C++ decider on the calling thread, with the GIL held.
        host = torch.frombuffer(buf, dtype=torch.uint8)  # shares buf's memory
        src = _global_rank(group, root)
        if device.type == "cpu":
            dist.broadcast(host, src=src, group=group)
            return
        dev = host.to(device)
        dist.broadcast(dev, src=src, group=group)
        host.copy_(dev.cpu())
    return broadcast


class GroupDecider:
    """See the module docstring. `client` is required on the group's rank 0 (its
    rank_in_group must be 0) and optional elsewhere (every rank still reports its own
    telemetry through its own Client)."""

    def __init__(self, client: Optional["spgate.Client"], process_group=None,
                 device: Optional[torch.device] = None):
        if not dist.is_initialized():
            raise _error(spgate.FailedPreconditionError, 9, "FAILED_PRECONDITION",
                         "process_group: torch.distributed is not initialised")
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.size = dist.get_world_size(process_group)
        if self.rank < 0:
            raise _invalid(
                "process_group: this process is not a member of the group")
        if client is not None and client.rank_in_group != self.rank:
            raise _invalid(
                "client: created for rank_in_group %d but this process is rank %d of the "
                "process group" % (client.rank_in_group, self.rank))
        if client is not None and client.group_size != self.size:
            raise _invalid(
                "client: created for group_size %d but the process group has %d ranks"
                % (client.group_size, self.size))
        self._root = _global_rank(process_group, 0)
        backend = str(dist.get_backend(process_group))
        if device is None:
            device = (torch.device("cuda", torch.cuda.current_device())
                      if backend == "nccl" else torch.device("cpu"))
        self.device = torch.device(device)
        self.client = client
        # The callback holds the group and device, not self: no reference cycle through
        # the native object (which the garbage collector cannot see into).
        self._native = spgate.GroupDecider(client, self.rank,
                                           _make_broadcast(process_group, self.device))

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def submit_plan(self, step_or_plan, lengths: Optional[Sequence[int]] = None, **memory):
        """Leader: Client.submit_plan (a BatchPlan, or step, lengths and the memory
        keywords). Other ranks: nothing to do."""
        if not self.is_leader:
            return
        if isinstance(step_or_plan, spgate.BatchPlan):
            self._native.submit_plan(step_or_plan)
        else:
            self._native.submit_plan(int(step_or_plan), list(lengths), **memory)

    def decide(self, step: int, timeout: Optional[float] = None) -> "spgate.GateDecision":
        """Collective. The leader waits for the daemon at most `timeout` seconds (default:
        the client's decision_deadline); the others wait for the leader."""
        return self._native.decide(step, timeout)
