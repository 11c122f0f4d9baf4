#!/usr/bin/env python3
"""A small GPT trained on CPU by 4 processes - 2 tensor-parallel (TP) groups of 2 ranks,
data parallel across the groups - with spgate choosing, batch by batch and per TP group,
sequence parallel (SP) or TP-only (docs/design.md §4):

  - the group leader submits the plan (sequence lengths) for step n+1 while step n runs;
  - every rank gets its TP group's decider from one call, spgate.torch.connect (the launch
    agreed, the leader's session opened; a refused job id, token or launch raises there on
    every rank), and calls decider.decide(n) (the leader asks spgated; past the deadline or
    without a daemon it decides locally; everyone gets the leader's decision over the TP
    group's gloo broadcast), logs it, and runs step n in that mode through
    spgate.torch.parallel's layers (SP chosen per forward call);
  - every rank reports its telemetry (step time, reduce-scatter and all-gather time,
    effective tokens, peak memory) to GroupDecider.report_telemetry, which reduces the TP
    group's records (each value's maximum over the ranks) into the leader: the leader's
    Client holds the group's one session with spgated (group_session, the default) and
    sends one record per step for the group, and the other ranks have no Client at all;
    at the end rank 0 prints the summary JSON with every
    top-level key spgate-worker writes (worker/runtime/summary.cc) and its rules - those
    whose quantity this example does not have (device allocations on CPU, predicted
    memory, norm-boundary stalls) are present but empty (docs/pytorch.md).

Start it with torch.multiprocessing (this script spawns the ranks itself): Debian 12's
torchrun (torch 1.13) fails on Python 3.11, so `/usr/bin/python3 train.py ...` is the way
to run it - Debian's interpreter, the one python3-torch is installed for (a `python3` first
on PATH may be another one, without torch: docs/pytorch.md). All ranks run on this
machine: the ranks rendezvous at a store main() serves on 127.0.0.1 (join_ranks), so mpirun
and multi-node runs are not supported as written; a job started by its own launcher runs
run_rank's body after init_process_group(init_method="env://"), docs/pytorch.md.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch/train.py \
        --controller=127.0.0.1:50061 --job_id=torch-demo --steps=30 --summary_json=/tmp/summary.json

Against a daemon with TLS and a worker token, add spgate-worker's TLS flags and the token
file: --tls_ca=ca.pem [--tls_cert=worker.pem --tls_key=worker.key] [--tls_server_name=...]
--worker_token_file=token.

The launch's incarnation and credential (docs/design.md §10) need no configuration:
spgate.torch.connect agrees on them (spgate.torch.agree_on_launch), and world rank 0's
(--incarnation or the launcher's run id or a new one; SPGATE_LAUNCH_CREDENTIAL or a new
one) reach every rank over the job's own process group, as under torchrun or srun.

Batches are packed variable-length sequences from a bimodal length mix, so some batches
pass the length-CV gate (SP) and others do not (TP-only). Exits 1 on a consistency
violation or a failed rank; 2 on a usage error - a bad flag or model shape, refused before
any rank starts - or when spgated refuses the job (each rank says why, before any step).
A daemon that does not answer is no error: the leaders wait at most 5 s for it at the
start (connect_timeout), every step falls back to the local policy, and at the end each
leader waits at most 10 s to flush its telemetry.

Pipelined (docs/design.md §12; spgate.torch.pipeline): --pp=P --microbatches=M runs P
stages of layers / P blocks each, world = tp x pp x dp. The replica's first stage's leader
draws each step's M micro-batches and shares their lengths with every stage; each stage's
leader submits a step plan (a micro-batch's lengths and bytes in each mode) and every rank
of its TP group gets a decision per micro-batch; the stages run 1F1B with the
sequence-sharded boundary (so stages may run one micro-batch in different modes), every
message's size checked. The decision log gets a row per (step, micro-batch) with its stage,
the summary `layout`, `stages` and `p2p_size_mismatches` (docs/pytorch.md):

    PYTHONPATH=build/python /usr/bin/python3 examples/torch/train.py --controller= \
        --job_id=torch-pp --pp=2 --microbatches=4 --steps=10 --summary_json=/tmp/summary.json
"""
import argparse
import datetime
import json
import math
import os
import random
import statistics
import sys
import time


