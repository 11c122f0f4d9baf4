"""spgate.torch.GroupDecider over gloo (2 and 4 processes, loopback): every rank gets the
leader's decision for every step; a leader that cannot decide broadcasts its error so
every rank raises the same code (and the group goes on with the next step); every rank's
telemetry reaches the leader's client as one record a step (group session), or each
rank's own client (group_session=False); bad construction names the argument and raises
on every rank of the group within seconds (one rank's refusal included), as does a
follower whose client disagrees with the leader's on group_session; with a
live spgated killed (SIGKILL) mid-run, a group of 4 ranks - a client on the leader only -
switches to the same fail-static decisions (CONTROLLER_UNAVAILABLE), step for step. (The
leader's deadline is 1 s: a live daemon always answers in time, and a dead one ends the
wait at once, when its stream breaks.) One group session against a live spgated: the
daemon accepts one telemetry record per step for a group of 4, not one per rank, and its
GroupStatus names the slowest rank and the rank with the highest peak memory.
spgate.torch.agree_on_launch: every rank gets world rank 0's incarnation and credential,
whatever its own environment says, and a new launch gets a new credential; the
LaunchIdentity's repr and str never show the credential.

Run: PYTHONPATH=build/python SPGATED=build/bin/spgated python3 tests/python/group_decider_test.py
"""
import gc
import os
import sys
import time
import types
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
GIB = 1 << 30
TOOLS_DEMO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "demo")


def lengths_for(step):
    return MIXED if step % 3 == 1 else UNIFORM


def record(d):
    return (d.step, int(d.mode), int(d.reason), int(d.policy_reason), int(d.source),
            d.config_version)


def rank_telemetry(rank, d):
    """Rank `rank`'s own record of step d.step: rank 2 is the slowest, rank 1 has the
    highest peak memory (within the group's size: rank % world)."""
    return spgate.StepTelemetry(
        step=d.step, mode=d.mode, reason=d.reason,
        step_time_s=0.5 if rank == 2 else 0.1 + 0.01 * rank,
        rs_wait_s=0.001, all_gather_s=0.002, effective_tokens=sum(lengths_for(d.step)),
        peak_memory_bytes=(70 if rank == 1 else 40 + rank) * GIB)


def local_rank(rank, world, steps):
    import torch.distributed as dist
    from spgate.torch import GroupDecider
    # Local-only clients (no controller): a follower may have one; the leader's group
    # session still takes the group's telemetry.
    client = spgate.Client(job_id="gd-local", rank_in_group=rank, group_size=world)
    decider = GroupDecider(client, dist.group.WORLD)
    out = {"is_leader": decider.is_leader, "log": [], "errors": [],
           "group_session": decider.group_session}
    decider.submit_plan(0, lengths_for(0))
    for step in range(steps):
        if step + 1 < steps and step + 1 != 5:  # no plan for step 5: the leader fails
            decider.submit_plan(spgate.BatchPlan(step=step + 1, lengths=lengths_for(step + 1)))
        try:
            d = decider.decide(step)
        except spgate.Error as e:
            out["errors"].append((step, e.code, type(e).__name__))
            continue
        out["log"].append(record(d))
        if step % 2:
            decider.report_telemetry(rank_telemetry(rank, d))
        else:
            t = rank_telemetry(rank, d)
            decider.report_telemetry(step=t.step, mode=t.mode, reason=t.reason,
                                     step_time_s=t.step_time_s,
                                     peak_memory_bytes=t.peak_memory_bytes)
    out["telemetry_reported"] = client.stats().telemetry_reported
    # A rank whose record is refused still takes part: it and the leader raise, the
    # others return, and the group goes on.
    d = spgate.GateDecision(step=steps - 1, mode=spgate.Mode.SEQUENCE_PARALLEL,
                            reason=spgate.Reason.GATES_PASSED)
    t = rank_telemetry(rank, d)
    if rank == world - 1:
        t.step_time_s = -1.0
    try:
        decider.report_telemetry(t)
        out["refused"] = None
    except spgate.InvalidArgumentError as e:
        out["refused"] = str(e)
    out["telemetry_reported_after_refusal"] = client.stats().telemetry_reported
    # Per-rank sessions: every rank's own client takes its own records, no reduction.
    own = spgate.Client(job_id="gd-local", rank_in_group=rank, group_size=world,
                        group_session=False)
    per_rank = GroupDecider(own, dist.group.WORLD)
    out["per_rank_group_session"] = per_rank.group_session
    for step in range(3):
        per_rank.submit_plan(step, UNIFORM)
        per_rank.report_telemetry(rank_telemetry(rank, per_rank.decide(step)))
    out["per_rank_reported"] = own.stats().telemetry_reported
    own.close()
    # From here to the frame count below, no automatic collection: it could free a cycle
    # the refusals left (the count would pass with the cycle there).
    gc.disable()
    # A follower whose client disagrees with the leader's on group_session.
    mixed = spgate.Client(job_id="gd-local", rank_in_group=rank, group_size=world,
                          group_session=(rank == 0))
    try:
        GroupDecider(mixed, dist.group.WORLD)
        out["mixed"] = None
    except spgate.InvalidArgumentError as e:
        out["mixed"] = str(e)
    mixed.close()
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
    # A refusal on one rank raises on every rank, after the one collective, rather than
    # leaving the others in it until gloo's timeout (60 s here): a leader without a
    # client, then one follower with another rank's client.
    start = time.monotonic()
    try:
        GroupDecider(None, dist.group.WORLD)
        out["no_client"] = None
    except spgate.InvalidArgumentError as e:
        out["no_client"] = str(e)
    stray = spgate.Client(job_id="x", rank_in_group=0, group_size=world)
    try:
        GroupDecider(client if rank == 0 else stray if rank == world - 1 else None,
                     dist.group.WORLD)
        out["one_refused"] = None
    except spgate.InvalidArgumentError as e:
        out["one_refused"] = str(e)
    out["refusals_s"] = time.monotonic() - start
    # A refused construction holds nothing: no frame of it keeps the process group (and
    # with it gloo's threads, and the client) alive until the garbage collector runs.
    out["frames_holding_group"] = sum(
        isinstance(o, types.FrameType) for o in gc.get_referrers(dist.group.WORLD))
    gc.enable()
    stray.close()
    client.close()
    return out


