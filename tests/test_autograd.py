"""Gradients against PyTorch (CPU), on every device, on fresh random inputs.

Each case of the table below is one function written once for both libraries (`L` is fusegrad's or
torch's namespace; `L.c(array)` makes a constant such as an index tensor), the shapes of its inputs and
the domain they are drawn from. The test runs the function on fusegrad float32 inputs that require grad,
calls `out.backward(g)` with a random `g`, and compares every input's `.grad` with torch's gradient of
the same function on the same values in float64. Domain "ties" draws small integers, so that maxima,
minima, clamp bounds and the kinks of relu/abs are hit exactly: the tie rules must be torch's.
The rest of the file pins the autograd API (accumulation, detach, no_grad, fusegrad.grad, errors) and
the kernel counts of a few backward passes.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import fusegrad as fg

RTOL, ATOL = 1e-4, 1e-5


# ---- inputs ---------------------------------------------------------------------------------------------------

TIES = (0, 2, -2, 2, -2, 1, -1)
WIDE = (-100, 100, -95, 95, -30, 30, 0.5)


def draw(rng, shape, dom: str = "real") -> np.ndarray:
  """float32 values of a domain: real (-3, 3), pos (0.5, 3), unit (-0.9, 0.9), nz (+-[0.5, 2]), ties (ints -2..2),
  wide (-100, 100)"""
  if dom == "ties":   # the fixed prefix makes sure of a zero, of ties for max and min, and of values at +-1
    a = rng.integers(-2, 3, size=shape).astype(np.float32)
    k = min(a.size, len(TIES))
    a.reshape(-1)[:k] = TIES[:k]
    return a
  if dom == "wide":   # saturating activations: exp overflows in float32 past 88
    a = rng.uniform(-100, 100, size=shape).astype(np.float32)
    a.reshape(-1)[:min(a.size, len(WIDE))] = WIDE[:min(a.size, len(WIDE))]
    return a
  if dom == "nz": return (rng.choice([-1, 1], size=shape) * rng.uniform(0.5, 2, size=shape)).astype(np.float32)
  lo, hi = {"real": (-3, 3), "pos": (0.5, 3), "unit": (-0.9, 0.9)}[dom]
  return rng.uniform(lo, hi, size=shape).astype(np.float32)


class FG:
  """fusegrad's namespace, with constants made on the device under test"""
  def __init__(self, device): self.device = device
  def c(self, a): return fg.tensor(np.asarray(a), device=self.device)
  def __getattr__(self, name): return getattr(fg, name)


class TH:
  def c(self, a): return torch.tensor(np.asarray(a))
  def __getattr__(self, name): return getattr(torch, name)


def compare(got: fg.Tensor | None, want: torch.Tensor, like: fg.Tensor, label: str, tol: float = 1.0) -> None:
  assert got is not None, f"{label}: .grad is None, torch has a gradient"
  assert isinstance(got, fg.Tensor), f"{label}: .grad is a {type(got).__name__}"
  assert got.shape == like.shape, f"{label}: grad shape {got.shape}, input shape {like.shape}"
  assert got.dtype == like.dtype, f"{label}: grad dtype {got.dtype.name}, input dtype {like.dtype.name}"
  assert got.device == like.device, f"{label}: grad on {got.device}, input on {like.device}"
  exp = want.double().numpy()
  scale = max(1.0, float(np.abs(exp).max())) if exp.size else 1.0
  np.testing.assert_allclose(got.float().numpy() if got.dtype in (fg.float16, fg.bfloat16) else got.numpy(), exp,
                             rtol=RTOL * tol, atol=ATOL * tol * scale, err_msg=label)


# ---- the table ----------------------------------------------------------------------------------------------

class Case:
  def __init__(self, name, fn, shapes, dom="real", tfn=None, tol=1.0, dtypes=None, native=False):
    """fn(L, *inputs); tfn the torch spelling where it differs; dom one domain or one per input; native: torch
    computes in the inputs' dtypes (casts), not float64"""
    self.name, self.fn, self.tfn, self.shapes, self.tol, self.native = name, fn, tfn or fn, shapes, tol, native
    self.doms = [dom] * len(shapes) if isinstance(dom, str) else list(dom)
    self.dtypes = dtypes or ["float32"] * len(shapes)


