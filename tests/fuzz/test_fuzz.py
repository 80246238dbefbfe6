"""Random-graph fuzzer: hypothesis builds random graphs of unary, binary (broadcasting), reduce and movement
ops on small float32 inputs; each graph runs on a device and, in parallel, in numpy (float64).

The numpy side also carries a rigorous elementwise bound on how far a float32 evaluation may drift from the
float64 value (forward error analysis: rounding of every op plus the propagation of earlier errors), so the
comparison is tight where the math allows it and never flaky: a wrong index, a missing mask, a misplaced
reduction shows up as a difference far beyond the bound. Domains are kept safe (log(|x|+1), x/(|y|+1), ...)
and magnitudes bounded, so no NaN or inf arises.

Quick by default (~40 graphs per device); FUSEGRAD_FUZZ_EXAMPLES=N runs N per device. A failure prints the
program as fusegrad code (hypothesis `note`), ready to paste into a repro.
"""
from __future__ import annotations
from dataclasses import dataclass
import math
import numpy as np
import pytest
from hypothesis import Phase, event, given, note, settings, strategies as st
import fusegrad as fg
from conftest import DEVICES
from fusegrad import config

EXAMPLES = config.FUZZ_EXAMPLES or 40

U = 2.0 ** -23     # twice float32's unit roundoff: one correctly rounded op
TR = 2.0 ** -19    # a transcendental: 16 ulps, looser than any libm/OpenCL bound
MAX_MAG = 1e5      # values larger than this are not built (keeps everything finite)
TINY = 2.0 ** -149  # float32's smallest subnormal
MAX_NUMEL = 3000
MAX_NDIM = 6
MAX_OPS = 8




@dataclass
class Val:
  name: str
  ref: np.ndarray     # float64 value of the graph
  err: np.ndarray     # bound on |float32 evaluation - ref|, elementwise
  t: fg.Tensor

  @property
  def shape(self): return self.ref.shape


def op_name(code: str) -> str:
  """A short label of the op in a line of code, for --hypothesis-show-statistics."""
  if code.startswith("fg.tensor"): return "input"
  for k in ("reshape", "permute", "expand", "pad", "flip", "contiguous", "sum", "mean", "amax", "amin", "prod",
            "maximum", "minimum", "reciprocal", "sigmoid", "square", "sqrt", "tanh", "sin", "cos", "exp", "log", "relu"):
    if f".{k}" in code: return k
  for sym_, k in (("[", "slice"), (" / (", "div"), (" * ", "mul/scale"), (" + ", "add"), (" - ", "sub"), ("-", "neg"),
                  (".abs()", "abs")):
    if sym_ in code: return k
  return "other"


class Program:
  """Builds fusegrad tensors and numpy values side by side, and the fusegrad code that does the same."""

  def __init__(self, device: str):
    self.device, self.lines, self.pool, self.n = device, [], [], 0

  def new_name(self) -> str:
    self.n += 1
    return f"v{self.n}"

  def add(self, ref, err, t, code: str) -> Val:
    ref = np.asarray(ref, dtype=np.float64)
    # every float32 result may also underflow: an absolute error of up to the smallest subnormal (the relative
    # bounds of the op tables do not cover results in the subnormal range)
    err = np.asarray(err, dtype=np.float64) + TINY
    v = Val(self.new_name(), ref, np.broadcast_to(err, ref.shape), t)
    self.lines.append(f"{v.name} = {code}")
    note(self.lines[-1])
    event(op_name(code))
    self.pool.append(v)
    return v

  def input(self, shape: tuple, seed: int) -> Val:
    arr = np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)
    t = fg.tensor(arr, device=self.device)
    return self.add(arr.astype(np.float64), np.zeros(shape), t,
                    f"fg.tensor(np.random.default_rng({seed}).uniform(-2, 2, {shape}).astype(np.float32), "
                    f"device={self.device!r})")


# ---- op tables: numpy value, error bound, fusegrad expression ---------------------------------------------

