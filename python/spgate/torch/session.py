"""spgate.torch.connect (this module is spgate.torch.session): spgate in a PyTorch trainer with one call (docs/pytorch.md).

Every rank of the job calls it once, after init_process_group and after creating its
groups, and gets its TP group's decider - spgate.torch.GroupDecider, or with a pipeline
(pp_group, a spgate.torch.PipelineGrid) spgate.torch.PipelineDecider - with
submit_plan(step, lengths) (a no-op except on the leader), decide(step) and
report_telemetry(...) on every rank. In between it does what a trainer otherwise writes
by hand, in this order, each a collective every rank joins:

  1. agree on the launch (agree_on_launch over the world: rank 0's incarnation and
     credential on every rank);
  2. number the TP groups (the leaders' world ranks, gathered over the world) unless
     `group` or the grid gives the index;
  3. the TP group's leader (every rank with group_session=False) creates its
     spgate.Client and waits at most `connect_timeout` seconds for its session;
  4. every rank's outcome is gathered over the world: when any rank was refused, every
     rank of the job raises that spgate.Error (its own group's first, else the first
     one's naming the group) - after the gather, never before a collective its peers
     join, so no rank is left waiting in one (the hang spgate exists to prevent);
  5. the decider (its construction is a collective over the TP group).

A refusal is the daemon's answer to Register that retrying cannot change -
INVALID_ARGUMENT (a bad job id or option), PERMISSION_DENIED (a wrong worker token or
credential), UNAUTHENTICATED (none) - and raises as soon as the leader learns it; a launch
conflict (FAILED_PRECONDITION: another launch of the job still holds it) raises when it
still stands after `connect_timeout` (a launch that ended in the meantime hands over). A
daemon that does not answer at all is not a refusal: the leader says so once on stderr and
the decider decides locally (fail-static, reason CONTROLLER_UNAVAILABLE) until the
session opens.

Usage:
    dist.init_process_group("nccl")                   # env:// under torchrun or srun
    tp_group = ...                                    # this rank's TP group
    decider = spgate.torch.connect(controller="127.0.0.1:50061", job_id="llama-13b",
                                   tp_group=tp_group)  # every rank
    decider.submit_plan(n, lengths)                   # leader only; no-op elsewhere
    d = decider.decide(n)                             # every rank, the same answer
    decider.report_telemetry(step=n, mode=d.mode, reason=d.reason, step_time_s=t)
    decider.close()                                   # at the end (flushes telemetry)
"""
from __future__ import annotations

import re
import sys
import time
from typing import Optional, Union

import torch
import torch.distributed as dist

import spgate
from spgate.torch.group_decider import (GroupDecider, _error, _error_for_code, _global_rank,
                                        _invalid)
from spgate.torch.launch import LaunchIdentity, agree_on_launch

# Register refusals (the daemon's status codes) that no retry can change: raised at once.
_REFUSED_AT_ONCE = {"INVALID_ARGUMENT": 3, "PERMISSION_DENIED": 7, "UNAUTHENTICATED": 16}
# Another launch of the job holds it: raised when it still stands at the end of the wait.
_LAUNCH_CONFLICT = {"FAILED_PRECONDITION": 9}
_POLL_S = 0.05  # how often the leader looks at the client's last Register answer


def _refusal(last_error: str):
    """(code, code_name, message) of a refused Register in the client's last_error
    ("Register: CODE: message", gate_client_stream.cc), else None."""
    m = re.match(r"Register: ([A-Z_]+): (.*)", last_error, re.S)
    if not m:
        return None
    code = {**_REFUSED_AT_ONCE, **_LAUNCH_CONFLICT}.get(m.group(1))
    return None if code is None else (code, m.group(1), m.group(2))


def _wait_for_session(client: "spgate.Client", controller: str, job_id: str,
                      timeout: float) -> Optional[str]:
    """Waits at most `timeout` s for the client's session. None once it is open; the
    line to print when the daemon did not answer; raises spgate.Error for a refusal."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.wait_until_connected(max(0.0, min(_POLL_S, deadline - time.monotonic())))
            return None
        except spgate.DeadlineExceededError:
            pass
        last_error = client.stats().last_error
        refused = _refusal(last_error)
        expired = time.monotonic() >= deadline
        if refused and (refused[1] in _REFUSED_AT_ONCE or expired):
            code, code_name, message = refused
            raise _error_for_code(code, code_name, "spgated at %s refused job %s: %s: %s"
                                  % (controller, job_id, code_name, message))
        if expired:
            return ("spgate: spgated at %s did not answer job %s in %g s%s; deciding locally "
                    "(fail-static) until it does" % (controller, job_id, timeout,
                                                     " (%s)" % last_error if last_error else ""))


def _outcome(error: BaseException):
    if isinstance(error, spgate.Error):
        return ("error", error.code, error.code_name, str(error))
    return ("type_error", 3, "INVALID_ARGUMENT", str(error))  # e.g. a keyword Client lacks


def _group_index(tp_group, world_group) -> int:
    """This TP group's index: its leader's place among every group's leader (world ranks)."""
    leaders = [None] * dist.get_world_size(world_group)
    dist.all_gather_object(leaders, _global_rank(tp_group, 0), group=world_group)
    return sorted(set(leaders)).index(_global_rank(tp_group, 0))