A, B, V, C3 = (3, 4), (4, 5), (4,), (2, 3, 4)
PAD_MODES = ("reflect", "replicate", "circular")
IDX = [0, 2, 2, 1, 0]           # repeated rows: their gradients must add up
CASES = [
  # binary, broadcasting, python scalars (reflected too)
  Case("add", lambda L, x, y: x + y, [A, A]),
  Case("add_bcast", lambda L, x, y: x + y, [(3, 1), (1, 4)]),
  Case("add_bcast_rank", lambda L, x, y: x.add(y), [C3, V]),
  Case("add_alpha", lambda L, x, y: x.add(y, alpha=2.5), [A, V]),
  Case("sub", lambda L, x, y: x - y, [A, (3, 1)]),
  Case("mul", lambda L, x, y: x * y, [A, A]),
  Case("mul_bcast", lambda L, x, y: x * y, [C3, (3, 1)]),
  Case("mul_0d", lambda L, x, s: x * s, [A, ()]),
  Case("mul_self", lambda L, x: x * x, [A]),
  Case("div", lambda L, x, y: x / y, [A, A], dom=["real", "nz"]),
  Case("div_bcast", lambda L, x, y: x / y, [(3, 1), V], dom=["real", "nz"]),
  Case("mixed_dtypes", lambda L, x, y: x * y, [A, V], dtypes=["float32", "float64"]),
  Case("scalars", lambda L, x: (x + 2.5) * -1.5 - 0.5, [A]),
  Case("scalars_reflected", lambda L, x: 2.5 - (3 * (1 + x)), [A]),
  Case("div_scalar", lambda L, x: x / 3.0, [A]),
  Case("rdiv_scalar", lambda L, x: 3.0 / x, [A], dom="nz"),
  # unary
  Case("neg", lambda L, x: -x, [A]),
  Case("exp", lambda L, x: x.exp(), [A]),
  Case("exp2", lambda L, x: x.exp2(), [A]),
  Case("expm1", lambda L, x: x.expm1(), [A]),
  Case("log", lambda L, x: x.log(), [A], dom="pos"),
  Case("log2", lambda L, x: x.log2(), [A], dom="pos"),
  Case("log10", lambda L, x: x.log10(), [A], dom="pos"),
  Case("log1p", lambda L, x: x.log1p(), [A], dom="unit"),
  Case("sqrt", lambda L, x: x.sqrt(), [A], dom="pos"),
  Case("rsqrt", lambda L, x: x.rsqrt(), [A], dom="pos"),
  Case("sin", lambda L, x: x.sin(), [A]),
  Case("cos", lambda L, x: x.cos(), [A]),
  Case("tan", lambda L, x: x.tan(), [A], dom="unit"),
  Case("tanh", lambda L, x: x.tanh(), [A]),
  Case("erf", lambda L, x: x.erf(), [A]),
  Case("sigmoid", lambda L, x: x.sigmoid(), [A]),
  Case("relu", lambda L, x: x.relu(), [A]),
  Case("relu_at_0", lambda L, x: x.relu(), [A], dom="ties"),                  # torch: 0 at x == 0
  Case("gelu", lambda L, x: x.gelu(), [A], tfn=lambda L, x: F.gelu(x)),
  Case("gelu_tanh", lambda L, x: x.gelu(approximate="tanh"), [A], tfn=lambda L, x: F.gelu(x, approximate="tanh")),
  Case("silu", lambda L, x: x.silu(), [A], tfn=lambda L, x: F.silu(x)),
  Case("elu", lambda L, x: x.elu(0.7), [A], dom="ties", tfn=lambda L, x: F.elu(x, 0.7)),
  Case("elu_real", lambda L, x: x.elu(), [A], tfn=lambda L, x: F.elu(x)),
  Case("leaky_relu", lambda L, x: x.leaky_relu(0.1), [A], dom="ties", tfn=lambda L, x: F.leaky_relu(x, 0.1)),
  Case("softplus", lambda L, x: x.softplus(), [A], tfn=lambda L, x: F.softplus(x)),
  Case("softplus_threshold", lambda L, x: x.softplus(beta=2.0, threshold=1.0), [A],
       tfn=lambda L, x: F.softplus(x, beta=2.0, threshold=1.0)),
  Case("abs", lambda L, x: x.abs(), [A], dom="ties"),                         # torch: 0 at x == 0
  Case("reciprocal", lambda L, x: x.reciprocal(), [A], dom="nz"),
  Case("square", lambda L, x: x.square(), [A]),
  # pow
  Case("pow_2", lambda L, x: x ** 2, [A]),
  Case("pow_3", lambda L, x: x ** 3, [A]),
  Case("pow_int_at_0", lambda L, x: (x ** 0) + (x ** 1) * 2 + (x ** 2) * 3 + (x ** 3) * 4, [A], dom="ties"),
  Case("pow_half", lambda L, x: x ** 0.5, [A], dom="pos"),
  Case("pow_neg_frac", lambda L, x: x ** -1.5, [A], dom="pos"),
  Case("pow_neg_int", lambda L, x: x ** -2, [A], dom="nz"),
  Case("pow_scalar_base", lambda L, x: 2.5 ** x, [A]),
  Case("pow_scalar_base_lt1", lambda L, x: 0.5 ** x, [A]),
  Case("pow_tensor", lambda L, x, y: x ** y, [A, A], dom=["pos", "real"]),
  Case("pow_tensor_bcast", lambda L, x, y: x.pow(y), [(3, 1), V], dom=["pos", "real"]),
  # maximum, minimum, clamp, where, lerp
  Case("maximum", lambda L, x, y: L.maximum(x, y), [A, A]),
  Case("maximum_ties", lambda L, x, y: L.maximum(x, y), [A, A], dom="ties"),   # torch: half to each
  Case("minimum_ties", lambda L, x, y: L.minimum(x, y), [A, A], dom="ties"),
  Case("maximum_ties_bcast", lambda L, x, y: x.maximum(y), [A, V], dom="ties"),
  Case("clamp", lambda L, x: x.clamp(-1.0, 1.5), [A]),
  Case("clamp_at_bounds", lambda L, x: x.clamp(-1, 1), [A], dom="ties"),       # torch: bounds are inside
  Case("clamp_min", lambda L, x: x.clamp(min=0.0), [A], dom="ties"),
  Case("clamp_max", lambda L, x: x.clamp(max=1.0), [A], dom="ties"),
  Case("clamp_tensor_bounds", lambda L, x, lo, hi: x.clamp(lo, hi + 3.5), [A, V, (3, 1)]),
  Case("where", lambda L, x, y: L.where(x > 0, x * 2, y), [A, V]),
  Case("where_scalar", lambda L, x: L.where(x < 1, x.exp(), 0.5), [A]),
  Case("lerp", lambda L, x, y: x.lerp(y, 0.3), [A, A]),
  Case("lerp_tensor_weight", lambda L, x, y, w: x.lerp(y, w), [A, V, (3, 1)]),
  # reductions
  Case("sum", lambda L, x: x.sum(), [A]),
  Case("sum_dim", lambda L, x: x.sum(1), [C3]),
  Case("sum_dims_keepdim", lambda L, x: x.sum((0, 2), keepdim=True), [C3]),
  Case("mean", lambda L, x: x.mean(), [A]),
  Case("mean_dim", lambda L, x: x.mean(-1, keepdim=True), [C3]),
  Case("var", lambda L, x: x.var(), [A], tol=10),
  Case("var_dim_corr0", lambda L, x: x.var(1, correction=0), [C3], tol=10),
  Case("std", lambda L, x: x.std(0), [A], tol=10),
  Case("prod", lambda L, x: x.prod(), [A], dom="nz"),
  Case("prod_dim", lambda L, x: x.prod(1, keepdim=True), [C3], dom="nz"),
  Case("amax", lambda L, x: x.amax(1), [(5, 6)], dom="ties"),                # torch: evenly among ties
  Case("amax_dims", lambda L, x: x.amax((0, 2)), [C3], dom="ties"),
  Case("amax_all", lambda L, x: x.amax(), [A], dom="ties"),
  Case("amin", lambda L, x: x.amin(0, keepdim=True), [(5, 6)], dom="ties"),
  Case("max_all", lambda L, x: x.max(), [A], dom="ties"),                     # torch: evenly among ties
  Case("min_all", lambda L, x: x.min(), [A], dom="ties"),
  Case("max_dim", lambda L, x: x.max(1).values, [(5, 6)], dom="ties"),       # torch: to the returned index
  Case("max_dim_keepdim", lambda L, x: x.max(0, keepdim=True)[0], [(5, 6)], dom="ties"),
  Case("min_dim", lambda L, x: x.min(-1)[0], [(5, 6)], dom="ties"),
  Case("max_dim_distinct", lambda L, x: x.max(1).values, [C3]),
  Case("logsumexp", lambda L, x: x.logsumexp(1), [C3]),
  Case("logsumexp_dims", lambda L, x: x.logsumexp((0, 2), keepdim=True), [C3]),
  Case("softmax", lambda L, x: x.softmax(-1), [C3]),
  Case("softmax_dim0", lambda L, x: x.softmax(0), [A]),
  Case("log_softmax", lambda L, x: x.log_softmax(-1), [C3]),
  Case("log_softmax_dim1", lambda L, x: x.log_softmax(1), [C3]),
  Case("cumsum", lambda L, x: x.cumsum(1), [A]),
  Case("cumsum_dim0", lambda L, x: x.cumsum(0), [C3]),
  # movement
  Case("reshape", lambda L, x: x.reshape(4, 3) * L.c(np.arange(12.0, dtype=np.float32).reshape(4, 3)), [A]),
  Case("permute", lambda L, x: x.permute(2, 0, 1), [C3]),
  Case("transpose", lambda L, x: x.transpose(0, 2), [C3]),
  Case("T", lambda L, x, y: x.T * y, [A, (4, 3)]),
  Case("expand", lambda L, x: x.expand(3, 4), [(3, 1)]),
  Case("expand_rank", lambda L, x: x.expand(2, 3, 4), [V]),
  Case("squeeze_unsqueeze", lambda L, x: x.unsqueeze(1).squeeze(2).unsqueeze(-1), [(3, 1, 4)]),
  Case("flatten", lambda L, x: x.flatten(1), [C3]),
  Case("flip", lambda L, x: x.flip(0, 2), [C3]),
  Case("pad", lambda L, x: x.pad((1, 2, 0, 1), value=1.5), [A], tfn=lambda L, x: F.pad(x, (1, 2, 0, 1), value=1.5)),
  Case("pad_negative", lambda L, x: x.pad((-1, 2, 1, -1)), [A], tfn=lambda L, x: F.pad(x, (-1, 2, 1, -1))),
  Case("slice_steps", lambda L, x: x[::2, 1:], [A]),
  # torch has no negative steps: its spelling flips
  Case("slice_neg_step", lambda L, x: x[::-1, 3:0:-2], [A], tfn=lambda L, x: x.flip(0)[:, 1:4:2].flip(1)),
  Case("slice_neg_step_3d", lambda L, x: x[:, ::-2][..., ::-3], [C3],
       tfn=lambda L, x: x.flip(1)[:, ::2].flip(2)[..., ::3]),
  Case("slice_int_ellipsis", lambda L, x: x[1, ..., -1] * x[None, 0, 0:3, 2], [C3]),
  Case("narrow_select", lambda L, x: x.narrow(1, 1, 2).select(0, 2), [A]),
  Case("index_repeated", lambda L, x: x[L.c(IDX)], [A]),
  Case("index_2d_idx", lambda L, x: x[L.c([[0, 2, 2], [1, 1, 0]])], [A]),
  Case("index_dim1", lambda L, x: x[:, L.c([3, 1, 3, 3])], [A]),
  Case("index_pairs", lambda L, x: x[L.c([1, 1, 0, 2]), L.c([2, 2, 3, 0])], [A]),
  Case("cat", lambda L, x, y: L.cat([x, y, x], 0), [A, (2, 4)]),
  Case("cat_dim1", lambda L, x, y: L.cat([y, x], 1), [A, (3, 2)]),
  Case("stack", lambda L, x, y: L.stack([x, y, y], 1), [A, A]),
  Case("split", lambda L, x: (lambda a, b, c: L.cat([c, a], 1))(*x.split([1, 2, 1], 1)), [A]),  # b unused
  Case("split_size", lambda L, x: x.split(2, 0)[1] * 3, [(5, 4)]),
  Case("chunk", lambda L, x: (lambda a, b: b - a)(*x.chunk(2, 1)), [A]),
  Case("unbind", lambda L, x: (lambda a, b, c: a * c)(*x.unbind(0)), [A]),
  Case("repeat", lambda L, x: x.repeat(2, 1, 3), [A]),
  Case("tile", lambda L, x: x.tile(2), [A]),
  Case("tril", lambda L, x: x.tril(), [(4, 4)]),
  Case("triu", lambda L, x: x.triu(1), [A]),
  # matmul, einsum
  Case("matmul", lambda L, x, y: x @ y, [A, B], tol=3),
  Case("matmul_batched", lambda L, x, y: x @ y, [C3, (2, 4, 5)], tol=3),
  Case("matmul_bcast", lambda L, x, y: x @ y, [C3, B], tol=3),
  Case("matmul_bcast_left", lambda L, x, y: x.matmul(y), [A, (2, 4, 5)], tol=3),
  Case("matmul_vec_mat", lambda L, x, y: x @ y, [V, B], tol=3),
  Case("matmul_mat_vec", lambda L, x, y: x @ y, [A, V], tol=3),
  Case("matmul_dot", lambda L, x, y: x @ y, [V, V], tol=3),
  Case("einsum_mm", lambda L, x, y: L.einsum("ij,jk->ik", x, y), [A, B], tol=3),
  Case("einsum_bmm", lambda L, x, y: L.einsum("bij,bjk->bik", x, y), [C3, (2, 4, 5)], tol=3),
  Case("einsum_outer", lambda L, x, y: L.einsum("i,j->ij", x, y), [V, (3,)]),
  Case("einsum_diag", lambda L, x: L.einsum("ii->i", x), [(4, 4)]),
  Case("einsum_trace_sum", lambda L, x, y: L.einsum("bij,ij->j", x, y), [C3, A], tol=3),
  # casts between float dtypes
  Case("double", lambda L, x: x.double().exp() * 2, [A], native=True),
  Case("float_of_double", lambda L, x: x.float() * 2, [A], dtypes=["float64"], native=True),
  Case("half", lambda L, x: (x.half() * 2).float().sin(), [A], native=True, tol=100),
  Case("cumprod", lambda L, x: x.cumprod(1), [A], dom="nz"),
  Case("empty", lambda L, x: x.exp().sum(0), [(0, 3)]),
  Case("half_leaf", lambda L, x: (x * x).float() * 3, [A], dtypes=["float16"], native=True, tol=100),
  # saturation: the branch a where() does not take, or a factor that overflows, must not turn into nan
  Case("sigmoid_wide", lambda L, x: x.sigmoid(), [A], dom="wide"),
  Case("silu_wide", lambda L, x: x.silu(), [A], dom="wide", tfn=lambda L, x: F.silu(x)),
  Case("softplus_wide", lambda L, x: x.softplus(), [A], dom="wide", tfn=lambda L, x: F.softplus(x)),
  Case("elu_wide", lambda L, x: x.elu(), [A], dom="wide", tfn=lambda L, x: F.elu(x)),
  Case("gelu_wide", lambda L, x: x.gelu() + x.gelu(approximate="tanh"), [A], dom="wide",
       tfn=lambda L, x: F.gelu(x) + F.gelu(x, approximate="tanh")),
  Case("tanh_wide", lambda L, x: x.tanh(), [A], dom="wide"),
  Case("log_softmax_wide", lambda L, x: x.log_softmax(-1) + x.logsumexp(0, keepdim=True), [A], dom="wide"),
  Case("softmax_wide", lambda L, x: x.softmax(0), [A], dom="wide"),
  Case("std_of_constant", lambda L, x: (x * 0).std(1) + (x * 0 + 1).std(), [A]),   # torch: 0, not 0 * inf
  # more of the torch API fusegrad has (kinks: torch's hardtanh family is flat at its bounds, unlike clamp)
  Case("hardtanh", lambda L, x: x.hardtanh(), [A], dom="ties", tfn=lambda L, x: F.hardtanh(x)),
  Case("relu6", lambda L, x: (x * 3).relu6(), [A], dom="ties", tfn=lambda L, x: F.relu6(x * 3)),
  Case("hardsigmoid", lambda L, x: (x * 1.5).hardsigmoid(), [A], dom="ties", tfn=lambda L, x: F.hardsigmoid(x * 1.5)),
  Case("hardswish", lambda L, x: (x * 1.5).hardswish(), [A], dom="ties", tfn=lambda L, x: F.hardswish(x * 1.5)),
  Case("hardswish_real", lambda L, x: (x * 1.5).hardswish(), [A], tfn=lambda L, x: F.hardswish(x * 1.5)),
  Case("mish", lambda L, x: x.mish(), [A], tfn=lambda L, x: F.mish(x)),
  Case("fmax_fmin_ties", lambda L, x, y: L.fmax(x, y) * 2 + L.fmin(x, y), [A, A], dom="ties"),  # torch: ties to input
  Case("fmod_remainder", lambda L, x, y: x.fmod(y) + x.remainder(y * 2) + x % 1.5, [A, A], dom=["real", "nz"]),
  Case("rounding", lambda L, x: x.floor() + x.ceil() + x.round() + x.trunc() + x.frac() * 2 + x.sign(), [A]),
  Case("addcmul_addcdiv", lambda L, x, y, z: x.addcmul(y, z, value=0.5).addcdiv(y, z, value=2), [A, V, (3, 1)],
       dom=["real", "real", "nz"]),
  Case("pad_modes", lambda L, x: L.cat([x.pad((2, 1, 1, 2), mode=m).reshape(-1) for m in PAD_MODES]), [A],
       tfn=lambda L, x: L.cat([F.pad(x[None], (2, 1, 1, 2), mode=m).reshape(-1) for m in PAD_MODES])),
  Case("movedim_unflatten", lambda L, x: x.movedim(0, 2).unflatten(0, (3, 1)), [C3]),
  Case("index_negative", lambda L, x: x[L.c([-1, 0, -1])], [A]),
  Case("outer_dot", lambda L, x, y: x.outer(y) * x.dot(x), [V, (3,)]),
  Case("var_mean", lambda L, x: (lambda v, m: v * m)(*x.var_mean(1)), [A],
       tfn=lambda L, x: (lambda v, m: v * m)(*L.var_mean(x, 1)), tol=10),
  # small and degenerate shapes (a one-element input is a constant node, not a buffer)
  Case("zero_dim", lambda L, x: (x * x).sum() + x.exp() * x.reshape(1, 1).expand(2, 3), [()]),
  Case("one_element", lambda L, x, y: x.expand(3, 4) * y + x.sum(), [(1,), A]),
  Case("amax_size1_dim", lambda L, x: x.amax(1) + x.amin(1, keepdim=True).squeeze(1), [(3, 1, 4)]),
  Case("reduce_size1_dims", lambda L, x: x.sum(1) + x.amax(1) * x.mean((1, 2)).unsqueeze(-1) - x.prod(1), [(3, 1, 4)]),
  Case("same_tensor_matmul", lambda L, x: x.T @ x + x.T @ x.sum(1, keepdim=True), [A], tol=3),
  Case("cat_with_constant", lambda L, x: L.cat([x, L.c(np.ones((1, 4), np.float32)), x * 2]).softmax(0), [A]),
  # compositions
  Case("cross_entropy", lambda L, x: -(x.log_softmax(-1)[L.c([0, 1, 2]), L.c([3, 0, 3])]).mean(), [A],
       tfn=lambda L, x: F.cross_entropy(x, torch.tensor([3, 0, 3]))),
  Case("mlp", lambda L, x, w1, w2: (x @ w1).relu() @ w2, [A, B, (5, 2)], tol=3),
  Case("layernorm", lambda L, x: (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, correction=0) + 1e-5).sqrt(),
       [C3], tol=30),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_grad(device, rng, case):
  arrs = [draw(rng, s, d).astype(t) for s, d, t in zip(case.shapes, case.doms, case.dtypes)]
  xs = [fg.tensor(a, device=device, requires_grad=True) for a in arrs]
  out = case.fn(FG(device), *xs)
  txs = [torch.tensor(a, dtype=getattr(torch, t) if case.native else torch.float64, requires_grad=True)
         for a, t in zip(arrs, case.dtypes)]
  tout = case.tfn(TH(), *txs)
  assert out.shape == tuple(tout.shape), f"{case.name}: forward shape {out.shape}, torch {tuple(tout.shape)}"
  assert out.requires_grad, f"{case.name}: the result does not require grad"
  g = draw(rng, out.shape)
  out.backward(fg.tensor(g, dtype=out.dtype, device=device))
  tout.backward(torch.tensor(g, dtype=tout.dtype))
  fg.realize(*[x.grad for x in xs if x.grad is not None])
  for i, (x, tx) in enumerate(zip(xs, txs)):
    compare(x.grad, tx.grad, x, f"{case.name}: d/d input {i}", case.tol)


