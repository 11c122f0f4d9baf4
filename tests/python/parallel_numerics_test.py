"""spgate.torch.parallel numerics on 2 and 4 gloo ranks (fp32): the TP block stack's
outputs, input gradients and every parameter's gradient under SP equal TP-only and a
single-process reference; a gradient-accumulation window that mixes SP and TP-only
micro-batches equals the reference's accumulated gradients; the small GPT's loss and
gradients agree the same way.

Tolerance: |got - ref| <= ATOL + RTOL * |ref| elementwise, ATOL = 2e-5, RTOL = 1e-4
(fp32; the paths sum the same products in different orders - reduce-scatter vs
all-reduce vs one GEMM - so only rounding may differ; values are O(1)).

Run: PYTHONPATH=build/python python3 tests/python/parallel_numerics_test.py
"""
import os
import sys
import unittest

try:
    import torch
except ImportError:
    print("FAILED: PyTorch is not importable; `make deps` installs python3-torch")
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_util import run_ranks  # noqa: E402

from spgate.torch import parallel as P  # noqa: E402

ATOL, RTOL = 2e-5, 1e-4
HIDDEN, HEADS, FFN, LAYERS = 32, 4, 64, 2
# 103 tokens: not a multiple of 2 or 4, so SP pads; one single-token sequence.
LENGTHS = [37, 5, 60, 1]
WINDOW = [([40, 41, 9], "sp"), ([7, 90], "tp"), ([13] * 5, "sp"), ([64, 2, 3], "tp")]


def make_stack(tp, dropout):
    return torch.nn.ModuleList(P.ParallelTransformerBlock(HIDDEN, HEADS, FFN, tp, seed=5,
                                                          layer=i, dropout=dropout)
                               for i in range(LAYERS))


