"""spgate.torch.GroupDecider over gloo (2 and 4 processes, loopback): every rank gets the
leader's decision for every step; a leader that cannot decide broadcasts its error so
every rank raises the same code (and the group goes on with the next step); bad
construction names the argument; with a live spgated killed (SIGKILL) mid-run, a group of
4 ranks switches to the same fail-static decisions (CONTROLLER_UNAVAILABLE), step for
step. (The leader's deadline is 1 s: a live daemon always answers in time, and a dead one
ends the wait at once, when its stream breaks.) spgate.torch.agree_on_launch: every rank
gets world rank 0's incarnation and credential, whatever its own environment says, and a
new launch gets a new credential.

Run: PYTHONPATH=build/python SPGATED=build/bin/spgated python3 tests/python/group_decider_test.py
"""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch  # noqa: F401
    import spgate
    from spgate import _spgate  # noqa: F401
except ImportError as e:
    print(f"FAILED: needs PyTorch (make deps installs python3-torch) and spgate's native module ({e})")
    sys.exit(1)
from daemon_util import Daemon  # noqa: E402
from dist_util import run_ranks  # noqa: E402

UNIFORM = [512] * 4
MIXED = [64, 1024, 128, 700]


def lengths_for(step):
    return MIXED if step % 3 == 1 else UNIFORM


def record(d):
    return (d.step, int(d.mode), int(d.reason), int(d.policy_reason), int(d.source),
            d.config_version)


def local_rank(rank, world, steps):
    import torch.distributed as dist
    from spgate.torch import GroupDecider
    client = spgate.Client(job_id="gd-local", rank_in_group=rank, group_size=world)
    decider = GroupDecider(client, dist.group.WORLD)
    out = {"is_leader": decider.is_leader, "log": [], "errors": []}
    decider.submit_plan(0, lengths_for(0))
    for step in range(steps):
        if step + 1 < steps and step + 1 != 5:  # no plan for step 5: the leader fails
            decider.submit_plan(spgate.BatchPlan(step=step + 1, lengths=lengths_for(step + 1)))
        try:
            out["log"].append(record(decider.decide(step)))
        except spgate.Error as e:
            out["errors"].append((step, e.code, type(e).__name__))
    # Construction errors.
    try:
        GroupDecider(spgate.Client(job_id="x", rank_in_group=(rank + 1) % world,
                                   group_size=world), dist.group.WORLD)
    except spgate.InvalidArgumentError as e:
        out["bad_rank"] = str(e)
    try:
        GroupDecider(spgate.Client(job_id="x", rank_in_group=rank, group_size=world + 1),
                     dist.group.WORLD)
    except spgate.InvalidArgumentError as e:
        out["bad_size"] = str(e)
    if rank == 0:
        try:
            GroupDecider(None, dist.group.WORLD)
        except spgate.InvalidArgumentError as e:
            out["no_client"] = str(e)
    client.close()
    return out


def daemon_rank(rank, world, address, progress_path, steps):
    import torch.distributed as dist
    from spgate.torch import GroupDecider
    client = spgate.Client(controller=address, job_id="gd-kill", rank_in_group=rank,
                           group_size=world, global_rank=rank, decision_deadline=1.0)
    if rank == 0:
        client.wait_until_connected(10)
    dist.barrier()
    decider = GroupDecider(client, dist.group.WORLD)
    log = []
    decider.submit_plan(0, lengths_for(0))
    for step in range(steps):
        if step + 1 < steps:
            decider.submit_plan(step + 1, lengths_for(step + 1))
        d = decider.decide(step)
        log.append(record(d))
        if rank == 0:
            with open(progress_path, "a") as f:
                f.write(f"{step}\n")
        time.sleep(0.02)  # the step
    client.close()
    return log


def launch_rank(rank, world):
    from spgate.torch import agree_on_launch
    # Each rank's environment differs (as it may on other hosts): rank 0's wins.
    os.environ.pop("SPGATE_LAUNCH_CREDENTIAL", None)
    os.environ["SPGATE_INCARNATION"] = f"env-of-rank-{rank}"
    made = agree_on_launch()
    again = agree_on_launch()
    os.environ["SPGATE_LAUNCH_CREDENTIAL"] = f"wrapper-credential-of-rank-{rank}"
    given = agree_on_launch(incarnation=f"given-by-rank-{rank}")
    return [tuple(made), tuple(again), tuple(given)]


