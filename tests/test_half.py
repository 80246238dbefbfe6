"""float16/bfloat16 results are the value of their dtype after every op, as PyTorch computes them.

Values live in float32 registers, but each op's result is rounded to the 16-bit dtype (a SUM/PROD
accumulates in float32 and rounds once; matmul, mean, softmax and the composite activations compute in
float32 and round once, as PyTorch's kernels do). So a result never depends on where kernels were cut:
random chains of ops evaluated fully fused and with .realize() after every op agree bit for bit, on
every device, and each op agrees with torch (CPU) bit for bit, or within 1 ulp of the 16-bit dtype
where the float32 value it rounds is itself not correctly rounded or is summed in another order
(exp/log/tanh/sigmoid/sqrt: fusegrad's float32 functions are within 1 float32 ulp, not torch's;
sum/mean/matmul: torch's vectorized accumulation order differs from the kernels').
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
import fusegrad as fg

HALF = ["float16", "bfloat16"]


def bits(x) -> np.ndarray:
  """A 16-bit tensor (fusegrad or torch) as its float32 values (exact: both dtypes widen exactly)."""
  return np.asarray(x.float().numpy() if isinstance(x, fg.Tensor) else x.float().numpy(), dtype=np.float32)


def ordered(a: np.ndarray) -> np.ndarray:
  """float32 bit patterns as integers that count float32 ulps (monotonic in the value, -0 == +0)."""
  u = a.view(np.int32).astype(np.int64)
  return np.where(u < 0, -(u & 0x7fffffff), u)


def assert_same_bits(got: np.ndarray, want: np.ndarray, label: str) -> None:
  assert got.shape == want.shape, f"{label}: shape {got.shape} != {want.shape}"
  nan = np.isnan(got)
  assert (nan == np.isnan(want)).all(), f"{label}: NaN at different places\n{got}\n{want}"
  bad = ~nan & (got.view(np.int32) != want.view(np.int32))
  assert not bad.any(), f"{label}: {int(bad.sum())} elements differ, e.g. {got[bad][:4]} != {want[bad][:4]}"


def assert_within_ulp(got: np.ndarray, want: np.ndarray, dtype: str, label: str, atol: float = 0.0) -> None:
  """within 1 ulp of the 16-bit dtype (NaN where the other has NaN), or within atol: a result of cancellation
  (b - w * y near 0) carries float32's error of its operands' size, many ulps of its own tiny size."""
  assert got.shape == want.shape, f"{label}: shape {got.shape} != {want.shape}"
  nan = np.isnan(got)
  assert (nan == np.isnan(want)).all(), f"{label}: NaN at different places\n{got}\n{want}"
  if dtype == "bfloat16": g, w = ordered(got[~nan]) >> 16, ordered(want[~nan]) >> 16
  else: g, w = ordered_f16(got[~nan]), ordered_f16(want[~nan])
  far = (np.abs(g - w) > 1) & (np.abs(got[~nan] - want[~nan]) > atol)
  assert not far.any(), f"{label}: more than 1 ulp apart: {got[~nan][far][:4]} vs {want[~nan][far][:4]}"


def ordered_f16(a: np.ndarray) -> np.ndarray:
  u = a.astype(np.float16).view(np.int16).astype(np.int64)
  return np.where(u < 0, -(u & 0x7fff), u)


# ---- the reproducers --------------------------------------------------------------------------------

def test_sum_is_rounded_before_realize(device):
  a = fg.tensor([1.0], dtype=fg.bfloat16, device=device)
  s = a + 0.005859375
  assert s.item() == 1.0078125 == (torch.tensor([1.0], dtype=torch.bfloat16) + 0.005859375).item()
  assert s.realize().item() == 1.0078125


def test_comparison_does_not_flip_after_realize(device):
  x = fg.tensor([1.0, 2.0, 3.0], dtype=fg.bfloat16, device=device)
  s = x + 0.005859375
  before = (s == x).tolist()
  s.realize()
  assert before == (s == x).tolist() == [False, True, True]
  tx = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
  assert ((tx + 0.005859375) == tx).tolist() == before


@pytest.mark.parametrize("dtype", HALF)
def test_constants_hold_the_dtype_value(device, dtype):
  fd, td = getattr(fg, dtype), getattr(torch, dtype)
  want = torch.full((2,), 1.0001, dtype=td).float().tolist()
  assert want == [1.0, 1.0]
  assert fg.full((2,), 1.0001, dtype=fd, device=device).tolist() == want
  assert fg.full((2,), 1.0001, dtype=fd, device=device).realize().tolist() == want
  assert fg.tensor(1.0001, dtype=fd, device=device).item() == 1.0         # the small-constant path
  assert fg.tensor([1.0001], dtype=fd, device=device).item() == 1.0
  assert fg.full((2,), 1.0001, dtype=fd, device=device).float().tolist() == want
  if dtype == "float16":
    c = fg.full((2, 2), 1.0001, dtype=fd, device=device)
    assert c.numpy().dtype == np.float16 and (c.numpy() == 1.0).all()
  # a Python scalar meets a 16-bit tensor in its dtype: 1.0001 is 1.0 there (torch: True)
  assert (torch.tensor([1.0], dtype=td) == 1.0001).item() is True
  assert (fg.tensor([1.0], dtype=fd, device=device) == 1.0001).item() is True
  assert (fg.ones(3, dtype=fd, device=device) == 1.0001).tolist() == [True] * 3
  assert (fg.ones(3, dtype=fd, device=device) < 1.0001).tolist() == [False] * 3


@pytest.mark.parametrize("dtype", HALF)
def test_python_double_converts_through_float32(device, dtype):
  # v lies just above the midpoint of two 16-bit values, but in float32 it is the midpoint: PyTorch converts
  # through float32, so it rounds to even (down)
  fd, td = getattr(fg, dtype), getattr(torch, dtype)
  v = 1 + (2 ** -11 if dtype == "float16" else 2 ** -8) + 2 ** -40
  want = torch.tensor(v, dtype=td).item()
  assert want == 1.0
  assert fg.tensor(v, dtype=fd, device=device).item() == want
  assert fg.full((3,), v, dtype=fd, device=device).tolist() == [want] * 3
  assert fg.tensor([v, v], dtype=fd, device=device).tolist() == [want] * 2
  d64 = fg.tensor([v, -v], dtype=fg.float64, device=device)
  assert d64.to(fd).tolist() == torch.tensor([v, -v], dtype=torch.float64).to(td).tolist()


@pytest.mark.parametrize("dtype", HALF)
def test_iota_values_round(device, dtype):
  fd, td = getattr(fg, dtype), getattr(torch, dtype)
  lo = 2040 if dtype == "float16" else 250
  got = fg.arange(lo, lo + 20, dtype=fd, device=device)
  assert got.tolist() == torch.arange(lo, lo + 20, dtype=td).tolist()
  assert (got * 1).tolist() == (torch.arange(lo, lo + 20, dtype=td) * 1).tolist()


@pytest.mark.parametrize("dtype", HALF)
def test_reductions_accumulate_in_float32(device, rng, dtype):
  fd, td = getattr(fg, dtype), getattr(torch, dtype)
  x = torch.tensor(rng.uniform(-3, 3, (5, 300)).astype(np.float32)).to(td)
  fx = fg.tensor(x.float().numpy(), device=device).to(fd)
  # torch: float32 accumulation, one rounding (for mean: the division in float32 too)
  for name, got, want in (("sum", fx.sum(1), x.sum(1)), ("mean", fx.mean(1), x.mean(1)),
                          ("sum-all", fx.sum(), x.sum()), ("mean-all", fx.mean(), x.mean())):
    assert got.dtype == fd
    assert_within_ulp(bits(got), bits(want), dtype, name)
    exact = x.float().sum(1 if "all" not in name else None)
    if "mean" in name: exact = exact / (300 if "all" not in name else 1500)
    # the float32 sums of both differ in order only: rounding them agrees up to 1 ulp, and rounding once
    # (not twice) is what makes the mean agree
    assert_within_ulp(bits(got), bits(exact.to(td)), dtype, name + " vs float32")


def test_large_sum_rounds_once(device):
  # a split reduction (two kernels) keeps its partial sums in float32: 2**16 ones plus ones still count
  n = (1 << 16) + 512 if device != "PYTHON" else (1 << 15) + 512
  x = fg.ones(n, dtype=fg.bfloat16, device=device)
  assert x.sum().item() == torch.ones(n, dtype=torch.bfloat16).sum().item()
  assert x.sum().dtype == fg.bfloat16


@pytest.mark.parametrize("dtype", HALF)
def test_matmul_rounds_once(device, rng, dtype):
  fd, td = getattr(fg, dtype), getattr(torch, dtype)
  a = torch.tensor(rng.uniform(-2, 2, (8, 40)).astype(np.float32)).to(td)
  b = torch.tensor(rng.uniform(-2, 2, (40, 16)).astype(np.float32)).to(td)
  got = fg.tensor(a.float().numpy(), device=device).to(fd) @ fg.tensor(b.float().numpy(), device=device).to(fd)
  assert got.dtype == fd
  # products are not rounded (torch's CPU matmul: float32 products and sum, one rounding at the end); a sum near 0
  # (cancellation) carries float32's reassociation error, bounded by n * eps32 * sum |a||b|, many ulps of its size
  atol = a.shape[1] * 2.0 ** -24 * float((a.float().abs() @ b.float().abs()).max())
  assert_within_ulp(bits(got), bits((a.float() @ b.float()).to(td)), dtype, "matmul vs float32", atol)
  assert_within_ulp(bits(got), bits(a @ b), dtype, "matmul vs torch", atol)


@pytest.mark.parametrize("dtype", HALF)
def test_composite_ops_round_once(device, rng, dtype):
  """Ops fusegrad composes but torch computes as one kernel in float32: one rounding."""
  fd, td = getattr(fg, dtype), getattr(torch, dtype)
  x = torch.tensor(rng.uniform(-4, 4, (6, 33)).astype(np.float32)).to(td)
  fx = fg.tensor(x.float().numpy(), device=device).to(fd)
  F = torch.nn.functional
  cases = {"sigmoid": (lambda t: t.sigmoid(), None), "silu": (lambda t: t.silu(), F.silu),
           "gelu": (lambda t: t.clamp(-2, 4).gelu(), F.gelu), "softplus": (lambda t: t.softplus(), F.softplus),
           "softmax": (lambda t: t.softmax(-1), None), "log_softmax": (lambda t: t.log_softmax(-1), None),
           "var": (lambda t: t.var(1), None), "std": (lambda t: t.std(1), None),
           "logsumexp": (lambda t: t.logsumexp(1), None), "expm1": (lambda t: t.expm1(), None),
           "rsqrt": (lambda t: t.abs().rsqrt(), None), "log1p": (lambda t: t.abs().log1p(), None)}
  for name, (fn, tfn) in cases.items():
    got = fn(fx)
    assert got.dtype == fd, name
    # (gelu's tail below -2 cancels in 1 + erf: float32 error, not rounding, would show there)
    want = (tfn or fn)(x.clamp(-2, 4) if name == "gelu" else x)
    assert_within_ulp(bits(got), bits(want), dtype, name)
    assert_within_ulp(bits(got), bits((tfn or fn)((x.clamp(-2, 4) if name == "gelu" else x).float()).to(td)), dtype,
                      name + " vs float32")


@pytest.mark.parametrize("dtype", HALF)
def test_norms_round_once(device, rng, dtype):
  """layer_norm / rms_norm / group_norm of 16-bit values: float32 inside, one rounding (rms_norm's default eps
  is float32's, as torch's)."""
  import fusegrad.nn.functional as F
  fd, td = getattr(fg, dtype), getattr(torch, dtype)
  x, w, b = (torch.tensor(rng.normal(0.5, 2, s).astype(np.float32)).to(td) for s in ((8, 64), (64,), (64,)))
  fx, fw, fb = (fg.tensor(t.float().numpy(), device=device).to(fd) for t in (x, w, b))
  TF = torch.nn.functional
  for name, got, want in (("layer_norm", F.layer_norm(fx, (64,), fw, fb), TF.layer_norm(x, (64,), w, b)),
                          ("rms_norm", F.rms_norm(fx, (64,), fw), TF.rms_norm(x, (64,), w)),
                          ("group_norm", F.group_norm(fx.reshape(8, 8, 8), 4, fw[:8], fb[:8]),
                           TF.group_norm(x.reshape(8, 8, 8), 4, w[:8], b[:8]))):
    assert got.dtype == fd, name
    # the operands are of size ~10: float32's rounding before the last rounding to 16 bits is ~1e-6
    assert_within_ulp(bits(got), bits(want), dtype, name, atol=1e-5)


def test_rounding_only_where_needed():
  """float32 kernels get no rounding; a 16-bit kernel rounds each inexact op once, and not before its store."""
  from fusegrad.codegen.lower import lower
  from fusegrad.codegen.ir import toposort, is_round16
  def rounds(t):
    k, _ = lower([t.node], lambda n: n.op == "BUFFER")
    return k, [v for v in toposort([s.value for s in k.stores]) if is_round16(v)]
  x = fg.tensor(np.ones((4, 4), np.float32))
  k, r = rounds((x * x).exp().maximum(x) + x)
  assert r == []
  h = fg.tensor(np.ones((4, 4), np.float16))
  k, r = rounds((h * h).exp().maximum(h).neg() + h)
  assert sorted(v.src[0].op for v in r) == ["EXP", "MUL"]     # MAX and NEG are exact; the ADD is stored
  assert k.stores[0].value.op == "ADD"


# ---- random chains: fused == realized after every op, and each op == torch --------------------------------------

# (name, arity, fn(L, D, O, R, *args), exact): L is the library (fg or torch), D the chain's dtype, O the other
# 16-bit dtype, R applied to every op's result (.realize() or nothing). `exact` ops must match torch bit for bit.
def _div(L, D, O, R, a, b): return R(a / R(R(b.abs()) + 0.25))
STEPS = [
  ("add", 2, lambda L, D, O, R, a, b: R(a + b), True),
  ("sub", 2, lambda L, D, O, R, a, b: R(a - b), True),
  ("mul", 2, lambda L, D, O, R, a, b: R(a * b), True),
  ("scale", 1, lambda L, D, O, R, a: R(R(a * 0.3) + 0.7), True),
  ("div", 2, _div, True),
  ("rdiv", 1, lambda L, D, O, R, a: R(1.7 / R(R(a.abs()) + 0.25)), True),
  ("rsub", 1, lambda L, D, O, R, a: R(0.3 - R(a * 1.3)), True),
  ("exp", 1, lambda L, D, O, R, a: R(R(a.clamp(-6, 6)).exp()), False),
  ("log", 1, lambda L, D, O, R, a: R(R(R(a.abs()) + 0.1).log()), False),
  ("sqrt", 1, lambda L, D, O, R, a: R(R(a.abs()).sqrt()), False),
  ("tanh", 1, lambda L, D, O, R, a: R(a.tanh()), False),
  ("sigmoid", 1, lambda L, D, O, R, a: R(a.sigmoid()), False),
  ("where", 2, lambda L, D, O, R, a, b: R(L.where(R(a > b), a, R(b * 0.5))), True),
  ("maximum", 2, lambda L, D, O, R, a, b: R(L.maximum(a, b)), True),
  ("to_f32", 1, lambda L, D, O, R, a: R(R(R(a.float()) * 1.1).to(D)), True),
  ("to_other", 1, lambda L, D, O, R, a: R(R(R(a.to(O)) * 0.9).to(D)), True),
  ("sum", 1, lambda L, D, O, R, a: R(a.sum(1, keepdim=True)), False),
  ("sum0", 1, lambda L, D, O, R, a: R(a.sum(0, keepdim=True)), False),
  ("mean", 1, lambda L, D, O, R, a: R(a.mean(1, keepdim=True)), False),
  ("amax", 1, lambda L, D, O, R, a: R(a.amax(1, keepdim=True)), True),
  ("matmul", 1, None, False),   # a @ W with the chain's (6, 6) weight
]
SHAPE = (4, 6)


def run_chain(L, dtype: str, device, plan, inputs, w, realize_each: bool):
  """Evaluate a chain plan; returns every step's result (inputs first)."""
  D, O = getattr(L, dtype), getattr(L, "bfloat16" if dtype == "float16" else "float16")
  R = (lambda t: t.realize()) if realize_each else (lambda t: t)
  mk = (lambda a: fg.tensor(a, device=device).to(D)) if L is fg else (lambda a: torch.tensor(a).to(D))
  pool = [mk(a) for a in inputs]
  W = mk(w)
  for name, args in plan:
    _, _, fn, _ = next(s for s in STEPS if s[0] == name)
    xs = [pool[i] for i in args]
    pool.append(R(xs[0].expand(*SHAPE) @ W) if name == "matmul" else fn(L, D, O, R, *xs))
  return pool


