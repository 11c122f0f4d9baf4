"""spgate.torch.agree_on_launch: the launch's identity - its incarnation and its credential
(docs/design.md §10) - the same on every rank of a torch.distributed job, with no
configuration under torchrun/TorchElastic, Slurm or mpirun.

World rank 0 (rank 0 of `group`) decides and broadcasts over the job's own process group,
as spgate-worker does over MPI: the incarnation is the one passed, else the launcher's run
id (spgate.incarnation_from_environment), else a new one; the credential is the one
passed, else SPGATE_LAUNCH_CREDENTIAL, else 128 bits from the kernel's random source
(spgate.new_launch_credential). Launcher variables (SLURM_JOB_ID, TORCHELASTIC_RUN_ID) are
visible to other users of the machine, so they never make the credential; the group's own
broadcast reaches only the launch's processes. If rank 0 cannot decide, every rank raises
its error rather than one waiting alone in the broadcast.

Invariant: a collective - every rank of `group` calls it once, before the TP group's
leader creates its Client (in a group session only the leader has one; with
group_session=False every rank does).
On NCCL it travels as an object collective: set each rank's CUDA device first
(torch.cuda.set_device), as any NCCL object collective needs.

Usage:
    dist.init_process_group("nccl")                  # env:// under torchrun or srun
    launch = spgate.torch.agree_on_launch()          # every rank
    if rank_in_group == 0:                           # the TP group's leader (group session)
        client = spgate.Client(controller=addr, job_id="llama",
                               incarnation=launch.incarnation,
                               launch_credential=launch.launch_credential, group=g, ...)
"""
from __future__ import annotations

import uuid
from typing import NamedTuple

import torch.distributed as dist

import spgate
from spgate.torch.group_decider import _error_for_code, _global_rank


class LaunchIdentity(NamedTuple):
    incarnation: str
    launch_credential: str

    def __repr__(self) -> str:
        # The credential is the launch's secret: a trainer that logs what it got back
        # must not leak it (str() is this too). The field itself holds the value.
        return "LaunchIdentity(incarnation=%r, launch_credential='<hidden>')" % (
            self.incarnation,)


def _decide(incarnation: str, launch_credential: str):
    try:
        inc = incarnation or spgate.incarnation_from_environment() or uuid.uuid4().hex
        cred = (launch_credential or spgate.launch_credential_from_environment()
                or spgate.new_launch_credential())
        return ("ok", inc, cred)
    except spgate.Error as e:
        return ("error", e.code, e.code_name, str(e))


def agree_on_launch(incarnation: str = "", launch_credential: str = "",
                    group=None) -> LaunchIdentity:
    """Collective over `group` (default: the world). See the module docstring."""
    if not dist.is_initialized():
        # Made in another frame and raised at once: an exception kept in a local here
        # would be held by its own traceback's frame (a cycle only the collector frees).
        raise _error_for_code(9, "FAILED_PRECONDITION",
                              "agree_on_launch: torch.distributed is not initialised")
    root = _global_rank(group, 0)
    payload = [_decide(incarnation, launch_credential) if dist.get_rank() == root else None]
    dist.broadcast_object_list(payload, src=root, group=group)
    if payload[0][0] != "ok":
        _, code, code_name, message = payload[0]
        raise _error_for_code(code, code_name,
                              "agree_on_launch: world rank %d: %s" % (root, message))
    return LaunchIdentity(payload[0][1], payload[0][2])