def batch_data(lengths, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    n = sum(lengths)
    return torch.randn(n, HIDDEN, generator=g), torch.randn(n, HIDDEN, generator=g) / n


def run_stack(stack, tp, lengths, mode, seed, dropout_seed=3):
    """Forward + backward of one micro-batch; returns (full output, full input grad)."""
    x_full, dy_full = batch_data(lengths, seed)
    batch = P.PackedBatch.make(lengths, tp, mode, dropout_seed=dropout_seed)
    x = batch.local_rows(x_full).clone().requires_grad_(True)
    y = x
    for block in stack:
        y = block(y, batch)
    y.backward(batch.local_rows(dy_full))
    calls = dict(tp.timer.calls)  # the layers' collectives, before the test's own gathers
    return gather_rows(y.detach(), batch, tp), gather_rows(x.grad, batch, tp), calls


def gather_rows(local, batch, tp):
    if batch.sequence_parallel:
        local = tp.all_gather_rows(local)
    return local[:batch.tokens].clone()


def reference_stack(dropout, micro_batches):
    tp = P.TensorParallel(None)
    stack = make_stack(tp, dropout)
    stack.train()
    outs = [run_stack(stack, tp, lengths, "tp", seed) for seed, (lengths, _) in micro_batches]
    grads = {n: p.grad.clone() for n, p in stack.named_parameters()}
    return outs, grads


def max_violation(got, ref):
    """max of |got - ref| - (ATOL + RTOL |ref|): <= 0 means within tolerance."""
    return float(((got - ref).abs() - (ATOL + RTOL * ref.abs())).max())


def single_batch_rank(rank, world):
    import torch.distributed as dist
    tp = P.TensorParallel(dist.group.WORLD)
    out = {}
    ref_outs, ref_grads = reference_stack(0.1, [(11, (LENGTHS, "tp"))])
    for mode in ("sp", "tp"):
        stack = make_stack(tp, dropout=0.1)
        stack.train()
        tp.timer.reset()
        y, dx, calls = run_stack(stack, tp, LENGTHS, mode, 11)
        # Before finishing: under SP the replicated grads are partial (the rule matters).
        pre = P.gather_full(stack, tp, "grad")
        P.finish_gradients(stack, tp)
        grads = P.gather_full(stack, tp, "grad")
        out[mode] = {
            "y": max_violation(y, ref_outs[0][0]),
            "dx": max_violation(dx, ref_outs[0][1]),
            "grads": {n: max_violation(g, ref_grads[n]) for n, g in grads.items()},
            "pre_ln1_w": max_violation(pre["0.ln1.weight"], ref_grads["0.ln1.weight"]),
            "calls": calls,
            "y_full": y, "grads_full": grads,
        }
    return out


def window_rank(rank, world):
    import torch.distributed as dist
    tp = P.TensorParallel(dist.group.WORLD)
    micro = list(enumerate(WINDOW, start=20))
    _, ref_grads = reference_stack(0.0, micro)
    stack = make_stack(tp, dropout=0.0)
    for seed, (lengths, mode) in micro:
        run_stack(stack, tp, lengths, mode, seed)
    P.finish_gradients(stack, tp)
    grads = P.gather_full(stack, tp, "grad")
    return {n: max_violation(g, ref_grads[n]) for n, g in grads.items()}


def gpt_rank(rank, world):
    import torch.distributed as dist
    lengths = [9, 30, 2, 21]
    g = torch.Generator()
    g.manual_seed(4)
    tokens = torch.randint(0, 50, (sum(lengths),), generator=g)
    targets = tokens.roll(-1).clone()
    ends = torch.tensor(lengths).cumsum(0) - 1
    targets[ends] = -100

    def run(tp, mode):
        model = P.ParallelGPT(vocab=50, hidden=HIDDEN, heads=HEADS, ffn_hidden=FFN, layers=2,
                              max_positions=64, tp=tp, seed=9)
        batch = P.PackedBatch.make(lengths, tp, mode)
        loss = model(tokens, targets, batch)
        loss.backward()
        P.finish_gradients(model, tp)
        total = tp.all_reduce(loss.detach()) if batch.sequence_parallel else loss.detach()
        return total, P.gather_full(model, tp, "grad")

    ref_loss, ref_grads = run(P.TensorParallel(None), "tp")
    tp = P.TensorParallel(dist.group.WORLD)
    res = {}
    for mode in ("sp", "tp"):
        loss, grads = run(tp, mode)
        res[mode] = {"loss": max_violation(loss, ref_loss),
                     "grads": {n: max_violation(x, ref_grads[n]) for n, x in grads.items()}}
    return res


class ParallelNumericsTest(unittest.TestCase):
    def check_within(self, value, what):
        self.assertLessEqual(value, 0.0, f"{what} exceeds the tolerance by {value:.3g}")

    def single_batch(self, world):
        results = run_ranks(world, single_batch_rank)
        for rank, res in enumerate(results):
            for mode in ("sp", "tp"):
                r = res[mode]
                self.check_within(r["y"], f"t={world} rank {rank} {mode} output")
                self.check_within(r["dx"], f"t={world} rank {rank} {mode} input grad")
                self.assertEqual(len(r["grads"]), 12 * LAYERS)
                for name, v in r["grads"].items():
                    self.check_within(v, f"t={world} rank {rank} {mode} grad {name}")
            # The paths really differ: SP reduce-scatters and gathers, TP-only all-reduces.
            sp, tp = res["sp"]["calls"], res["tp"]["calls"]
            # Per layer: 2 reduce-scatters in forward and 2 in backward; 2 all-gathers in
            # forward, 2 in backward (row-parallel outputs) and 2 re-gathers of the
            # column-parallel inputs for the weight gradients.
            self.assertEqual(sp["reduce_scatter"], 4 * LAYERS)
            self.assertEqual(sp["all_gather"], 6 * LAYERS)
            self.assertEqual(sp["all_reduce"], 0)
            self.assertEqual(tp["reduce_scatter"] + tp["all_gather"], 0)
            self.assertEqual(tp["all_reduce"], 2 * LAYERS * 2)
            # Under SP the LayerNorm grads are partial until finish_gradients sums them.
            self.assertGreater(res["sp"]["pre_ln1_w"], 0.0)
            # SP equals TP-only directly too.
            self.assertLessEqual(max_violation(res["sp"]["y_full"], res["tp"]["y_full"]), 0.0)
            for name, g in res["sp"]["grads_full"].items():
                self.assertLessEqual(max_violation(g, res["tp"]["grads_full"][name]), 0.0, name)

    def test_single_batch_2_ranks(self):
        self.single_batch(2)

    def test_single_batch_4_ranks(self):
        self.single_batch(4)

    def window(self, world):
        for rank, grads in enumerate(run_ranks(world, window_rank)):
            self.assertEqual(len(grads), 12 * LAYERS)
            for name, v in grads.items():
                self.check_within(v, f"t={world} rank {rank} window grad {name}")

    def test_mixed_accumulation_window_2_ranks(self):
        self.window(2)

    def test_mixed_accumulation_window_4_ranks(self):
        self.window(4)

    def test_gpt_2_ranks(self):
        for rank, res in enumerate(run_ranks(2, gpt_rank)):
            for mode in ("sp", "tp"):
                self.check_within(res[mode]["loss"], f"rank {rank} {mode} loss")
                for name, v in res[mode]["grads"].items():
                    self.check_within(v, f"rank {rank} {mode} grad {name}")

    def test_single_process_modes_agree(self):
        # t = 1 (no process group): SP and TP-only are the same computation, no padding,
        # and the stack's outputs, input gradients and every parameter's gradient agree
        # (same tolerance) in both modes, with no collective called in either.
        tp = P.TensorParallel(None)
        b = P.PackedBatch.make([3, 4], tp, "sp")
        self.assertEqual((b.padded_tokens, b.rows_local, b.cu_seqlens), (7, 7, [0, 3, 7]))
        res = {}
        for mode in ("sp", "tp"):
            stack = make_stack(tp, dropout=0.1)
            stack.train()
            tp.timer.reset()
            y, dx, calls = run_stack(stack, tp, LENGTHS, mode, 11)
            P.finish_gradients(stack, tp)
            res[mode] = (y, dx, calls, {n: p.grad.clone() for n, p in stack.named_parameters()})
        (y_sp, dx_sp, calls_sp, g_sp), (y_tp, dx_tp, calls_tp, g_tp) = res["sp"], res["tp"]
        self.assertEqual(tuple(y_sp.shape), (sum(LENGTHS), HIDDEN))
        self.check_within(max_violation(y_sp, y_tp), "t=1 SP vs TP-only output")
        self.check_within(max_violation(dx_sp, dx_tp), "t=1 SP vs TP-only input grad")
        self.assertEqual(set(g_sp), set(g_tp))
        self.assertEqual(len(g_sp), 12 * LAYERS)
        for name in g_sp:
            self.assertGreater(float(g_tp[name].abs().max()), 0.0, f"{name}: zero gradient")
            self.check_within(max_violation(g_sp[name], g_tp[name]), f"t=1 grad {name}")
        for calls in (calls_sp, calls_tp):
            self.assertEqual(sum(calls.values()), 0, calls)

    def test_geometry_pads_to_multiple_of_t(self):
        class FakeTP:
            size, rank = 4, 3
        b = P.PackedBatch.make([37, 5, 60, 1], FakeTP, "sp")
        self.assertEqual((b.tokens, b.padded_tokens, b.rows_local, b.row_offset),
                         (103, 104, 26, 78))
        self.assertEqual(b.cu_seqlens, [0, 37, 42, 102, 103, 104])
        self.assertEqual(b.real_rows(), 25)
        t = P.PackedBatch.make([37, 5, 60, 1], FakeTP, "tp")
        self.assertEqual((t.padded_tokens, t.rows_local, t.row_offset), (103, 103, 0))
        with self.assertRaisesRegex(ValueError, "lengths"):
            P.PackedBatch.make([3, 0], FakeTP, "sp")
        # Lengths are integers: a float is named, never truncated (5.7 is not 5).
        for bad, shown in (([5.7, 3], r"lengths\[0\]: must be an integer, got float 5.7"),
                           ([3, True], r"lengths\[1\]: must be an integer, got bool True"),
                           ([torch.tensor(2.5)], r"lengths\[0\]: must be an integer")):
            with self.subTest(lengths=bad):
                with self.assertRaisesRegex(ValueError, shown):
                    P.PackedBatch.make(bad, FakeTP, "sp")
        b = P.PackedBatch.make(torch.tensor([37, 5]), FakeTP, "tp")  # integer tensors are fine
        self.assertEqual(b.lengths, [37, 5])

    def test_mode_values(self):
        # A mode is SP or TP-only, by any of its spellings; anything else is an error,
        # not TP-only in silence.
        for sp, modes in ((True, [True, 1, "sp", "SP", "sequence_parallel"]),
                          (False, [False, 2, "tp", "tp_only", "TENSOR_PARALLEL_ONLY"])):
            for mode in modes:
                with self.subTest(mode=mode):
                    self.assertIs(P.is_sequence_parallel(mode), sp)
        for mode, error, pattern in (("bogus", ValueError, "'bogus' is not a mode"),
                                     ("", ValueError, "is not a mode"),
                                     (7, ValueError, "7 is not a mode"),
                                     (0, ValueError, "0 is not a mode"),
                                     (1.0, TypeError, "got float"),
                                     (None, TypeError, "got NoneType")):
            with self.subTest(mode=mode):
                with self.assertRaisesRegex(error, pattern):
                    P.is_sequence_parallel(mode)

    def test_bad_shape_names_the_argument(self):
        class FakeTP:
            size, rank = 4, 0
        with self.assertRaisesRegex(ValueError, "heads"):
            P.ParallelTransformerBlock(32, 6, 64, FakeTP)


if __name__ == "__main__":
    unittest.main()