def make_plan(rng, n_inputs: int, n_steps: int) -> list:
  plan, n = [], n_inputs
  for _ in range(n_steps):
    name, arity, _, _ = STEPS[rng.integers(len(STEPS))]
    # the newest value is always an operand, so the chain is one long dependency
    args = [n - 1] + [int(rng.integers(n)) for _ in range(arity - 1)]
    if rng.random() < 0.5: args.reverse()
    plan.append((name, args))
    n += 1
  return plan


@pytest.mark.parametrize("dtype", HALF)
def test_random_chains_fused_equal_realized_and_torch(device, rng, dtype):
  td = getattr(torch, dtype)
  # PoCL compiles each new kernel slowly: fewer chains there (the kernels are the C device's, re-spelled)
  for _ in range({"OPENCL": 2, "CPU": 4}.get(device, 8)):
    inputs = [rng.uniform(-3, 3, s).astype(np.float32) for s in (SHAPE, SHAPE, (4, 1), (1, 6))]
    w = rng.uniform(-1, 1, (6, 6)).astype(np.float32)
    plan = make_plan(rng, len(inputs), 10)
    fused = run_chain(fg, dtype, device, plan, inputs, w, False)
    fg.realize(*fused[len(inputs):])   # every step an output: one schedule, its own kernel cuts
    fused_last = run_chain(fg, dtype, device, plan, inputs, w, False)[-1]   # the last step alone, all fused
    split = run_chain(fg, dtype, device, plan, inputs, w, True)
    assert_same_bits(bits(fused_last), bits(split[-1]), f"{dtype} {device} last step fused vs realized: {plan}")
    for i, (f, s) in enumerate(zip(fused, split)):
      assert_same_bits(bits(f), bits(s), f"{dtype} {device} value {i} fused vs realized: {plan}")
    # each step against torch, on fusegrad's own (realized) operands, so differences do not propagate
    W = torch.tensor(w).to(td)
    tw = [torch.tensor(bits(t)).to(td) for t in split]
    for k, (name, args) in enumerate(plan):
      _, _, fn, exact = next(s for s in STEPS if s[0] == name)
      xs = [tw[i] for i in args]
      O = torch.bfloat16 if dtype == "float16" else torch.float16
      want = xs[0].expand(*SHAPE) @ W if name == "matmul" else fn(torch, td, O, lambda t: t, *xs)
      got = bits(split[len(inputs) + k])
      label = f"{dtype} {device} step {k} {name}{args} vs torch"
      # torch gives maximum(-0, +0) either sign, by its loop (+0 in place, -0 broadcast), and a row's amax over -0 and
      # +0 either sign by its reduction order: those compare by value (-0 == +0), every other bit exactly
      if name in ("maximum", "amax"):
        np.testing.assert_array_equal(got, bits(want), err_msg=label)
      elif exact: assert_same_bits(got, bits(want), label)
      else: assert_within_ulp(got, bits(want), dtype, label)