# ---- the autograd API -------------------------------------------------------------------------------------------

def pair(rng, device, shape=A, dom="real"):
  a = draw(rng, shape, dom)
  return fg.tensor(a, device=device, requires_grad=True), torch.tensor(a, dtype=torch.float64, requires_grad=True)


def test_accumulates_across_backward_calls(device, rng):
  (x, tx), (y, ty) = pair(rng, device), pair(rng, device, V)
  for a, b in ((x, y), (tx, ty)):
    (a * b).sum().backward()
    (a.exp() * 2).sum().backward()
  compare(x.grad, tx.grad, x, "x after two calls")
  compare(y.grad, ty.grad, y, "y after two calls")
  x.grad = None
  tx.grad = None
  for a in (x, tx): (a * a).sum().backward()
  compare(x.grad, tx.grad, x, "x after .grad = None and a third call")
  for b in (y, ty): (b * 3).sum().backward()          # onto a gradient that has been realized
  compare(y.grad, ty.grad, y, "y after a realized gradient and a third call")


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_gradients_reach_their_own_positions(device, rng, bad):
  """An inf or NaN in the incoming gradient of a lookup (embedding, an index gather) or of a whole tensor's max()/min()
  reaches the positions it belongs to, as PyTorch's scatter-add and max backward give it; 0 * inf was NaN in every
  other row of the embedding table before. (amax keeps PyTorch's product with the mask: NaN elsewhere, as torch's.)"""
  V, D, M = 7, 5, 9
  w0 = rng.standard_normal((V, D)).astype(np.float32)
  idx = rng.integers(0, V, M)
  g = rng.standard_normal((M, D)).astype(np.float32)
  g[int(rng.integers(M)), int(rng.integers(D))] = bad
  x0 = rng.integers(0, 4, (3, 6)).astype(np.float32)   # (ties)
  gi = rng.standard_normal(4).astype(np.float32)
  gi[int(rng.integers(4))] = bad
  pos = rng.integers(0, 18, 4)
  grads = []
  for L, mk in ((fg, lambda a: fg.tensor(a, device=device)), (torch, torch.tensor)):
    w = mk(w0).requires_grad_()
    L.nn.functional.embedding(mk(idx), w).backward(mk(g))
    x = mk(x0).requires_grad_()
    x.reshape(-1)[mk(pos)].backward(mk(gi))
    outs = [w.grad, x.grad]
    for op in ("max", "min", "amax"):
      x = mk(x0).requires_grad_()
      getattr(x, op)().backward(mk(np.float32(bad)))
      outs.append(x.grad)
    grads.append([np.asarray(o.numpy() if isinstance(o, fg.Tensor) else o.detach().numpy()) for o in outs])
  for a, b, name in zip(*grads, ("embedding", "gather", "max", "min", "amax")):
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=name)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("case", ["duplicates", "2d_indices", "float16", "one_index", "non_finite"])
def test_embedding_gradient_summed_by_sorting(device, rng, case, monkeypatch):
  """An embedding's gradient over a big vocabulary sums g's rows by sorting the indices (autograd.
  _rows_summed_by_sort: a stable rank, a segmented scan, a binary search per row) instead of the one-hot reduction
  (rows x indices x row size). Forced here on small tables: the same values as torch's scatter-add, repeated
  indices summed, a row no index names 0, an inf/NaN only in its own row, a float16 table's gradient float16; its
  kernels do a fraction of the one-hot's multiply-adds."""
  from fusegrad import autograd as ag
  monkeypatch.setattr(ag, "SORTED_SCATTER_MIN", 0)
  V, D, M = {"one_index": (1, 3, 1)}.get(case, (613, 24, 40))
  w0 = rng.standard_normal((V, D)).astype(np.float32)
  shape = (5, 8) if case == "2d_indices" else (M,)
  idx = rng.integers(0, V, shape)
  if case == "duplicates": idx[:12] = idx[0]; idx[20:25] = V - 1
  g = rng.standard_normal(shape + (D,)).astype(np.float32)
  if case == "non_finite": g[3, 5], g[7, 2] = np.inf, np.nan
  dtype = "float16" if case == "float16" else "float32"
  w = fg.tensor(w0, dtype=dtype, device=device, requires_grad=True)
  with fg.track() as t:
    fg.nn.functional.embedding(fg.tensor(idx, device=device), w).backward(fg.tensor(g, dtype=dtype, device=device))
    got = w.grad.numpy()
  tw = torch.tensor(w0).to(getattr(torch, dtype)).requires_grad_()
  torch.nn.functional.embedding(torch.tensor(idx), tw).backward(torch.tensor(g).to(getattr(torch, dtype)))
  want = tw.grad.float().numpy()
  assert w.grad.dtype.name == dtype and got.shape == want.shape
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  tol = 2e-3 if dtype == "float16" else 1e-5
  np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol)
  if V > 1:
    assert sum(k.flops for k in t.kernels) < V * idx.size * D, [(k.name, k.flops) for k in t.kernels]


