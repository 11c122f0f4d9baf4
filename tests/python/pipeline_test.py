"""spgate.torch pipelines (docs/design.md §12) on 4 gloo processes, TP2 x PP2:

- numerics: one optimizer step of 4 micro-batches under 1F1B with a random mode per
  (stage, micro-batch) - the stages disagree on some micro-batches and modes change
  between micro-batches - and dropout on: every micro-batch's loss and every parameter's
  gradient equal a single-process reference (the same model as one stage) at fp32
  tolerance, and no boundary message ever had another size than its receiver expected;
- decisions: three steps of step plans through spgate.torch.PipelineDecider (lengths
  shared by the replica's first stage, one micro-batch's lengths unknown at one step, a
  memory budget that the first stage - two micro-batches in flight - cannot afford
  TP-only for but the last stage can): every rank of a stage gets the same decision per
  micro-batch, and it equals the C++ client's (spgate.Client with the layout, in this
  process: GateClient -> DecisionBook -> LocalGatePolicy::DecideStage) for the same plans;
  and, with a live spgated, the daemon's decisions equal those too;
- the exact-size check: a boundary message of another size raises StageBoundaryError
  naming both sizes (and the sender is not left waiting); spgate.stage_schedule is the
  1F1B order;
- examples/torch/train.py --pp=2 --microbatches=4: the summary's layout, stages and
  p2p_size_mismatches, and a decision-log row per (step, micro-batch) with its stage;
  against a live spgated every stage's decisions come from the daemon.

Tolerance: |got - ref| <= ATOL + RTOL * |ref| (as parallel_numerics_test.py).

Run: PYTHONPATH=build/python SPGATED=build/bin/spgated python3 tests/python/pipeline_test.py
"""
import json
import os
import re
import random
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import torch
    import spgate
    from spgate import _spgate  # noqa: F401
except ImportError as e:
    print(f"FAILED: needs PyTorch (make deps installs python3-torch) and spgate's native module ({e})")
    sys.exit(1)
from dist_util import run_ranks  # noqa: E402

from spgate.torch import parallel as P  # noqa: E402

ATOL, RTOL = 2e-5, 1e-4
TP, PP, M = 2, 2, 4
VOCAB, HIDDEN, HEADS, FFN, LAYERS, MAXPOS = 64, 32, 4, 64, 2, 128
DROPOUT = 0.1
TRAIN = os.path.join(HERE, "..", "..", "examples", "torch", "train.py")

# Decisions: mixed lengths want TP-only (LENGTH_CV), uniform ones SP; micro-batch 3's
# lengths are unknown at step 1 (the loader lagged).
UNIFORM = [96, 96, 96, 96]
MIXED = [8, 200, 16, 150]
DECIDE_STEPS = 3
UNKNOWN = {(1, 3)}
# Memory: resident R; a micro-batch keeps K bytes per row it holds (SP: tokens / t rows,
# TP-only: all, ~384 tokens). Under 1F1B with 2 stages stage 0 holds 2 micro-batches at
# once, stage 1 one: within budget x 0.9 headroom (1.8 MB) stage 1 fits a TP-only one
# (1.0 + 0.77 MB), stage 0 not even one beside an SP one (1.0 + 0.77 + 0.38 MB) but two
# SP ones (1.0 + 2 x 0.38 MB).
RESIDENT, K = 1_000_000, 2000
BUDGET = 2_000_000


def decide_lengths(step, i):
    if (step, i) in UNKNOWN:
        return None
    return MIXED if (step + i) % 2 else UNIFORM