def at_least(minimum, kind=int, below=None, most=None):
    """An argparse type: a `kind` >= minimum (and < below, <= most when given), or a usage
    error that argparse prefixes with the flag."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("not %s: %r" % (
                "an integer" if kind is int else "a number", text)) from None
        bounds = ">= %s" % minimum
        ok = value >= minimum  # False for nan
        if below is not None:
            bounds, ok = bounds + " and < %s" % below, ok and value < below
        if most is not None:
            bounds, ok = bounds + " and <= %s" % most, ok and value <= most
        if not ok:
            raise argparse.ArgumentTypeError("must be %s, got %s" % (bounds, text))
        return value
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # --controller, --job_id and --worker_token_file default to the variables spgate's
    # Kubernetes sidecar sets (docs/deploy.md), as spgate.torch.connect reads them.
    env = os.environ.get
    p.add_argument("--controller", default=None,
                   help="spgated worker API; --controller= (empty): the local policy only "
                        "(default: SPGATE_CONTROLLER; an error when neither gives one)")
    p.add_argument("--job_id", default=None,
                   help="default: SPGATE_JOB_ID, else SLURM_JOB_NAME; required with a "
                        "controller")
    p.add_argument("--incarnation", default="",
                   help="this launch of the job, the same on every rank; default: the "
                        "launcher's (SPGATE_INCARNATION, TORCHELASTIC_RUN_ID, ...) or a new "
                        "one made by world rank 0 (spgate.torch.agree_on_launch)")
    p.add_argument("--world", type=at_least(1), default=4,
                   help="processes (ranks): tp x pp x dp")
    p.add_argument("--tp", type=at_least(1), default=2, help="ranks per TP group")
    p.add_argument("--pp", type=at_least(1), default=1,
                   help="pipeline stages (docs/design.md §12); each runs layers / pp blocks")
    p.add_argument("--microbatches", type=at_least(1), default=1,
                   help="micro-batches per optimizer step (1F1B over the stages); with "
                        "--pp=1 --microbatches=1 the step is one batch, as before")
    p.add_argument("--memory_budget", type=at_least(0), default=0,
                   help="bytes: the stages' plans' memory budget for the schedule-aware memory "
                        "gate (pipelined runs; 0: none)")
    p.add_argument("--steps", type=at_least(1), default=30)
    p.add_argument("--layers", type=at_least(1), default=2)
    p.add_argument("--hidden", type=at_least(1), default=64)
    p.add_argument("--heads", type=at_least(1), default=4)
    p.add_argument("--ffn_hidden", type=at_least(1), default=256)
    p.add_argument("--vocab", type=at_least(1), default=128)
    p.add_argument("--dropout", type=at_least(0.0, float, below=1.0), default=0.1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--tokens_per_batch", type=at_least(1), default=1024)
    p.add_argument("--short", type=at_least(1), default=64, help="bimodal lengths: short")
    p.add_argument("--long", type=at_least(1), default=512, help="bimodal lengths: long")
    p.add_argument("--p_long", type=at_least(0.0, float, most=1.0), default=0.3)
    p.add_argument("--decision_deadline_ms", type=at_least(0.0, float), default=20.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--summary_json", default="")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="rank 0: a progress line on stderr every 2 s (spgate.progress; "
                        "default: when stderr is a terminal)")
    p.add_argument("--decision_log", default="",
                   help="PREFIX: one CSV per rank, PREFIX.rank<N>.csv "
                        "(step,mode,reason,source,stage,micro_batch)")
    # TLS: the names and meaning of spgate-worker's flags (worker/client/tls_flags.cc).
    p.add_argument("--tls_ca", default="",
                   help="PEM roots that sign the daemon's certificate; turns TLS on")
    p.add_argument("--tls_cert", default="",
                   help="PEM client certificate for mTLS (needs --tls_key); turns TLS on")
    p.add_argument("--tls_key", default="", help="PEM private key of --tls_cert")
    p.add_argument("--tls_server_name", default="",
                   help="name to check in the daemon's certificate (default: the host of "
                        "--controller)")
    p.add_argument("--worker_token_file", default=env("SPGATE_WORKER_TOKEN_FILE", ""),
                   help="worker token file: its first credential line's token (the part "
                        "after NAME:, as every spgate client reads it); sent as "
                        "'authorization: Bearer <token>' (default: SPGATE_WORKER_TOKEN_FILE)")
    args = p.parse_args(argv)
    # As spgate.torch.connect reads them: no controller at all is an error, not a run that
    # silently decides every step locally; a local run needs no job id.
    if args.controller is None:
        args.controller = env("SPGATE_CONTROLLER", "")
        if not args.controller:
            p.error("--controller: required (or set SPGATE_CONTROLLER); --controller= "
                    "decides every step locally")
    if args.job_id is None:
        args.job_id = env("SPGATE_JOB_ID") or env("SLURM_JOB_NAME") or ""
        if args.controller and not args.job_id:
            p.error("--job_id: required with a controller (or set SPGATE_JOB_ID)")
    if not args.lr > 0:
        p.error("argument --lr: must be > 0, got %s" % args.lr)
    if args.world % (args.tp * args.pp):
        p.error("--world must be a multiple of --tp x --pp (world = tp x pp x dp)")
    if args.layers % args.pp:
        p.error("--layers must be a multiple of --pp (each stage runs layers / pp blocks)")
    # The model's shape by the layers' own rule, refused here as spgate-worker refuses it
    # (exit 2 naming the flag), not by every rank's traceback once the ranks have started.
    from spgate.torch.parallel import block_shape_problems
    for name, value, by, divisor in block_shape_problems(args.hidden, args.heads,
                                                         args.ffn_hidden, args.tp)[:1]:
        p.error(f"--{name}={value} is not divisible by --{by}={divisor}")
    if (args.tls_key or args.tls_server_name) and not (args.tls_ca or args.tls_cert):
        p.error("--tls_key and --tls_server_name need --tls_ca or --tls_cert (TLS is off "
                "without them)")
    args.worker_token = ""
    if args.worker_token_file:
        import spgate  # the one rule every client reads the file by (worker/client/tls.h)
        try:
            args.worker_token = spgate.read_worker_token_file(args.worker_token_file)
        except spgate.Error as e:
            p.error(f"--worker_token_file: {e}")
    return args


def tls_options(args):
    """spgate.Client's tls= from the --tls_* flags: None (plaintext) unless --tls_ca or
    --tls_cert is given, as in spgate-worker."""
    if not (args.tls_ca or args.tls_cert):
        return None
    return {"ca": args.tls_ca, "cert": args.tls_cert, "key": args.tls_key,
            "server_name": args.tls_server_name}


# ---- data -------------------------------------------------------------------------------

def connect(args, rank, **groups):
    """spgate.torch.connect with the example's flags: every rank gets its TP group's
    decider (the leader's session waited for at most 5 s; an unreachable daemon is said
    once, and steps fall back meanwhile). A refusal - a bad job id, a wrong or missing
    worker token, another launch holding the job - raises on every rank: this rank says so
    and exits 2."""
    import spgate
    import spgate.torch
    try:
        return spgate.torch.connect(
            controller=args.controller, job_id=args.job_id, incarnation=args.incarnation,
            connect_timeout=5.0, decision_deadline=args.decision_deadline_ms / 1000.0,
            seed=args.seed + rank, tls=tls_options(args), worker_token=args.worker_token,
            **groups)
    except spgate.Error as e:
        print(f"rank {rank}: {e}", file=sys.stderr, flush=True)
        sys.exit(2)


def batch_lengths(args, group, step):
    """The packed batch of TP group `group` at `step`: a pure function, so every rank of
    the group (and the leader, a step early, for the plan) builds the same one."""
    rng = random.Random((args.seed * 1_000_003 + group) * 1_000_003 + step)
    if rng.random() < 0.5:  # a bucketed batch: similar lengths (low CV)
        n = args.long if rng.random() < args.p_long else args.short
        lengths = [max(1, int(n * rng.uniform(0.9, 1.1)))]
        while sum(lengths) + lengths[0] <= args.tokens_per_batch:
            lengths.append(max(1, int(n * rng.uniform(0.9, 1.1))))
        return lengths
    lengths = []
    while True:
        n = args.long if rng.random() < args.p_long else args.short
        if lengths and sum(lengths) + n > args.tokens_per_batch:
            return lengths
        lengths.append(min(n, args.tokens_per_batch))


def batch_tokens(args, group, step, lengths):
    """Sequences of x[i+1] = (5 x[i] + 3) mod vocab from a random start: learnable."""
    import torch
    g = torch.Generator()
    g.manual_seed(args.seed * 7 + group * 100_003 + step)
    seqs = []
    for n in lengths:
        x = int(torch.randint(0, args.vocab, (1,), generator=g))
        seq = []
        for _ in range(n):
            seq.append(x)
            x = (5 * x + 3) % args.vocab
        seqs.append(seq)
    tokens = torch.tensor([t for s in seqs for t in s])
    targets = torch.tensor([t for s in seqs for t in (s[1:] + [-100])])
    return tokens, targets


# ---- one rank ---------------------------------------------------------------------------

class SavedBytes:
    """Bytes of activations autograd keeps for backward (storages counted once)."""

    def __init__(self):
        self.seen, self.bytes = set(), 0

    def pack(self, t):
        try:
            key = t.untyped_storage().data_ptr()
            size = t.untyped_storage().nbytes()
        except AttributeError:  # torch < 2.0
            key = t.storage().data_ptr()
            size = t.storage().nbytes()
        if key not in self.seen:
            self.seen.add(key)
            self.bytes += size
        return t


def pipelined(args):
    return args.pp > 1 or args.microbatches > 1


def join_ranks(rank, world, port):
    """The rank's gloo process group, met at the store main() serves on 127.0.0.1:port."""
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, world, False, timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)