def _raise_agreed(outcomes, my_group: int) -> None:
    """Every rank: raises the refusal of its own TP group, else the first one of any."""
    refused = [(g, r, o) for r, (g, o) in enumerate(outcomes) if o is not None and o[0] != "ok"]
    if not refused:
        return
    mine = [x for x in refused if x[0] == my_group]
    g, r, (kind, code, code_name, message) = (mine or refused)[0]
    if not mine:
        message = "TP group %d (world rank %d): %s" % (g, r, message)
    if kind == "type_error":
        raise TypeError("connect: " + message)
    raise _error_for_code(code, code_name, "connect: " + message)


def connect(controller: str = "", job_id: str = "", tp_group=None, pp_group=None, *,
            group: Optional[int] = None, incarnation: str = "", launch_credential: str = "",
            connect_timeout: float = 10.0, device: Optional[torch.device] = None,
            **client_options) -> Union[GroupDecider, "spgate.torch.PipelineDecider"]:
    """See the module docstring. A collective over the world: every rank calls it once.

    controller: spgated's worker API ("" decides locally, LOCAL_ONLY). tp_group: this
    rank's TP process group (None: the world is one group). pp_group: the job's
    spgate.torch.PipelineGrid for a pipelined job (its TP group, layout and this rank's
    coordinates; tp_group then defaults to the grid's). group: the TP group's index
    (default: the grid's, else numbered by the leaders' world ranks). incarnation,
    launch_credential: as agree_on_launch. connect_timeout: seconds the leader waits for
    its session. device: the decider's (default: the current CUDA device on NCCL).
    client_options: spgate.Client's other keywords (decision_deadline, worker_token, tls,
    memory_budget_bytes, group_session, seed, ...)."""
    if not dist.is_initialized():
        raise _error(spgate.FailedPreconditionError, 9, "FAILED_PRECONDITION",
                     "connect: torch.distributed is not initialised (call "
                     "init_process_group first)")
    grid = pp_group
    if grid is not None:
        from spgate.torch.pipeline import PipelineDecider, PipelineGrid
        if not isinstance(grid, PipelineGrid):
            raise TypeError("connect: pp_group must be a spgate.torch.PipelineGrid, got %s"
                            % type(grid).__name__)
        if tp_group is not None and tp_group is not grid.tp_group:
            raise _invalid("tp_group: not the pipeline grid's TP group (pass pp_group alone)")
        tp_group = grid.tp_group
    for reserved in ("job_id", "controller", "rank_in_group", "group_size", "global_rank",
                     "layout", "coordinates"):
        if reserved in client_options:
            raise TypeError("connect: %s is connect's to set, not a Client option" % reserved)
    world = dist.group.WORLD
    tp_rank = dist.get_rank(tp_group)
    tp_size = dist.get_world_size(tp_group)

    launch = (agree_on_launch(incarnation, launch_credential) if controller
              else LaunchIdentity(incarnation, launch_credential))
    if group is None:
        group = grid.group if grid is not None else _group_index(tp_group, world)

    client, outcome, warning = None, None, None
    if tp_rank == 0 or not client_options.get("group_session", True):
        try:
            pipeline = {} if grid is None else {"layout": grid.layout(),
                                                "coordinates": grid.coordinates()}
            client = spgate.Client(controller=controller, job_id=job_id,
                                   incarnation=launch.incarnation,
                                   launch_credential=launch.launch_credential, group=group,
                                   rank_in_group=tp_rank, group_size=tp_size,
                                   global_rank=dist.get_rank(), **pipeline, **client_options)
            if controller:
                warning = _wait_for_session(client, controller, job_id, connect_timeout)
            outcome = ("ok",)
        except (spgate.Error, TypeError) as e:
            outcome = _outcome(e)
            if client is not None:
                client.close()
                client = None
    outcomes = [None] * dist.get_world_size(world)
    dist.all_gather_object(outcomes, (group, outcome), group=world)
    _raise_agreed(outcomes, group)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if grid is not None:
        return PipelineDecider(client, grid, device=device)
    return GroupDecider(client, tp_group, device=device)