def _sqrt_err(x, e):
  a = np.abs(x)
  with np.errstate(invalid="ignore", divide="ignore"):
    far = e / (np.sqrt(a) + np.sqrt(np.maximum(a - e, 0)))
  return np.where(a >= e, np.nan_to_num(far), np.sqrt(e))


UNARY = {
  # name: (numpy value, error bound of the result given x and its bound e, fusegrad code, fusegrad op)
  "neg": (lambda x: -x, lambda x, e, r: e, "-{}", lambda t: -t),
  "abs": (np.abs, lambda x, e, r: e, "{}.abs()", lambda t: t.abs()),
  "relu": (lambda x: np.maximum(x, 0), lambda x, e, r: e, "{}.relu()", lambda t: t.relu()),
  "tanh": (np.tanh, lambda x, e, r: e + TR * np.abs(r), "{}.tanh()", lambda t: t.tanh()),
  "sin": (np.sin, lambda x, e, r: e + TR * np.abs(r) + 4 * U, "{}.sin()", lambda t: t.sin()),
  "cos": (np.cos, lambda x, e, r: e + TR * np.abs(r) + 4 * U, "{}.cos()", lambda t: t.cos()),
  "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), lambda x, e, r: e / 4 + TR * np.abs(r), "{}.sigmoid()",
              lambda t: t.sigmoid()),
  "exp": (np.exp, lambda x, e, r: r * np.expm1(e) + TR * r * np.exp(e), "{}.exp()", lambda t: t.exp()),
  "log1p_abs": (lambda x: np.log(np.abs(x) + 1), lambda x, e, r: e + 2 * U + TR * np.abs(r), "({}.abs() + 1).log()",
                lambda t: (t.abs() + 1).log()),
  "sqrt_abs": (lambda x: np.sqrt(np.abs(x)), lambda x, e, r: _sqrt_err(x, e) + U * r, "{}.abs().sqrt()",
               lambda t: t.abs().sqrt()),
  "recip1": (lambda x: 1 / (np.abs(x) + 1), lambda x, e, r: e + 2 * U * r + U, "({}.abs() + 1).reciprocal()",
             lambda t: (t.abs() + 1).reciprocal()),
  "square": (lambda x: x * x, lambda x, e, r: 2 * np.abs(x) * e + e * e + U * r, "{}.square()", lambda t: t.square()),
}


def _div_err(a, ea, b, eb, r):
  d = np.abs(b) + 1
  ed = eb + U * d
  out = (ea + np.abs(r) * ed) / np.maximum(d - ed, 1e-300) + U * np.abs(r)
  return np.where(ed < d / 2, out, np.inf)


BINARY = {
  "add": (np.add, lambda a, ea, b, eb, r: ea + eb + U * np.abs(r), "{} + {}", lambda x, y: x + y),
  "sub": (np.subtract, lambda a, ea, b, eb, r: ea + eb + U * np.abs(r), "{} - {}", lambda x, y: x - y),
  "mul": (np.multiply, lambda a, ea, b, eb, r: np.abs(a) * eb + np.abs(b) * ea + ea * eb + U * np.abs(r), "{} * {}",
          lambda x, y: x * y),
  "maximum": (np.maximum, lambda a, ea, b, eb, r: np.maximum(ea, eb), "{}.maximum({})", lambda x, y: x.maximum(y)),
  "minimum": (np.minimum, lambda a, ea, b, eb, r: np.maximum(ea, eb), "{}.minimum({})", lambda x, y: x.minimum(y)),
  "div_safe": (lambda a, b: a / (np.abs(b) + 1), _div_err, "{} / ({}.abs() + 1)", lambda x, y: x / (y.abs() + 1)),
}

REDUCE = ["sum", "mean", "amax", "amin", "prod"]
MOVEMENT = ["reshape", "reshape", "permute", "permute", "expand", "expand", "pad", "pad", "slice", "slice", "flip",
            "contiguous"]