def run_rank(rank, world, args, port):
    if pipelined(args):
        return run_pipeline_rank(rank, world, args, port)
    import torch
    import torch.distributed as dist
    import spgate
    from spgate.torch import parallel as P

    torch.set_num_threads(1)
    join_ranks(rank, world, port)
    tp_size, groups = args.tp, world // args.tp
    group, tp_rank = rank // tp_size, rank % tp_size
    # Every rank creates every group, in the same order (torch.distributed's rule).
    tp_groups = [dist.new_group(list(range(g * tp_size, (g + 1) * tp_size))) for g in range(groups)]
    dp_groups = [dist.new_group(list(range(r, world, tp_size))) for r in range(tp_size)]
    tp_pg, dp_pg = tp_groups[group], dp_groups[tp_rank]
    decider = connect(args, rank, tp_group=tp_pg, group=group)
    client = decider.client  # the leader's (its counters for the summary); None elsewhere

    tp = P.TensorParallel(tp_pg)
    torch.manual_seed(args.seed)
    model = P.ParallelGPT(vocab=args.vocab, hidden=args.hidden, heads=args.heads,
                          ffn_hidden=args.ffn_hidden, layers=args.layers,
                          max_positions=max(args.long, args.short) + 64, tp=tp, seed=args.seed,
                          dropout=args.dropout)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    # Peak memory of a step (docs/design.md §2): parameters, gradients and Adam's two moments (4x the
    # parameter bytes), plus the activations autograd keeps for backward (measured).
    state_bytes = 4 * sum(p.numel() * p.element_size() for p in model.parameters())


    log_file = None
    if args.decision_log:
        log_file = open(f"{args.decision_log}.rank{rank}.csv", "w")
        log_file.write("step,mode,reason,source,stage,micro_batch\n")

    records = []
    progress = make_progress(args, rank)
    decider.submit_plan(0, batch_lengths(args, group, 0))
    for step in range(args.steps):
        lengths = batch_lengths(args, group, step)
        tokens, targets = batch_tokens(args, group, step, lengths)  # prefetched data
        if step + 1 < args.steps:  # the plan for n+1 goes out while n runs
            decider.submit_plan(step + 1, batch_lengths(args, group, step + 1))
        t0 = time.perf_counter()
        d = decider.decide(step)
        t1 = time.perf_counter()
        if log_file:
            log_file.write(f"{step},{d.mode.label},{d.reason.label},{d.source.label},0,0\n")

        batch = P.PackedBatch.make(lengths, tp, d.mode, dropout_seed=args.seed * 1009 + step)
        tp.timer.reset()
        saved = SavedBytes()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            loss = model(tokens, targets, batch)
        loss.backward()
        # Norm-boundary collectives: none here. spgate.torch.parallel runs LayerNorm on the
        # sequence shard under SP (spgate-worker's --norm_boundary=shard), so there is no
        # gather/scatter around the norms to time and norm_stall_s is not reported.
        P.finish_gradients(model, tp)        # replicated grads: SUM over the TP group
        if groups > 1:                       # data parallel: mean over the TP groups
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat, group=dp_pg)
            flat /= groups
            off = 0
            for p in model.parameters():
                p.grad.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()
        opt.step()
        opt.zero_grad(set_to_none=False)
        step_time = time.perf_counter() - t1
        times = tp.timer.totals()
        group_loss = float(tp.all_reduce(loss.detach()) if batch.sequence_parallel else loss)
        peak = state_bytes + saved.bytes
        # Every rank, every step (a collective over the TP group): the leader sends the
        # group's record - each value the max over its ranks, the slowest rank named - and
        # hands the group's reduce-scatter wait share (the max over its ranks, docs/design.md
        # §2) to its fail-static fallback, which otherwise only sees its own rank's.
        decider.report_telemetry(spgate.StepTelemetry(
            step=step, mode=d.mode, reason=d.reason, step_time_s=step_time,
            rs_wait_s=times["reduce_scatter"], all_gather_s=times["all_gather"],
            effective_tokens=batch.tokens, padding_tokens=batch.padding_tokens,
            peak_memory_bytes=peak))
        # "step" is the decision's own step, so the summary's consistency check compares
        # the step each rank ran as well as the mode (as spgate-worker's does).
        records.append({"step": d.step, "mode": d.mode.label, "reason": d.reason.label,
                        "source": d.source.label, "tokens": batch.tokens,
                        "padding": batch.padding_tokens, "step_time_s": step_time,
                        "decision_s": t1 - t0, "rs_s": times["reduce_scatter"],
                        "ag_s": times["all_gather"], "ar_s": times["all_reduce"],
                        "peak": peak, "loss": group_loss,
                        "length_cv": _cv(lengths)})
        progress.add(tokens=batch.tokens, mode=d.mode)
    progress.finish()
    if log_file:
        log_file.close()
    finish_run(args, world, rank, records, finish_client(client, args), client)


