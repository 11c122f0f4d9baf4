"""spgate.torch.GroupDecider: one decision per (TP group, step), identical on every rank,
broadcast over the group's own torch.distributed process group (docs/design.md §4).

This is the C++ GroupDecider (worker/client/group_decider.h) with a torch.distributed
broadcast plugged in, so the semantics are the same code: the leader (rank 0 of the group)
asks its Client - the daemon's answer, or past the deadline the fail-static local one -
and broadcasts it before the batch's first collective, in one broadcast: the 24-byte
DecisionWire, and for a step plan one more byte per micro-batch; the other ranks only
receive. A leader that cannot decide broadcasts the failure's status code, so every rank
raises the same spgate.Error instead of one rank waiting alone in the broadcast. On gloo
the bytes travel in a CPU tensor, on NCCL in a device tensor on the current CUDA device.
The GIL is released while the leader waits.

One session per TP group (the Client option group_session, the default): only the
leader has a Client, and every rank gives its own step telemetry to report_telemetry,
which takes the element-wise maximum of the group's records (a float64 tensor of 15,
dist.all_reduce with MAX over the group; on NCCL a device tensor, like the broadcast) into
the leader, which sends one record per step for the group, with the slowest rank and the
rank of the highest peak memory. With group_session=False every rank has a Client and a
session of its own, and report_telemetry sends the rank's own record through it.

Invariant: decide(step) and, in a group session, report_telemetry(...) are collectives -
every rank of the group calls them for every step, in the same order. So is the
construction: one all-reduce tells every rank whether the leader's Client holds the
group's session and whether any rank refused its arguments, so that a refusal raises on
every rank of the group (after the collective, never before it on one rank alone).

Usage:
    launch = spgate.torch.agree_on_launch()          # every rank, once (launch.py)
    client = None                                    # followers: no client
    if r == 0:
        client = spgate.Client(controller=addr, job_id="llama",
                               incarnation=launch.incarnation,
                               launch_credential=launch.launch_credential, group=g,
                               rank_in_group=0, group_size=t, global_rank=dist.get_rank())
    decider = spgate.torch.GroupDecider(client, tp_group)
    decider.submit_plan(step + 1, next_lengths)      # leader only; no-op elsewhere
    d = decider.decide(step)                         # every rank
    y = block(x, PackedBatch.make(lengths, tp, d.mode))
    decider.report_telemetry(step=step, mode=d.mode, reason=d.reason,
                             step_time_s=t_step, rs_wait_s=t_rs, ...)   # every rank

Per-rank sessions: every rank creates its Client with group_session=False (and its own
rank_in_group) and passes it; report_telemetry then needs no collective.
"""
from __future__ import annotations

import operator
from typing import Optional, Sequence

import torch
import torch.distributed as dist

import spgate

WIRE_BYTES = 24
TELEMETRY_WIRE_DOUBLES = 16  # the in-group telemetry payload: 128 bytes
MICROBATCH_TELEMETRY_DOUBLES = 8  # and a step plan's, per micro-batch
# Then the ranks' busy times: one per rank, and one per rank per micro-batch while
# micro-batches x ranks is at most this (the group's straggler delays, docs/design.md §2).
MAX_STRAGGLER_BUSY_VALUES = 4096


def _telemetry_doubles(microbatches: int, ranks: int) -> int:
    busy = ranks + (microbatches * ranks
                    if microbatches * ranks <= MAX_STRAGGLER_BUSY_VALUES else 0)
    return TELEMETRY_WIRE_DOUBLES + MICROBATCH_TELEMETRY_DOUBLES * microbatches + busy


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


def _error_for_code(code: int, code_name: str, message: str):
    """The spgate.Error subclass the native module raises for `code` (spgate_module.cc),
    for an error that crossed a collective as (code, code_name, message)."""
    cls = {3: spgate.InvalidArgumentError, 4: spgate.DeadlineExceededError,
           9: spgate.FailedPreconditionError, 14: spgate.UnavailableError}.get(code, spgate.Error)
    return _error(cls, code, code_name, message)


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