def plan_memory(lengths):
    tokens = sum(lengths or UNIFORM)
    return {"activation_sp": K * ((tokens + TP - 1) // TP), "activation_tp": K * tokens}


def numerics_lengths(i):
    """Micro-batch i of the numerics step: odd token counts, so SP pads."""
    g = random.Random(1000 + i)
    return [g.randint(1, 40) for _ in range(g.randint(2, 4))]


def numerics_data(i, lengths):
    g = torch.Generator()
    g.manual_seed(77 + i)
    tokens = torch.randint(0, VOCAB, (sum(lengths),), generator=g)
    targets = torch.randint(0, VOCAB, (sum(lengths),), generator=g)
    # The last token of each sequence has no target.
    end = 0
    for n in lengths:
        end += n
        targets[end - 1] = -100
    return tokens, targets


def random_modes(seed=3):
    """A mode per (stage, micro-batch): random, redrawn until the stages disagree on some
    micro-batch and each stage changes mode between micro-batches."""
    g = random.Random(seed)
    while True:
        modes = [[g.choice(["sp", "tp"]) for _ in range(M)] for _ in range(PP)]
        differ = any(modes[0][i] != modes[1][i] for i in range(M))
        changes = all(len(set(row)) == 2 for row in modes)
        if differ and changes:
            return modes


def dropout_seed(i):
    return 4242 + 17 * i


# ---- the ranks --------------------------------------------------------------------------

def pipeline_rank(rank, world, modes, controller, job_id):
    import torch.distributed as dist
    from spgate.torch import pipeline as PL
    grid = PL.PipelineGrid(tp=TP, pp=PP, microbatches=M)
    out = {"rank": rank, "stage": grid.stage, "tp_rank": grid.tp_rank}

    # Decisions: step plans through the pipeline decider.
    client = None
    if grid.tp_rank == 0:
        client = spgate.Client(job_id=job_id, controller=controller, group=grid.group,
                               rank_in_group=0, group_size=TP, global_rank=rank,
                               layout=grid.layout(), coordinates=grid.coordinates(),
                               decision_deadline=5.0)
        if controller:
            client.wait_until_connected(10.0)
    decider = PL.PipelineDecider(client, grid)
    shared, decided = [], []
    for step in range(DECIDE_STEPS):
        mine = [decide_lengths(step, i) for i in range(M)] if grid.is_data_leader else None
        lengths = decider.share_lengths(step, mine)
        shared.append(lengths)
        decider.submit_plan(step, lengths, memory=[plan_memory(ls) for ls in lengths],
                            resident_bytes=RESIDENT, memory_budget_bytes=BUDGET)
        d = decider.decide(step)
        decided.append({"step": d.step, "source": int(d.source),
                        "mbs": [(int(x.mode), int(x.reason)) for x in d.microbatches],
                        "peak": d.stage_peak_bytes})
    out["shared"], out["decided"] = shared, decided
    if client is not None:
        client.close()

    # Numerics: one step, 1F1B, a mode per (stage, micro-batch).
    tp = P.TensorParallel(grid.tp_group)
    model = P.ParallelGPTStage(VOCAB, HIDDEN, HEADS, FFN, LAYERS, MAXPOS, tp, stage=grid.stage,
                               stages=PP, seed=9, dropout=DROPOUT)
    model.train()
    lengths = [numerics_lengths(i) for i in range(M)]
    batches = [P.PackedBatch.make(lengths[i], tp, modes[grid.stage][i],
                                  dropout_seed=dropout_seed(i)) for i in range(M)]
    link = PL.StageLink(grid.prev_rank, grid.next_rank)

    def forward(i, x):
        if x is not None:
            x = PL.stage_input(x, batches[i], tp)
        tokens, targets = numerics_data(i, lengths[i])
        y = model(x, tokens, targets, batches[i], loss_scale=1.0 / M)
        return y if grid.is_last else PL.stage_output(y, batches[i], tp)

    losses = PL.run_1f1b(link, grid.schedule(), grid.is_first, grid.is_last, forward,
                         lambda i: (PL.boundary_rows(lengths[i], TP), HIDDEN))
    P.finish_gradients(model, tp)
    out["grads"] = P.gather_full(model, tp, "grad")
    if grid.is_last:
        out["losses"] = [float(tp.all_reduce(losses[i]) if batches[i].sequence_parallel
                               else losses[i]) for i in range(M)]
    out["p2p"] = (link.messages, link.size_mismatches, link.bytes_sent)
    dist.barrier()
    return out


def mismatch_rank(rank, world):
    """Rank 0 (stage 0) sends micro-batch 0 as expected and micro-batch 1 with 6 rows
    where rank 1 expects 5 (a TP-only stage sending its native rows would do that)."""
    from spgate.torch import pipeline as PL
    link = PL.StageLink(-1 if rank == 0 else 0, 1 if rank == 0 else -1)
    out = {}
    if rank == 0:
        link.send(PL.FORWARD, 0, torch.ones(10, 8))
        link.send(PL.FORWARD, 1, torch.ones(6, 8))
        t0 = time.monotonic()
        link.finish()  # both messages were taken: the sender is not left waiting
        out["finish_s"] = time.monotonic() - t0
    else:
        out["first"] = tuple(link.recv(PL.FORWARD, 0, (10, 8)).shape)
        try:
            link.recv(PL.FORWARD, 1, (5, 8))
            out["error"] = None
        except PL.StageBoundaryError as e:
            out["error"] = str(e)
    out["mismatches"] = link.size_mismatches
    return out


# ---- references -------------------------------------------------------------------------

def reference_numerics():
    tp = P.TensorParallel(None)
    model = P.ParallelGPTStage(VOCAB, HIDDEN, HEADS, FFN, LAYERS, MAXPOS, tp, stage=0,
                               stages=1, seed=9, dropout=DROPOUT)
    model.train()
    losses = []
    for i in range(M):
        lengths = numerics_lengths(i)
        batch = P.PackedBatch.make(lengths, tp, "tp", dropout_seed=dropout_seed(i))
        tokens, targets = numerics_data(i, lengths)
        loss = model(None, tokens, targets, batch, loss_scale=1.0 / M)
        loss.backward()
        losses.append(float(loss))
    return losses, {n: p.grad.clone() for n, p in model.named_parameters()}


def reference_decisions():
    """Each stage's decisions from the C++ client, fed the same plans in this process."""
    layout = spgate.JobLayout(tp=TP, pp=PP, microbatches=M)
    out = {}
    for stage in range(PP):
        c = spgate.Client(job_id="reference", group=stage, group_size=TP, layout=layout,
                          coordinates=spgate.StageCoordinates(stage=stage))
        rows = []
        for step in range(DECIDE_STEPS):
            mbs = [spgate.MicrobatchPlan(i, decide_lengths(step, i) or [],
                                         **plan_memory(decide_lengths(step, i)))
                   for i in reversed(range(M))]  # by id, in any order
            c.submit_plan(spgate.BatchPlan(step, microbatches=mbs, resident_bytes=RESIDENT,
                                           memory_budget_bytes=BUDGET))
            d = c.await_decision(step)
            rows.append([(int(x.mode), int(x.reason)) for x in d.microbatches])
        c.close()
        out[stage] = rows
    return out


def max_violation(got, ref):
    return float(((got - ref).abs() - (ATOL + RTOL * ref.abs())).max())


SP, TPO = int(spgate.Mode.SEQUENCE_PARALLEL), int(spgate.Mode.TENSOR_PARALLEL_ONLY)
R = spgate.Reason


class PipelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.modes = random_modes()
        t0 = time.monotonic()
        cls.results = run_ranks(TP * PP, pipeline_rank, cls.modes, "", "pipeline-local",
                                timeout_s=120)
        cls.seconds = time.monotonic() - t0

    def test_loss_and_gradients_equal_the_reference(self):
        ref_losses, ref_grads = reference_numerics()
        last = [r for r in self.results if r["stage"] == PP - 1]
        for r in last:
            for i in range(M):
                self.assertLessEqual(abs(r["losses"][i] - ref_losses[i]),
                                     ATOL + RTOL * abs(ref_losses[i]), f"micro-batch {i}")
        seen = set()
        for r in self.results:
            for name, grad in r["grads"].items():
                seen.add(name)
                ref = ref_grads[name]
                self.assertEqual(tuple(grad.shape), tuple(ref.shape), name)
                self.assertLessEqual(max_violation(grad, ref), 0.0,
                                     f"stage {r['stage']} rank {r['rank']}: {name} "
                                     f"(modes {self.modes})")
        self.assertEqual(seen, set(ref_grads), "every parameter is on some stage")
        self.assertGreater(float(ref_grads["blocks.0.ln1.weight"].abs().sum()), 0)

    def test_boundary_sizes_never_depend_on_the_mode(self):
        for r in self.results:
            messages, mismatches, sent = r["p2p"]
            self.assertEqual(mismatches, 0)
            # Each rank sends a message per micro-batch across its one boundary.
            self.assertEqual(messages, M)
            rows = sum((sum(numerics_lengths(i)) + TP - 1) // TP for i in range(M))
            self.assertEqual(sent, rows * HIDDEN * 4)

    def test_decisions_equal_the_cxx_clients(self):
        want = reference_decisions()
        for r in self.results:
            got = [d["mbs"] for d in r["decided"]]
            self.assertEqual(got, want[r["stage"]], f"rank {r['rank']} stage {r['stage']}")
            self.assertTrue(all(d["source"] == int(spgate.DecisionSource.LOCAL_ONLY)
                                for d in r["decided"]))
        # The lengths reached every stage, the unknown one as unknown.
        for r in self.results:
            for step in range(DECIDE_STEPS):
                self.assertEqual(r["shared"][step], [decide_lengths(step, i) for i in range(M)])
        # What the plans exercise: the unknown micro-batch runs SP on every stage; the
        # first stage (two in flight) is kept from a TP-only micro-batch the last runs.
        for stage in range(PP):
            self.assertEqual(want[stage][1][3], (SP, int(R.LENGTHS_UNKNOWN)))
        reasons0 = {x for row in want[0] for x in row}
        self.assertIn((SP, int(R.MEMORY_REQUIRES_SP)), reasons0)
        self.assertTrue(any(want[0][s][i] == (SP, int(R.MEMORY_REQUIRES_SP))
                            and want[1][s][i] == (TPO, int(R.LENGTH_CV))
                            for s in range(DECIDE_STEPS) for i in range(M)), want)
        self.assertIn((SP, int(R.GATES_PASSED)), reasons0)

    def test_time_bound(self):
        self.assertLess(self.seconds, 60)


class PipelineDaemonTest(unittest.TestCase):
    def test_daemon_decisions_equal_the_cxx_clients(self):
        from daemon_util import Daemon
        daemon = Daemon()
        try:
            results = run_ranks(TP * PP, pipeline_rank, random_modes(), daemon.address,
                                "pipeline-daemon", timeout_s=120)
        finally:
            daemon.stop()
        want = reference_decisions()
        for r in results:
            self.assertEqual([d["mbs"] for d in r["decided"]], want[r["stage"]])
            self.assertTrue(all(d["source"] == int(spgate.DecisionSource.DAEMON)
                                for d in r["decided"]), r["decided"])


class StageLinkTest(unittest.TestCase):
    def test_a_size_mismatch_raises_naming_both_sizes(self):
        t0 = time.monotonic()
        r0, r1 = run_ranks(2, mismatch_rank, timeout_s=60)
        self.assertLess(time.monotonic() - t0, 60)
        self.assertEqual(r1["first"], (10, 8))
        self.assertIsNotNone(r1["error"])
        self.assertIn("micro-batch 1's activation message from world rank 0 has 6 x 8 = 48 "
                      "floats, this stage expected 5 x 8 = 40", r1["error"])
        self.assertEqual(r1["mismatches"], 1)
        self.assertEqual(r0["mismatches"], 0)

    def test_stage_schedule_is_1f1b(self):
        layout = spgate.JobLayout(tp=2, pp=2, microbatches=4)
        f = lambda i: (True, i, 0)  # noqa: E731
        b = lambda i: (False, i, 0)  # noqa: E731
        self.assertEqual(spgate.stage_schedule(layout, 0),
                         [f(0), f(1), b(0), f(2), b(1), f(3), b(2), b(3)])
        self.assertEqual(spgate.stage_schedule(layout, 1),
                         [f(0), b(0), f(1), b(1), f(2), b(2), f(3), b(3)])
        with self.assertRaises(spgate.InvalidArgumentError):
            spgate.stage_schedule(layout, 2)

    def test_layout_options_are_checked(self):
        layout = spgate.JobLayout(tp=2, pp=2, microbatches=4)
        with self.assertRaisesRegex(spgate.InvalidArgumentError, "layout.tp"):
            spgate.Client(job_id="x", group_size=4, layout=layout)
        with self.assertRaisesRegex(spgate.InvalidArgumentError, "group"):
            spgate.Client(job_id="x", group=0, group_size=2, layout=layout,
                          coordinates=spgate.StageCoordinates(stage=1))
        with self.assertRaisesRegex(spgate.InvalidArgumentError, "schedule"):
            spgate.JobLayout(schedule="gpipe")
        self.assertEqual(spgate.StageCoordinates(dp_index=1, stage=1).group(
            spgate.JobLayout(tp=2, pp=2, dp=2)), 3)
        # An SP-only feature: every micro-batch SP, SP_REQUIRED.
        c = spgate.Client(job_id="x", group=1, group_size=2, layout=layout,
                          coordinates=spgate.StageCoordinates(stage=1),
                          sp_required=["cuda_graphs"])
        c.submit_plan(spgate.BatchPlan(0, microbatches=[spgate.MicrobatchPlan(i, MIXED)
                                                        for i in range(4)]))
        d = c.await_decision(0)
        self.assertEqual(d.microbatches,
                         [spgate.MicrobatchDecision(spgate.Mode.SEQUENCE_PARALLEL,
                                                    R.SP_REQUIRED)] * 4)
        # Ids that repeat are refused, naming the id.
        with self.assertRaisesRegex(spgate.InvalidArgumentError, "id"):
            c.submit_plan(spgate.BatchPlan(1, microbatches=[spgate.MicrobatchPlan(0, MIXED)] * 4))
        c.close()


def run_example(steps, *extra):
    """train.py with two stages of 4 micro-batches on 4 ranks: (summary, each rank's log)."""
    with tempfile.TemporaryDirectory(prefix="spgate-torch-pp-") as d:
        summary_path = os.path.join(d, "summary.json")
        prefix = os.path.join(d, "decisions")
        cmd = [sys.executable, TRAIN, "--world=4", "--tp=2", "--pp=2", "--microbatches=4",
               f"--steps={steps}", "--layers=2", "--tokens_per_batch=256",
               f"--summary_json={summary_path}", f"--decision_log={prefix}", *extra]
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=120)
        if run.returncode != 0:
            raise AssertionError(run.stdout[-4000:])
        with open(summary_path) as f:
            s = json.load(f)
        logs = []
        for r in range(4):
            with open(f"{prefix}.rank{r}.csv") as f:
                logs.append(f.read().splitlines())
    return s, logs


class PipelineExampleTest(unittest.TestCase):
    def test_two_stages_against_a_live_daemon(self):
        from daemon_util import Daemon
        daemon = Daemon()
        try:
            s, logs = run_example(3, "--job_id=torch-pp-daemon",
                                  f"--controller={daemon.address}",
                                  "--decision_deadline_ms=2000")
            text = daemon.metrics()
        finally:
            daemon.stop()
        # Each step's record carried its micro-batches' compute, none refused, and each
        # stage learned from its own (docs/design.md §12).
        self.assertIn('spgate_telemetry_records_total{result="rejected"} 0', text)
        learned = [dict(re.findall(r'(\w+)="([^"]*)"', line)) for line in text.splitlines()
                   if line.startswith("spgate_stage_adaptive_tokens_per_second{")]
        self.assertEqual({(l["job_id"], l["stage"]) for l in learned},
                         {("torch-pp-daemon", "0"), ("torch-pp-daemon", "1")}, text)
        # Every step's plan answered by the daemon, at both stages (sources count once a
        # replica, at its first stage); one telemetry record a step per stage's group.
        self.assertEqual(s["decision_sources"], {"daemon": 3})
        self.assertEqual(s["daemon_decisions"], 2 * 3)
        self.assertEqual((s["local_decisions"], s["lost_telemetry"], s["telemetry_acked"]),
                         (0, 0, 2 * 3))
        self.assertEqual({row.split(",")[3] for log in logs for row in log[1:]}, {"daemon"})
        self.assertEqual(s["consistency_violations"], 0)

    def test_two_stages(self):
        steps = 3
        s, logs = run_example(steps, "--controller=", "--job_id=torch-pp")
        self.assertEqual((s["layout"]["tp"], s["layout"]["pp"], s["layout"]["dp"],
                          s["layout"]["microbatches"], s["layout"]["schedule"]),
                         (2, 2, 1, 4, "1f1b"))
        self.assertEqual(s["p2p_size_mismatches"], 0)
        self.assertGreater(s["p2p_bytes_sent"], 0)
        self.assertEqual(s["consistency_violations"], 0)
        self.assertEqual([st["stage"] for st in s["stages"]], [0, 1])
        for st in s["stages"]:
            self.assertEqual(sum(n for r in st["decisions"].values() for n in r.values()),
                             steps * 4, st)
            self.assertGreater(st["peak_memory_bytes"], 0)
        # The plans' bytes come from the calibrated memory model: each stage's predicted
        # peak over the schedule is the measured one (saved tensors), within 1 %.
        self.assertLess(s["memory_prediction_max_rel_error"], 0.01, s["stages"])
        # The top-level decisions are the stages' sum; one log row per (step, micro-batch)
        # with its stage, the same on both ranks of a stage, counted as the summary's.
        self.assertEqual(sum(n for r in s["decisions"].values() for n in r.values()),
                         2 * steps * 4)
        self.assertEqual(logs[0][0], "step,mode,reason,source,stage,micro_batch")
        self.assertEqual(logs[0], logs[1])
        self.assertEqual(logs[2], logs[3])
        for rank, stage in ((0, 0), (2, 1)):
            rows = [line.split(",") for line in logs[rank][1:]]
            self.assertEqual([(int(r[0]), int(r[5])) for r in rows],
                             [(n, i) for n in range(steps) for i in range(4)])
            self.assertEqual({r[4] for r in rows}, {str(stage)})
            counted = {}
            for r in rows:
                counted.setdefault(r[1], {}).setdefault(r[2], 0)
                counted[r[1]][r[2]] += 1
            self.assertEqual(counted, s["stages"][stage]["decisions"])
        self.assertIsNotNone(s["loss_first"])


if __name__ == "__main__":
    unittest.main()