# ---- pipelined: stages and micro-batches (docs/design.md §12) ---------------------------

def microbatch_lengths(args, replica, step, i):
    """Micro-batch i of replica `replica`'s step: a pure function, so the replica's first
    stage (which loads data) and its last (which needs the targets) build the same one."""
    return batch_lengths(args, replica * args.microbatches + i, step)


def microbatch_data(args, replica, step, i, lengths):
    return batch_tokens(args, replica * args.microbatches + i, step, lengths)


# What a micro-batch costs this stage's memory, for its step plans (docs/design.md §12):
# the bytes autograd keeps from its forward to its backward, in each mode. The model's
# saved tensors are, per micro-batch, linear in four features - a constant, the rows this
# rank holds (SP: tokens padded to t, over t, for the sharded parts; every count below is
# a function of the rows and the lengths), the sum of squared sequence lengths (attention's
# scores) and the number of sequences - so calibrate_stage_memory measures a few probe
# forwards per mode at start-up (saved_tensors_hooks, no backward) and fits them; the
# plans then carry the fitted bytes, and the summary's memory_prediction_max_rel_error
# says how close the schedule's predicted peak came to the measured one.
PROBE_LENGTHS = ([64, 64], [128], [32, 32, 32, 32], [96, 32, 64], [200, 8], [16] * 10)


