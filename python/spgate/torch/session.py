"""spgate.torch.connect (this module is spgate.torch.session): spgate in a PyTorch trainer with one call (docs/pytorch.md).

Every rank of the job calls it once, after init_process_group and after creating its
groups, and gets its TP group's decider - spgate.torch.GroupDecider, or with a pipeline
(pp_group, a spgate.torch.PipelineGrid) spgate.torch.PipelineDecider - with
submit_plan(step, lengths) (a no-op except on the leader), decide(step) and
report_telemetry(...) on every rank. In between it does what a trainer otherwise writes
by hand, in this order, each a collective every rank joins:

  1. agree on the arguments and number the TP groups (one gather over the world): each
     rank's controller and job id - the argument given, else SPGATE_CONTROLLER and
     SPGATE_JOB_ID, the variables the Kubernetes sidecar sets
     (deploy/k8s/components/sidecar) - and its TP group's leader's world rank (the
     group's index, unless `group` or the grid gives it). A rank with neither, or ranks
     that disagree on having a controller or on the job id, make every rank raise;
  2. agree on the launch (agree_on_launch over the world: rank 0's incarnation and
     credential on every rank);
  3. the TP group's leader (every rank with group_session=False) creates its
     spgate.Client - its worker token the `worker_token` given, else the one in the file
     SPGATE_WORKER_TOKEN_FILE names - and waits at most `connect_timeout` seconds for its
     session;
  4. every rank's outcome is gathered over the world: when any rank was refused, every
     rank of the job raises that spgate.Error (its own group's first, else the first
     one's naming the group) - after the gather, never before a collective its peers
     join, so no rank is left waiting in one (the hang spgate exists to prevent);
  5. the decider (its construction is a collective over the TP group).

A refusal is the daemon's answer to Register that retrying cannot change -
INVALID_ARGUMENT (a bad job id or option), PERMISSION_DENIED (a wrong worker token or
credential), UNAUTHENTICATED (none), UNIMPLEMENTED (the address is a gRPC server without
the worker API, e.g. spgated's admin port) - and raises as soon as the leader learns it; a launch
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
    # in a pod with spgate's sidecar (SPGATE_CONTROLLER, SPGATE_JOB_ID and
    # SPGATE_WORKER_TOKEN_FILE set): spgate.torch.connect(tp_group=tp_group)
    decider.submit_plan(n, lengths)                   # leader only; no-op elsewhere
    d = decider.decide(n)                             # every rank, the same answer
    decider.report_telemetry(step=n, mode=d.mode, reason=d.reason, step_time_s=t)
    decider.close()                                   # at the end (flushes telemetry)
"""
from __future__ import annotations

import numbers
import os
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
_REFUSED_AT_ONCE = {"INVALID_ARGUMENT": 3, "PERMISSION_DENIED": 7, "UNIMPLEMENTED": 12,
                    "UNAUTHENTICATED": 16}
# The credential refusals (a Register's, or a stream's end).
_CREDENTIAL_REFUSED = ("PERMISSION_DENIED", "UNAUTHENTICATED")
# What the client's waits return at once (docs/client.md): those, a Register refused
# for a field (INVALID_ARGUMENT, e.g. a group past the daemon's --max_groups_per_job) and
# one answered by a server without the worker API (UNIMPLEMENTED: the admin port).
_WAIT_REFUSED = _CREDENTIAL_REFUSED + ("INVALID_ARGUMENT", "UNIMPLEMENTED")
# Another launch of the job holds it: raised when it still stands at the end of the wait.
_LAUNCH_CONFLICT = {"FAILED_PRECONDITION": 9}
_POLL_S = 0.05  # how often the leader looks at the client's last Register answer
# What a launcher or the Kubernetes sidecar (deploy/k8s/components/sidecar) sets for the
# trainer, read for an argument not given. As spgatectl reads SPGATE_ADMIN: an argument
# given wins, then the variable; an empty variable counts as unset.
_CONTROLLER_ENV = "SPGATE_CONTROLLER"
_JOB_ID_ENV = "SPGATE_JOB_ID"  # else Slurm's SLURM_JOB_NAME (spgate.job_id_from_environment)
_WORKER_TOKEN_FILE_ENV = "SPGATE_WORKER_TOKEN_FILE"
_HARDWARE_ID_ENV = "SPGATE_HARDWARE_ID"  # spgate.default_hardware_id reads it
_LAUNCH_CREDENTIAL_ENV = "SPGATE_LAUNCH_CREDENTIAL"  # world rank 0's, in agree_on_launch