def _reduce(kind: str, x, e, axes: tuple, keepdim: bool):
  n = math.prod(x.shape[a] for a in axes)
  ax = axes
  if kind in ("sum", "mean"):
    r = x.sum(ax, keepdims=keepdim)
    err = e.sum(ax, keepdims=keepdim) + n * U * (np.abs(x) + e).sum(ax, keepdims=keepdim)
    if kind == "mean":
      r, err = r / n, err / n + U * np.abs(r / n)
    return r, err
  if kind in ("amax", "amin"):
    r = x.max(ax, keepdims=keepdim) if kind == "amax" else x.min(ax, keepdims=keepdim)
    return r, e.max(ax, keepdims=keepdim)
  # prod: |prod(x + d) - prod(x)| <= prod(|x| + e) - prod(|x|)
  r = x.prod(ax, keepdims=keepdim)
  hi = (np.abs(x) + e).prod(ax, keepdims=keepdim)
  return r, hi - np.abs(x).prod(ax, keepdims=keepdim) + n * U * hi


# ---- strategies for the arguments of each op --------------------------------------------------------------

DIM = st.sampled_from([1, 2, 3, 4, 5] * 4 + [0])


@st.composite
def shapes(draw, min_dims=0, max_dims=4):
  return tuple(draw(st.lists(DIM, min_size=min_dims, max_size=max_dims)))


def _primes(n: int) -> list[int]:
  out, p = [], 2
  while n > 1:
    while n % p == 0: out.append(p); n //= p
    p += 1
  return out


@st.composite
def reshape_target(draw, shape):
  n = math.prod(shape)
  if n == 0:
    dims = draw(st.lists(st.integers(1, 3), min_size=0, max_size=3))
    dims.insert(draw(st.integers(0, len(dims))), 0)
    return tuple(dims)
  ps = _primes(n)
  k = draw(st.integers(0 if n == 1 else 1, min(4, max(1, len(ps)))))
  dims = [1] * k
  for p in ps: dims[draw(st.integers(0, k - 1))] *= p
  for _ in range(draw(st.integers(0, 2))):
    if len(dims) < MAX_NDIM: dims.insert(draw(st.integers(0, len(dims))), 1)
  return tuple(dims)


@st.composite
def index_for(draw, shape):
  """A basic index (ints, slices with any step, including negative ones) for a tensor of this shape."""
  idx = []
  for s in shape:
    kind = draw(st.sampled_from(["all", "slice", "slice", "int"] if s > 0 else ["all", "slice"]))
    if kind == "all": idx.append(slice(None))
    elif kind == "int": idx.append(draw(st.integers(-s, s - 1)))
    else:
      start = draw(st.none() | st.integers(-s - 1, s + 1))
      stop = draw(st.none() | st.integers(-s - 1, s + 1))
      step = draw(st.sampled_from([None, 1, 2, 3, -1, -2]))
      idx.append(slice(start, stop, step))
  return tuple(idx)


def _fmt_index(idx) -> str:
  def one(i):
    if isinstance(i, int): return str(i)
    return f"{'' if i.start is None else i.start}:{'' if i.stop is None else i.stop}" + \
        (f":{i.step}" if i.step is not None else "")
  return "[" + ", ".join(one(i) for i in idx) + "]" if idx else "[()]"


def _broadcastable(a, b) -> bool:
  try:
    np.broadcast_shapes(a, b)
    return True
  except ValueError:
    return False


def _ok(ref, err) -> bool:
  ref = np.asarray(ref)
  return (ref.size <= MAX_NUMEL and ref.ndim <= MAX_NDIM and bool(np.all(np.isfinite(ref)))
          and bool(np.all(np.abs(ref) <= MAX_MAG)) and not np.any(np.isnan(err)))


# ---- one random step --------------------------------------------------------------------------------------