def memory_features(lengths, tp, sequence_parallel):
    tokens = sum(lengths)
    rows = -(-tokens // tp) * tp if sequence_parallel else tokens
    return [1.0, float(rows), float(sum(n * n for n in lengths)), float(len(lengths))]


def calibrate_stage_memory(args, model, tp, grid):
    """Per mode, the coefficients of memory_features that give the bytes one micro-batch's
    forward keeps on this stage, fitted to probe forwards (every rank of the TP group runs
    the same probes: their collectives match). Returns {sequence_parallel: coefficients}."""
    import torch
    from spgate.torch import parallel as P
    from spgate.torch import pipeline as PL
    import spgate
    fits = {}
    for mode in (spgate.Mode.SEQUENCE_PARALLEL, spgate.Mode.TENSOR_PARALLEL_ONLY):
        rows, measured = [], []
        for k, lengths in enumerate(PROBE_LENGTHS):
            batch = P.PackedBatch.make(lengths, tp, mode, dropout_seed=k)
            tokens, targets = batch_tokens(args, 0, k, lengths)
            x = None
            if not grid.is_first:
                x = torch.zeros(PL.boundary_rows(lengths, args.tp), args.hidden,
                                requires_grad=True)
            counter = SavedBytes()
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
                if x is not None:
                    x = PL.stage_input(x, batch, tp)
                out = model(x, tokens, targets, batch)
            del out
            rows.append(memory_features(lengths, args.tp, batch.sequence_parallel))
            measured.append(float(counter.bytes))
        a = torch.tensor(rows, dtype=torch.float64)
        b = torch.tensor(measured, dtype=torch.float64).unsqueeze(1)
        fits[mode == spgate.Mode.SEQUENCE_PARALLEL] = \
            torch.linalg.lstsq(a, b).solution.squeeze(1).tolist()
    return fits


def stage_memory(args, lengths, fits):
    def predict(sp):
        c = fits[sp]
        return max(0, int(round(sum(w * f for w, f in
                                    zip(c, memory_features(lengths, args.tp, sp))))))
    return {"activation_sp": predict(True), "activation_tp": predict(False),
            "workspace_sp": 0, "workspace_tp": 0}


def run_pipeline_rank(rank, world, args, port):
    """One rank of a tp x pp x dp job: its stage's blocks, a decision per micro-batch for
    its TP group (the stage leader's spgate.Client with the job's layout, shared over the
    group by spgate.torch.PipelineDecider), the step's lengths from the replica's first
    stage, the sequence-sharded stage boundary and the 1F1B schedule
    (spgate.torch.pipeline)."""
    import torch
    import torch.distributed as dist
    import spgate
    from spgate.torch import parallel as P
    from spgate.torch import pipeline as PL

    torch.set_num_threads(1)
    join_ranks(rank, world, port)
    grid = PL.PipelineGrid(tp=args.tp, pp=args.pp, microbatches=args.microbatches)
    m = args.microbatches
    decider = connect(args, rank, pp_group=grid)  # the stage's PipelineDecider
    client = decider.client
    tp = P.TensorParallel(grid.tp_group)
    model = P.ParallelGPTStage(vocab=args.vocab, hidden=args.hidden, heads=args.heads,
                               ffn_hidden=args.ffn_hidden, layers=args.layers,
                               max_positions=max(args.long, args.short) + 64, tp=tp,
                               stage=grid.stage, stages=args.pp, seed=args.seed,
                               dropout=args.dropout)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    state_bytes = 4 * sum(p.numel() * p.element_size() for p in model.parameters())

    memory_fits = calibrate_stage_memory(args, model, tp, grid)
    link = PL.StageLink(grid.prev_rank, grid.next_rank)
    ops = grid.schedule()

    log_file = None
    if args.decision_log:
        log_file = open(f"{args.decision_log}.rank{rank}.csv", "w")
        log_file.write("step,mode,reason,source,stage,micro_batch\n")

    def plan(step):
        """Step `step`'s lengths reach every rank of the replica (from its first stage's
        leader, which loads the data), and the stage's leader submits its step plan."""
        mine = None
        if grid.is_data_leader:
            mine = [microbatch_lengths(args, grid.dp_index, step, i) for i in range(m)]
        lengths = decider.share_lengths(step, mine)
        decider.submit_plan(step, lengths,
                            memory=[stage_memory(args, ls, memory_fits) for ls in lengths],
                            resident_bytes=state_bytes, memory_budget_bytes=args.memory_budget)
        return lengths

    records = []
    progress = make_progress(args, rank)
    next_lengths = plan(0)
    for step in range(args.steps):
        lengths = next_lengths
        if step + 1 < args.steps:  # the plans for n+1 go out while n runs
            next_lengths = plan(step + 1)
        t0 = time.perf_counter()
        d = decider.decide(step)
        t1 = time.perf_counter()
        modes = [x.mode for x in d.microbatches]
        if log_file:
            for i, x in enumerate(d.microbatches):
                # A fallback's rows say controller_unavailable, as its step does.
                reason = d.reason if d.reason == spgate.Reason.CONTROLLER_UNAVAILABLE else x.reason
                log_file.write(f"{step},{x.mode.label},{reason.label},{d.source.label},"
                               f"{grid.stage},{i}\n")
        batches = [P.PackedBatch.make(lengths[i], tp, modes[i],
                                      dropout_seed=(args.seed * 1009 + step) * 131 + i)
                   for i in range(m)]
        data = [microbatch_data(args, grid.dp_index, step, i, lengths[i])
                if grid.is_first or grid.is_last else (None, None) for i in range(m)]
        saved = [0] * m

        def forward(i, x):
            counter = SavedBytes()
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
                if x is not None:
                    x = PL.stage_input(x, batches[i], tp)
                tokens, targets = data[i]
                out = model(x, tokens, targets, batches[i], loss_scale=1.0 / m)
                if not grid.is_last:
                    out = PL.stage_output(out, batches[i], tp)
            saved[i] = counter.bytes
            return out

        tp.timer.reset()
        link.wait_s = 0.0
        mb_times = {}
        losses = PL.run_1f1b(link, ops, grid.is_first, grid.is_last, forward,
                             lambda i: (PL.boundary_rows(lengths[i], args.tp), args.hidden),
                             times=mb_times, timer=tp.timer)
        P.finish_gradients(model, tp)
        if grid.dp > 1:
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat, group=grid.dp_group)
            flat /= grid.dp
            off = 0
            for p in model.parameters():
                p.grad.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()
        opt.step()
        opt.zero_grad(set_to_none=False)
        step_time = time.perf_counter() - t1
        times = tp.timer.totals()
        # What the stage held at once: each micro-batch's saved activations (measured), from
        # its forward to its backward, in the schedule's order.
        held = peak_held = 0
        for forward_op, i, _ in ops:
            held += saved[i] if forward_op else -saved[i]
            peak_held = max(peak_held, held)
        peak = state_bytes + peak_held
        step_loss = None
        if grid.is_last:
            step_loss = sum(float(tp.all_reduce(losses[i]) if batches[i].sequence_parallel
                                  else losses[i]) for i in range(m))
        # The step's record: SP when any micro-batch ran SP (their reduce-scatters are the
        # step's wait), so the group's ranks report one mode, as spgate-worker's.
        any_sp = any(b.sequence_parallel for b in batches)
        step_mode = spgate.Mode.SEQUENCE_PARALLEL if any_sp else spgate.Mode.TENSOR_PARALLEL_ONLY
        tokens = sum(b.tokens for b in batches)
        padding = sum(b.padding_tokens for b in batches)
        # And each micro-batch's compute on this stage, in its own mode: what the stage's
        # ADAPTIVE learns from (docs/design.md §12), reduced over the group with the record.
        per_mb = [spgate.MicrobatchTelemetry(
            id=i, mode=d.microbatches[i].mode, forward_s=mb_times[i]["forward_s"],
            backward_s=max(mb_times[i]["backward_s"], 1e-9),
            rs_wait_s=mb_times[i]["reduce_scatter"], all_gather_s=mb_times[i]["all_gather"],
            effective_tokens=batches[i].tokens) for i in range(m)]
        decider.report_telemetry(spgate.StepTelemetry(
            step=step, mode=step_mode, reason=d.reason, step_time_s=step_time,
            rs_wait_s=times["reduce_scatter"], all_gather_s=times["all_gather"],
            effective_tokens=tokens, padding_tokens=padding, peak_memory_bytes=peak,
            microbatches=per_mb))
        records.append({"step": d.step, "mode": step_mode.label, "reason": d.reason.label,
                        "source": d.source.label, "tokens": tokens, "padding": padding,
                        "step_time_s": step_time, "decision_s": t1 - t0,
                        "rs_s": times["reduce_scatter"], "ag_s": times["all_gather"],
                        "ar_s": times["all_reduce"], "peak": peak, "loss": step_loss,
                        "predicted_peak": d.stage_peak_bytes,
                        "length_cv": sum(_cv(ls) for ls in lengths) / m,
                        "microbatches": [(x.mode.label, x.reason.label)
                                         for x in d.microbatches]})
        sp = sum(1 for x in modes if x == spgate.Mode.SEQUENCE_PARALLEL)
        progress.add(tokens=tokens, sp=sp, tp=m - sp)
    progress.finish()
    if log_file:
        log_file.close()
    counters = finish_client(client, args)
    counters.update({"p2p_size_mismatches": link.size_mismatches,
                     "p2p_bytes_sent": link.bytes_sent, "stage": grid.stage})
    finish_run(args, world, rank, records, counters, client)