def daemon_rank(rank, world, address, progress_path, steps):
    import torch.distributed as dist
    from spgate.torch import GroupDecider
    client = None  # one session for the group: the leader's
    if rank == 0:
        client = spgate.Client(controller=address, job_id="gd-kill", rank_in_group=rank,
                               group_size=world, global_rank=rank, decision_deadline=1.0)
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
        decider.report_telemetry(rank_telemetry(rank, d))
    if client is not None:
        client.close()
    return log


def session_rank(rank, world, address, admin_address, steps):
    import torch.distributed as dist
    from spgate.torch import GroupDecider
    out = {}
    client = None
    if rank == 0:
        client = spgate.Client(controller=address, job_id="gd-session", rank_in_group=0,
                               group_size=world, global_rank=0, decision_deadline=2.0)
        client.wait_until_connected(10)
    else:
        try:  # with a controller, only the leader may have a client
            spgate.Client(controller=address, job_id="gd-session", rank_in_group=rank,
                          group_size=world, global_rank=rank)
        except spgate.InvalidArgumentError as e:
            out["follower_client"] = str(e)
    decider = GroupDecider(client, dist.group.WORLD)
    out["log"] = []
    decider.submit_plan(0, lengths_for(0))
    for step in range(steps):
        if step + 1 < steps:
            decider.submit_plan(step + 1, lengths_for(step + 1))
        d = decider.decide(step)
        out["log"].append(record(d))
        decider.report_telemetry(rank_telemetry(rank, d))
    if rank == 0:
        client.flush(10.0)
        s = client.stats()
        out["stats"] = (s.telemetry_reported, s.telemetry_sent, s.telemetry_acked)
        # The daemon's view of the group, over the admin API (server reflection).
        sys.path.insert(0, TOOLS_DEMO)
        import spgate_reflect as sr
        admin = sr.connect(admin_address, "spgate.v1.AdminService")
        deadline = time.monotonic() + 10
        while True:
            job = admin.call("GetJob", job_id="gd-session")
            g = job.groups[0]
            if g.last_step == steps - 1 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        out["group"] = {"group_session": g.group_session, "group_size": g.group_size,
                        "ranks_active": g.ranks_active, "last_step": g.last_step,
                        "slowest_rank": g.slowest_rank,
                        "slowest_step_time_s": g.slowest_step_time_s,
                        "peak_memory_rank": g.peak_memory_rank}
        out["peak_memory_bytes"] = max(m.peak_memory_bytes for m in job.mode_stats)
        admin.channel.close()
        client.close()
    return out


def launch_rank(rank, world):
    from spgate.torch import agree_on_launch
    # Each rank's environment differs (as it may on other hosts): rank 0's wins.
    os.environ.pop("SPGATE_LAUNCH_CREDENTIAL", None)
    os.environ["SPGATE_INCARNATION"] = f"env-of-rank-{rank}"
    made = agree_on_launch()
    again = agree_on_launch()
    os.environ["SPGATE_LAUNCH_CREDENTIAL"] = f"wrapper-credential-of-rank-{rank}"
    given = agree_on_launch(incarnation=f"given-by-rank-{rank}")
    return [tuple(made), tuple(again), tuple(given), repr(made), str(given)]