def _refusal(last_error: str):
    """(code, code_name, message) of a refused Register, or of a stream ended for its
    credential, in the client's last_error ("Register: CODE: message", "Connect: CODE:
    message", gate_client_stream.cc), else None."""
    m = re.match(r"(Register|Connect): ([A-Z_]+): (.*)", last_error, re.S)
    if not m:
        return None
    call, code_name, message = m.groups()
    if call == "Connect" and code_name not in _CREDENTIAL_REFUSED:
        return None
    code = {**_REFUSED_AT_ONCE, **_LAUNCH_CONFLICT}.get(code_name)
    return None if code is None else (code, code_name, message)


def _wait_for_session(client: "spgate.Client", controller: str, job_id: str,
                      timeout: float) -> Optional[str]:
    """Waits at most `timeout` s for the client's session. None once it is open; the
    line to print when the daemon did not answer; raises spgate.Error for a refusal."""
    deadline = time.monotonic() + timeout
    while True:
        wait = max(0.0, min(_POLL_S, deadline - time.monotonic()))
        answered_at_once = False
        try:
            client.wait_until_connected(wait)
            return None
        except spgate.Error as e:
            # DEADLINE_EXCEEDED: not yet; a refused credential or Register returns at once
            # with its code (docs/client.md), and last_error below names the refusal.
            if not isinstance(e, spgate.DeadlineExceededError):
                if e.code_name not in _WAIT_REFUSED:
                    raise
                answered_at_once = True
        last_error = client.stats().last_error
        refused = _refusal(last_error)
        expired = time.monotonic() >= deadline
        if refused and (refused[1] in _REFUSED_AT_ONCE or expired):
            code, code_name, message = refused
            said = ("no spgated worker API at %s (job %s): %s" % (controller, job_id, message)
                    if code_name == "UNIMPLEMENTED" else
                    "spgated at %s refused job %s: %s: %s" % (controller, job_id, code_name,
                                                              message))
            raise _error_for_code(code, code_name, said)
        if expired:
            return ("spgate: spgated at %s did not answer job %s in %g s%s; deciding locally "
                    "(fail-static) until it does" % (controller, job_id, timeout,
                                                     " (%s)" % last_error if last_error else ""))
        if answered_at_once:
            time.sleep(wait)  # a refusal last_error no longer names: poll, do not spin


def _outcome(error: BaseException):
    if isinstance(error, spgate.Error):
        return ("error", error.code, error.code_name, str(error))
    return ("type_error", 3, "INVALID_ARGUMENT", str(error))  # e.g. a keyword Client lacks


def _arguments(controller: Optional[str], job_id: Optional[str]):
    """(controller, job_id): each argument given, else its variable. InvalidArgumentError
    naming both when neither gives the controller, or the job id of a job that has one
    (deciding locally needs none)."""
    if controller is None:
        controller = os.environ.get(_CONTROLLER_ENV, "")
        if not controller:
            raise _invalid("no controller: pass controller= or set %s (controller=\"\" "
                           "decides locally)" % _CONTROLLER_ENV)
    if job_id is None:
        job_id = spgate.job_id_from_environment()  # SPGATE_JOB_ID, else SLURM_JOB_NAME
        if not job_id and controller:
            raise _invalid("no job_id: pass job_id= or set %s (under Slurm SLURM_JOB_NAME "
                           "serves)" % _JOB_ID_ENV)
    return controller, job_id


