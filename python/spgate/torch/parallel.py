"""Megatron-style tensor-parallel (TP) transformer layers in plain PyTorch whose sequence
parallelism (SP) is chosen per forward call, so spgate's per-batch decision can switch it.

The same weights run in either mode (docs/design.md §1, §4; the C++ reference is
worker/runtime/transformer_stack.h):
  TP-only: every rank holds the full sequence. A column-parallel linear takes the full
    input (its input gradient is all-reduced in backward); a row-parallel linear's
    partial output is all-reduced.
  SP: the residual stream, LayerNorm and dropout work on this rank's block of
    padded_tokens / t rows. An all-gather along the sequence enters each column-parallel
    linear (reduce-scatter in backward) and a reduce-scatter leaves each row-parallel one
    (all-gather in backward). LayerNorm is per token, so the shard computes it exactly.

Gradient rule for replicated parameters (LayerNorm weights and biases, row-parallel
output biases, embeddings used on the shard): under SP a rank's gradient covers its
shard's tokens only, under TP-only it is the full gradient on every rank. TP-only
forwards scale those gradients by 1/t (ScaleGrad), so one SUM all-reduce at the end of an
accumulation window (finish_gradients) is right for any mix of SP and TP-only batches.

Packed variable-length sequences: a batch is sequences of tokens back to back
(cu_seqlens); attention is causal inside each sequence. Under SP the batch is padded to a
multiple of t with one extra "sequence" of padding tokens that attends only to itself and
whose outputs the caller ignores (so it receives zero gradient).

Collectives are timed per call (launch to completion; on CUDA with events read at the end
of the step) into TensorParallel.timer, for the step's telemetry (rs_wait_s,
all_gather_s). torch 1.13's gloo backend has no reduce-scatter: there it is emulated as an
all-reduce followed by keeping this rank's rows (twice the traffic; timed as the
reduce-scatter it stands for). NCCL uses the real collectives.

Usage:
    tp = TensorParallel(tp_group)                       # torch.distributed group (or None)
    block = ParallelTransformerBlock(hidden=256, heads=8, ffn_hidden=1024, tp=tp, seed=1)
    batch = PackedBatch.make(lengths, tp, sequence_parallel=decision_is_sp)
    y = block(batch.local_rows(x_full), batch)          # this rank's rows in, rows out
    y.backward(batch.local_rows(dy_full))
    finish_gradients(block, tp)                         # once per accumulation window
"""
from __future__ import annotations

import math
import operator
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = [
    "CollectiveTimer", "TensorParallel", "PackedBatch", "ColumnParallelLinear",
    "RowParallelLinear", "ParallelTransformerBlock", "ParallelGPT", "finish_gradients",
    "replicated", "is_sequence_parallel", "gather_full", "varlen_causal_attention",
    "CopyToTensorParallel", "ReduceFromTensorParallel", "GatherFromSequenceParallel",
    "ReduceScatterToSequenceParallel", "ColumnParallelLinearSP", "ScaleGrad",
    "ParallelGPTStage", "block_shape_problems",
]


_SP_NAMES = ("sp", "sequence_parallel")
_TP_NAMES = ("tp", "tp_only", "tensor_parallel_only")


def is_sequence_parallel(mode) -> bool:
    """True for SP, False for TP-only: accepts a bool, spgate.Mode or its int value (1 SP,
    2 TP-only), or a name ("sp" / "sequence_parallel", "tp" / "tp_only" /
    "tensor_parallel_only", any case). Anything else is a ValueError (a TypeError for a
    value of another type): a mode nobody knows must not run TP-only in silence."""
    if isinstance(mode, bool):
        return mode
    if isinstance(mode, str):
        name = mode.lower()
        if name in _SP_NAMES or name in _TP_NAMES:
            return name in _SP_NAMES
        raise ValueError("mode: %r is not a mode (%s)" % (mode, ", ".join(_SP_NAMES + _TP_NAMES)))
    try:
        value = operator.index(mode)  # spgate.Mode and ints; not 1.0
    except TypeError:
        raise TypeError("mode: a bool, spgate.Mode, 1, 2 or a mode's name, got %s"
                        % type(mode).__name__) from None
    if value not in (1, 2):
        raise ValueError("mode: %d is not a mode (1 = SP, 2 = TP-only)" % value)
    return value == 1