def _movement(draw, x: Val):
  """(numpy function applied alike to value and error arrays, fusegrad op, code) or None."""
  name = draw(st.sampled_from(MOVEMENT))
  nd = x.ref.ndim
  if name == "reshape":
    s = draw(reshape_target(x.shape))
    return (lambda a, fill: a.reshape(s)), (lambda t: t.reshape(s)), f"{x.name}.reshape({s})"
  if name == "permute" and nd > 1:
    p = tuple(draw(st.permutations(range(nd))))
    return (lambda a, fill: a.transpose(p)), (lambda t: t.permute(p)), f"{x.name}.permute({p})"
  if name == "expand" and nd < MAX_NDIM:
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=min(2, MAX_NDIM - nd))))
    s = lead + tuple(draw(st.integers(1, 4)) if d == 1 else d for d in x.shape)
    return (lambda a, fill: np.broadcast_to(a, s).copy()), (lambda t: t.expand(*s)), f"{x.name}.expand{s}"
  if name == "pad" and nd > 0:
    k = draw(st.integers(1, nd))
    flat = tuple(draw(st.integers(0, 2)) for _ in range(2 * k))   # torch order: last dim first
    widths = [(0, 0)] * (nd - k) + [(flat[2 * i], flat[2 * i + 1]) for i in reversed(range(k))]
    return (lambda a, fill: np.pad(a, widths, constant_values=fill)), (lambda t: t.pad(flat)), f"{x.name}.pad({flat})"
  if name == "slice" and nd > 0:
    idx = draw(index_for(x.shape))
    return (lambda a, fill: a[idx]), (lambda t: t[idx]), f"{x.name}{_fmt_index(idx)}"
  if name == "flip" and nd > 0:
    axes = tuple(sorted(draw(st.sets(st.integers(0, nd - 1), min_size=1))))
    return (lambda a, fill: np.flip(a, axes)), (lambda t: t.flip(axes)), f"{x.name}.flip({axes})"
  if name == "contiguous":
    return (lambda a, fill: a), (lambda t: t.contiguous()), f"{x.name}.contiguous()"
  return None


def step(draw, prog: Program) -> None:
  # mostly extend the newest value (long fused chains); sometimes reuse an older one (shared subgraphs)
  x = prog.pool[-1] if draw(st.integers(0, 3)) else draw(st.sampled_from(prog.pool))
  kind = draw(st.sampled_from(["unary", "unary", "binary", "binary", "reduce", "reduce", "movement", "movement",
                               "movement", "movement", "scale"]))
  new = None   # (value, error bound, fusegrad thunk, code)
  with np.errstate(all="ignore"):
    if kind == "unary":
      f, ferr, code, op = UNARY[draw(st.sampled_from(sorted(UNARY)))]
      r = f(x.ref)
      new = r, ferr(x.ref, x.err, r), lambda: op(x.t), code.format(x.name)
    elif kind == "scale":
      c, d = (float(np.float32(draw(st.floats(-2, 2, allow_nan=False, width=32)))) for _ in range(2))
      r = x.ref * c + d
      new = (r, abs(c) * x.err + U * (np.abs(x.ref * c) + np.abs(r)), lambda: x.t * c + d,
             f"{x.name} * {c!r} + {d!r}")
    elif kind == "binary":
      f, ferr, code, op = BINARY[draw(st.sampled_from(sorted(BINARY)))]
      partners = [v for v in prog.pool if _broadcastable(v.shape, x.shape)]
      if partners and draw(st.booleans()):
        y = draw(st.sampled_from(partners))
      else:   # a new input whose shape broadcasts against x: some dims 1, leading dims dropped or added
        s = [1 if draw(st.integers(0, 2)) == 0 else d for d in x.shape]
        if draw(st.booleans()): s = s[draw(st.integers(0, len(s))):]
        elif len(s) < MAX_NDIM and draw(st.integers(0, 3)) == 0: s = [draw(st.integers(1, 3))] + s
        y = prog.input(tuple(s), draw(st.integers(0, 2 ** 32 - 1)))
      a, b = (x, y) if draw(st.booleans()) else (y, x)
      r = f(a.ref, b.ref)
      new = (r, ferr(a.ref, a.err, b.ref, b.err, r), lambda: op(a.t, b.t), code.format(a.name, b.name))
    elif kind == "reduce" and x.ref.ndim > 0:
      name = draw(st.sampled_from(REDUCE))
      axes = tuple(sorted(draw(st.sets(st.integers(0, x.ref.ndim - 1), min_size=1, max_size=x.ref.ndim))))
      keepdim = draw(st.booleans())
      if not (any(x.shape[a] == 0 for a in axes) and name in ("amax", "amin", "mean")):   # refused / nan
        r, e = _reduce(name, x.ref, x.err, axes, keepdim)
        dim = axes[0] if len(axes) == 1 and draw(st.booleans()) else axes
        new = (r, e, lambda: getattr(x.t, name)(dim, keepdim=keepdim),
               f"{x.name}.{name}({dim!r}, keepdim={keepdim})")
    elif kind == "movement":
      m = _movement(draw, x)
      if m is not None:
        fn, op, code = m
        new = fn(x.ref, 0.0), fn(x.err, 0.0), lambda: op(x.t), code
  if new is not None and _ok(new[0], new[1]):
    r, e, make, code = new
    prog.add(r, e, make(), code)
    return
  # the drawn op did not apply (or would leave the safe range): a bounded op instead
  f, ferr, code, op = UNARY["tanh"]
  r = f(x.ref)
  prog.add(r, ferr(x.ref, x.err, r), op(x.t), code.format(x.name))