def _worker_token_from_environment() -> str:
    """The token in the file SPGATE_WORKER_TOKEN_FILE names, read as every spgate client
    reads a worker token file; "" when it is unset. InvalidArgumentError naming the
    variable and the file when the file gives none."""
    path = os.environ.get(_WORKER_TOKEN_FILE_ENV, "")
    try:
        return spgate.read_worker_token_file(path) if path else ""
    except spgate.Error as e:
        raise _invalid("environment variable %s: %s" % (_WORKER_TOKEN_FILE_ENV, e)) from None


def _hardware_id(hardware_id: Optional[str], device: Optional[torch.device]) -> str:
    """The hardware id this rank declares (the learned tables' relaunch key): the argument
    given, else SPGATE_HARDWARE_ID, else the CUDA device's (torch.cuda: name, compute
    capability, memory, as a CUDA spgate-worker makes it), else "cpu:" and the CPU model."""
    if hardware_id is not None:
        return hardware_id
    detected = ""
    if not os.environ.get(_HARDWARE_ID_ENV) and torch.cuda.is_available():
        index = device.index if device is not None and device.type == "cuda" else None
        p = torch.cuda.get_device_properties(
            torch.cuda.current_device() if index is None else index)
        detected = spgate.gpu_hardware_id(p.name, p.major, p.minor, p.total_memory)
    return spgate.default_hardware_id(detected)


def _ranks_by(values) -> str:
    """"'a' (world ranks [0, 2]), 'b' (world ranks [1])": who names which value."""
    by = {}
    for r, v in enumerate(values):
        by.setdefault(v, []).append(r)
    return ", ".join("%r (world ranks %s)" % (v, rs) for v, rs in sorted(by.items()))


def _check_tp_groups(members) -> None:
    """members[r]: world rank r's TP group, as the world ranks in it. The groups must
    partition the world: every rank in its own group, every member of it naming the same
    group - else the decider's collectives over them would wait for ranks that never join
    (the hang spgate exists to prevent). InvalidArgumentError naming the first rank that
    disagrees."""
    for r, group in enumerate(members):
        if r not in group:
            raise _invalid("connect: world rank %d passed a tp_group without itself (world "
                           "ranks %s)" % (r, list(group)))
        for m in group:
            if members[m] != group:
                raise _invalid("connect: the ranks disagree on the TP groups: world rank %d's "
                               "tp_group is world ranks %s, world rank %d's is %s (every "
                               "rank of a TP group must pass that group)"
                               % (r, list(group), m, list(members[m])))


def _argument_problem(tp_group, connect_timeout) -> Optional[Exception]:
    """What is wrong with connect's own arguments (a TypeError or InvalidArgumentError
    naming the argument), raised by every rank after the first gather, else None."""
    non_member = getattr(dist.GroupMember, "NON_GROUP_MEMBER", None)
    if non_member is not None and tp_group is non_member or (
            isinstance(tp_group, int) and tp_group == -100):
        return _invalid("tp_group: this rank is not in the group it passed (new_group gives "
                        "ranks outside a group a placeholder): pass each rank its own TP group")
    if tp_group is not None and not isinstance(tp_group, dist.ProcessGroup):
        return TypeError("tp_group must be a torch.distributed process group (new_group) or "
                         "None, got %s" % type(tp_group).__name__)
    if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, numbers.Real):
        return TypeError("connect_timeout must be a number of seconds, got %s"
                         % type(connect_timeout).__name__)
    if not 0 <= connect_timeout < float("inf"):
        return _invalid("connect_timeout: must be >= 0 seconds and finite, got %r"
                        % connect_timeout)
    return None