def test_sgd_steps_under_no_grad(device, rng):
  """a training loop: in-place updates of leaves under no_grad keep them leaves that require grad"""
  (w, tw), xb = pair(rng, device, (4, 3)), draw(rng, (5, 4))
  for step in range(3):
    for W, X, ctx in ((w, fg.tensor(xb, device=device), fg.no_grad), (tw, torch.tensor(xb, dtype=torch.float64),
                                                                      torch.no_grad)):
      ((X @ W).tanh() ** 2).mean().backward()
      with ctx():
        W -= 0.5 * W.grad
        W[0, 0] = 0.25
      W.grad = None
    assert w.requires_grad and w.grad is None
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=f"step {step}")


def test_backward_with_gradient_on_non_scalar(device, rng):
  (x, tx), g = pair(rng, device), draw(rng, (2, 3, 4))
  out = x.sin() * fg.tensor(np.arange(1.0, 3.0, dtype=np.float32).reshape(2, 1, 1), device=device)
  tout = tx.sin() * torch.tensor([[[1.0]], [[2.0]]], dtype=torch.float64)
  out.backward(fg.tensor(g, device=device))
  tout.backward(torch.tensor(g, dtype=torch.float64))
  compare(x.grad, tx.grad, x, "backward(gradient)")


def test_backward_non_scalar_without_gradient_raises(device, rng):
  x, _ = pair(rng, device)
  with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
    (x * 2).backward()
  with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
    fg.grad(x * 2, x)
  with pytest.raises(RuntimeError, match="Mismatch in shape"):       # torch's words for a gradient of another shape
    (x * 2).backward(fg.ones(4, device=device))
  assert x.grad is None