def make_progress(args, rank):
    """Rank 0's progress line on stderr (spgate.progress): its TP group's steps, tokens and
    decisions; with --progress, or by default when stderr is a terminal."""
    import spgate.progress
    return spgate.progress.Progress(total_steps=args.steps, label="train.py, TP group 0",
                                    rate_unit="tok/s/group",
                                    enabled=args.progress if rank == 0 else False)


def finish_run(args, world, rank, records, counters, client):
    """Every rank's records and counters to rank 0, which prints and writes the summary;
    exits 1 when the ranks of a group disagreed on a decision."""
    import torch.distributed as dist
    gathered = [None] * world if rank == 0 else None
    dist.gather_object({"records": records, "counters": counters}, gathered, dst=0)
    if client is not None:
        client.close()
    summary = None
    if rank == 0:
        summary = summarize(args, world, gathered)
        text = json.dumps(summary, indent=2, sort_keys=True)
        print(text)
        if args.summary_json:
            with open(args.summary_json, "w") as f:
                f.write(text + "\n")
    dist.barrier()
    dist.destroy_process_group()
    if summary is not None and summary["consistency_violations"]:
        sys.exit(1)


def finish_client(client, args):
    """The leader's counters at the end (flushed first with a daemon); a follower's are 0:
    it has no client, its records went to the leader."""
    import spgate
    if client is None:
        return {"telemetry_sent": 0, "telemetry_acked": 0, "local_decisions": 0,
                "daemon_decisions": 0, "late_decisions": 0, "memory_overrides": 0,
                "flushed": True}
    flushed = True
    if args.controller:
        try:
            client.flush(10.0)
        except spgate.Error:
            flushed = False
    s = client.stats()
    return {"telemetry_sent": s.telemetry_sent, "telemetry_acked": s.telemetry_acked,
            "local_decisions": s.local_decisions, "daemon_decisions": s.daemon_decisions,
            "late_decisions": s.late_decisions, "memory_overrides": s.memory_overrides,
            "flushed": flushed}


def _cv(lengths):
    mean = sum(lengths) / len(lengths)
    return math.sqrt(sum((n - mean) ** 2 for n in lengths) / len(lengths)) / mean


def _p95(values):
    """Nearest-rank p95, as the C++ summary."""
    if not values:
        return 0.0
    v = sorted(values)
    return v[max(0, math.ceil(0.95 * len(v)) - 1)]


def lengths_description(args):
    """run.lengths, in the spirit of spgate-worker's --lengths spec."""
    return (f"bimodal:short={args.short},long={args.long},p_long={args.p_long}"
            f" (half the batches one length +-10%)")