def _make_reduce(group, device: torch.device):
    ranks = dist.get_world_size(group)

    def reduce(buf: bytearray, root: int) -> None:
        # Called by the C++ decider on the calling thread, with the GIL held. An all-reduce
        # (every rank ends with the maximum; only the root's is read).
        # _telemetry_doubles(micro-batches, ranks) values; shares buf's memory.
        host = torch.frombuffer(buf, dtype=torch.float64)
        n = host.numel()
        # The micro-batch count, with and without their busy slots (past the bound).
        rest = n - TELEMETRY_WIRE_DOUBLES - ranks
        counts = (rest // (MICROBATCH_TELEMETRY_DOUBLES + ranks),
                  rest // MICROBATCH_TELEMETRY_DOUBLES)
        if rest < 0 or not any(_telemetry_doubles(m, ranks) == n for m in counts):
            raise ValueError(
                "reduce: expected %d doubles, %d per micro-batch and the %d ranks' busy "
                "times, got %d" % (TELEMETRY_WIRE_DOUBLES, MICROBATCH_TELEMETRY_DOUBLES,
                                   ranks, n))
        if device.type == "cpu":
            dist.all_reduce(host, op=dist.ReduceOp.MAX, group=group)
            return
        dev = host.to(device)
        dist.all_reduce(dev, op=dist.ReduceOp.MAX, group=group)
        host.copy_(dev.cpu())
    return reduce


def _agree(values, group, device: torch.device):
    """The element-wise maximum of every rank's `values` (floats), on every rank."""
    t = torch.tensor(values, dtype=torch.float64)
    if device.type == "cpu":
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return t.tolist()
    dev = t.to(device)
    dist.all_reduce(dev, op=dist.ReduceOp.MAX, group=group)
    return dev.cpu().tolist()


def _check_client(client, rank: int, size: int) -> None:
    """This rank's own checks of its `client` (InvalidArgumentError naming it)."""
    if rank == 0 and (client is None or client.closed):
        raise _invalid("client: the group leader (rank 0) needs an open Client")
    if client is None:
        return
    if client.closed:
        raise _invalid("client: the Client is closed")
    if client.rank_in_group != rank:
        raise _invalid(
            "client: created for rank_in_group %d but this process is rank %d of the "
            "process group" % (client.rank_in_group, rank))
    if client.group_size != size:
        raise _invalid(
            "client: created for group_size %d but the process group has %d ranks"
            % (client.group_size, size))


class GroupDecider:
    """See the module docstring. `client` is required on the group's rank 0 (its
    rank_in_group must be 0). Elsewhere: None when the leader's Client holds the group's
    session (group_session, the default); with per-rank sessions (group_session=False on
    every rank) each rank's own Client, through which report_telemetry sends its records.
    Construction is a collective over the group."""

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
        self._root = _global_rank(process_group, 0)
        backend = str(dist.get_backend(process_group))
        if device is None:
            device = (torch.device("cuda", torch.cuda.current_device())
                      if backend == "nccl" else torch.device("cpu"))
        self.device = torch.device(device)
        self.client = client
        # The callbacks hold the group and device, not self: no reference cycle through
        # the native object (which the garbage collector cannot see into).
        broadcast = _make_broadcast(process_group, self.device)
        reduce = _make_reduce(process_group, self.device)
        # This rank's own checks, and the leader's native decider (it knows its session),
        # before the one collective; every rank raises after it if any rank refused.
        refused, own_session = None, None
        try:
            _check_client(client, self.rank, self.size)
            own_session = None if client is None else client.group_session
            if self.rank == 0:
                self._native = spgate.GroupDecider(client, 0, broadcast,
                                                   reduce if own_session else None,
                                                   group_size=self.size)
        except spgate.Error as e:
            refused = e
        # Every rank's: [the leader's group_session, 1 + the highest rank that refused, a
        # follower's Client with group_session, a follower's Client without].
        follower = self.rank != 0 and own_session is not None
        leader_session, refusing, follower_session, follower_own = _agree(
            [1.0 if self.rank == 0 and refused is None and own_session else 0.0,
             0.0 if refused is None else 1.0 + self.rank,
             1.0 if follower and own_session else 0.0,
             1.0 if follower and not own_session else 0.0], process_group, self.device)
        if refused is not None:
            try:
                raise refused
            finally:
                # The exception's traceback holds this frame: kept in a local too, it made a
                # cycle (frame, exception, traceback) that held the process group, the
                # client and the callbacks until the garbage collector ran, often not before
                # the interpreter's exit, where gloo's threads still running under a
                # finalizing interpreter abort the process.
                refused = None
        if refusing:
            raise _invalid("process_group: rank %d of the group refused its arguments (see "
                           "that rank's error); no rank of the group has a GroupDecider"
                           % (int(refusing) - 1))
        # Whether the group reduces its telemetry into the leader: the leader's Client says
        # (its group session), and every rank must agree, or report_telemetry would wait in
        # a reduction that some ranks never join.
        self.group_session = bool(leader_session)
        if follower_own if self.group_session else follower_session:
            raise _invalid(
                "client: a follower's Client has group_session=%s but the group's leader's "
                "Client has group_session=%s: every rank of a group sets the same"
                % (not self.group_session, self.group_session))
        if self.rank != 0:
            self._native = spgate.GroupDecider(client, self.rank, broadcast,
                                               reduce if self.group_session else None,
                                               group_size=self.size)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def close(self, flush_timeout: float = 5.0) -> bool:
        """At the end of training, on every rank (not a collective): this rank's Client, if
        it has one, sends what is queued - waiting at most flush_timeout seconds for the
        daemon's acknowledgements - and ends its session. True when everything was
        acknowledged (or there was nothing to send)."""
        if self.client is None or self.client.closed:
            return True
        try:
            self.client.flush(flush_timeout)
            flushed = True
        except spgate.Error:  # the daemon away, or the session taken over: nothing to wait for
            flushed = False
        self.client.close()
        return flushed

    def submit_plan(self, step_or_plan, lengths: Optional[Sequence[int]] = None, **memory):
        """Leader: Client.submit_plan (a BatchPlan, or step, lengths and the memory
        keywords). Other ranks: nothing to do."""
        if not self.is_leader:
            return
        if isinstance(step_or_plan, spgate.BatchPlan):
            self._native.submit_plan(step_or_plan)
        else:
            # A step of 1.5 is a bug, not step 1; the native call checks the lengths,
            # naming the element.
            try:
                step = operator.index(step_or_plan)
            except TypeError:
                raise TypeError("submit_plan: step must be an int or a spgate.BatchPlan, got %s"
                                % type(step_or_plan).__name__) from None
            self._native.submit_plan(step, list(lengths), **memory)

    def decide(self, step: int, timeout: Optional[float] = None) -> "spgate.GateDecision":
        """Collective. The leader waits for the daemon at most `timeout` seconds (default:
        the client's decision_deadline); the others wait for the leader."""
        return self._native.decide(step, timeout)

    def decide_microbatches(self, step: int, microbatches: int,
                            timeout: Optional[float] = None) -> "spgate.GateDecision":
        """Collective, for a step plan (a Client with a layout, docs/design.md §12): the
        step's decision with one per micro-batch in .microbatches, by id - the leader's,
        broadcast over the group in one broadcast (the head and one byte per micro-batch) -
        identical on every rank, errors included."""
        return self._native.decide_microbatches(step, microbatches, timeout)

    def report_telemetry(self, telemetry: Optional["spgate.StepTelemetry"] = None,
                         **fields) -> None:
        """This rank's own measurements of a step it ran: a spgate.StepTelemetry, or its
        fields as keywords (step, mode, reason, step_time_s, rs_wait_s, all_gather_s,
        norm_stall_s, effective_tokens, padding_tokens, peak_memory_bytes, microbatches,
        all_reduce_s: the time inside TP-only's all-reduces, which ADAPTIVE's straggler rule
        needs to see TP-only's stragglers, docs/design.md §11).

        After decide_microbatches (a step plan), every rank gives `microbatches`: one
        spgate.MicrobatchTelemetry per micro-batch id (its compute on this stage, p2p waits
        excluded), reduced in the same collective, which the daemon learns each stage
        from (docs/design.md §12); a rank without them is refused like any bad record.

        In a group session a collective (every rank, every step it reports, in the same
        order): the group's maximum reaches the leader, which sends one record for the
        group and feeds the group's reduce-scatter wait share to its fallback. A rank
        whose record is refused (InvalidArgumentError) still takes part, and the leader
        then sends nothing for the step. With per-rank sessions: the rank's own Client's
        report_telemetry (FailedPreconditionError on a rank without one)."""
        if telemetry is None:
            telemetry = spgate.StepTelemetry(**fields)
        elif fields:
            raise TypeError("report_telemetry: a StepTelemetry or keywords, not both")
        self._native.report_telemetry(telemetry)