class GroupDeciderTest(unittest.TestCase):
    def test_every_rank_agrees_on_world_rank_zeros_launch(self):
        results = run_ranks(3, launch_rank)
        for rank, r in enumerate(results[1:], start=1):
            self.assertEqual(r, results[0], f"rank {rank} has another launch identity")
        made, again, given, made_repr, given_str = results[0]
        self.assertEqual(made[0], "env-of-rank-0")
        # What a trainer logs of it shows the incarnation, never the secret.
        self.assertEqual(made_repr, "LaunchIdentity(incarnation='env-of-rank-0', "
                                    "launch_credential='<hidden>')")
        self.assertNotIn(made[1], made_repr)
        self.assertNotIn("wrapper-credential", given_str)
        self.assertIn("'<hidden>'", given_str)
        self.assertRegex(made[1], r"^[0-9a-f]{32}$")
        self.assertEqual(again[0], "env-of-rank-0")
        self.assertNotEqual(again[1], made[1], "a new launch needs a new credential")
        self.assertEqual(given, ("given-by-rank-0", "wrapper-credential-of-rank-0"))

    def test_launch_identity_hides_the_credential(self):
        from spgate.torch import LaunchIdentity
        secret = "0123456789abcdef-secret"
        launch = LaunchIdentity("run-7", secret)
        for shown in (repr(launch), str(launch), "%s" % (launch,), repr([launch])):
            self.assertNotIn(secret, shown)
            self.assertIn("launch_credential='<hidden>'", shown)
            self.assertIn("incarnation='run-7'", shown)
        # Still the NamedTuple it was: the fields, unpacking and equality hold the value.
        incarnation, credential = launch
        self.assertEqual((incarnation, credential, launch.launch_credential),
                         ("run-7", secret, secret))
        self.assertEqual(launch, ("run-7", secret))

    def test_agree_on_launch_needs_torch_distributed(self):
        from spgate.torch import agree_on_launch
        with self.assertRaises(spgate.FailedPreconditionError) as c:
            agree_on_launch()  # this process never initialised torch.distributed
        self.assertEqual((c.exception.code, c.exception.code_name),
                         (9, "FAILED_PRECONDITION"))
        self.assertIn("torch.distributed is not initialised", str(c.exception))

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
        self.assertIn("leader (rank 0) needs an open Client", leader["no_client"])
        last = world - 1
        self.assertIn("rank_in_group 0", results[last]["one_refused"])
        for rank, r in enumerate(results):
            self.assertLess(r["refusals_s"], 30, "a refusal waited out the collective")
            self.assertEqual(r["frames_holding_group"], 0,
                             "a refused GroupDecider's frame still holds the process group")
            if rank:
                self.assertIn("rank 0 of the group refused", r["no_client"])
            if rank != last:
                self.assertIn(f"rank {last} of the group refused", r["one_refused"])
        # One group record a step reached the leader's client; the followers' none.
        self.assertTrue(all(r["group_session"] for r in results))
        self.assertEqual(leader["telemetry_reported"], steps - 1)
        for r in results[1:]:
            self.assertEqual(r["telemetry_reported"], 0)
        # The refused record: its rank and the leader raise, nothing more was queued.
        self.assertIn("step_time_s", results[-1]["refused"])
        self.assertIn("refused", leader["refused"])
        for r in results[1:-1]:
            self.assertIsNone(r["refused"])
        self.assertEqual(leader["telemetry_reported_after_refusal"], steps - 1)
        # Per-rank sessions: every rank's own records in its own client.
        for r in results:
            self.assertFalse(r["per_rank_group_session"])
            self.assertEqual(r["per_rank_reported"], 3)
        # group_session must agree with the leader's: every rank raises.
        for r in results:
            self.assertIn("group_session", r["mixed"])

    def test_local_2_ranks(self):
        self.check_local(2)

    def test_local_4_ranks(self):
        self.check_local(4)

    def test_group_session_sends_one_record_per_step(self):
        daemon = Daemon()
        steps, world = 10, 4
        try:
            results = run_ranks(world, session_rank, daemon.address,
                                f"127.0.0.1:{daemon.admin_port}", steps)
            metrics = daemon.metrics()
        finally:
            daemon.stop()
        leader = results[0]
        for rank, r in enumerate(results[1:], start=1):
            self.assertIn("group_session", r["follower_client"])
            self.assertEqual(r["log"], leader["log"], f"rank {rank} got other decisions")
        daemon_src = int(spgate.DecisionSource.DAEMON)
        self.assertEqual([src for _, _, _, _, src, _ in leader["log"]], [daemon_src] * steps)
        # One record a step for the group, not one per rank: the leader's client and the
        # daemon agree.
        self.assertEqual(leader["stats"], (steps, steps, steps))
        accepted = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                    if line.startswith('spgate_telemetry_records_total{result="accepted"}')]
        self.assertEqual(accepted, [steps], "spgate_telemetry_records_total{accepted}")
        slowest = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("spgate_slowest_rank{")
                   and 'job_id="gd-session"' in line]
        self.assertEqual(slowest, [2])
        # The group's record: the slowest rank and its time, the highest peak and its rank.
        g = leader["group"]
        self.assertTrue(g["group_session"])
        self.assertEqual((g["group_size"], g["ranks_active"]), (world, world))
        self.assertEqual(g["last_step"], steps - 1)
        self.assertEqual(g["slowest_rank"], 2)
        self.assertAlmostEqual(g["slowest_step_time_s"], 0.5, places=9)
        self.assertEqual(g["peak_memory_rank"], 1)
        self.assertEqual(leader["peak_memory_bytes"], 70 * GIB)

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