class GroupDeciderTest(unittest.TestCase):
    def test_every_rank_agrees_on_world_rank_zeros_launch(self):
        results = run_ranks(3, launch_rank)
        for rank, r in enumerate(results[1:], start=1):
            self.assertEqual(r, results[0], f"rank {rank} has another launch identity")
        made, again, given = results[0]
        self.assertEqual(made[0], "env-of-rank-0")
        self.assertRegex(made[1], r"^[0-9a-f]{32}$")
        self.assertEqual(again[0], "env-of-rank-0")
        self.assertNotEqual(again[1], made[1], "a new launch needs a new credential")
        self.assertEqual(given, ("given-by-rank-0", "wrapper-credential-of-rank-0"))

    def check_local(self, world):
        steps = 12
        results = run_ranks(world, local_rank, steps)
        leader = results[0]
        self.assertTrue(leader["is_leader"])
        self.assertEqual([s for s, _, _ in leader["errors"]], [5])
        self.assertEqual(len(leader["log"]), steps - 1)
        for rank, r in enumerate(results[1:], start=1):
            self.assertFalse(r["is_leader"])
            self.assertEqual(r["log"], leader["log"], f"rank {rank} got other decisions")
            # The leader's FAILED_PRECONDITION reached every rank with its code.
            self.assertEqual(r["errors"], [(5, 9, "FailedPreconditionError")])
        modes = {m for _, m, _, _, _, _ in leader["log"]}
        self.assertEqual(modes, {1, 2}, "both modes were decided")
        self.assertEqual([s for s, *_ in leader["log"]], [s for s in range(steps) if s != 5])
        for r in results:
            self.assertIn("rank_in_group", r["bad_rank"])
            self.assertIn("group_size", r["bad_size"])
        self.assertIn("client", leader["no_client"])

    def test_local_2_ranks(self):
        self.check_local(2)

    def test_local_4_ranks(self):
        self.check_local(4)

    def test_daemon_killed_mid_run(self):
        daemon = Daemon()
        steps, kill_after = 60, 15
        progress = os.path.join(daemon.state_dir, "progress")
        try:
            import threading
            killed_at = []

            def killer():
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        with open(progress) as f:
                            n = len(f.read().split())
                    except FileNotFoundError:
                        n = 0
                    if n >= kill_after:
                        killed_at.append(n)
                        daemon.kill()
                        return
                    time.sleep(0.005)
            t = threading.Thread(target=killer)
            t.start()
            logs = run_ranks(4, daemon_rank, daemon.address, progress, steps)
            t.join(timeout=130)
        finally:
            daemon.stop()
        self.assertEqual(len(killed_at), 1, "the daemon was not killed")
        self.assertLess(killed_at[0], steps - 10, "the daemon was not killed mid-run")
        self.assertEqual(len(logs[0]), steps)
        for r in range(1, 4):
            self.assertEqual(logs[r], logs[0], f"rank {r} ran other decisions than rank 0")
        daemon_src, fallback = int(spgate.DecisionSource.DAEMON), int(spgate.DecisionSource.FALLBACK)
        unavailable = int(spgate.Reason.CONTROLLER_UNAVAILABLE)
        sources = [src for _, _, _, _, src, _ in logs[0]]
        self.assertEqual(sources[0], daemon_src)
        self.assertTrue(all(s == daemon_src for s in sources[:killed_at[0] - 1]), sources)
        # Answers already on the wire may serve a step or two after the kill; from then on
        # every step is the fallback's, with the gate's own reason as policy_reason.
        for step, mode, reason, policy_reason, src, _ in logs[0][killed_at[0] + 3:]:
            self.assertEqual((src, reason), (fallback, unavailable), f"step {step}")
            expected = int(spgate.Reason.LENGTH_CV if step % 3 == 1 else spgate.Reason.GATES_PASSED)
            self.assertEqual(policy_reason, expected, f"step {step}")


if __name__ == "__main__":
    unittest.main()