def test_detach_stops_gradients(device, rng):
  (x, tx) = pair(rng, device)
  d = x.detach()
  assert not d.requires_grad and x.requires_grad
  np.testing.assert_array_equal(d.numpy(), x.numpy())
  for a in (x, tx): (a.detach() * a + a.detach().exp()).sum().backward()
  compare(x.grad, tx.grad, x, "detach")              # d/dx = x, not 2x
  z = fg.tensor(draw(rng, A), device=device, requires_grad=True)
  w = (z.detach() * 3).sum()
  assert not w.requires_grad


def test_no_grad_decorator(device, rng):
  @fg.no_grad()
  def f(t): return t * 2
  x, _ = pair(rng, device)
  assert not f(x).requires_grad and (x * 2).requires_grad


def test_no_grad(device, rng):
  x, _ = pair(rng, device)
  with fg.no_grad():
    y = x * 2 + 1
    assert not y.requires_grad
    assert not x.exp().sum().requires_grad
  assert x.requires_grad, "no_grad must not change the leaf"
  z = x * 2
  assert z.requires_grad, "no_grad must end with its block"
  np.testing.assert_allclose(y.numpy(), x.numpy() * 2 + 1, rtol=1e-6)
  (z + y).sum().backward()                           # y is a constant here
  np.testing.assert_array_equal(x.grad.numpy(), np.full(A, 2, np.float32))