def _agree_on_arguments(controller, job_id, tp_group, world, problem=None):
    """Collective over the world: (controller, job_id, leaders) - this rank's arguments
    (_arguments) and every rank's TP group leader's world rank - once every rank has
    its arguments. Every rank raises when one has none (its own error first), when some
    ranks decide locally and others ask a daemon (they would wait in different
    collectives), when they name different controllers or jobs, or when their TP groups
    do not partition the world."""
    try:
        if problem is not None:
            raise problem
        mine = ("ok",) + _arguments(controller, job_id)
    except (spgate.Error, TypeError) as e:
        mine = _outcome(e)
    members = ((dist.get_rank(),) if problem is not None else
               tuple(_global_rank(tp_group, i) for i in range(dist.get_world_size(tp_group))))
    everyone = [None] * dist.get_world_size(world)
    dist.all_gather_object(everyone, (members, mine), group=world)
    _raise_agreed([(None, o) for _, o in everyone], None)
    asking = [r for r, (_, o) in enumerate(everyone) if o[1]]
    if asking and len(asking) < len(everyone):
        local = [r for r in range(len(everyone)) if r not in asking]
        raise _invalid("connect: world ranks %s ask spgated at %s and world ranks %s decide "
                       "locally (no controller): every rank needs a controller, or none does"
                       % (asking, everyone[asking[0]][1][1], local))
    for field, at in (("controller", 1), ("job_id", 2)):
        if asking and len({o[at] for _, o in everyone}) > 1:
            raise _invalid("connect: the ranks name different %ss: %s; one job, one %s"
                           % (field, _ranks_by([o[at] for _, o in everyone]), field))
    _check_tp_groups([m for m, _ in everyone])
    return mine[1], mine[2], [m[0] for m, _ in everyone]


def _raise_agreed(outcomes, my_group: Optional[int]) -> None:
    """Every rank: raises the refusal of its own TP group (its own, with my_group None:
    before the groups are numbered), else the first one of any, naming whose."""
    refused = [(g, r, o) for r, (g, o) in enumerate(outcomes) if o is not None and o[0] != "ok"]
    if not refused:
        return
    me = dist.get_rank()
    mine = [x for x in refused if (x[1] == me if my_group is None else x[0] == my_group)]
    g, r, (kind, code, code_name, message) = (mine or refused)[0]
    if not mine:
        message = ("world rank %d: %s" % (r, message) if g is None
                   else "TP group %d (world rank %d): %s" % (g, r, message))
    if kind == "type_error":
        raise TypeError("connect: " + message)
    raise _error_for_code(code, code_name, "connect: " + message)


