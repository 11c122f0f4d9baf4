"""spgate.torch.pipeline: pipeline stages over torch.distributed (docs/design.md §12), the
PyTorch twin of the reference worker's (worker/runtime/pipeline.h): the job's grid of TP
groups, stages and replicas; each step's micro-batch lengths shared with every stage; a
decision per (TP group, micro-batch) from the C++ client; the stage-boundary p2p with
exact sizes; and the 1F1B schedule in the order the schedule-aware memory gate assumed.

The boundary contract: what crosses a stage boundary, forward and backward, is the
micro-batch's sequence-sharded rows in both modes - the micro-batch padded to a multiple
of t, TP rank r sending and receiving rows [r*rows, (r+1)*rows) with rows = ceil(tokens/t)
(boundary_rows) - so no p2p shape depends on a mode and each stage's TP group decides on
its own. A stage that runs a micro-batch TP-only all-gathers its input rows at entry
(stage_input) and keeps its own rows of its replicated output at exit (stage_output);
backward mirrors both. StageLink checks every received message's size against the one its
receiver expects before taking it, and raises StageBoundaryError naming both instead of
waiting forever (NCCL would hang there; gloo could truncate).

The p2p is gloo's (CPU tensors, with tags); the decisions also run over NCCL (their
broadcast is spgate.torch.GroupDecider's).

Ranks: world = dp x pp x tp, rank = (dp_index * pp + stage) * tp + tp_rank, the TP group of
(dp_index, stage) is group (dp_index * pp + stage): spgate-worker's grid, and the layout's
group index (spgate.StageCoordinates.group).

Lengths for every stage: only the first stage loads data. PipelineDecider.share_lengths is
a broadcast over the replica's pipeline group (its pp x tp ranks) from the replica's first
stage's leader, before the step's plans are submitted, as spgate-worker does over MPI. A
micro-batch whose lengths the loader does not have yet travels as unknown; the stage then
plans it without lengths, and the C++ client decides it SP with reason LENGTHS_UNKNOWN
(policy/step_plan.h; nothing of the policy is written here).

Usage (every rank; the stage's leader has a Client with the layout):
    grid = PipelineGrid(tp=2, pp=2, microbatches=4)
    client = spgate.Client(job_id="j", group=grid.group, rank_in_group=0, group_size=2,
                           layout=grid.layout(), coordinates=grid.coordinates(), ...) \\
        if grid.tp_rank == 0 else None
    decider = PipelineDecider(client, grid)
    lengths = decider.share_lengths(n, my_lengths if grid.is_data_leader else None)
    decider.submit_plan(n, lengths, memory=[...], resident_bytes=r)   # leader only
    d = decider.decide(n)                         # d.microbatches[i].mode on every rank
    link = StageLink(grid.prev_rank, grid.next_rank)
    losses = run_1f1b(link, grid.schedule(), grid.is_first, grid.is_last, forward_fn,
                      lambda i: (boundary_rows(lengths[i], grid.tp), hidden))
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

import spgate
from spgate.torch.group_decider import GroupDecider
from spgate.torch.parallel import _integer_lengths

__all__ = ["PipelineGrid", "PipelineDecider", "StageLink", "StageBoundaryError", "FORWARD",
           "BACKWARD", "boundary_rows", "stage_input", "stage_output", "run_1f1b"]

FORWARD, BACKWARD = 0, 1
_HEADER = 4  # int64: micro-batch, direction, rows, columns


def boundary_rows(lengths: Sequence[int], tp: int) -> int:
    """Rows of one TP rank's boundary message for a micro-batch: its tokens padded to a
    multiple of t, divided by t (TransformerStack's BoundaryRows)."""
    tokens = sum(_integer_lengths(lengths))
    return (tokens + tp - 1) // tp


# ---------------------------------------------------------------------------------------
# The grid.

class PipelineGrid:
    """The job's process groups for tp x pp x dp ranks (world = tp * pp * dp, checked).
    Every rank creates every group, in the same order (torch.distributed's rule):
    tp_group (this rank's TP group), replica_group (this rank's replica: pp * tp ranks,
    which share each step's lengths), dp_group (the same (stage, tp_rank) in every
    replica: the data-parallel gradient mean)."""

    def __init__(self, tp: int, pp: int, microbatches: int = 1, schedule: str = "1f1b"):
        if not dist.is_initialized():
            raise RuntimeError("PipelineGrid: torch.distributed is not initialised")
        world = dist.get_world_size()
        if tp < 1 or pp < 1 or world % (tp * pp):
            raise ValueError("PipelineGrid: world size %d is not a multiple of tp * pp = %d * %d"
                             % (world, tp, pp))
        self.tp, self.pp, self.dp = tp, pp, world // (tp * pp)
        self.microbatches, self.schedule_name = microbatches, schedule
        self.rank = dist.get_rank()
        self.tp_rank = self.rank % tp
        self.stage = (self.rank // tp) % pp
        self.dp_index = self.rank // (tp * pp)
        self.group = self.dp_index * pp + self.stage  # the TP group's index
        self.prev_rank = self.rank - tp if self.stage > 0 else -1
        self.next_rank = self.rank + tp if self.stage + 1 < pp else -1
        self.data_leader = self.dp_index * pp * tp  # the replica's first stage's leader
        self.tp_group = self.replica_group = self.dp_group = None
        for g in range(self.dp * pp):
            pg = dist.new_group(list(range(g * tp, (g + 1) * tp)))
            if g == self.group:
                self.tp_group = pg
        for r in range(self.dp):
            pg = dist.new_group(list(range(r * pp * tp, (r + 1) * pp * tp)))
            if r == self.dp_index:
                self.replica_group = pg
        for s in range(pp):
            for t in range(tp):
                pg = dist.new_group([(r * pp + s) * tp + t for r in range(self.dp)])
                if (s, t) == (self.stage, self.tp_rank):
                    self.dp_group = pg

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.pp - 1

    @property
    def is_data_leader(self) -> bool:
        return self.rank == self.data_leader

    def layout(self) -> "spgate.JobLayout":
        return spgate.JobLayout(tp=self.tp, pp=self.pp, dp=self.dp,
                                microbatches=self.microbatches, schedule=self.schedule_name)

    def coordinates(self) -> "spgate.StageCoordinates":
        return spgate.StageCoordinates(dp_index=self.dp_index, stage=self.stage)

    def schedule(self) -> List[Tuple[bool, int, int]]:
        """This stage's (forward, micro-batch, chunk) in order: the C++ StageSchedule."""
        return spgate.stage_schedule(self.layout(), self.stage)


# ---------------------------------------------------------------------------------------
# Decisions.

class PipelineDecider:
    """A decision per (TP group, micro-batch), the same on every rank of the group: the
    C++ GroupDecider's Decide over the TP group (spgate.torch.GroupDecider),
    with the step's lengths shared over the replica first. `client`: the stage leader's
    spgate.Client created with layout=grid.layout() and coordinates=grid.coordinates()
    (None on the other ranks of a group session). Construction is a collective over the
    TP group."""

    def __init__(self, client: Optional["spgate.Client"], grid: PipelineGrid,
                 device: Optional[torch.device] = None):
        self.grid = grid
        self.decider = GroupDecider(client, grid.tp_group, device=device)

    @property
    def is_leader(self) -> bool:
        return self.decider.is_leader

    @property
    def client(self) -> Optional["spgate.Client"]:
        """This rank's Client (the stage leader's; None elsewhere in a group session)."""
        return self.decider.client

    def close(self, flush_timeout: float = 5.0) -> bool:
        """GroupDecider.close: this rank's Client, if any, flushed and closed."""
        return self.decider.close(flush_timeout)

    def share_lengths(self, step: int, lengths: Optional[Sequence[Optional[Sequence[int]]]]
                      ) -> List[Optional[List[int]]]:
        """Collective over the replica (every rank of it, every step, in order): the
        step's micro-batch lengths from the replica's first stage's leader, which passes a
        list of `microbatches` lists (None for one its loader does not have yet); the other
        ranks pass None. Returns them on every rank, None for an unknown one."""
        m = self.grid.microbatches
        src = self.grid.data_leader
        counts = torch.full((m + 1,), -1, dtype=torch.int64)
        flat: List[int] = []
        if self.grid.rank == src:
            if lengths is None or len(lengths) != m:
                raise ValueError("share_lengths: the data leader passes %d micro-batches' "
                                 "lengths, got %r" % (m, None if lengths is None else len(lengths)))
            for i, ls in enumerate(lengths):
                if ls is not None:
                    counts[i] = len(ls)
                    flat.extend(_integer_lengths(ls, "lengths[%d]" % i))
            counts[m] = step  # so a replica out of step is caught, not mixed up
        dist.broadcast(counts, src=src, group=self.grid.replica_group)
        if int(counts[m]) != step:
            raise RuntimeError("share_lengths: step %d here, but the data leader shared step %d"
                               % (step, int(counts[m])))
        total = int(counts[:m].clamp(min=0).sum())
        buf = torch.tensor(flat, dtype=torch.int64) if self.grid.rank == src else \
            torch.empty(total, dtype=torch.int64)
        if total:
            dist.broadcast(buf, src=src, group=self.grid.replica_group)
        out: List[Optional[List[int]]] = []
        at = 0
        for i in range(m):
            c = int(counts[i])
            if c < 0:
                out.append(None)
                continue
            out.append([int(n) for n in buf[at:at + c]])
            at += c
        return out

    def submit_plan(self, step: int, lengths: Sequence[Optional[Sequence[int]]],
                    memory: Optional[Sequence[Dict[str, int]]] = None,
                    resident_bytes: int = 0, memory_budget_bytes: int = 0) -> None:
        """Leader: the stage's step plan - micro-batch i with lengths[i] (None or empty:
        unknown here, decided SP with LENGTHS_UNKNOWN) and memory[i] (activation_sp,
        activation_tp, workspace_sp, workspace_tp: this stage's bytes) - and the stage's
        resident bytes. Other ranks: nothing to do."""
        if not self.is_leader:
            return
        mbs = []
        for i, ls in enumerate(lengths):
            mem = dict(memory[i]) if memory is not None else {}
            mbs.append(spgate.MicrobatchPlan(i, list(ls or []), **mem))
        self.decider.submit_plan(spgate.BatchPlan(step, microbatches=mbs,
                                                  resident_bytes=resident_bytes,
                                                  memory_budget_bytes=memory_budget_bytes))

    def decide(self, step: int, timeout: Optional[float] = None) -> "spgate.GateDecision":
        """Collective over the TP group: step `step`'s decision, with one per micro-batch
        in .microbatches (by id), identical on every rank, errors included."""
        return self.decider.decide_microbatches(step, self.grid.microbatches, timeout)

    def report_telemetry(self, telemetry=None, **fields) -> None:
        self.decider.report_telemetry(telemetry, **fields)


# ---------------------------------------------------------------------------------------
# The stage boundary.

class StageBoundaryError(RuntimeError):
    """A boundary message whose size is not the one its receiver expected: the stages
    disagree on a micro-batch's shape."""


class StageLink:
    """The p2p of one rank with the same TP rank of the previous and next stage (world
    ranks; -1 for none). Every message is a fixed 4-int64 header (micro-batch, direction,
    rows, columns) and then the payload, on tags of their own per (micro-batch,
    direction). send never blocks (isend, completed by finish); recv reads the header
    first and, when the payload's shape is not the expected one, still takes it (so the
    sender is not left waiting) and raises StageBoundaryError naming both shapes."""

    def __init__(self, prev_rank: int, next_rank: int, group=None):
        self.prev_rank, self.next_rank, self.group = prev_rank, next_rank, group
        self._pending: List = []
        self._keep: List[torch.Tensor] = []
        self.size_mismatches = 0
        self.messages = 0
        self.bytes_sent = 0
        self.wait_s = 0.0

    @staticmethod
    def _tags(direction: int, microbatch: int) -> Tuple[int, int]:
        base = 4 * microbatch + 2 * direction
        return base, base + 1

    def _peer(self, direction: int, sending: bool) -> int:
        peer = self.next_rank if (direction == FORWARD) == sending else self.prev_rank
        if peer < 0:
            raise StageBoundaryError("stage link: no %s stage to %s" % (
                "next" if (direction == FORWARD) == sending else "previous",
                "send to" if sending else "receive from"))
        return peer

    def send(self, direction: int, microbatch: int, tensor: torch.Tensor) -> None:
        """Forward: to the next stage; backward: to the previous one."""
        peer = self._peer(direction, sending=True)
        data = tensor.detach().contiguous()
        if data.dim() != 2:
            raise ValueError("stage link: a boundary message is [rows, hidden], got %s"
                             % (tuple(data.shape),))
        header = torch.tensor([microbatch, direction, data.shape[0], data.shape[1]],
                              dtype=torch.int64)
        th, tp = self._tags(direction, microbatch)
        self._pending.append(dist.isend(header, peer, group=self.group, tag=th))
        self._pending.append(dist.isend(data, peer, group=self.group, tag=tp))
        self._keep += [header, data]
        self.messages += 1
        self.bytes_sent += data.numel() * data.element_size()

    def recv(self, direction: int, microbatch: int, shape: Tuple[int, int],
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Forward: from the previous stage; backward: from the next one. The payload must
        be exactly `shape` (rows, hidden)."""
        peer = self._peer(direction, sending=False)
        th, tp = self._tags(direction, microbatch)
        t0 = time.perf_counter()
        header = torch.empty(_HEADER, dtype=torch.int64)
        dist.recv(header, peer, group=self.group, tag=th)
        mb, d, rows, cols = (int(v) for v in header)
        got = (rows, cols)
        data = torch.empty(got, dtype=dtype)
        dist.recv(data, peer, group=self.group, tag=tp)  # taken whatever its size
        self.wait_s += time.perf_counter() - t0
        what = "activation" if direction == FORWARD else "gradient"
        if (mb, d) != (microbatch, direction):
            self.size_mismatches += 1
            raise StageBoundaryError(
                "stage boundary: expected micro-batch %d's %s from world rank %d, got the "
                "header of micro-batch %d direction %d" % (microbatch, what, peer, mb, d))
        want = (int(shape[0]), int(shape[1]))
        if got != want:
            self.size_mismatches += 1
            raise StageBoundaryError(
                "stage boundary: micro-batch %d's %s message from world rank %d has %d x %d "
                "= %d floats, this stage expected %d x %d = %d (the stages disagree on its "
                "shape; NCCL would hang here)" % (microbatch, what, peer, rows, cols,
                                                  rows * cols, want[0], want[1],
                                                  want[0] * want[1]))
        return data

    def finish(self) -> None:
        """Waits for every send of the step."""
        t0 = time.perf_counter()
        for work in self._pending:
            work.wait()
        self.wait_s += time.perf_counter() - t0
        self._pending.clear()
        self._keep.clear()


def _own_rows(x: torch.Tensor, rows: int, tp) -> torch.Tensor:
    """This rank's rows [r*rows, (r+1)*rows) of x padded with zeros to t*rows rows."""
    padded = rows * tp.size
    if x.shape[0] < padded:
        x = torch.cat([x, x.new_zeros((padded - x.shape[0],) + tuple(x.shape[1:]))])
    return x[tp.rank * rows:(tp.rank + 1) * rows]


def _gather_rows(x: torch.Tensor, tp) -> torch.Tensor:
    """All TP ranks' [rows, ...] in rank order (untimed: a boundary collective, not a
    layer's, like CollectivePurpose::kStageBoundary in the C++ worker)."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x, group=tp.group)
    return torch.cat(parts)


class _EnterTpOnly(torch.autograd.Function):
    """TP-only entry: boundary rows -> the whole micro-batch on every rank (all-gather,
    the real tokens kept). Backward: the full gradient is replicated over the group, so
    each rank's boundary gradient is its own rows of it (not a reduce-scatter, which
    would add t equal copies)."""

    @staticmethod
    def forward(ctx, x, tp, tokens: int):
        ctx.tp, ctx.rows = tp, x.shape[0]
        return _gather_rows(x, tp)[:tokens]

    @staticmethod
    def backward(ctx, grad):
        return _own_rows(grad, ctx.rows, ctx.tp).contiguous(), None, None


class _ExitTpOnly(torch.autograd.Function):
    """TP-only exit: the replicated whole micro-batch -> this rank's boundary rows.
    Backward: every rank needs the whole gradient (TP-only's residual stream is
    replicated), so the ranks' boundary gradients are all-gathered."""

    @staticmethod
    def forward(ctx, y, tp, rows: int):
        ctx.tp, ctx.tokens = tp, y.shape[0]
        return _own_rows(y, rows, tp).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather_rows(grad, ctx.tp)[:ctx.tokens], None, None


def stage_input(x: torch.Tensor, batch, tp) -> torch.Tensor:
    """A received boundary message (this rank's boundary rows) as the stage's input for
    `batch` (a spgate.torch.parallel.PackedBatch in its decided mode): SP - the rows
    themselves, which are SP's own shard; TP-only - the whole micro-batch, all-gathered."""
    rows = (batch.tokens + tp.size - 1) // tp.size
    if x.shape[0] != rows:
        raise StageBoundaryError("stage_input: %d rows, the boundary of %d tokens over %d "
                                 "ranks has %d" % (x.shape[0], batch.tokens, tp.size, rows))
    if batch.sequence_parallel or tp.size == 1:
        return x
    return _EnterTpOnly.apply(x, tp, batch.tokens)


def stage_output(y: torch.Tensor, batch, tp) -> torch.Tensor:
    """The stage's output for `batch` as the boundary message this rank sends: SP - its
    shard as it is; TP-only - its own rows of the replicated whole micro-batch."""
    rows = (batch.tokens + tp.size - 1) // tp.size
    if batch.sequence_parallel or tp.size == 1:
        if y.shape[0] != rows:
            raise StageBoundaryError("stage_output: %d rows under SP, the boundary has %d"
                                     % (y.shape[0], rows))
        return y
    return _ExitTpOnly.apply(y, tp, rows)


# ---------------------------------------------------------------------------------------
# The schedule.

def run_1f1b(link: StageLink, ops: Sequence[Tuple[bool, int, int]], first: bool, last: bool,
             forward_fn: Callable[[int, Optional[torch.Tensor]], torch.Tensor],
             boundary_shape: Callable[[int], Tuple[int, int]],
             times: Optional[Dict[int, Dict[str, float]]] = None,
             timer=None) -> Dict[int, torch.Tensor]:
    """One optimizer step of a stage: `ops` (PipelineGrid.schedule(): warm-up forwards,
    one forward and one backward in turn, the remaining backwards) in order, each
    micro-batch's activations held from its forward to its backward.

    forward_fn(i, x) runs micro-batch i's forward on this stage: x is the received
    boundary rows (requires grad; None on the first stage) and it returns the boundary
    rows to send (stage_output), or on the last stage the loss to backpropagate.
    boundary_shape(i) is micro-batch i's (rows, hidden) at this stage's boundaries.
    Gradients accumulate in the stage's parameters. Returns the last stage's losses by
    micro-batch (detached; {} elsewhere). Sends are completed before it returns.

    `times` (a dict): filled with each micro-batch's compute on this stage, what its step
    telemetry reports (spgate.MicrobatchTelemetry): times[i] = {"forward_s", "backward_s",
    "reduce_scatter", "all_gather"} - the wall time of its forward_fn and of its backward,
    receives excluded, and of those the time in the collectives `timer` (a
    spgate.torch.parallel.CollectiveTimer) counted."""
    held: Dict[int, Tuple[Optional[torch.Tensor], torch.Tensor]] = {}
    losses: Dict[int, torch.Tensor] = {}

    def collectives():
        if timer is None:
            return 0.0, 0.0
        t = timer.totals()
        return t["reduce_scatter"], t["all_gather"]

    def account(i, key, start, before):
        if times is None:
            return
        after = collectives()
        entry = times.setdefault(i, {"forward_s": 0.0, "backward_s": 0.0,
                                     "reduce_scatter": 0.0, "all_gather": 0.0})
        entry[key] += time.perf_counter() - start
        entry["reduce_scatter"] += after[0] - before[0]
        entry["all_gather"] += after[1] - before[1]

    # No finish on an error: a send may wait for a receive its peer will never post (the
    # job ends with the error, as spgate-worker's does).
    for forward, i, chunk in ops:
        if chunk != 0:
            raise NotImplementedError("run_1f1b: one model chunk per stage (vp = 1)")
        if forward:
            x = None
            if not first:
                x = link.recv(FORWARD, i, boundary_shape(i)).requires_grad_(True)
            start, before = time.perf_counter(), collectives()
            out = forward_fn(i, x)
            account(i, "forward_s", start, before)
            if last:
                losses[i] = out.detach()
            else:
                link.send(FORWARD, i, out)
            held[i] = (x, out)
        else:
            if i not in held:
                raise RuntimeError("run_1f1b: micro-batch %d's backward before its forward" % i)
            x, out = held.pop(i)
            grad = None if last else link.recv(BACKWARD, i, boundary_shape(i))
            start, before = time.perf_counter(), collectives()
            if last:
                out.backward()
            else:
                torch.autograd.backward(out, grad)
            account(i, "backward_s", start, before)
            if not first:
                link.send(BACKWARD, i, x.grad)
    link.finish()
    return losses