def test_requires_grad_flags(device, rng):
  a = draw(rng, A)
  x = fg.tensor(a, device=device)
  assert not x.requires_grad and not (x * 2).requires_grad
  assert x.requires_grad_() is x and x.requires_grad
  c = fg.tensor(a, device=device)                    # no grad: gets none, and does not block x's
  (x * c).sum().backward()
  assert c.grad is None
  np.testing.assert_array_equal(x.grad.numpy(), a)
  assert not x.grad.requires_grad, "a gradient is data: it does not require grad"
  assert fg.zeros(2, 3, device=device, requires_grad=True).requires_grad
  assert fg.ones(4, device=device, requires_grad=True).requires_grad
  assert fg.randn(3, device=device, requires_grad=True).requires_grad
  assert x.requires_grad_(False) is x and not x.requires_grad
  assert not (x > 0).requires_grad and not x.argmax().requires_grad   # integer/bool results never do
  w = fg.randn(3, 4, device=device, requires_grad=True)               # a leaf, as in torch
  (w * 2).sum().backward()
  np.testing.assert_array_equal(w.grad.numpy(), np.full((3, 4), 2, np.float32))
  h = w * 3                                                           # not a leaf: torch keeps its .grad None
  h.sum().backward()
  assert h.grad is None
  np.testing.assert_array_equal(w.grad.numpy(), np.full((3, 4), 5, np.float32))
  w.grad = fg.ones(3, 4, device=device)                               # a .grad set by hand is accumulated into
  w.sum().backward()
  np.testing.assert_array_equal(w.grad.numpy(), np.full((3, 4), 2, np.float32))
  with pytest.raises(RuntimeError, match="does not require grad"):
    fg.tensor(a, device=device).sum().backward()