def connect(controller: Optional[str] = None, job_id: Optional[str] = None, tp_group=None,
            pp_group=None, *, group: Optional[int] = None, incarnation: str = "",
            launch_credential: str = "", connect_timeout: float = 10.0,
            device: Optional[torch.device] = None, hardware_id: Optional[str] = None,
            **client_options) -> Union[GroupDecider, "spgate.torch.PipelineDecider"]:
    """See the module docstring. A collective over the world: every rank calls it once.

    controller: spgated's worker API ("" decides locally, LOCAL_ONLY; not given:
    SPGATE_CONTROLLER, an error when that is unset or empty). job_id: the job's id (not
    given: SPGATE_JOB_ID, else SLURM_JOB_NAME; an error when both are unset or empty and
    there is a controller).
    tp_group: this rank's TP process group (None: the world is one group). pp_group: the
    job's spgate.torch.PipelineGrid for a pipelined job (its TP group, layout and this
    rank's coordinates; tp_group then defaults to the grid's). group: the TP group's index
    (default: the grid's, else numbered by the leaders' world ranks). incarnation,
    launch_credential: as agree_on_launch. connect_timeout: seconds the leader waits for
    its session. device: the decider's (default: the current CUDA device on NCCL).
    hardware_id: the kind of hardware, part of the learned tables' relaunch key (not
    given: SPGATE_HARDWARE_ID, else the CUDA device's name, compute capability and memory
    when torch.cuda is available, else "cpu:" and the CPU's model name).
    client_options: spgate.Client's other keywords (decision_deadline, worker_token, tls,
    memory_budget_bytes, group_session, seed, ...); worker_token not given: the token in
    the file SPGATE_WORKER_TOKEN_FILE names (none when that is unset)."""
    if not dist.is_initialized():
        raise _error(spgate.FailedPreconditionError, 9, "FAILED_PRECONDITION",
                     "connect: torch.distributed is not initialised (call "
                     "init_process_group first)")
    # What is wrong with the arguments is raised after the first gather, on every rank:
    # raised here, on one rank, it would leave the others waiting in it.
    problem = None
    grid = pp_group
    if grid is not None:
        from spgate.torch.pipeline import PipelineDecider, PipelineGrid
        if not isinstance(grid, PipelineGrid):
            problem = TypeError("pp_group must be a spgate.torch.PipelineGrid, got %s"
                                % type(grid).__name__)
        elif tp_group is not None and tp_group is not grid.tp_group:
            problem = _invalid("tp_group: not the pipeline grid's TP group (pass pp_group "
                               "alone)")
        else:
            tp_group = grid.tp_group
    for reserved in ("job_id", "controller", "rank_in_group", "group_size", "global_rank",
                     "layout", "coordinates"):
        if problem is None and reserved in client_options:
            problem = TypeError("%s is connect's to set, not a Client option" % reserved)
    if problem is None:
        problem = _argument_problem(tp_group, connect_timeout)
    world = dist.group.WORLD

    job_id_variable = None
    if job_id is None:
        job_id_variable = _JOB_ID_ENV if os.environ.get(_JOB_ID_ENV) else "SLURM_JOB_NAME"
    hardware_id_variable = (_HARDWARE_ID_ENV if hardware_id is None
                            and os.environ.get(_HARDWARE_ID_ENV) else None)
    controller, job_id, leaders = _agree_on_arguments(controller, job_id, tp_group, world,
                                                      problem)
    tp_rank = dist.get_rank(tp_group)
    tp_size = dist.get_world_size(tp_group)
    if group is None:
        group = (grid.group if grid is not None   # else numbered by the leaders' world ranks
                 else sorted(set(leaders)).index(_global_rank(tp_group, 0)))
    launch = (agree_on_launch(incarnation, launch_credential) if controller
              else LaunchIdentity(incarnation, launch_credential))
    # Not passed, and the value of this rank's SPGATE_LAUNCH_CREDENTIAL: rank 0 read it
    # there, so an error about it names the variable (as spgate-worker's does).
    credential_variable = (_LAUNCH_CREDENTIAL_ENV if not launch_credential
                           and launch.launch_credential
                           and launch.launch_credential == os.environ.get(_LAUNCH_CREDENTIAL_ENV)
                           else None)

    client, outcome, warning = None, None, None
    if tp_rank == 0 or not client_options.get("group_session", True):
        try:
            pipeline = {} if grid is None else {"layout": grid.layout(),
                                                "coordinates": grid.coordinates()}
            from_environment = {}  # what connect reads for a client with a daemon
            if controller and "worker_token" not in client_options:
                from_environment["worker_token"] = _worker_token_from_environment()
            if controller:
                from_environment["hardware_id"] = _hardware_id(hardware_id, device)
            client = spgate.Client(controller=controller, job_id=job_id,
                                   incarnation=launch.incarnation,
                                   launch_credential=launch.launch_credential, group=group,
                                   rank_in_group=tp_rank, group_size=tp_size,
                                   global_rank=dist.get_rank(), **pipeline,
                                   **from_environment, **client_options)
            if controller:
                warning = _wait_for_session(client, controller, job_id, connect_timeout)
            outcome = ("ok",)
        except (spgate.Error, TypeError) as e:
            outcome = _outcome(e)
            for variable, field in ((job_id_variable, "job_id:"),
                                    (hardware_id_variable, "hardware_id:"),
                                    (credential_variable, "launch_credential:")):
                if variable and outcome[3].startswith(field):  # the rule, on its value
                    outcome = outcome[:3] + ("environment variable %s: %s"
                                             % (variable, outcome[3]),)
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