def summarize(args, world, per_rank):
    """The run summary with spgate-worker's keys and rules (worker/runtime/summary.cc,
    Summarize and SummaryJson): a group's step time is its slowest rank's; tokens/s is the
    job's (each group's, summed over the groups; also job_effective_tokens_per_s);
    steps_by_mode (also group_steps_by_mode), sources and local decisions count
    group-steps, decisions group-steps or micro-batches (decision_unit), all the
    leaders'; a consistency violation is a (group, step) whose ranks ran different modes
    or different steps; switch costs compare a mode's first step after a switch with its
    other steps, per token. Keys whose quantity does not exist in this example are
    present but empty ({} for a per-mode map, null for a number): see the comments below
    and docs/pytorch.md. Extra keys: daemon_decisions, loss_first, loss_last.

    Pipelined (--pp, --microbatches): TP group g is stage g % pp of replica g // pp; a
    replica's tokens, time and sources count once, at its first stage; `stages` holds
    each stage's decisions per micro-batch (mode -> reason -> count, the leaders'), the
    largest peak over its ranks and its leaders' predicted peak, and the top-level
    decisions are their sum; a consistency violation is also a (group, step) whose ranks
    ran any micro-batch in a different mode."""
    tp, groups = args.tp, world // args.tp
    pp = getattr(args, "pp", 1)
    microbatches = getattr(args, "microbatches", 1)
    stages = [{"stage": st, "decisions": {}, "peak_memory_bytes": 0,
               "predicted_peak_memory_bytes": 0} for st in range(pp)]
    predicted, prediction_error = {}, None
    decisions, sources, by_mode_steps = {}, {}, {}
    step_times, time_sum, peaks, padding, eff_tokens, cv_sum = {}, {}, {}, {}, {}, {}
    rate = {}
    per_token_switch, per_token_steady = {}, {}  # mode -> [seconds per token of each step]
    rs_share, ag_tail, decision_wait = [], [], []
    violations, local, leader_wait_max = 0, 0, 0.0
    microbatch_decisions = False  # decisions count micro-batches, not group-steps
    for g in range(groups):
        ranks = [per_rank[g * tp + r]["records"] for r in range(tp)]
        g_tokens, g_time = {}, {}
        stage = stages[g % pp]
        for i in range(args.steps):
            recs = [ranks[r][i] for r in range(tp)]
            lead = recs[0]
            mode = lead["mode"]
            if any(r["mode"] != mode or r["step"] != lead["step"]
                   or r.get("microbatches") != lead.get("microbatches") for r in recs) \
                    or lead["step"] != i:
                violations += 1
            stage["peak_memory_bytes"] = max(stage["peak_memory_bytes"],
                                             max(r["peak"] for r in recs))
            microbatch_decisions = microbatch_decisions or bool(lead.get("microbatches"))
            for mb_mode, mb_reason in lead.get("microbatches") or [(mode, lead["reason"])]:
                by_reason = stage["decisions"].setdefault(mb_mode, {})
                by_reason[mb_reason] = by_reason.get(mb_reason, 0) + 1
            if lead.get("predicted_peak"):
                stage["predicted_peak_memory_bytes"] = max(
                    stage["predicted_peak_memory_bytes"], lead["predicted_peak"])
                predicted[mode] = max(predicted.get(mode, 0), lead["predicted_peak"])
                for r in recs:
                    err = abs(lead["predicted_peak"] - r["peak"]) / r["peak"]
                    prediction_error = max(prediction_error or 0.0, err)
            t_max = max(r["step_time_s"] for r in recs)
            rs_max = max((r["rs_s"] / r["step_time_s"] for r in recs if r["step_time_s"] > 0),
                         default=0.0)
            ag_max = max(r["ag_s"] for r in recs)
            dec_max = max(r["decision_s"] for r in recs)
            for key in (mode, "all"):
                peaks[key] = max(peaks.get(key, 0), max(r["peak"] for r in recs))
            if g % pp:  # a replica's tokens, time and sources: once, at its first stage
                continue
            if i > 0 and lead["tokens"] > 0:
                switched = ranks[0][i - 1]["mode"] != mode
                (per_token_switch if switched else per_token_steady).setdefault(
                    mode, []).append(t_max / lead["tokens"])
            sources[lead["source"]] = sources.get(lead["source"], 0) + 1
            if lead["source"] in ("fallback", "local"):
                local += 1
            for key in (mode, "all"):
                step_times.setdefault(key, []).append(t_max)
                time_sum[key] = time_sum.get(key, 0.0) + t_max
                g_tokens[key] = g_tokens.get(key, 0) + lead["tokens"]
                g_time[key] = g_time.get(key, 0.0) + t_max
                eff_tokens[key] = eff_tokens.get(key, 0) + lead["tokens"]
                padding[key] = padding.get(key, 0) + lead["padding"]
                cv_sum[key] = cv_sum.get(key, 0.0) + lead["length_cv"]
                by_mode_steps[key] = by_mode_steps.get(key, 0) + 1
            if mode == "sp":
                rs_share.append(rs_max)
                ag_tail.append(ag_max)
            decision_wait.append(dec_max)
            leader_wait_max = max(leader_wait_max, lead["decision_s"])
        for key, n in g_tokens.items():
            if g_time[key] > 0:
                rate[key] = rate.get(key, 0.0) + n / g_time[key]
    switch_steps, switch_cost = {}, {}
    for mode, firsts in per_token_switch.items():
        # Medians, as spgate-worker: one preempted step must not decide the figure.
        switch_steps[mode] = len(firsts)
        # A ratio needs both sides: a mode that never ran two steps in a row has none.
        steady = statistics.median(per_token_steady[mode]) if per_token_steady.get(mode) else 0
        if steady > 0:
            switch_cost[mode] = statistics.median(firsts) / steady
    for st in stages:  # the top-level decisions: every stage's micro-batches
        for mode, reasons in st["decisions"].items():
            for reason, n in reasons.items():
                decisions.setdefault(mode, {})[reason] = decisions.get(mode, {}).get(reason, 0) + n
    counters = [r["counters"] for r in per_rank]
    sent = sum(c["telemetry_sent"] for c in counters)
    acked = sum(c["telemetry_acked"] for c in counters)
    # The loss is the last stage's (replica 0's).
    losses = [per_rank[(pp - 1) * tp]["records"][s]["loss"] for s in range(args.steps)]
    return {
        "steps": args.steps,
        "decisions": decisions,
        "decision_sources": sources,
        "local_decisions": local,
        # Daemon TP-only answers the leaders' memory gate refused (SP ran); the example's
        # plans carry no memory prediction, so there are none here.
        "memory_overrides": sum(c["memory_overrides"] for c in counters),
        "daemon_decisions": sum(counters[g * tp]["daemon_decisions"] for g in range(groups)),
        "consistency_violations": violations,
        "lost_telemetry": max(0, sent - acked),
        "telemetry_sent": sent,
        "telemetry_acked": acked,
        "effective_tokens_per_s": rate,
        "job_effective_tokens_per_s": rate,  # the same, labelled: the job's, not a group's
        "decision_unit": "microbatches" if microbatch_decisions else "group_steps",
        "step_time_p95_s": {k: _p95(v) for k, v in step_times.items()},
        "step_time_mean_s": {k: time_sum[k] / len(v) for k, v in step_times.items()},
        "switch_cost_ratio": switch_cost,
        "switch_steps": switch_steps,
        # Bytes a step took from the device allocator (spgate-worker: its arena's cache
        # misses). This example trains on CPU, where PyTorch keeps no allocator
        # statistics (torch.cuda.memory_stats exists for CUDA only), so nothing is
        # measured: empty.
        "switch_device_alloc_bytes": {},
        "steady_device_alloc_bytes": {},
        "peak_memory_bytes": peaks,
        # Without pipelines the example submits its plans without a memory prediction
        # (no predicted_peak_bytes_sp/_tp), so there is no predicted peak and no
        # prediction error to report: empty ({}) and null. Pipelined, the stages' plans
        # carry the calibrated memory model's bytes (stage_memory) and the leaders get
        # the stage's predicted peak back with the decision.
        "predicted_peak_memory_bytes": predicted,
        "memory_prediction_max_rel_error": prediction_error,
        "steps_by_mode": by_mode_steps,
        "group_steps_by_mode": by_mode_steps,  # the same, labelled
        "effective_tokens": eff_tokens,
        "padding_tokens": padding,
        "mean_length_cv": {k: cv_sum[k] / len(v) for k, v in step_times.items()},
        "rs_wait_share_mean": sum(rs_share) / len(rs_share) if rs_share else 0.0,
        "all_gather_tail_p95_s": _p95(ag_tail),
        # Norm-boundary stalls do not exist here: LayerNorm runs on the sequence shard
        # (run.norm_boundary "shard") and no collective surrounds it, so nothing is
        # timed: null rather than a made-up 0.
        "norm_stall_ratio_mean": None,
        "decision_wait_p95_s": _p95(decision_wait),
        "leader_decision_wait_max_s": leader_wait_max,
        # docs/design.md §12. With --pp=1 --microbatches=1 one stage, the whole model,
        # one micro-batch a step and no p2p (spgate-worker's --pp=1 --microbatches=1).
        "layout": {"tp": tp, "pp": pp, "dp": groups // pp, "microbatches": microbatches,
                   "schedule": "1f1b", "stage_boundary": "sharded"},
        "stages": stages,
        "p2p_size_mismatches": sum(c.get("p2p_size_mismatches", 0) for c in counters),
        "p2p_bytes_sent": sum(c.get("p2p_bytes_sent", 0) for c in counters),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "run": {"world_size": world, "tp": tp, "dp": groups // pp, "pp": pp,
                "microbatches": microbatches, "backend": "gloo",
                "job_id": args.job_id, "controller": args.controller,
                "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                "ffn_hidden": args.ffn_hidden, "lengths": lengths_description(args),
                "tokens_per_batch": args.tokens_per_batch,
                # The batches come as they are (no bucket_by_tokens), the mode is chosen
                # per batch (spgated or the local policy: spgate-worker's --mode=auto),
                # LayerNorm runs on the shard, and there is no --verify pass.
                "bucketing": False, "mode": "auto", "norm_boundary": "shard",
                "verify": False},
    }


def main(argv=None):
    args = parse_args(argv)
    import torch.distributed as dist
    import torch.multiprocessing as mp
    # The ranks meet at a store this process serves, on a port the kernel chose and that
    # stays bound while they run: a port found free here and bound by a rank seconds later
    # (after it imports torch) can be taken in between by another program.
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=120),
                          wait_for_workers=False)
    port = store.port
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = mp.start_processes(run_rank, args=(args.world, args, port), nprocs=args.world,
                                 join=False, start_method="spawn")
    try:
        while not context.join():
            pass
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:
        print(f"train.py: {e}", file=sys.stderr)
        # A rank that exited 2 was refused (connect: the job id, token or launch) or
        # misconfigured: the run's status is 2, as for a bad flag; any other failure 1.
        return 2 if any(p.exitcode == 2 for p in context.processes) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