def _integer_lengths(lengths: Sequence[int], what: str = "lengths") -> List[int]:
    """`lengths` as a list of ints; ValueError naming the element for a bool or a value
    that is not an integer (5.7, a float tensor's element), which int() would truncate."""
    out = []
    for i, n in enumerate(lengths):
        try:
            if isinstance(n, bool):
                raise TypeError
            out.append(operator.index(n))
        except TypeError:
            raise ValueError("%s[%d]: must be an integer, got %s %r"
                             % (what, i, type(n).__name__, n)) from None
    return out


# ---------------------------------------------------------------------------------------
# Timing and the raw collectives.

@dataclass
class CollectiveTimer:
    """Seconds spent inside collective calls since the last reset, by kind. On CUDA the
    calls are asynchronous: events are recorded around each and read in totals()."""
    enabled: bool = True
    seconds: Dict[str, float] = field(default_factory=lambda: {
        "all_gather": 0.0, "reduce_scatter": 0.0, "all_reduce": 0.0})
    calls: Dict[str, int] = field(default_factory=lambda: {
        "all_gather": 0, "reduce_scatter": 0, "all_reduce": 0})
    _events: List = field(default_factory=list)

    def reset(self) -> None:
        for k in self.seconds:
            self.seconds[k] = 0.0
            self.calls[k] = 0
        self._events.clear()

    def totals(self) -> Dict[str, float]:
        """Seconds by kind; waits for pending CUDA events first."""
        if self._events:
            torch.cuda.synchronize()
            for kind, start, end in self._events:
                self.seconds[kind] += start.elapsed_time(end) / 1000.0
            self._events.clear()
        return dict(self.seconds)


class _Timed:
    def __init__(self, timer: Optional[CollectiveTimer], kind: str, tensor: torch.Tensor):
        self.timer, self.kind = timer, kind
        self.cuda = tensor.is_cuda

    def __enter__(self):
        if self.timer is None or not self.timer.enabled:
            return self
        self.timer.calls[self.kind] += 1
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.timer is None or not self.timer.enabled:
            return False
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.timer._events.append((self.kind, self.start, end))
        else:
            self.timer.seconds[self.kind] += time.perf_counter() - self.t0
        return False