def check(v: Val, got: np.ndarray) -> None:
  assert got.shape == v.shape, f"{v.name}: shape {got.shape}, expected {v.shape}"
  assert got.dtype == np.float32, f"{v.name}: dtype {got.dtype}"
  diff = np.abs(got.astype(np.float64) - v.ref)
  bad = ~(diff <= 2 * v.err + 1e-30)   # also catches NaN in got
  if bad.any():
    i = tuple(int(j) for j in np.argwhere(bad)[0])
    raise AssertionError(f"{v.name}: {int(bad.sum())} of {bad.size} elements off; at {i}: got {got[i]!r}, "
                         f"expected {v.ref[i]!r} (allowed error {2 * v.err[i]:.3g})")


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=EXAMPLES, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
@given(data=st.data())
def test_random_graph_matches_numpy(device, data):
  draw = data.draw
  prog = Program(device)
  for _ in range(draw(st.integers(1, 2))):
    prog.input(draw(shapes()), draw(st.integers(0, 2 ** 32 - 1)))
  for _ in range(draw(st.integers(1, MAX_OPS))):
    step(draw, prog)
  # the newest value always; sometimes an earlier one too, realized in the same schedule or on its own
  outs = [prog.pool[-1]]
  if len(prog.pool) > 2 and draw(st.booleans()):
    outs.append(draw(st.sampled_from(prog.pool[:-1])))
  together = len(outs) > 1 and draw(st.booleans())
  note("# compare: " + ", ".join(v.name for v in outs) + (" (after fg.realize of them together)" if together else ""))
  if together: fg.realize(*[v.t for v in outs])
  for v in outs: check(v, v.t.numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_zero_size_views(device):
  # found by this fuzzer with zero-size dims allowed
  x = fg.tensor(np.zeros((2, 0), np.float32), device=device)
  assert x.abs().reshape(0).numpy().shape == (0,)
  assert (x + 1).permute(1, 0).numpy().shape == (0, 2)
  assert (x * 2).reshape(0, 3).numpy().shape == (0, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_reduce_seen_only_through_padding(device):
  # found by this fuzzer
  x = fg.tensor(np.arange(12, dtype=np.float32).reshape(4, 3), device=device)
  r = x.sum(1, keepdim=True)
  np.testing.assert_array_equal(r.pad((0, 2))[:, 1:].numpy(), np.zeros((4, 2), np.float32))
  np.testing.assert_array_equal((r.pad((0, 2)) + x)[:, 1:].numpy(), x.numpy()[:, 1:])


@pytest.mark.parametrize("device", DEVICES)
def test_constant_realized_with_its_copy(device):
  # found by this fuzzer: a constant realized in the same schedule as a copy of it is inlined into the copy's
  # kernel, so the lowering cache must key that kernel by the constant's value
  keep = []
  for value in (1.25, -0.5, 3.0):
    c = fg.tensor(np.float32(value), device=device)
    copy = c.abs().contiguous() if value > 0 else (-c).contiguous()
    fg.realize(copy, c)
    assert copy.numpy() == abs(value) and c.numpy() == np.float32(value)
    keep += [c, copy]