def test_integer_tensors_cannot_require_grad(device):
  for d in ("int32", "int64", "bool"):
    with pytest.raises(RuntimeError, match="(?i)only Tensors of floating point"):
      fg.tensor([1, 0, 1], dtype=d, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="(?i)only Tensors of floating point"):
      fg.tensor([1, 0, 1], dtype=d, device=device).requires_grad_()
  with pytest.raises(RuntimeError, match="(?i)only Tensors of floating point"):
    fg.arange(4, device=device, requires_grad=True)


def test_functional_grad(device, rng):
  (x, tx), (y, ty) = pair(rng, device), pair(rng, device, V)
  g = draw(rng, A)
  got = fg.grad(x * y.sin() + x, (x, y), grad_outputs=fg.tensor(g, device=device))
  want = torch.autograd.grad(tx * ty.sin() + tx, (tx, ty), grad_outputs=torch.tensor(g, dtype=torch.float64))
  assert isinstance(got, tuple) and len(got) == 2
  for i, (a, b, like) in enumerate(zip(got, want, (x, y))): compare(a, b, like, f"fusegrad.grad input {i}")
  assert x.grad is None and y.grad is None, "fusegrad.grad must not touch .grad"
  # a scalar output with no grad_outputs, one input given alone, and an intermediate as the input
  got = fg.grad((x * x).sum(), x)
  assert isinstance(got, tuple) and len(got) == 1
  np.testing.assert_allclose(got[0].numpy(), 2 * x.numpy(), rtol=1e-6)
  assert not got[0].requires_grad
  with pytest.raises(RuntimeError, match="allow_unused"):             # torch: an input the output does not use
    fg.grad((x * 2).sum(), [x, y])
  h = x.exp()
  (gh,) = fg.grad((h * h).sum(), [h])
  np.testing.assert_allclose(gh.numpy(), 2 * np.exp(x.numpy().astype(np.float64)), rtol=RTOL)
  assert x.grad is None and h.grad is None


def test_tensor_used_twice_sums_paths(device, rng):
  (x, tx) = pair(rng, device)
  for a in (x, tx):
    b = a * 2                                          # a diamond: b feeds two branches that meet again
    (b.sin() * b + a.exp() * a.T.sum(0, keepdim=True).T - a[:, :1]).sum().backward()
  compare(x.grad, tx.grad, x, "diamond")


def test_backward_of_intermediate_leaves_stop(device, rng):
  """.grad lands on leaves; an input that does not reach the output keeps .grad None"""
  (x, tx), (y, _) = pair(rng, device), pair(rng, device)
  (x.tanh() * 2).mean().backward()
  tx.tanh().mul(2).mean().backward()
  compare(x.grad, tx.grad, x, "tanh mean")
  assert y.grad is None


def test_large_inputs_cpu_threads_and_split_reduce(device, rng):
  """shapes big enough for several CPU threads, register blocking and a split reduction"""
  n, k, m = (67, 129, 33) if device != "PYTHON" else (5, 9, 3)
  (x, tx), (w, tw) = pair(rng, device, (n, k)), pair(rng, device, (k, m))
  for a, b in ((x, w), (tx, tw)): ((a @ b).tanh().sum() + (a * a).sum() * 1e-3).backward()
  compare(x.grad, tx.grad, x, "big x", tol=3)
  compare(w.grad, tw.grad, w, "big w", tol=3)


def test_inplace_ops_on_non_leaf(device, rng):
  """torch records in-place ops on tensors that are not leaves (h += b is common in models)"""
  (x, tx), (b, tb) = pair(rng, device), pair(rng, device, V)
  for a, c in ((x, b), (tx, tb)):
    y = a * 2
    y *= a
    y += c
    y.mul_(1.5)
    y.sub_(c.exp())
    y.sum().backward()
  compare(x.grad, tx.grad, x, "in-place x")
  compare(b.grad, tb.grad, b, "in-place b")
  with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
    x += 1


def test_setitem_on_non_leaf(device, rng):
  (x, tx), (v, tv) = pair(rng, device), pair(rng, device, V)
  for a, w in ((x, v), (tx, tv)):
    y = a * 1
    y[0] = 0.0
    y[:, 1] = y[:, 1] * 5
    y[2] = w.exp()
    y[y > 2.5] = 0.0
    (y * y).sum().backward()
  compare(x.grad, tx.grad, x, "setitem x")
  compare(v.grad, tv.grad, v, "setitem value")


def test_grad_through_copy_to_another_device(device, rng):
  (x, tx) = pair(rng, device)
  other = "PYTHON" if device != "PYTHON" else "CPU"
  (x.to(other).sin() * 3).sum().backward()
  (tx.sin() * 3).sum().backward()
  compare(x.grad, tx.grad, x, f"{device} -> {other}")