class TensorParallel:
    """A TP group: its torch.distributed process group (None: a single rank, no
    collectives - not the default group; pass dist.group.WORLD for that), size t, this
    rank, and the collective timer."""

    def __init__(self, group=None):
        self.group = group
        if group is None:
            self.size, self.rank, self.backend = 1, 0, None
        else:
            self.size = dist.get_world_size(group)
            self.rank = dist.get_rank(group)
            self.backend = str(dist.get_backend(group))
        self.timer = CollectiveTimer()

    def all_gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """[r, ...] on each rank -> [t * r, ...], rank order."""
        if self.size == 1:
            return x
        x = x.contiguous()
        out = torch.empty((self.size * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype,
                          device=x.device)
        with _Timed(self.timer, "all_gather", x):
            if self.backend == "gloo":
                dist.all_gather(list(out.chunk(self.size)), x, group=self.group)
            else:
                _all_gather_into_tensor(out, x, self.group)
        return out

    def reduce_scatter_rows(self, x: torch.Tensor) -> torch.Tensor:
        """[t * r, ...] partial sums on each rank -> this rank's [r, ...] of the sum."""
        if self.size == 1:
            return x
        x = x.contiguous()
        rows = x.shape[0] // self.size
        with _Timed(self.timer, "reduce_scatter", x):
            if self.backend == "gloo":
                # gloo in torch 1.13 has no reduce-scatter: all-reduce, keep our rows.
                full = x.clone()
                dist.all_reduce(full, group=self.group)
                out = full[self.rank * rows:(self.rank + 1) * rows].clone()
            else:
                out = torch.empty((rows,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
                _reduce_scatter_tensor(out, x, self.group)
        return out

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        out = x.contiguous().clone()
        with _Timed(self.timer, "all_reduce", out):
            dist.all_reduce(out, group=self.group)
        return out


def _all_gather_into_tensor(out, x, group):
    fn = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    fn(out, x, group=group)


def _reduce_scatter_tensor(out, x, group):
    fn = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    fn(out, x, group=group)


# ---------------------------------------------------------------------------------------
# Autograd Functions for the collectives (each one's backward is its conjugate).

class CopyToTensorParallel(torch.autograd.Function):
    """TP-only entry of a column-parallel linear: identity; backward all-reduces."""

    @staticmethod
    def forward(ctx, x, tp: TensorParallel):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.tp.all_reduce(grad), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """TP-only exit of a row-parallel linear: all-reduce; backward is the identity."""

    @staticmethod
    def forward(ctx, x, tp: TensorParallel):
        return tp.all_reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromSequenceParallel(torch.autograd.Function):
    """SP entry of a column-parallel linear: all-gather the sequence shards; backward
    reduce-scatters (every rank's GEMM contributed to every row's input gradient)."""

    @staticmethod
    def forward(ctx, x, tp: TensorParallel):
        ctx.tp = tp
        return tp.all_gather_rows(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.tp.reduce_scatter_rows(grad), None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """SP exit of a row-parallel linear: reduce-scatter the partial sums into this
    rank's shard; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, tp: TensorParallel):
        ctx.tp = tp
        return tp.reduce_scatter_rows(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.tp.all_gather_rows(grad), None


class ColumnParallelLinearSP(torch.autograd.Function):
    """A column-parallel linear under SP, fused with its all-gather: forward gathers the
    sequence shards and multiplies; backward gathers them again for the weight gradient
    (instead of keeping the gathered input: activation memory stays sharded, Megatron's
    choice and the C++ reference's) and reduce-scatters the input gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, tp: TensorParallel):
        ctx.tp = tp
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(tp.all_gather_rows(x), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        tp = ctx.tp
        total = tp.all_gather_rows(x)
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_weight = g2.t().matmul(total.reshape(-1, total.shape[-1]))
        grad_bias = g2.sum(0) if ctx.has_bias else None
        grad_x = tp.reduce_scatter_rows(grad.matmul(weight))
        return grad_x, grad_weight, grad_bias, None


class ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by `scale` (TP-only replicated params)."""

    @staticmethod
    def forward(ctx, x, scale: float):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def replicated(param: torch.Tensor, sequence_parallel: bool, tp: TensorParallel) -> torch.Tensor:
    """`param` as used by a forward: under TP-only with t > 1 its gradient is scaled by 1/t
    (docs/design.md §4) so that finish_gradients' SUM is right for any mix of modes."""
    if sequence_parallel or tp.size == 1:
        return param
    return ScaleGrad.apply(param, 1.0 / tp.size)


def _mark_replicated(p: nn.Parameter) -> nn.Parameter:
    p.spgate_replicated = True
    return p


def finish_gradients(module: nn.Module, tp: TensorParallel) -> None:
    """End of an accumulation window: one SUM all-reduce over the TP group of every
    replicated parameter's gradient (flattened into one buffer). Untimed: it is not a
    layer collective."""
    if tp.size == 1:
        return
    grads = [p.grad for p in module.parameters()
             if getattr(p, "spgate_replicated", False) and p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=tp.group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


# ---------------------------------------------------------------------------------------
# Batch geometry.

@dataclass
class PackedBatch:
    """How a packed batch lies on one rank (like BatchGeometry in the C++ runtime).
    cu_seqlens covers padded_tokens, the padding segment included."""
    lengths: List[int]
    sequence_parallel: bool
    tokens: int
    padded_tokens: int
    rows_local: int
    row_offset: int
    cu_seqlens: List[int]
    tp_size: int = 1
    # Dropout masks are a function of (dropout_seed, token, column, call), identical in
    # both modes; set one per step (equal on every rank of the group).
    dropout_seed: int = 0

    @staticmethod
    def make(lengths: Sequence[int], tp: TensorParallel, sequence_parallel,
             dropout_seed: int = 0) -> "PackedBatch":
        lengths = _integer_lengths(lengths)
        if not lengths or any(n < 1 for n in lengths):
            raise ValueError("lengths: every sequence needs at least one token, got %r"
                             % (lengths,))
        sp = is_sequence_parallel(sequence_parallel)
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        tokens = cu[-1]
        if sp:
            padded = (tokens + tp.size - 1) // tp.size * tp.size
            if padded > tokens:
                cu.append(padded)
            rows = padded // tp.size
            offset = rows * tp.rank
        else:
            padded, rows, offset = tokens, tokens, 0
        return PackedBatch(lengths, sp, tokens, padded, rows, offset, cu, tp.size, dropout_seed)

    @property
    def padding_tokens(self) -> int:
        return self.padded_tokens - self.tokens

    def pad(self, x_full: torch.Tensor, value=0) -> torch.Tensor:
        """[tokens, ...] -> [padded_tokens, ...] (padding rows = value)."""
        if self.padded_tokens == x_full.shape[0]:
            return x_full
        pad = x_full.new_full((self.padded_tokens - x_full.shape[0],) + tuple(x_full.shape[1:]),
                              value)
        return torch.cat([x_full, pad])

    def local_rows(self, x_full: torch.Tensor, value=0) -> torch.Tensor:
        """This rank's rows of a [tokens, ...] tensor (padded first under SP)."""
        return self.pad(x_full, value)[self.row_offset:self.row_offset + self.rows_local]

    def real_rows(self) -> int:
        """How many of this rank's rows are real tokens (the rest are padding)."""
        return max(0, min(self.rows_local, self.tokens - self.row_offset))


# ---------------------------------------------------------------------------------------
# Layers.

class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's rows (outputs) split over the group. `rows` are the indices
    of this rank's rows in the full W (full_weight[rows])."""

    def __init__(self, full_weight: torch.Tensor, full_bias: torch.Tensor,
                 rows: torch.Tensor, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(full_weight[rows].clone())
        self.bias = nn.Parameter(full_bias[rows].clone())
        self.weight.spgate_shard = ("rows", rows)
        self.bias.spgate_shard = ("rows", rows)

    def forward(self, x: torch.Tensor, sequence_parallel: bool) -> torch.Tensor:
        if sequence_parallel and self.tp.size > 1:
            return ColumnParallelLinearSP.apply(x, self.weight, self.bias, self.tp)
        return F.linear(CopyToTensorParallel.apply(x, self.tp), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's columns (inputs) split over the group; x holds this rank's
    columns. The bias is replicated and added after the reduction, on the shard under SP."""

    def __init__(self, full_weight: torch.Tensor, full_bias: torch.Tensor,
                 cols: torch.Tensor, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(full_weight[:, cols].clone())
        self.weight.spgate_shard = ("cols", cols)
        self.bias = _mark_replicated(nn.Parameter(full_bias.clone()))

    def forward(self, x: torch.Tensor, sequence_parallel: bool) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if sequence_parallel:
            y = ReduceScatterToSequenceParallel.apply(y, self.tp)
        else:
            y = ReduceFromTensorParallel.apply(y, self.tp)
        return y + replicated(self.bias, sequence_parallel, self.tp)


class _LayerNorm(nn.Module):
    """Per-token LayerNorm with replicated weight and bias (runs on the shard under SP)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.weight = _mark_replicated(nn.Parameter(weight.clone()))
        self.bias = _mark_replicated(nn.Parameter(bias.clone()))

    def forward(self, x, sequence_parallel: bool):
        return F.layer_norm(x, (x.shape[-1],), replicated(self.weight, sequence_parallel, self.tp),
                            replicated(self.bias, sequence_parallel, self.tp), 1e-5)


def _dropout(x: torch.Tensor, p: float, training: bool, batch: PackedBatch, call: int):
    """Dropout whose mask is a function of (batch.dropout_seed, call, token, column): the
    same for a token whichever mode or rank computes it, so SP and TP-only agree. The mask
    covers the whole batch (rounded up to the group size) and this rank keeps its rows."""
    if not training or p == 0.0:
        return x
    gen = torch.Generator(device=x.device)
    gen.manual_seed((batch.dropout_seed * 1_000_003 + call) & 0x7FFFFFFFFFFFFFFF)
    rows = (batch.tokens + batch.tp_size - 1) // batch.tp_size * batch.tp_size
    keep = torch.rand((rows, x.shape[-1]), generator=gen, device=x.device) >= p
    keep = keep[batch.row_offset:batch.row_offset + x.shape[0]]
    return x * keep.to(x.dtype) / (1.0 - p)


def varlen_causal_attention(q, k, v, cu_seqlens: Sequence[int]) -> torch.Tensor:
    """q, k, v: [tokens, heads, d]; causal attention inside each segment of cu_seqlens."""
    out = []
    scale = 1.0 / math.sqrt(q.shape[-1])
    for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        qs, ks, vs = (t[s:e].transpose(0, 1) for t in (q, k, v))  # [heads, n, d]
        scores = torch.matmul(qs, ks.transpose(1, 2)) * scale
        n = e - s
        mask = torch.ones((n, n), dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        out.append(torch.matmul(torch.softmax(scores, dim=-1), vs).transpose(0, 1))
    return torch.cat(out)


def _full_block_params(hidden, ffn_hidden, seed, layer, dtype=torch.float32):
    """The block's full (unsharded) parameters, a function of (seed, layer) only, so every
    rank builds its own shard and a single-process reference the whole - no broadcast."""
    g = torch.Generator()
    g.manual_seed(seed * 7919 + layer)

    def randn(*shape, std):
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    h, f = hidden, ffn_hidden
    return {
        "ln1_w": 1.0 + randn(h, std=0.1), "ln1_b": randn(h, std=0.1),
        "qkv_w": randn(3 * h, h, std=0.02 * 4), "qkv_b": randn(3 * h, std=0.02),
        "proj_w": randn(h, h, std=0.02 * 4), "proj_b": randn(h, std=0.02),
        "ln2_w": 1.0 + randn(h, std=0.1), "ln2_b": randn(h, std=0.1),
        "fc1_w": randn(f, h, std=0.02 * 4), "fc1_b": randn(f, std=0.02),
        "fc2_w": randn(h, f, std=0.02 * 4), "fc2_b": randn(h, std=0.02),
    }


def block_shape_problems(hidden: int, heads: int, ffn_hidden: int, tp_size: int):
    """What a block's shape needs over tp_size ranks - heads and ffn_hidden divisible by
    the TP size, hidden by heads - as (name, value, divisor's name, divisor) for each
    that fails, in that order; empty when the shape fits. ParallelTransformerBlock
    refuses a shape with any; a trainer can refuse its flags before starting ranks
    (examples/torch/train.py). Sizes below 1 are the caller's to refuse first."""
    return [(name, value, by, divisor) for name, value, by, divisor in (
        ("heads", heads, "tp", tp_size), ("ffn_hidden", ffn_hidden, "tp", tp_size),
        ("hidden", hidden, "heads", heads)) if divisor >= 1 and value % divisor]


class ParallelTransformerBlock(nn.Module):
    """One pre-LN GPT block (the C++ reference's model.h):
        h = x + dropout(attn_proj(attention(qkv(LN1(x)))))    qkv column-, proj row-parallel
        y = h + dropout(fc2(gelu(fc1(LN2(h)))))               fc1 column-, fc2 row-parallel
    Attention heads are split over the group; x and y are this rank's rows: the shard under
    SP, the whole batch under TP-only."""

    def __init__(self, hidden: int, heads: int, ffn_hidden: int, tp: TensorParallel,
                 seed: int = 1, layer: int = 0, dropout: float = 0.0):
        super().__init__()
        t = tp.size
        for name, value in (("hidden", hidden), ("heads", heads), ("ffn_hidden", ffn_hidden)):
            if value < 1:
                raise ValueError("%s must be >= 1, got %d" % (name, value))
        if block_shape_problems(hidden, heads, ffn_hidden, t):
            raise ValueError("heads (%d) and ffn_hidden (%d) must divide by the TP size %d, "
                             "and hidden (%d) by heads" % (heads, ffn_hidden, t, hidden))
        self.tp, self.hidden, self.heads, self.dropout = tp, hidden, heads, dropout
        self.layer = layer
        self.heads_local = heads // t
        self.head_dim = hidden // heads
        hl, fl, r = self.heads_local * self.head_dim, ffn_hidden // t, tp.rank
        full = _full_block_params(hidden, ffn_hidden, seed, layer)
        # QKV rows: Q heads, then K, then V; this rank's heads in each block.
        qkv_rows = torch.cat([torch.arange(hl) + blk * hidden + r * hl for blk in range(3)])
        self.ln1 = _LayerNorm(full["ln1_w"], full["ln1_b"], tp)
        self.qkv = ColumnParallelLinear(full["qkv_w"], full["qkv_b"], qkv_rows, tp)
        self.proj = RowParallelLinear(full["proj_w"], full["proj_b"], torch.arange(hl) + r * hl, tp)
        self.ln2 = _LayerNorm(full["ln2_w"], full["ln2_b"], tp)
        self.fc1 = ColumnParallelLinear(full["fc1_w"], full["fc1_b"], torch.arange(fl) + r * fl, tp)
        self.fc2 = RowParallelLinear(full["fc2_w"], full["fc2_b"], torch.arange(fl) + r * fl, tp)

    def forward(self, x: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        sp = batch.sequence_parallel
        expect = batch.rows_local
        if x.shape[0] != expect:
            raise ValueError("x has %d rows; this rank's part of the batch has %d (%s)"
                             % (x.shape[0], expect, "SP shard" if sp else "TP-only: all"))
        qkv = self.qkv(self.ln1(x, sp), sp)                       # [padded, 3 * hl]
        n, d = qkv.shape[0], self.head_dim
        q, k, v = qkv.view(n, 3, self.heads_local, d).unbind(1)
        o = varlen_causal_attention(q, k, v, batch.cu_seqlens).reshape(n, self.heads_local * d)
        h = x + _dropout(self.proj(o, sp), self.dropout, self.training, batch, 2 * self.layer)
        f = F.gelu(self.fc1(self.ln2(h, sp), sp))
        return h + _dropout(self.fc2(f, sp), self.dropout, self.training, batch,
                            2 * self.layer + 1)


def gather_full(module: nn.Module, tp: TensorParallel, what: str = "param") -> Dict[str, torch.Tensor]:
    """Collective: every parameter (what="param") or gradient (what="grad") of `module` as
    the full, unsharded tensor, keyed by name. Replicated ones are returned as they are."""
    out = {}
    for name, p in module.named_parameters():
        local = p.detach() if what == "param" else (
            p.grad if p.grad is not None else torch.zeros_like(p))
        spec = getattr(p, "spgate_shard", None)
        if spec is None or tp.size == 1:
            out[name] = local.clone()
            continue
        kind, index = spec
        local = local.contiguous()
        pieces = [torch.empty_like(local) for _ in range(tp.size)]
        dist.all_gather(pieces, local, group=tp.group)
        indices = [torch.empty_like(index) for _ in range(tp.size)]
        dist.all_gather(indices, index.contiguous(), group=tp.group)
        if kind == "rows":
            full = local.new_zeros((sum(t.shape[0] for t in pieces),) + tuple(local.shape[1:]))
            for piece, idx in zip(pieces, indices):
                full[idx] = piece
        else:
            full = local.new_zeros((local.shape[0], sum(t.shape[1] for t in pieces)))
            for piece, idx in zip(pieces, indices):
                full[:, idx] = piece
        out[name] = full
    return out


class ParallelGPT(nn.Module):
    """A small GPT over ParallelTransformerBlocks: token and position embeddings
    (replicated, looked up for this rank's rows only so their gradients follow the
    replicated rule), L blocks, a final LayerNorm and an LM head tied to the token
    embedding, also on this rank's rows. forward returns this rank's share of the batch's
    mean next-token loss: summed over the group (SP) or equal on every rank (TP-only)."""

    def __init__(self, vocab: int, hidden: int, heads: int, ffn_hidden: int, layers: int,
                 max_positions: int, tp: TensorParallel, seed: int = 1, dropout: float = 0.0):
        super().__init__()
        self.tp = tp
        g = torch.Generator()
        g.manual_seed(seed)
        self.wte = _mark_replicated(nn.Parameter(torch.randn(vocab, hidden, generator=g) * 0.02))
        self.wpe = _mark_replicated(nn.Parameter(torch.randn(max_positions, hidden, generator=g) * 0.01))
        self.blocks = nn.ModuleList(
            ParallelTransformerBlock(hidden, heads, ffn_hidden, tp, seed=seed, layer=i,
                                     dropout=dropout) for i in range(layers))
        self.ln_f = _LayerNorm(torch.ones(hidden), torch.zeros(hidden), tp)
        self.max_positions = max_positions

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, batch: PackedBatch):
        """tokens, targets: [batch.tokens] packed (targets -100 where there is none)."""
        sp = batch.sequence_parallel
        positions = torch.cat([torch.arange(n) for n in batch.lengths]).clamp_(max=self.max_positions - 1)
        ids = batch.local_rows(tokens)
        pos = batch.local_rows(positions.to(tokens.device))
        tgt = batch.local_rows(targets, value=-100)
        x = F.embedding(ids, replicated(self.wte, sp, self.tp)) + \
            F.embedding(pos, replicated(self.wpe, sp, self.tp))
        for block in self.blocks:
            x = block(x, batch)
        x = self.ln_f(x, sp)
        logits = F.linear(x, replicated(self.wte, sp, self.tp))
        n_targets = max(1, int((targets != -100).sum()))
        return F.cross_entropy(logits, tgt, ignore_index=-100, reduction="sum") / n_targets


class ParallelGPTStage(nn.Module):
    """Stage `stage` of `stages` of a small GPT for pipeline parallelism (docs/design.md
    §12; spgate.torch.pipeline): the model's `layers` blocks split evenly, each numbered as
    in the whole model (blocks["i"]: its parameters are a function of (seed, i), so a
    one-stage model is the single-process reference of any split). The first stage holds
    the token and position embeddings, the last the final LayerNorm and the LM head,
    untied from the embedding (they live on different stages). All replicated parameters
    follow finish_gradients' rule.

    forward(x, tokens, targets, batch): x is this rank's rows of the micro-batch as the
    stage runs it (spgate.torch.pipeline.stage_input; None on the first stage, which
    embeds `tokens`); returns this rank's rows of the stage's output (not last), or on the
    last stage this rank's share of the micro-batch's mean next-token loss times
    `loss_scale` (summed over the group under SP, equal on every rank under TP-only)."""

    def __init__(self, vocab: int, hidden: int, heads: int, ffn_hidden: int, layers: int,
                 max_positions: int, tp: TensorParallel, stage: int = 0, stages: int = 1,
                 seed: int = 1, dropout: float = 0.0):
        super().__init__()
        if stages < 1 or not 0 <= stage < stages or layers % stages:
            raise ValueError("ParallelGPTStage: stage %d of %d, with %d layers (a multiple "
                             "of the stages)" % (stage, stages, layers))
        self.tp, self.stage, self.stages = tp, stage, stages
        self.first, self.last = stage == 0, stage == stages - 1
        self.max_positions = max_positions
        per = layers // stages
        self.layer_offset = stage * per
        if self.first:
            g = torch.Generator()
            g.manual_seed(seed)
            self.wte = _mark_replicated(nn.Parameter(torch.randn(vocab, hidden, generator=g) * 0.02))
            self.wpe = _mark_replicated(
                nn.Parameter(torch.randn(max_positions, hidden, generator=g) * 0.01))
        self.blocks = nn.ModuleDict({
            str(i): ParallelTransformerBlock(hidden, heads, ffn_hidden, tp, seed=seed, layer=i,
                                             dropout=dropout)
            for i in range(self.layer_offset, self.layer_offset + per)})
        if self.last:
            g = torch.Generator()
            g.manual_seed(seed * 7919 + 104729)
            self.ln_f = _LayerNorm(torch.ones(hidden), torch.zeros(hidden), tp)
            self.lm_head = _mark_replicated(
                nn.Parameter(torch.randn(vocab, hidden, generator=g) * 0.02))

    def forward(self, x: Optional[torch.Tensor], tokens: torch.Tensor, targets: torch.Tensor,
                batch: PackedBatch, loss_scale: float = 1.0) -> torch.Tensor:
        sp = batch.sequence_parallel
        if self.first:
            positions = torch.cat([torch.arange(n) for n in batch.lengths]).clamp_(
                max=self.max_positions - 1)
            x = F.embedding(batch.local_rows(tokens), replicated(self.wte, sp, self.tp)) + \
                F.embedding(batch.local_rows(positions.to(tokens.device)),
                            replicated(self.wpe, sp, self.tp))
        elif x is None:
            raise ValueError("ParallelGPTStage: stage %d needs its input rows" % self.stage)
        for block in self.blocks.values():
            x = block(x, batch)
        if not self.last:
            return x
        x = self.ln_f(x, sp)
        logits = F.linear(x, replicated(self.lm_head, sp, self.tp))
        tgt = batch.local_rows(targets, value=-100)
        n_targets = max(1, int((targets != -100).sum()))
        return F.cross_entropy(logits, tgt, ignore_index=-100, reduction="sum") * \
            (loss_scale / n_targets)