def test_split_reductions(device, rng):
  """reductions big enough to run as two kernels (partials, then the total): ties of a max spread unevenly over
  the partials still share the gradient evenly, as torch's amax/max do"""
  n = (1 << 15) + 3 if device == "PYTHON" else (1 << 18) + 3
  a = draw(rng, (n,), "unit")
  a[[5, n - 10, n - 9, n - 8]] = 1.0                  # one tie in the first partial, three in the last
  a[[7, n - 2, n - 1]] = -1.0
  fns = {"amax": lambda t: t.amax(), "max": lambda t: t.max(), "amin": lambda t: t.amin(),
         "amax_dim": lambda t: t.reshape(1, n).amax(1, keepdim=True), "max_dim": lambda t: t.max(0)[0],
         "sum": lambda t: (t * t).sum() / n, "mean": lambda t: t.exp().mean()}
  errors = []
  for name, f in fns.items():
    x = fg.tensor(a, device=device, requires_grad=True)
    tx = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    f(x).sum().backward()
    f(tx).sum().backward()
    try:
      compare(x.grad, tx.grad, x, f"split reduction {name}")
    except AssertionError as e:
      errors.append(f"{name}: {e}")
  assert not errors, "\n".join(errors)


# ---- kernel counts (CPU) ------------------------------------------------------------------------------------------

def leaf(rng, shape, dom="real"):
  return fg.tensor(draw(rng, shape, dom), device="CPU", requires_grad=True).realize()


def count(*tensors) -> int:
  with fg.track() as t:
    fg.realize(*tensors)
  return len(t.kernels)


def test_kernels_mul_sum_backward(rng):
  x, y = leaf(rng, (64, 65)), leaf(rng, (64, 65))
  (x * y).sum().backward()
  assert count(x.grad, y.grad) <= 2
  np.testing.assert_array_equal(x.grad.numpy(), y.numpy())


def test_kernels_elementwise_chain_backward(rng):
  x, y = leaf(rng, (64, 65)), leaf(rng, (64, 65))
  ((x.exp() * y).sin() + x.tanh()).mean().backward()
  assert count(x.grad, y.grad) <= 2


def test_kernels_softmax_backward(rng):
  x, w = leaf(rng, (64, 65)), leaf(rng, (64, 65))
  (x.softmax(-1) * w).sum().backward()
  assert count(x.grad) == 1      # max, sum and the dot of g with softmax are all row reductions of one kernel
  (x.log_softmax(-1) * w).sum().backward()
  assert count(x.grad) == 1


def test_kernels_big_sum_backward(rng):
  x = leaf(rng, (1 << 16,))
  (x * x).sum().backward()       # the forward is a split reduction; the gradient needs none of it
  assert count(x.grad) == 1


def test_kernels_layernorm_and_mlp_backward(rng):
  """pinned at the current counts (a change either way should be deliberate)"""
  x, g, b, w = leaf(rng, (64, 65)), leaf(rng, (65,)), leaf(rng, (65,)), leaf(rng, (64, 65))
  norm = (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, correction=0) + 1e-5).sqrt()
  (norm * g + b).mul(w).sum().backward()
  # 7 since var computes its own shifted mean (tensor._moments) rather than sharing the x.mean() node written here
  assert count(x.grad, g.grad, b.grad) <= 7
  x, w1, w2 = leaf(rng, (32, 16)), leaf(rng, (16, 64)), leaf(rng, (64, 10))
  ((x @ w1).relu() @ w2).log_softmax(-1).mean().backward()
  assert count(w1.grad, w2.grad) <= 9


def test_kernels_matmul_backward(rng):
  x, w = leaf(rng, (64, 48)), leaf(rng, (48, 32))
  (x @ w).relu().sum().backward()
  assert count(x.grad, w.grad) <= 3   # the forward matmul (for relu's mask), then one matmul per gradient
  x, w = leaf(rng, (64, 48)), leaf(rng, (48, 32))
  (x @ w).sum().backward()
  assert count(x.grad, w.grad) <= 2


def test_each_leaf_gets_its_own_grad_tensor(rng):
  """Leaves whose gradients are one value get distinct .grad tensors, each writable in place without touching the
  other's (PyTorch's): w + v (the same broadcast ones for both: an in-place op on it raised), b1 + b2 of one shape
  (the same tensor: `b1.grad.mul_(2)` doubled b2's too)."""
  a = rng.standard_normal(4).astype(np.float32)
  w, v = fg.tensor(a, requires_grad=True), fg.tensor(a, requires_grad=True)
  (w + v).sum().backward()
  assert w.grad is not v.grad
  w.grad.mul_(2)
  np.testing.assert_array_equal(w.grad.numpy(), np.full(4, 2, np.float32))
  np.testing.assert_array_equal(v.grad.numpy(), np.ones(4, np.float32))
  b1, b2 = fg.tensor(a, requires_grad=True), fg.tensor(a, requires_grad=True)
  x = fg.tensor(rng.standard_normal((3, 4)).astype(np.float32))
  ((x + (b1 + b2)) ** 2).sum().backward()
  want = b2.grad.numpy().copy()
  b1.grad.mul_(0.5)
  np.testing.assert_array_equal(b2.grad.numpy(), want)
  np.testing.assert_allclose(b1.grad.numpy(), want * 0.5, rtol=1e-6)


def test_grad_mode_decorators_as_torch():
  """@no_grad() on a function that recurses restores the caller's mode (one saved mode per entry), on a generator
  function it holds in every resumption, and @no_grad works without parentheses; enable_grad alike."""
  x = fg.ones(3, requires_grad=True)
  @fg.no_grad()
  def f(n):
    if n: f(n - 1)
    return (x * 2).requires_grad
  assert f(3) is False and fg.is_grad_enabled() and (x * 2).requires_grad
  @fg.enable_grad()
  def g(n):
    if n: g(n - 1)
    return (x * 2).requires_grad
  with fg.no_grad():
    assert g(2) is True and not fg.is_grad_enabled()
  assert fg.is_grad_enabled()
  @fg.no_grad()
  def gen():
    for _ in range(3):
      got = yield x * 2
      assert got is None
  assert [y.requires_grad for y in gen()] == [False] * 3 and fg.is_grad_enabled()
  @fg.no_grad
  def h(): return (x * 2).requires_grad
  assert h() is False and fg.is_grad_enabled()
  with fg.no_grad():
    assert not (x * 2).requires_grad
  assert (x * 2).requires_grad
