"""Forward tests of every Tensor op against PyTorch (CPU), on every device.

Each test draws fresh random inputs (the `rng` fixture prints its seed), builds the same values as a
fusegrad tensor and a torch tensor, runs the op on both and compares dtype, shape and values with a
tolerance that fits the dtype. fusegrad computes float16/bfloat16 in float32 and rounds each op's result,
so the torch reference for those runs in float32 on the same (already rounded) inputs and is then cast.
Shapes repeat across tests so that compiled kernels are reused.
"""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import fusegrad as fg
from conftest import DEVICES

FLOATS = ["float32", "float16", "bfloat16", "float64"]
INTS = ["int8", "int16", "int32", "int64", "uint8"]
ALL = FLOATS + INTS + ["bool"]
# (rtol, atol) per result dtype; transcendental ops scale them with `loose`
TOL = {"float32": (1e-5, 1e-6), "float64": (1e-10, 1e-12), "float16": (1e-3, 1e-3), "bfloat16": (1e-2, 1e-2)}
BIG = (1 << 18) + 3    # CPU threading / split reduce; odd on purpose


def tname(d) -> str: return str(d).split(".")[-1]


def small(device: str, n: int, m: int) -> int:
  """the PYTHON device interprets kernels with numpy: keep its inputs small"""
  return m if device == "PYTHON" else n


# ---- making inputs ------------------------------------------------------------------------------------------

def data(rng, shape, dtype: str, lo=-3.0, hi=3.0) -> np.ndarray:
  """Random values exactly representable in `dtype` (float dtypes held as float64)."""
  if dtype == "bool": return rng.random(shape) < 0.5
  if dtype in INTS:
    info = np.iinfo(dtype)
    return rng.integers(max(math.ceil(lo), info.min), min(math.floor(hi), info.max) + 1, size=shape).astype(dtype)
  x = rng.uniform(lo, hi, size=shape)
  return torch.tensor(x).to(getattr(torch, dtype)).double().numpy()


SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, -2.5, 1.5, -1.0)


def with_specials(a: np.ndarray, vals=SPECIALS) -> np.ndarray:
  a = a.copy()
  k = min(a.size, len(vals))
  a.reshape(-1)[:k] = vals[:k]
  return a


def both(a: np.ndarray, dtype: str, device: str):
  """The same values as (fusegrad tensor on device, torch tensor)."""
  return fg.tensor(a, dtype=dtype, device=device), torch.tensor(a).to(getattr(torch, dtype))


def rand_pair(rng, shape, dtype, device, lo=-3.0, hi=3.0):
  return both(data(rng, shape, dtype, lo, hi), dtype, device)


def lib_dtype(t, name: str):
  """the dtype object called `name` in the library that t belongs to"""
  return getattr(torch if isinstance(t, torch.Tensor) else fg, name)


def upcast(t):
  return t.float() if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16) else t


def ref(fn, *args):
  """torch's result of fn(*args); half-precision inputs are computed in float32 and cast back, as fusegrad does."""
  native = fn(*args)
  if not any(isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) for a in args): return native
  if not native.dtype.is_floating_point: return native
  return fn(*[upcast(a) for a in args]).to(native.dtype)


# ---- comparing ------------------------------------------------------------------------------------------------

def to_np(t) -> np.ndarray:
  if isinstance(t, torch.Tensor): return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
  return (t.float() if t.dtype == fg.bfloat16 else t).numpy()


def check_meta(out, want, label: str = "") -> None:
  assert isinstance(out, fg.Tensor), f"{label}: expected a fusegrad Tensor, got {type(out).__name__}"
  assert out.dtype.name == tname(want.dtype), f"{label}: dtype {out.dtype.name}, torch gives {tname(want.dtype)}"
  assert out.shape == tuple(want.shape), f"{label}: shape {out.shape}, torch gives {tuple(want.shape)}"


def check_values(got: np.ndarray, want, label: str = "", loose: float = 1.0, rtol=None, atol=None) -> None:
  """rtol replaces the dtype's; atol only ever widens it (see l1_atol)"""
  exp = to_np(want)
  if want.dtype.is_floating_point:
    r, a = TOL[tname(want.dtype)]
    np.testing.assert_allclose(got, exp, rtol=rtol if rtol is not None else r * loose,
                               atol=max(a * loose, atol or 0.0), equal_nan=True, err_msg=label)
  else:
    np.testing.assert_array_equal(got, exp, err_msg=label)


def check(out, want, loose: float = 1.0, rtol=None, atol=None, label: str = ""):
  """dtype, shape and values of a fusegrad result against a torch result."""
  check_meta(out, want, label)
  check_values(to_np(out), want, label, loose, rtol, atol)


class together:
  """`with together() as chk: chk(out, want, label)` checks dtypes and shapes at once and the values of all
  results of one shape from a single stacked (float64) kernel: many small checks, few compiled kernels."""
  def __enter__(self):
    self.items = []
    return self

  def __call__(self, out, want, label: str = "", **kw):
    check_meta(out, want, label)
    self.items.append((out, want, label, kw))

  def __exit__(self, exc_type, *_):
    if exc_type is not None: return
    errors = []
    for shape in dict.fromkeys(o.shape for o, *_ in self.items):
      group = [it for it in self.items if it[0].shape == shape]
      got = fg.stack([o.double() for o, *_ in group]).numpy()
      for g, (_, want, label, kw) in zip(got, group):
        try:
          check_values(g, want, label, **kw)
        except AssertionError as e:
          errors.append(str(e))
    assert not errors, f"{len(errors)} of {len(self.items)} results differ:\n" + "\n".join(errors)


def l1_atol(fn, *targs, ulps: float = 4) -> float:
  """Absolute tolerance for sums whose terms may cancel (sum, mean, cumsum, matmul, einsum): a few ulps of the
  magnitude the same op reaches on |inputs| -- the classic bound on rounding errors in summation."""
  out = fn(*targs)
  if not out.dtype.is_floating_point or out.numel() == 0: return 0.0
  mag = fn(*[t.double().abs() if isinstance(t, torch.Tensor) else t for t in targs]).abs().max().item()
  return ulps * torch.finfo(out.dtype).eps * mag


def check_all(outs, wants, **kw):
  assert len(outs) == len(wants), f"{len(outs)} results, torch gives {len(wants)}"
  for o, w in zip(outs, wants): check(o, w, **kw)


# ================================================================================================================
# construction
# ================================================================================================================

CONSTRUCT_DATA = {
  "int": 3, "float": -2.5, "bool": True, "int_list": [1, -2, 3], "float_list": [1.5, -2.0],
  "mixed_list": [1, 2.5, True], "bool_list": [True, False, True], "bool_int_list": [True, 2],
  "nested": [[1, 2, 3], [4, 5, 6]], "nested_float": [[[0.5], [1.0]], [[-1.5], [2.0]]], "empty_list": [],
  "empty_nested": [[], []], "np_f64": np.array([1.25, -3.5]), "np_f32": np.array([[1.5, 2]], dtype=np.float32),
  "np_f16": np.array([0.1, 65504], dtype=np.float16), "np_i32": np.array([-7, 8], dtype=np.int32),
  "np_i8": np.array([-128, 127], dtype=np.int8), "np_u8": np.array([0, 255], dtype=np.uint8),
  "np_i16": np.array([[-300], [300]], dtype=np.int16), "np_i64": np.arange(6).reshape(2, 3),
  "np_bool": np.array([True, False]), "np_scalar_f64": np.float64(2.5), "np_scalar_i32": np.int32(-5),
  "np_0d": np.array(7.25, dtype=np.float32),
}


@pytest.mark.parametrize("key", CONSTRUCT_DATA)
def test_tensor_from_data(device, key):
  d = CONSTRUCT_DATA[key]
  check(fg.tensor(d, device=device), torch.tensor(d))


@pytest.mark.parametrize("dtype", ALL)
def test_tensor_with_dtype(device, rng, dtype):
  vals = rng.uniform(0, 100, size=(2, 3)).round(1)
  check(fg.tensor(vals.tolist(), dtype=dtype, device=device), torch.tensor(vals.tolist(), dtype=getattr(torch, dtype)))
  check(fg.tensor(vals, dtype=getattr(fg, dtype), device=device), torch.tensor(vals, dtype=getattr(torch, dtype)))


def test_tensor_from_random_numpy(device, rng):
  a = rng.standard_normal((3, 5)).astype(np.float32)
  t = fg.tensor(a, device=device)
  assert t.dtype == fg.float32 and t.device == device
  np.testing.assert_array_equal(t.numpy(), a)
  b = rng.integers(-1000, 1000, size=(4, 2))
  np.testing.assert_array_equal(fg.tensor(b, device=device).numpy(), b)
  assert fg.tensor(b, device=device).dtype == fg.int64


CREATE = {
  "zeros": lambda L, dev: L.zeros(2, 3, device=dev),
  "zeros_tuple_int": lambda L, dev: L.zeros((2, 3), dtype=L.int32, device=dev),
  "zeros_0d": lambda L, dev: L.zeros((), device=dev),
  "zeros_empty": lambda L, dev: L.zeros(0, 3, device=dev),
  "ones": lambda L, dev: L.ones(4, device=dev),
  "ones_f16": lambda L, dev: L.ones(2, 2, dtype=L.float16, device=dev),
  "ones_bool": lambda L, dev: L.ones(3, dtype=L.bool, device=dev),
  "full_int": lambda L, dev: L.full((2, 3), 7, device=dev),
  "full_float": lambda L, dev: L.full((2, 3), -2.5, device=dev),
  "full_bool": lambda L, dev: L.full((3,), True, device=dev),
  "full_dtype": lambda L, dev: L.full((2, 2), 3, dtype=L.float64, device=dev),
  "full_bf16": lambda L, dev: L.full((2, 2), 1.1, dtype=L.bfloat16, device=dev),
  "arange": lambda L, dev: L.arange(5, device=dev),
  "arange_start_step": lambda L, dev: L.arange(2, 11, 3, device=dev),
  "arange_neg_step": lambda L, dev: L.arange(10, -1, -3, device=dev),
  "arange_float": lambda L, dev: L.arange(0, 1, 0.1, device=dev),
  "arange_float_start": lambda L, dev: L.arange(1.5, 4, device=dev),
  "arange_dtype": lambda L, dev: L.arange(6, dtype=L.float32, device=dev),
  "arange_empty": lambda L, dev: L.arange(0, device=dev),
  "linspace": lambda L, dev: L.linspace(0, 1, 5, device=dev),
  "linspace_neg": lambda L, dev: L.linspace(-2, 3.5, 7, device=dev),
  "linspace_one": lambda L, dev: L.linspace(3, 5, 1, device=dev),
  "linspace_f64": lambda L, dev: L.linspace(0, 1, 9, dtype=L.float64, device=dev),
  "eye": lambda L, dev: L.eye(3, device=dev),
  "eye_rect": lambda L, dev: L.eye(2, 4, device=dev),
  "eye_int": lambda L, dev: L.eye(3, dtype=L.int32, device=dev),
}


@pytest.mark.parametrize("key", CREATE)
def test_create(device, key):
  check(CREATE[key](fg, device), CREATE[key](torch, "cpu"))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
def test_like(device, rng, dtype):
  x, tx = rand_pair(rng, (3, 4), dtype, device)
  check(fg.zeros_like(x), torch.zeros_like(tx))
  check(fg.ones_like(x), torch.ones_like(tx))
  check(fg.full_like(x, 2), torch.full_like(tx, 2))
  check(fg.ones_like(x, dtype=fg.float64), torch.ones_like(tx, dtype=torch.float64))
  for fe, te in ((fg.empty_like(x), torch.empty_like(tx)), (fg.empty(2, 0, 3, dtype=dtype, device=device),
                                                           torch.empty(2, 0, 3, dtype=getattr(torch, dtype)))):
    assert fe.shape == tuple(te.shape) and fe.dtype.name == tname(te.dtype)
  e = fg.empty(3, 2, device=device)
  assert e.shape == (3, 2) and e.dtype == fg.float32 and e.device == device
  if dtype in FLOATS:
    for f in (fg.rand_like, fg.randn_like):
      r = f(x)
      assert r.shape == x.shape and r.dtype == x.dtype and r.device == device


# ---- random numbers ----

def test_rand_statistics(device):
  n = small(device, 1 << 16, 1 << 12)
  fg.manual_seed(1234)
  u = fg.rand(n, device=device)
  assert u.dtype == fg.float32 and u.shape == (n,)
  a = u.numpy()
  assert a.min() >= 0 and a.max() < 1
  assert abs(a.mean() - 0.5) < 0.03 and abs(a.var() - 1 / 12) < 0.01
  assert np.histogram(a, bins=8, range=(0, 1))[0].min() > n / 8 * 0.8   # every eighth of [0, 1) is hit
  z = fg.randn(n // 4, 4, device=device).numpy()
  assert z.shape == (n // 4, 4) and np.isfinite(z).all()
  assert abs(z.mean()) < 0.05 and abs(z.std() - 1) < 0.05
  assert abs((np.abs(z) < 1).mean() - 0.6827) < 0.03
  i = fg.randint(-3, 5, (n,), device=device)
  assert i.dtype == fg.int64
  v = i.numpy()
  assert v.min() == -3 and v.max() == 4 and set(np.unique(v)) == set(range(-3, 5))
  assert fg.randint(10, size=(3, 2), dtype=fg.int32, device=device).dtype == fg.int32
  for d in ("float16", "bfloat16", "float64"):
    r = fg.rand(2, 3, dtype=getattr(fg, d), device=device)
    assert r.dtype.name == d and r.shape == (2, 3)
    rv = to_np(r)
    assert rv.min() >= 0 and rv.max() <= 1


def test_manual_seed_reproducible(device, rng):
  s = int(rng.integers(0, 2**31))
  def draw(dev):
    fg.manual_seed(s)
    return fg.rand(64, device=dev).numpy(), fg.randint(0, 1000, (64,), device=dev).numpy(), \
        fg.randn(8, 8, device=dev).numpy()
  first, cpu, again = draw(device), draw("CPU"), draw(device)
  for a, b, c in zip(first, cpu, again):
    np.testing.assert_array_equal(a, c)    # re-seeding repeats the numbers exactly
  np.testing.assert_array_equal(first[0], cpu[0])   # rand: bit-identical on every device
  np.testing.assert_array_equal(first[1], cpu[1])
  # randn goes through log and cos, whose last bit may differ between math libraries
  np.testing.assert_allclose(first[2], cpu[2], rtol=1e-5, atol=1e-6)
  # without re-seeding the stream moves on
  fg.manual_seed(s)
  x, y = fg.rand(64, device=device).numpy(), fg.rand(64, device=device).numpy()
  assert not np.array_equal(x, y)
  fg.manual_seed(s + 1)
  assert not np.array_equal(fg.rand(64, device=device).numpy(), x)


# ================================================================================================================
# dtypes: casts and promotion
# ================================================================================================================

def cast_source(rng, src: str, dst: str) -> np.ndarray:
  if src == "bool": return data(rng, (3, 7), "bool")
  if src in INTS:
    if dst in INTS: lo, hi = np.iinfo(src).min, np.iinfo(src).max     # narrowing wraps around, as in torch
    else: lo, hi = -1000, 1000
    return data(rng, (3, 7), src, lo, hi)
  lo, hi = (0, 250) if dst == "uint8" else (-120, 120)
  a = data(rng, (3, 7), src, lo, hi)
  a.reshape(-1)[:2] = [0.0, 1.0]
  return a


@pytest.mark.parametrize("src", ALL)
def test_casts(device, rng, src):
  with together() as chk:
    for dst in ALL:
      x, tx = both(cast_source(rng, src, dst), src, device)
      chk(x.to(getattr(fg, dst)), tx.to(getattr(torch, dst)), f"{src} -> {dst}")


def test_cast_methods(device, rng):
  x, tx = rand_pair(rng, (2, 5), "float32", device, -50, 50)
  for m in ("float", "half", "int", "long", "bool", "double", "bfloat16", "short", "char"):
    check(getattr(x, m)(), getattr(tx, m)())
  check(x.to("float16"), tx.to(torch.float16))
  check(x.to(dtype=fg.int32), tx.to(dtype=torch.int32))
  check(x.type(fg.int16), tx.type(torch.int16))
  check(x.float(), tx.float())   # a no-op cast still gives the values
  check(fg.tensor([math.nan, math.inf, -0.0], device=device).bool(), torch.tensor([math.nan, math.inf, -0.0]).bool())
  check(fg.tensor([0.75, 1.25, 0.5], dtype=fg.float16, device=device).bfloat16(),
        torch.tensor([0.75, 1.25, 0.5], dtype=torch.float16).bfloat16())


PAIRS = [(a, b) for a in ALL for b in ALL]


@pytest.mark.parametrize("a,b", PAIRS)
def test_promotion_tensor_tensor(a, b):
  x = fg.ones(2, dtype=getattr(fg, a)) * fg.ones(2, dtype=getattr(fg, b))
  assert x.dtype.name == tname((torch.ones(2, dtype=getattr(torch, a)) * torch.ones(2, dtype=getattr(torch, b))).dtype)
  assert fg.promote_types(getattr(fg, a), getattr(fg, b)).name == tname(torch.promote_types(getattr(torch, a), getattr(torch, b)))
  # a 0-d tensor only counts when it is of a higher category
  z = fg.ones(2, dtype=getattr(fg, a)) * fg.ones((), dtype=getattr(fg, b))
  tz = torch.ones(2, dtype=getattr(torch, a)) * torch.ones((), dtype=getattr(torch, b))
  assert z.dtype.name == tname(tz.dtype), f"{a} tensor * 0-d {b}"
  zz = fg.ones((), dtype=getattr(fg, a)) * fg.ones((), dtype=getattr(fg, b))
  assert zz.dtype.name == tname((torch.ones((), dtype=getattr(torch, a)) * torch.ones((), dtype=getattr(torch, b))).dtype)


@pytest.mark.parametrize("a", ALL)
@pytest.mark.parametrize("scalar", [True, 3, -2.5, np.float64(1.5), np.int32(2)], ids=lambda s: f"{type(s).__name__}")
def test_promotion_tensor_scalar(a, scalar):
  x, tx = fg.ones(2, dtype=getattr(fg, a)), torch.ones(2, dtype=getattr(torch, a))
  for f in (lambda u, s: u * s, lambda u, s: s * u, lambda u, s: u + s, lambda u, s: u == s, lambda u, s: u / s,
            lambda u, s: s / u, lambda u, s: u // s, lambda u, s: u.clamp(max=s)):
    try:
      want = f(tx, scalar)
    except RuntimeError:    # (bool // bool has no kernel in torch)
      continue
    assert f(x, scalar).dtype.name == tname(want.dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "uint8", "int8", "bool"])
def test_promotion_values(device, rng, dtype):
  """mixed dtypes compute in the promoted dtype (values, not only the dtype name)"""
  x, tx = rand_pair(rng, (3, 4), dtype, device, -20, 20)
  with together() as chk:
    for other in ("float64", "int16", "uint8", "bool", "bfloat16"):
      y, ty = rand_pair(rng, (4,), other, device, 1, 9)
      chk(x + y, ref(lambda a, b: a + b, tx, ty), f"{dtype} + {other}")
      chk(x * y[1:2].reshape(()), ref(lambda a, b: a * b, tx, ty[1:2].reshape(())), f"{dtype} * 0-d {other}")
    chk(x + 2, ref(lambda a: a + 2, tx), "+ 2")
    chk(x * 1.5, ref(lambda a: a * 1.5, tx), "* 1.5")
    chk(x / 4, ref(lambda a: a / 4, tx), "/ 4")


# ================================================================================================================
# unary ops
# ================================================================================================================

def _fn(name, **kw):
  """the same method on both libraries; torch.nn.functional for the activations torch keeps there"""
  def f(t):
    if isinstance(t, torch.Tensor) and not hasattr(torch.Tensor, name): return getattr(F, name)(t, **kw)
    return getattr(t, name)(**kw)
  return f


# name: (fn, loose, (lo, hi)) — loose scales the float tolerance of transcendental ops
UNARY = {
  "neg": (_fn("neg"), 1, (-3, 3)), "exp": (_fn("exp"), 2, (-8, 8)), "exp2": (_fn("exp2"), 4, (-8, 8)),
  "log": (_fn("log"), 2, (0, 10)), "log2": (_fn("log2"), 4, (0, 10)), "sqrt": (_fn("sqrt"), 1, (0, 10)),
  "rsqrt": (_fn("rsqrt"), 2, (0, 10)), "sin": (_fn("sin"), 2, (-6, 6)), "cos": (_fn("cos"), 2, (-6, 6)),
  "tan": (_fn("tan"), 4, (-1.4, 1.4)), "abs": (_fn("abs"), 1, (-3, 3)), "sign": (_fn("sign"), 1, (-3, 3)),
  "reciprocal": (_fn("reciprocal"), 1, (-3, 3)), "relu": (_fn("relu"), 1, (-3, 3)),
  "sigmoid": (_fn("sigmoid"), 2, (-10, 10)), "tanh": (_fn("tanh"), 2, (-5, 5)),
  "gelu": (_fn("gelu"), 2, (-5, 5)), "gelu_tanh": (_fn("gelu", approximate="tanh"), 2, (-5, 5)),
  "silu": (_fn("silu"), 2, (-8, 8)), "elu": (_fn("elu"), 2, (-5, 5)), "elu_alpha": (_fn("elu", alpha=0.5), 2, (-5, 5)),
  "leaky_relu": (_fn("leaky_relu"), 1, (-3, 3)), "leaky_relu_slope": (_fn("leaky_relu", negative_slope=0.2), 1, (-3, 3)),
  "softplus": (_fn("softplus"), 2, (-25, 25)), "softplus_beta": (_fn("softplus", beta=2.0, threshold=5.0), 2, (-6, 6)),
  "floor": (_fn("floor"), 1, (-5, 5)), "ceil": (_fn("ceil"), 1, (-5, 5)), "round": (_fn("round"), 1, (-5, 5)),
  "trunc": (_fn("trunc"), 1, (-5, 5)), "isnan": (_fn("isnan"), 1, (-3, 3)), "isinf": (_fn("isinf"), 1, (-3, 3)),
  "logical_not": (_fn("logical_not"), 1, (-2, 2)), "square": (_fn("square"), 1, (-3, 3)),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", UNARY)
def test_unary_float(device, rng, op, dtype):
  fn, loose, (lo, hi) = UNARY[op]
  # torch's float32 gelu gives nan at +-inf (float64 gives inf and nan): leave those out
  a = with_specials(data(rng, (4, 6), dtype, lo, hi), (math.nan, 0.0, -0.0, 0.5, -2.5) if op.startswith("gelu") else SPECIALS)
  if op == "round": a.reshape(-1)[9:14] = [0.5, 1.5, 2.5, -0.5, -3.5]   # ties go to even
  x, tx = both(a, dtype, device)
  check(fn(x), ref(fn, tx), loose=loose)


INT_UNARY = ["neg", "abs", "sign", "bitwise_not", "logical_not", "isnan", "isinf", "floor", "ceil", "round", "trunc",
             "relu", "exp", "sqrt", "sin", "sigmoid", "reciprocal", "square"]
# torch has no bool kernel for abs/floor/ceil/round/trunc (NotImplementedError): nothing to compare with
INT_UNARY_CASES = [(op, d) for op in INT_UNARY for d in ("int8", "int32", "int64", "uint8", "bool")
                   if not (d == "bool" and op in ("abs", "floor", "ceil", "round", "trunc"))]


@pytest.mark.parametrize("op,dtype", INT_UNARY_CASES)
def test_unary_int(device, rng, op, dtype):
  lo, hi = (0, 9) if op == "sqrt" else (-9, 9)
  x, tx = rand_pair(rng, (3, 4), dtype, device, lo, hi)
  fn = _fn(op)
  if dtype == "bool" and op in ("neg", "relu"):   # torch refuses these on purpose, so must fusegrad
    with pytest.raises(RuntimeError): fn(tx)
    with pytest.raises(RuntimeError): fn(x)
    return
  check(fn(x), fn(tx), loose=2)


def test_unary_module_functions(device, rng):
  x, tx = rand_pair(rng, (3, 4), "float32", device, 0.1, 3)
  xi, txi = rand_pair(rng, (3, 4), "int32", device, -50, 50)
  with together() as chk:
    for name in ("exp", "log", "sqrt", "abs", "sigmoid", "tanh", "floor", "neg"):
      chk(getattr(fg, name)(x), getattr(torch, name)(tx), name, loose=2)
    chk(-x, -tx, "-x")
    chk(abs(x - 1), abs(tx - 1), "abs()")
    chk(~xi, ~txi, "~int")
    chk(~(xi > 0), ~(txi > 0), "~bool")


# ================================================================================================================
# binary and ternary ops
# ================================================================================================================

def _safe_div(b):
  """integer divisors must not be zero"""
  return np.where(b == 0, 3, b).astype(b.dtype) if b.dtype.kind in "iub" else b


# name: (fn, dtypes, lhs range, rhs range)
NUM = ["float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8", "int16"]
BINARY = {
  "add": (lambda a, b: a + b, NUM + ["bool"], None, None),
  "sub": (lambda a, b: a - b, NUM, None, None),
  "mul": (lambda a, b: a * b, NUM + ["bool"], None, None),
  "div": (lambda a, b: a / b, NUM, None, "nonzero"),
  "div_trunc": (lambda a, b: a.div(b, rounding_mode="trunc"), NUM, None, "nonzero"),
  "div_floor": (lambda a, b: a.div(b, rounding_mode="floor"), NUM, None, "nonzero"),
  "floordiv": (lambda a, b: a // b, NUM, None, "nonzero"),
  "remainder": (lambda a, b: a % b, NUM, None, "nonzero"),
  "fmod": (lambda a, b: a.fmod(b), ["float32", "int32", "int64"], None, "nonzero"),
  "pow": (lambda a, b: a ** b, FLOATS, (0.1, 3), (-2, 2)),
  "pow_int": (lambda a, b: a ** b, ["int32", "int64", "int8", "int16", "uint8"], (-3, 3), (0, 4)),
  "maximum": (lambda a, b: a.maximum(b), NUM + ["bool"], None, None),
  "minimum": (lambda a, b: a.minimum(b), NUM + ["bool"], None, None),
  "eq": (lambda a, b: a == b, NUM + ["bool"], (-2, 2), (-2, 2)),
  "ne": (lambda a, b: a != b, NUM + ["bool"], (-2, 2), (-2, 2)),
  "lt": (lambda a, b: a < b, NUM + ["bool"], (-2, 2), (-2, 2)),
  "le": (lambda a, b: a <= b, NUM + ["bool"], (-2, 2), (-2, 2)),
  "gt": (lambda a, b: a > b, NUM + ["bool"], (-2, 2), (-2, 2)),
  "ge": (lambda a, b: a >= b, NUM + ["bool"], (-2, 2), (-2, 2)),
  "logical_and": (lambda a, b: a.logical_and(b), ["float32", "int32", "bool"], (-1, 1), (-1, 1)),
  "logical_or": (lambda a, b: a.logical_or(b), ["float32", "int32", "bool"], (-1, 1), (-1, 1)),
  "logical_xor": (lambda a, b: a.logical_xor(b), ["float32", "int32", "bool"], (-1, 1), (-1, 1)),
  "bitwise_and": (lambda a, b: a & b, INTS + ["bool"], (-100, 100), (-100, 100)),
  "bitwise_or": (lambda a, b: a | b, INTS + ["bool"], (-100, 100), (-100, 100)),
  "bitwise_xor": (lambda a, b: a ^ b, INTS + ["bool"], (-100, 100), (-100, 100)),
  "lshift": (lambda a, b: a << b, INTS, (-15, 15), (0, 3)),
  "rshift": (lambda a, b: a >> b, INTS, (-100, 100), (0, 5)),
}
BIN_CASES = [(op, d) for op, (_, ds, _, _) in BINARY.items() for d in ds]


def binary_inputs(rng, op, dtype, shape_a=(2, 3, 4), shape_b=(3, 1)):
  _, _, ra, rb = BINARY[op]
  lo, hi = ra or (-5, 5)
  a = data(rng, shape_a, dtype, lo, hi)
  if rb == "nonzero": b = _safe_div(data(rng, shape_b, dtype, -5, 5))
  else: b = data(rng, shape_b, dtype, *(rb or (-5, 5)))
  if dtype in FLOATS and rb == "nonzero": b = np.where(np.abs(b) < 0.1, 0.5, b)
  return a, b


@pytest.mark.parametrize("op,dtype", BIN_CASES)
def test_binary(device, rng, op, dtype):
  fn = BINARY[op][0]
  a, b = binary_inputs(rng, op, dtype)
  (x, tx), (y, ty) = both(a, dtype, device), both(b, dtype, device)
  check(fn(x, y), ref(fn, tx, ty))
  if BINARY[op][3] is None and dtype in ("float32", "int32", "bool"):   # operands swapped, lhs a sliced view
    check(fn(y, x[0]), ref(fn, ty, tx[0]))


SHAPE_PAIRS = [((4, 5), (4, 5)), ((4, 1), (1, 5)), ((2, 3, 4), (4,)), ((), (3, 4)), ((3, 4), ()), ((1,), (2, 3)),
               ((5, 1, 3), (1, 4, 1)), ((0, 3), (1, 3)), ((2, 0), (2, 1)), ((1, 1, 1), (3,))]


@pytest.mark.parametrize("sa,sb", SHAPE_PAIRS, ids=str)
def test_broadcasting(device, rng, sa, sb):
  (x, tx), (y, ty) = rand_pair(rng, sa, "float32", device), rand_pair(rng, sb, "float32", device)
  check(x * y - y, tx * ty - ty)
  check(fg.maximum(x, y), torch.maximum(tx, ty))
  check((x < y), (tx < ty))


def test_broadcast_errors(device, rng):
  x, y = fg.ones(3, 4, device=device), fg.ones(3, 5, device=device)
  with pytest.raises(RuntimeError, match="size"): x + y
  with pytest.raises(RuntimeError): fg.ones(2, device=device) * fg.ones(3, device=device)


SCALARS = [2, -3, 2.5, True]
SCALAR_OPS = {"add": lambda a, s: a + s, "rmul": lambda a, s: s * a, "sub": lambda a, s: a - s, "rsub": lambda a, s: s - a,
              "div": lambda a, s: a / s, "rdiv": lambda a, s: s / a, "lt": lambda a, s: a < s, "rgt": lambda a, s: s > a,
              "eq": lambda a, s: a == s}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "uint8", "bool"])
def test_scalar_operands(device, rng, dtype):
  """python scalars on either side: promotion by category, values in the promoted dtype"""
  x, tx = rand_pair(rng, (3, 4), dtype, device, 1, 9)
  with together() as chk:
    for s in SCALARS:
      for name, fn in SCALAR_OPS.items():
        try:
          want = ref(lambda a: fn(a, s), tx)
        except RuntimeError:     # a bool in a subtraction: torch refuses, so must fusegrad
          with pytest.raises(RuntimeError): fn(x, s)
          continue
        chk(fn(x, s), want, f"{name} {s!r}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64", "int8"])
def test_reflected_operators(device, rng, dtype):
  x, tx = rand_pair(rng, (3, 4), dtype, device, 1, 4)
  ops = {"7-": lambda a: 7 - a, "7/": lambda a: 7 / a, "2**": lambda a: 2 ** a, "7//": lambda a: 7 // a,
         "-7//": lambda a: -7 // a, "7%": lambda a: 7 % a, "-7%": lambda a: -7 % a, "1.5**": lambda a: 1.5 ** a,
         "2.5-": lambda a: 2.5 - a, "10.0//": lambda a: 10.0 // a, "np.float32*": lambda a: np.float32(2.0) * a}
  if dtype in INTS:
    ops.update({"5&": lambda a: 5 & a, "6|": lambda a: 6 | a, "3^": lambda a: 3 ^ a, "1<<": lambda a: 1 << a,
                "64>>": lambda a: 64 >> a})
  with together() as chk:
    for name, fn in ops.items(): chk(fn(x), ref(fn, tx), name, loose=2)


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8", "float32"])
def test_floor_division_negatives(device, dtype):
  vals = [-7, -6, -5, -1, 0, 1, 5, 6, 7]
  a = np.array([[v] for v in vals], dtype=dtype)
  b = np.array([[-3, -2, 2, 3]], dtype=dtype)
  (x, tx), (y, ty) = both(a, dtype, device), both(b, dtype, device)
  ops = {"//": lambda p, q: p // q, "%": lambda p, q: p % q, "floor": lambda p, q: p.div(q, rounding_mode="floor"),
         "trunc": lambda p, q: p.div(q, rounding_mode="trunc"), "remainder": lambda p, q: p.remainder(q),
         "fmod": lambda p, q: p.fmod(q), "// -2": lambda p, q: p // -2, "% -2": lambda p, q: p % -2,
         "% 3": lambda p, q: p % 3}
  with together() as chk:
    for name, fn in ops.items(): chk(fn(x, y), fn(tx, ty), name)


def test_float_division_specials(device, rng):
  a = with_specials(data(rng, (3, 4), "float32", -5, 5))
  b = data(rng, (3, 4), "float32", -5, 5)
  b.reshape(-1)[3:7] = [0.0, -0.0, math.inf, math.nan]
  (x, tx), (y, ty) = both(a, "float32", device), both(b, "float32", device)
  ops = {"/": lambda p, q: p / q, "maximum": lambda p, q: p.maximum(q), "minimum": lambda p, q: p.minimum(q),
         "*": lambda p, q: p * q, "<": lambda p, q: p < q, "==": lambda p, q: p == q, "!=": lambda p, q: p != q,
         "% 1.5": lambda p, q: p % 1.5, "// 1.5": lambda p, q: p // 1.5, "//": lambda p, q: p // q.abs().clamp(min=1)}
  with together() as chk:
    for name, fn in ops.items(): chk(fn(x, y), fn(tx, ty), name)


def test_pow_scalars(device, rng):
  (x, tx), (n, tn), (i, ti) = (rand_pair(rng, (3, 5), d, device, lo, hi)
                               for d, lo, hi in (("float32", 0.1, 4), ("float32", -4, 4), ("int64", -5, 5)))
  with together() as chk:
    for e in (2, 3, 0.5, -1, -2, 2.5, 0, 1):
      chk(x ** e, tx ** e, f"** {e}", loose=4)
      chk(x.pow(e), tx.pow(e), f"pow({e})", loose=4)
    for e in (2, 3, -1, 1.5):
      chk(n ** e, tn ** e, f"negative base ** {e}", loose=4)    # nan for non-integer powers
    for e in (2, 3, 0, 1):
      chk(i ** e, ti ** e, f"int64 ** {e}")
    chk(i ** 0.5, ti ** 0.5, "int64 ** 0.5", loose=4)


def test_integer_wraparound(device, rng):
  for dtype in ("int8", "uint8", "int16", "int32"):
    x, tx = rand_pair(rng, (4, 5), dtype, device, np.iinfo(dtype).min, np.iinfo(dtype).max)
    y, ty = rand_pair(rng, (4, 5), dtype, device, np.iinfo(dtype).min, np.iinfo(dtype).max)
    check(x + y, tx + ty)
    check(x - y, tx - ty)
    check(x * y, tx * ty)


WHERE_CASES = {
  "tensors": lambda L, c, a, b: L.where(c, a, b),
  "method": lambda L, c, a, b: a.where(c, b),
  "scalar_other": lambda L, c, a, b: L.where(c, a, 0.5),
  "scalar_input": lambda L, c, a, b: L.where(c, 2, b),
  "int_scalars": lambda L, c, a, b: L.where(c, 2, -1),
  "broadcast": lambda L, c, a, b: L.where(c[:, :1], a, b[0]),
  "mixed_dtypes": lambda L, c, a, b: L.where(c, a.int(), b.double()),
  "from_compare": lambda L, c, a, b: L.where(a > b, a, b),
}


@pytest.mark.parametrize("case", WHERE_CASES)
def test_where(device, rng, case):
  c, tc = rand_pair(rng, (3, 4), "bool", device)
  (a, ta), (b, tb) = rand_pair(rng, (3, 4), "float32", device), rand_pair(rng, (1, 4), "float32", device)
  f = WHERE_CASES[case]
  check(f(fg, c, a, b), f(torch, tc, ta, tb))


CLAMP_CASES = {
  "both": lambda a, lo, hi: a.clamp(-1, 1), "min_only": lambda a, lo, hi: a.clamp(min=0.5),
  "max_only": lambda a, lo, hi: a.clamp(max=-0.5), "tensors": lambda a, lo, hi: a.clamp(lo, hi),
  "tensor_min": lambda a, lo, hi: a.clamp(min=lo), "clip": lambda a, lo, hi: a.clip(-2, 2),
  "int_float_bound": lambda a, lo, hi: a.int().clamp(-1.5, 1.5), "int": lambda a, lo, hi: a.long().clamp(-1, 2),
}


@pytest.mark.parametrize("case", CLAMP_CASES)
def test_clamp(device, rng, case):
  a, ta = rand_pair(rng, (3, 4), "float32", device)
  (lo, tlo), (hi, thi) = rand_pair(rng, (4,), "float32", device, -2, 0), rand_pair(rng, (3, 1), "float32", device, 0, 2)
  f = CLAMP_CASES[case]
  check(f(a, lo, hi), f(ta, tlo, thi))


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_lerp(device, rng, dtype):
  (a, ta), (b, tb), (w, tw) = (rand_pair(rng, s, dtype, device) for s in ((3, 4), (3, 4), (4,)))
  check(a.lerp(b, 0.3), ref(lambda p, q: p.lerp(q, 0.3), ta, tb), loose=2)
  check(a.lerp(b, w), ref(lambda p, q, r: p.lerp(q, r), ta, tb, tw), loose=2)
  check(fg.lerp(a, b, 1.5), ref(lambda p, q: torch.lerp(p, q, 1.5), ta, tb), loose=2)


def test_binary_module_functions(device, rng):
  (x, tx), (y, ty) = rand_pair(rng, (3, 4), "float32", device), rand_pair(rng, (4,), "float32", device, 0.5, 3)
  with together() as chk:
    for name in ("add", "sub", "mul", "div", "maximum", "minimum", "eq", "lt", "ge", "logical_and", "remainder"):
      chk(getattr(fg, name)(x, y), getattr(torch, name)(tx, ty), name)
    chk(x.add(y, alpha=2), tx.add(ty, alpha=2), "add alpha")
    chk(x.sub(y, alpha=0.5), tx.sub(ty, alpha=0.5), "sub alpha")
  check(fg.pow(y, 2.0), torch.pow(ty, 2.0))


# ================================================================================================================
# reductions
# ================================================================================================================

def _red(name, **kw):
  def f(t, dim, keepdim):
    m = getattr(t, name)
    if dim is None and not keepdim: return m(**kw)
    return m(dim, keepdim=keepdim, **kw)
  return f


DIMS = [None, 0, 1, -1, (0, 2), (-1, -2), (0, 1, 2), ()]   # () is every dim for sum/mean/var/std/amax/amin
INT_DIMS = [None, 0, 1, -1]
REDUCE = {   # name: (fn, dims it accepts, loose)
  "sum": (_red("sum"), DIMS, 1), "prod": (_red("prod"), INT_DIMS, 2), "mean": (_red("mean"), DIMS, 1),
  "amax": (_red("amax"), DIMS, 1), "amin": (_red("amin"), DIMS, 1),
  "max": (_red("max"), INT_DIMS, 1), "min": (_red("min"), INT_DIMS, 1),
  "var": (_red("var"), DIMS, 2), "var_c0": (_red("var", correction=0), DIMS[:-1], 2),
  "var_c2": (_red("var", correction=2), [1, (0, 2)], 2), "var_unbiased": (_red("var", unbiased=False), [0, None], 2),
  "std": (_red("std"), DIMS, 2), "std_c0": (_red("std", correction=0), [None, 1, (0, 2)], 2),
  "argmax": (_red("argmax"), INT_DIMS, 1), "argmin": (_red("argmin"), INT_DIMS, 1),
  "any": (_red("any"), INT_DIMS + [(0, 2)], 1), "all": (_red("all"), INT_DIMS + [(0, 2)], 1),
  "logsumexp": (lambda t, d, k: t.logsumexp(d, keepdim=k), [0, 1, -1, (0, 2), (0, 1, 2)], 2),
}
RED_CASES = [(op, d, k) for op, (_, dims, _) in REDUCE.items() for d in dims for k in (False, True)
             if not (d is None and k and op in ("max", "min", "argmax", "argmin", "prod"))]


@pytest.mark.parametrize("op,dim,keepdim", RED_CASES, ids=str)
def test_reduce(device, rng, op, dim, keepdim):
  fn, _, loose = REDUCE[op]
  a = data(rng, (3, 4, 5), "float32", -2, 2)
  if op in ("any", "all"): a = np.where(rng.random(a.shape) < (0.1 if op == "any" else 0.9), a, 0).astype(a.dtype)
  x, tx = both(a, "float32", device)
  out, want = fn(x, dim, keepdim), fn(tx, dim, keepdim)
  if isinstance(want, tuple):   # max/min with a dim: (values, indices)
    assert type(out).__name__ == "return_types" and out._fields == ("values", "indices")
    v, i = out
    check(v, want.values)
    check(i, want.indices)
    check(out.values, want[0])
  else:
    atol = l1_atol(lambda t: fn(t, dim, keepdim), tx) if op in ("sum", "mean") else None
    check(out, want, loose=loose, atol=atol)


RED_DTYPE_OPS = {
  "sum": lambda t: t.sum(1), "sum_all": lambda t: t.sum(), "prod": lambda t: t.prod(0), "max": lambda t: t.max(1).values,
  "min_all": lambda t: t.min(), "argmax": lambda t: t.argmax(1), "argmin_all": lambda t: t.argmin(),
  "any": lambda t: t.any(0), "all": lambda t: t.all(1), "amax": lambda t: t.amax((0, 1)), "cumsum": lambda t: t.cumsum(1),
  "sum_dtype": lambda t: t.sum(0, dtype=lib_dtype(t, "float64")),
}


# torch refuses argmax/argmin of bool
RED_DTYPE_CASES = [(op, d) for op in RED_DTYPE_OPS for d in ("float16", "bfloat16", "float64", "int32", "int8", "uint8",
                                                             "int64", "bool") if not (d == "bool" and op.startswith("arg"))]


@pytest.mark.parametrize("op,dtype", RED_DTYPE_CASES)
def test_reduce_dtypes(device, rng, op, dtype):
  fn = RED_DTYPE_OPS[op]
  x, tx = rand_pair(rng, (4, 6), dtype, device, -3, 3)   # small ints: ties for argmax/argmin (first index wins)
  loose = 4 if op in ("sum", "sum_all", "cumsum", "prod") else 1
  atol = l1_atol(lambda t: ref(fn, t), tx) if op in ("sum", "sum_all", "cumsum", "sum_dtype") else None
  check(fn(x), ref(fn, tx), loose=loose, atol=atol)


def test_reduce_float_ties_and_nan(device):
  a = np.array([[1.0, 3.0, 3.0, -1.0], [math.nan, 2.0, 5.0, 5.0], [0.0, -0.0, 0.0, -4.0]], dtype=np.float32)
  x, tx = both(a, "float32", device)
  for fn in (lambda t: t.argmax(1), lambda t: t.argmin(1), lambda t: t.max(1).values, lambda t: t.max(1).indices,
             lambda t: t.amax(1), lambda t: t.min(0).indices, lambda t: t.sum(1), lambda t: t.argmax(), lambda t: t.max()):
    check(fn(x), fn(tx))


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool", "float16"])
def test_cumsum(device, rng, dim, dtype):
  x, tx = rand_pair(rng, (3, 4, 5), dtype, device)
  check(x.cumsum(dim), ref(lambda t: t.cumsum(dim), tx), loose=2, atol=l1_atol(lambda t: ref(lambda u: u.cumsum(dim), t), tx))


@pytest.mark.parametrize("n", [65, 1000])
def test_long_cumulative_sums_and_products(device, rng, n):
  """Past SCAN_BLOCK_MIN a cumulative sum (product) runs in blocks (tensor._scan_sum: each block's running sums plus
  the blocks' scanned totals): values against float64, along a middle and the last dim, integers exact, gradients
  against torch; an inf stays in the positions after it (before it they are finite) and a NaN likewise."""
  a = rng.standard_normal((3, n)).astype(np.float32)
  want = np.cumsum(a.astype(np.float64), 1)
  got = fg.Tensor(a, device=device).cumsum(1).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(n))
  got = fg.Tensor(np.ascontiguousarray(a.T), device=device).cumsum(0).numpy()
  np.testing.assert_allclose(got, want.T, rtol=1e-5, atol=1e-5 * np.sqrt(n))
  ai = rng.integers(-9, 9, (2, n)).astype(np.int32)
  np.testing.assert_array_equal(fg.Tensor(ai, device=device).cumsum(1).numpy(), np.cumsum(ai, 1))
  p = (1 + 0.01 * rng.standard_normal((2, n))).astype(np.float32)
  np.testing.assert_allclose(fg.Tensor(p, device=device).cumprod(1).numpy(), np.cumprod(p.astype(np.float64), 1), rtol=1e-4)
  b = a.copy()
  b[0, n // 2], b[1, n // 3] = np.inf, np.nan
  got = fg.Tensor(b, device=device).cumsum(1).numpy()
  assert np.isfinite(got[0, :n // 2]).all() and np.isposinf(got[0, n // 2:]).all()
  assert np.isfinite(got[1, :n // 3]).all() and np.isnan(got[1, n // 3:]).all()
  g = rng.standard_normal((3, n)).astype(np.float32)
  for op, data in (("cumsum", a), ("cumprod", (1 + 0.01 * a).astype(np.float32))):
    x, tx = fg.Tensor(data, device=device, requires_grad=True), torch.tensor(data, requires_grad=True)
    getattr(x, op)(1).backward(fg.Tensor(g, device=device))
    getattr(tx, op)(1).backward(torch.tensor(g))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4 * np.sqrt(n))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_softmax(device, rng, op, dim, dtype):
  a = data(rng, (3, 4, 5), dtype, -10, 10)
  x, tx = both(a, dtype, device)
  check(getattr(x, op)(dim), ref(lambda t: getattr(t, op)(dim), tx), loose=4)
  check(getattr(x, op)(dim, dtype=fg.float64), getattr(tx, op)(dim, dtype=torch.float64), loose=100)


def test_softmax_extremes(device):
  a = np.array([[1000.0, 0.0, -1000.0], [-math.inf, 0.0, 1.0], [88.0, 88.0, 88.0]], dtype=np.float32)
  x, tx = both(a, "float32", device)
  for fn in (lambda t: t.softmax(-1), lambda t: t.log_softmax(-1), lambda t: t.logsumexp(-1), lambda t: t.logsumexp(0)):
    check(fn(x), fn(tx), loose=4)
  r = np.array([[-math.inf, -math.inf], [math.inf, 1.0]], dtype=np.float32)
  check(fg.tensor(r, device=device).logsumexp(1), torch.tensor(r).logsumexp(1))


def test_reduce_int_promotion(device, rng):
  x, tx = rand_pair(rng, (4, 6), "int32", device, -100, 100)
  for fn in (lambda t: t.sum(), lambda t: t.prod(1), lambda t: t.cumsum(0), lambda t: t.float().mean(0),
             lambda t: t.sum(1, keepdim=True), lambda t: t.double().var(1), lambda t: t.sum(dtype=lib_dtype(t, "int32"))):
    check(fn(x), fn(tx))
  with pytest.raises(RuntimeError): x.mean()


def test_reduce_errors(device):
  x = fg.ones(2, 3, device=device)
  with pytest.raises(IndexError): x.sum(2)
  with pytest.raises(IndexError): x.max(-3)
  with pytest.raises(RuntimeError): x.sum((0, 0))


# ================================================================================================================
# movement and indexing
# ================================================================================================================

def pad(L, t, p, value=0.0):
  return F.pad(t, p, value=value) if L is torch else t.pad(p, value=value)


MOVE = {
  "reshape": lambda L, t: t.reshape(6, 4), "reshape_infer": lambda L, t: t.reshape(-1, 2),
  "reshape_tuple": lambda L, t: t.reshape((4, -1)), "view": lambda L, t: t.view(2, 12), "view_flat": lambda L, t: t.view(-1),
  "permute": lambda L, t: t.permute(2, 0, 1), "permute_tuple": lambda L, t: t.permute((1, 2, 0)),
  "permute_neg": lambda L, t: t.permute(-1, -3, -2), "transpose": lambda L, t: t.transpose(0, 2),
  "transpose_neg": lambda L, t: t.transpose(-1, -2), "T_2d": lambda L, t: t[0].T, "mT": lambda L, t: t.mT,
  "t": lambda L, t: t[1].t(), "expand": lambda L, t: t[:, :1].expand(2, 5, 4), "expand_new": lambda L, t: t[0, 0].expand(3, 2, 4),
  "expand_minus1": lambda L, t: t[:, :, :1].expand(-1, -1, 6), "expand_as": lambda L, t: t[:1].expand_as(t),
  "broadcast_to": lambda L, t: t[0].broadcast_to((2, 3, 4)),
  "squeeze": lambda L, t: t[:, :1].squeeze(), "squeeze_dim": lambda L, t: t[:, :1].squeeze(1),
  "squeeze_noop": lambda L, t: t.squeeze(0), "squeeze_neg": lambda L, t: t[..., :1].squeeze(-1),
  "unsqueeze": lambda L, t: t.unsqueeze(1), "unsqueeze_neg": lambda L, t: t.unsqueeze(-1), "unsqueeze_0": lambda L, t: t.unsqueeze(0),
  "flatten": lambda L, t: t.flatten(), "flatten_range": lambda L, t: t.flatten(1), "flatten_mid": lambda L, t: t.flatten(0, 1),
  "unflatten": lambda L, t: t.unflatten(2, (2, 2)), "unflatten_infer": lambda L, t: t.unflatten(1, (-1, 1)),
  "flip": lambda L, t: t.flip(0), "flip_many": lambda L, t: t.flip(0, 2), "flip_list": lambda L, t: t.flip([-1]),
  "pad_last": lambda L, t: pad(L, t, (1, 2)), "pad_two": lambda L, t: pad(L, t, (0, 1, 2, 0)),
  "pad_value": lambda L, t: pad(L, t, (1, 1, 1, 1, 1, 1), value=-2.5), "pad_negative": lambda L, t: pad(L, t, (-1, 2, 1, -2)),
  "pad_negative_value": lambda L, t: pad(L, t, (-2, 1), value=7.0),
  "narrow": lambda L, t: t.narrow(2, 1, 2), "narrow_neg": lambda L, t: t.narrow(-2, -2, 2),
  "repeat": lambda L, t: t.repeat(2, 1, 3), "repeat_more_dims": lambda L, t: t[0].repeat(2, 2, 1),
  "tile": lambda L, t: t.tile((2,)), "tile_more": lambda L, t: t.tile((2, 1, 1, 2)),
  "tril": lambda L, t: t.tril(), "triu": lambda L, t: t.triu(), "tril_k": lambda L, t: t.tril(1), "triu_k": lambda L, t: t.triu(-1),
  "tril_2d": lambda L, t: t[1].tril(-2), "triu_2d": lambda L, t: t[0].triu(2),
  "movedim": lambda L, t: t.movedim(0, -1), "swapaxes": lambda L, t: t.swapaxes(0, 1),
  "chain": lambda L, t: t.permute(1, 0, 2).reshape(3, 8).flip(1)[1:, ::3].unsqueeze(0).expand(2, 2, 3),
  "contiguous": lambda L, t: t.transpose(0, 1).contiguous(),
  "cat0": lambda L, t: L.cat([t, t * 2], 0), "cat_last": lambda L, t: L.cat([t, t[..., :1], t[..., 1:3]], -1),
  "cat_mid": lambda L, t: L.cat((t[:, :1], t), dim=1), "cat_one": lambda L, t: L.cat([t], 1),
  "cat_empty": lambda L, t: L.cat([t, t[:0], L.tensor([]).to(t.device)]), "concat": lambda L, t: L.concat([t, -t], 2),
  "stack": lambda L, t: L.stack([t, t + 1]), "stack_mid": lambda L, t: L.stack([t, t, t], 1),
  "stack_last": lambda L, t: L.stack((t[0], t[1]), -1),
}


@pytest.mark.parametrize("op", MOVE)
def test_movement(device, rng, op):
  x, tx = rand_pair(rng, (2, 3, 4), "float32", device)
  check(MOVE[op](fg, x), MOVE[op](torch, tx))


@pytest.mark.parametrize("dtype", ["int64", "bool", "float16", "bfloat16", "uint8"])
@pytest.mark.parametrize("op", ["permute", "pad_value", "cat_mid", "stack", "flip_many", "tril", "repeat", "expand"])
def test_movement_dtypes(device, rng, op, dtype):
  x, tx = rand_pair(rng, (2, 3, 4), dtype, device)
  f = MOVE[op]
  if op == "pad_value": f = lambda L, t: pad(L, t, (1, 1, 1, 1, 1, 1), value=1)
  if op == "stack" and dtype == "bool": f = lambda L, t: L.stack([t, ~t])
  check(f(fg, x), f(torch, tx))


SPLITS = {
  "split_int": lambda L, t: t.split(2, 2), "split_uneven": lambda L, t: t.split(2, 1),
  "split_sizes": lambda L, t: t.split([1, 3], -1), "chunk": lambda L, t: t.chunk(2, 2),
  "chunk_uneven": lambda L, t: t.chunk(2, 1), "chunk_more": lambda L, t: t.chunk(5, 2),
  "unbind": lambda L, t: t.unbind(1), "module_split": lambda L, t: L.split(t, 1, 0),
  "module_chunk": lambda L, t: L.chunk(t, 3, 1),
}


@pytest.mark.parametrize("op", SPLITS)
def test_split(device, rng, op):
  x, tx = rand_pair(rng, (2, 3, 4), "float32", device)
  outs, wants = SPLITS[op](fg, x), SPLITS[op](torch, tx)
  assert isinstance(outs, tuple)
  check_all(outs, wants)


def test_pad_errors(device):
  x = fg.ones(2, 3, device=device)
  with pytest.raises((ValueError, RuntimeError)): x.pad((1,))
  with pytest.raises(RuntimeError): x.pad((-2, -2))


# indices as functions of the library, so that index tensors are built by each
INDEX = {
  "int": lambda L: 1, "neg_int": lambda L: -1, "ints": lambda L: (1, 2), "all_ints": lambda L: (0, -1, 3),
  "slice": lambda L: slice(1, None), "slice_step": lambda L: (slice(None), slice(None, None, 2)),
  "slice_neg_bounds": lambda L: (slice(-1, None), slice(-3, -1)), "slice_empty": lambda L: slice(2, 1),
  "slice_out_of_range": lambda L: (slice(None), slice(1, 100)), "slice_step3": lambda L: (Ellipsis, slice(1, None, 3)),
  "none": lambda L: None, "none_mid": lambda L: (slice(None), None, 1), "none_many": lambda L: (None, 0, None, Ellipsis, None),
  "ellipsis": lambda L: (Ellipsis, 2), "ellipsis_mid": lambda L: (0, Ellipsis, 1), "ellipsis_only": lambda L: Ellipsis,
  "int_tensor": lambda L: L.tensor([1, 0, 1]), "int_tensor_2d": lambda L: L.tensor([[0, 1], [1, 1]]),
  "int_tensor_neg": lambda L: (Ellipsis, L.tensor([-1, 0, -4])), "list": lambda L: [1, 0],
  "tensor_mid": lambda L: (slice(None), L.tensor([2, 0])), "two_adjacent": lambda L: (L.tensor([1, 0]), L.tensor([2, 1])),
  "two_broadcast": lambda L: (slice(None), L.tensor([[0], [2]]), L.tensor([3, 1, 0])),
  "non_adjacent": lambda L: (L.tensor([0, 1, 1]), slice(None), L.tensor([3, 3, 0])),
  "non_adjacent_bcast": lambda L: (L.tensor([[1], [0]]), slice(1, 3), L.tensor([0, 2])),
  "int_and_tensor": lambda L: (1, slice(None), L.tensor([0, 2])), "tensor_and_int": lambda L: (L.tensor([1, 0]), 2),
  "three_tensors": lambda L: (L.tensor([0, 1]), L.tensor([2, 0]), L.tensor([[3, 1], [0, 0]])),
  "tensor_int32": lambda L: (slice(None), L.tensor([2, 1], dtype=L.int32)),
  "tensor_and_slice_step": lambda L: (slice(None, None, -1), np.array([0, 2]) if L is np else L.tensor([0, 2])),
  "neg_step": lambda L: slice(None, None, -1), "neg_step_2": lambda L: (slice(None), slice(None, None, -2)),
  "neg_step_bounds": lambda L: (Ellipsis, slice(3, 0, -2)), "neg_step_and_none": lambda L: (None, slice(1, None, -1), 1),
  "mask_full": lambda L: "mask_full", "mask_dim0": lambda L: "mask_dim0", "mask_mid": lambda L: "mask_mid",
  "mask_2d": lambda L: "mask_2d",
}
# torch has no negative slice steps: numpy is the reference for those
NUMPY_REF = {"tensor_and_slice_step", "neg_step", "neg_step_2", "neg_step_bounds", "neg_step_and_none"}


@pytest.mark.parametrize("case", INDEX)
def test_getitem(device, rng, case):
  a = data(rng, (2, 3, 4), "float32")
  x, tx = both(a, "float32", device)
  idx_fg, idx_t = INDEX[case](fg), INDEX[case](torch)
  if isinstance(idx_fg, str):   # boolean masks, from the data
    m = {"mask_full": a > 0, "mask_dim0": np.array([True, False]), "mask_mid": np.array([True, False, True]),
         "mask_2d": a[:, :, 0] > 0}[idx_fg]
    mf, mt = fg.tensor(m, device=device), torch.tensor(m)
    idx_fg, idx_t = {"mask_mid": ((slice(None), mf), (slice(None), mt))}.get(idx_fg, (mf, mt))
  if case in NUMPY_REF:
    idx_np = INDEX[case](np)
    out, want = x[idx_fg], torch.from_numpy(np.ascontiguousarray(a.astype(np.float32)[idx_np]))
  else:
    out, want = x[idx_fg], tx[idx_t]
  check(out, want)


def test_getitem_chained_and_views(device, rng):
  a = data(rng, (4, 5, 6), "float32")
  x, tx = both(a, "float32", device)
  check(x.permute(2, 0, 1)[1:, fg.tensor([0, 3])][..., ::2], tx.permute(2, 0, 1)[1:, torch.tensor([0, 3])][..., ::2])
  check(x[1:3][:, 2][fg.tensor([1, 0])], tx[1:3][:, 2][torch.tensor([1, 0])])
  check((x * 2)[x > 0], (tx * 2)[tx > 0])
  i, ti = rand_pair(rng, (7,), "int64", device, -4, 3)
  check(x[i], tx[ti])
  check(x[:, :, i], tx[:, :, ti])
  check(x.select(1, 2), tx.select(1, 2))
  check(x[0, 0, 0], tx[0, 0, 0])


def test_getitem_errors(device):
  x = fg.ones(2, 3, device=device)
  with pytest.raises(IndexError): x[2]
  with pytest.raises(IndexError): x[0, 0, 0]
  with pytest.raises(IndexError): x[fg.tensor([0, 5], device=device)]
  with pytest.raises(IndexError): x[fg.tensor([1.0], device=device)]


def test_setitem(device, rng):
  x, tx = rand_pair(rng, (3, 4), "float32", device)
  x[1] = 5.0; tx[1] = 5.0
  x[:, 1:3] = fg.tensor([[-1.0, -2.0]], device=device); tx[:, 1:3] = torch.tensor([[-1.0, -2.0]])
  x[0, ::2] = 7; tx[0, ::2] = 7
  check(x, tx)


# ================================================================================================================
# matmul and einsum
# ================================================================================================================

MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4,)), ((4,), (4, 5)), ((3, 4), (4,)), ((2, 3, 4), (4, 5)),
                 ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (2, 4, 3)), ((2, 3, 4), (4,)),
                 ((1, 4), (4, 1)), ((3, 0), (0, 2)), ((0, 4), (4, 3))]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=str)
def test_matmul(device, rng, sa, sb):
  (x, tx), (y, ty) = rand_pair(rng, sa, "float32", device), rand_pair(rng, sb, "float32", device)
  atol = l1_atol(lambda a, b: a @ b, tx, ty)
  check(x @ y, tx @ ty, atol=atol)
  check(fg.matmul(x, y), torch.matmul(tx, ty), atol=atol)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "int32", "int64", "uint8"])
def test_matmul_dtypes(device, rng, dtype):
  (x, tx), (y, ty) = rand_pair(rng, (2, 3, 6), dtype, device, 0, 4), rand_pair(rng, (6, 5), dtype, device, -2, 4)
  check(x @ y, ref(lambda a, b: a @ b, tx, ty), loose=4, atol=l1_atol(lambda a, b: ref(lambda p, q: p @ q, a, b), tx, ty))


def test_matmul_others(device, rng):
  (x, tx), (y, ty) = rand_pair(rng, (3, 4), "float32", device), rand_pair(rng, (4, 3), "float32", device)
  check(x.mm(y), tx.mm(ty))
  check(x.T @ y.T, tx.T @ ty.T)                       # non-contiguous operands
  check(x[:, ::2] @ y[1::2], tx[:, ::2] @ ty[1::2])
  check(fg.stack([x, x]).bmm(fg.stack([y, -y])), torch.stack([tx, tx]).bmm(torch.stack([ty, -ty])))
  check(x[0].dot(y[:, 1]), tx[0].dot(ty[:, 1]))
  check(x[0].outer(y[1]), tx[0].outer(ty[1]))
  with pytest.raises(RuntimeError): x @ x
  with pytest.raises(RuntimeError): x @ fg.tensor(2.0, device=device)


EINSUM = [("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,jk", [(3, 4), (4, 5)]), ("ij->ji", [(3, 4)]), ("ii->i", [(4, 4)]),
          ("ii", [(4, 4)]), ("ij->", [(3, 4)]), ("i,i->", [(5,), (5,)]), ("i,j->ij", [(3,), (4,)]),
          ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
          ("...ij,jk", [(2, 3, 4), (4, 5)]), ("b...,b->...", [(2, 3, 4), (2,)]), ("ij,ij->ij", [(3, 4), (3, 4)]),
          ("ijk->kji", [(2, 3, 4)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("ba,ca", [(3, 4), (5, 4)]),
          ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]), ("i...->...", [(3, 2, 2)])]


@pytest.mark.parametrize("eq,shapes", EINSUM, ids=[e for e, _ in EINSUM])
def test_einsum(device, rng, eq, shapes):
  xs, txs = zip(*[rand_pair(rng, s, "float32", device) for s in shapes])
  atol = l1_atol(lambda *ts: torch.einsum(eq, *ts), *txs)
  check(fg.einsum(eq, *xs), torch.einsum(eq, *txs), atol=atol)
  check(fg.einsum(eq, list(xs)), torch.einsum(eq, list(txs)), atol=atol)


# ================================================================================================================
# conversions and properties
# ================================================================================================================

@pytest.mark.parametrize("dtype", ALL)
def test_conversions(device, rng, dtype):
  a = data(rng, (2, 3), dtype, -9, 9)
  x, tx = both(a, dtype, device)
  if dtype != "bfloat16":
    n = x.numpy()
    assert isinstance(n, np.ndarray) and n.shape == (2, 3) and n.dtype == tx.numpy().dtype
    np.testing.assert_array_equal(n, tx.numpy())
    np.testing.assert_array_equal(np.asarray(x), tx.numpy())
  else:
    with pytest.raises(TypeError): x.numpy()
  assert x.tolist() == tx.tolist()
  assert type(x.tolist()[0][0]) is type(tx.tolist()[0][0])
  item = x[1, 2].item()
  assert item == tx[1, 2].item() and type(item) is type(tx[1, 2].item())
  assert x.shape == (2, 3) and isinstance(x.shape, tuple) and x.ndim == 2 and x.dim() == 2 and x.numel() == 6
  assert x.dtype is getattr(fg, dtype) and x.device == device and x.size() == (2, 3) and x.size(-1) == 3
  assert x.element_size() == tx.element_size() and x.is_floating_point() == tx.is_floating_point()
  assert len(x) == 2


def test_item_and_scalars(device, rng):
  v = float(rng.uniform(-5, 5))
  x = fg.tensor([[v]], device=device)
  assert x.item() == pytest.approx(v, rel=1e-6) and isinstance(x.item(), float)
  assert float(x) == pytest.approx(v, rel=1e-6) and int(fg.tensor(7, device=device)) == 7
  assert bool(fg.tensor([True], device=device)) is True
  assert fg.tensor(3, device=device).item() == 3 and isinstance(fg.tensor(3, device=device).item(), int)
  assert fg.tensor(5, device=device).tolist() == 5
  with pytest.raises(RuntimeError): fg.ones(2, device=device).item()
  with pytest.raises(RuntimeError): bool(fg.ones(2, device=device))
  assert [7, 8, 9][fg.tensor(1, device=device)] == 8     # __index__


def test_to_device(device, rng):
  a = data(rng, (3, 4), "float32").astype(np.float32)
  x = fg.tensor(a, device=device)
  for other in DEVICES:
    y = x.to(other)
    assert y.device == other and y.dtype == fg.float32
    back = (y.exp() + 1).to(device)
    np.testing.assert_allclose(back.numpy(), np.exp(a) + 1, rtol=2e-5)
    assert back.device == device
    np.testing.assert_array_equal(y.numpy(), a)
  hb = data(rng, (3, 4), "bfloat16")
  h = fg.tensor(hb, dtype=fg.bfloat16, device=device).to("CPU").float().numpy()
  np.testing.assert_array_equal(h, hb.astype(np.float32))
  assert x.cpu().device == "CPU"
  assert x.to(device, fg.int32).dtype == fg.int32
  with pytest.raises(RuntimeError):
    x + fg.ones(3, 4, device="PYTHON" if device != "PYTHON" else "CPU")


@pytest.mark.parametrize("view", ["slice", "transpose"])
def test_movement_of_realized_view(device, rng, view):
  """numpy() realizes a view in place; moving it afterwards must start from its buffer"""
  x, tx = rand_pair(rng, (2, 3), "float32", device)
  y, ty = (x[:, 1:], tx[:, 1:]) if view == "slice" else (x.T, tx.T)
  check(y, ty)
  check(y.reshape(-1), ty.reshape(-1))


@pytest.mark.parametrize("kind", ["copy", "gather"])
def test_reuse_realized_copy_or_gather(device, rng, kind):
  """a realized copy or gather feeds later graphs (their sources are forgotten once realized)"""
  a = data(rng, (5,), "float32").astype(np.float32)
  x = fg.tensor(a, device=device)
  y = x.to("CPU" if device != "CPU" else "PYTHON") if kind == "copy" else x[fg.tensor([0, 3], device=device)]
  want = a if kind == "copy" else a[[0, 3]]
  np.testing.assert_array_equal(y.numpy(), want)
  np.testing.assert_allclose((y + 1).numpy(), want + 1)


def test_contiguous_and_repr(device, rng):
  a = data(rng, (3, 4), "float32")
  x, tx = both(a, "float32", device)
  check(x.T.contiguous(), tx.T.contiguous())
  check(x.contiguous(), tx)
  r = repr(fg.tensor([[1.5, -2.0], [3.25, 4.0]], device=device))
  assert r.startswith("tensor(") and "1.5" in r and "-2." in r and "3.25" in r
  assert ("device=" in r) == (device != "CPU")
  assert "dtype=fusegrad.int32" in repr(fg.tensor([1, 2], dtype=fg.int32, device=device))
  assert "7" in repr(fg.tensor(7, device=device)) and "True" in repr(fg.tensor([True], device=device))
  assert "1.5" in repr(fg.tensor([1.5], dtype=fg.bfloat16, device=device))


# ================================================================================================================
# shapes: 0-d, size-1, empty, non-contiguous, big
# ================================================================================================================

def test_zero_dim(device, rng):
  (w, tw), (v, tv) = rand_pair(rng, (3,), "float32", device, 0.5, 2), rand_pair(rng, (3,), "float32", device)
  ops = (lambda t, u: t.exp(), lambda t, u: t + 1, lambda t, u: t.sum(), lambda t, u: t.reshape(1),
         lambda t, u: t.unsqueeze(0), lambda t, u: t.expand(2, 3), lambda t, u: t.max(), lambda t, u: t.argmax(),
         lambda t, u: t.mean(), lambda t, u: t.flatten(), lambda t, u: t.sum(0), lambda t, u: t.sum(-1, keepdim=True),
         lambda t, u: t.cumsum(0), lambda t, u: t.softmax(0), lambda t, u: t * u, lambda t, u: u[1] + t)
  for fn in ops:
    # a 0-d view of a buffer (made afresh: see test_movement_of_realized_view) and a 0-d constant
    for x, tx in ((w[1], tw[1]), (fg.tensor(1.75, device=device), torch.tensor(1.75))):
      assert x.shape == () and x.ndim == 0 and x.numel() == 1
      check(fn(x, v), fn(tx, tv))


def test_size_one(device, rng):
  x, tx = rand_pair(rng, (1, 3, 1), "float32", device)
  for fn in (lambda t: t.sum(0), lambda t: t.squeeze(), lambda t: t.max(2).values, lambda t: t.expand(4, 3, 2) * 2,
             lambda t: t.permute(2, 1, 0), lambda t: t.softmax(2), lambda t: t.reshape(3), lambda t: t.flip(0, 2)):
    check(fn(x), fn(tx))
  y, ty = rand_pair(rng, (1, 1), "float32", device)
  check(y.reshape(1) * x, ty.reshape(1) * tx)


EMPTY = {
  "add": lambda L, t: t + 1, "exp": lambda L, t: t.exp(), "sum_empty_dim": lambda L, t: t.sum(0),
  "sum_other_dim": lambda L, t: t.sum(1), "sum_all": lambda L, t: t.sum(), "prod": lambda L, t: t.prod(0),
  "mean": lambda L, t: t.mean(0), "amax_other": lambda L, t: t.amax(1), "any": lambda L, t: t.any(0), "all": lambda L, t: t.all(),
  "reshape": lambda L, t: t.reshape(3, 0), "permute": lambda L, t: t.T, "cat": lambda L, t: L.cat([t, t], 0),
  "cat_nonempty": lambda L, t: L.cat([t, L.ones(2, 3, device=t.device)], 0),
  "matmul": lambda L, t: t @ L.ones(3, 2, device=t.device),
  "pad": lambda L, t: pad(L, t, (1, 0, 1, 1)), "index": lambda L, t: t[:, 1], "cumsum": lambda L, t: t.cumsum(0),
  "softmax": lambda L, t: t.softmax(0), "expand": lambda L, t: t.unsqueeze(0).expand(2, 0, 3),
}


@pytest.mark.parametrize("op", EMPTY)
def test_empty_tensors(device, op):
  x, tx = fg.zeros(0, 3, device=device), torch.zeros(0, 3)
  check(EMPTY[op](fg, x), EMPTY[op](torch, tx))


def test_empty_reduce_errors(device):
  x = fg.zeros(0, 3, device=device)
  for f in (lambda t: t.max(), lambda t: t.argmax(), lambda t: t.amax(0), lambda t: t.min(0)):
    with pytest.raises((IndexError, RuntimeError)): f(x)


# views that make an input non-contiguous: (input shape, view giving a (2, 3, 4) tensor)
VIEWS = {
  "permuted": ((4, 3, 2), lambda L, t: t.permute(2, 1, 0)), "transposed": ((2, 4, 3), lambda L, t: t.transpose(1, 2)),
  "sliced": ((4, 3, 5), lambda L, t: t[1:3, :, 1:]), "strided": ((2, 6, 4), lambda L, t: t[:, ::2]),
  "flipped": ((2, 3, 4), lambda L, t: t.flip(1, 2)), "padded": ((2, 3, 4), lambda L, t: pad(L, t[:, 1:, 1:3], (1, 1, 1, 0), value=1.5)),
  "expanded": ((1, 3, 4), lambda L, t: t.expand(2, 3, 4)),
}
VIEW_OPS = {
  "exp": lambda L, t: t.exp(), "add_self_T": lambda L, t: t + t.flip(0), "sum": lambda L, t: t.sum(1),
  "max": lambda L, t: t.amax((0, 2)), "softmax": lambda L, t: t.softmax(-1), "matmul": lambda L, t: t @ t.transpose(1, 2),
  "reshape": lambda L, t: t.reshape(4, 6), "gather": lambda L, t: t[:, L.tensor([2, 0])], "cumsum": lambda L, t: t.cumsum(2),
  "mask": lambda L, t: t[t > 0.5],
}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("op", VIEW_OPS)
def test_non_contiguous_inputs(device, rng, view, op):
  shape, f = VIEWS[view]
  x, tx = rand_pair(rng, shape, "float32", device)
  v, tv = f(fg, x), f(torch, tx)
  assert v.shape == (2, 3, 4) == tuple(tv.shape)
  g = VIEW_OPS[op]
  check(g(fg, v), g(torch, tv), loose=2, atol=l1_atol(lambda t: g(torch, t), tv) if op in ("sum", "matmul", "cumsum") else None)


def test_big_elementwise(device, rng):
  n = small(device, BIG, 1000)
  (x, tx), (y, ty) = rand_pair(rng, (n,), "float32", device), rand_pair(rng, (n,), "float32", device, 0.5, 2)
  check((x * y + 1).exp() / y, (tx * ty + 1).exp() / ty, loose=2)
  check(x[1::2] * y[1::2] - x.flip(0)[1::2], tx[1::2] * ty[1::2] - tx.flip(0)[1::2])
  check(x.half() * 2, tx.half() * 2)


# float32 sums and products of 2^18 values against the exact result: rtol 2e-5 and 2e-4 (a few sqrt(n) * eps)
BIG_REDUCE = {   # name: (fn, dtype, input range, rtol)
  "sum": (lambda t: t.sum(), "float32", (0, 1), 2e-5), "mean": (lambda t: t.mean(), "float32", (0, 1), 2e-5),
  "var": (lambda t: t.var(), "float32", (0, 1), 2e-5), "max": (lambda t: t.max(), "float32", (-1, 1), 0),
  "argmax": (lambda t: t.argmax(), "float32", (-1, 1), 0), "min_int": (lambda t: t.min(), "int32", (-1000, 1000), 0),
  "sum_int": (lambda t: t.sum(), "int32", (-1000, 1000), 0), "any": (lambda t: (t > 0.9999).any(), "float32", (0, 1), 0),
  "all": (lambda t: (t >= 0).all(), "float32", (0, 1), 0), "prod": (lambda t: t.prod(), "float32", (0.99, 1.0101), 2e-4),
  "sum_f16": (lambda t: (t * 1e-3).half().sum(), "float32", (0, 1), 1e-3),
  "sum_rows": (lambda t: t.reshape(-1, 8).sum(0), "float32", (-1, 1), 2e-5),
}


@pytest.mark.parametrize("op", BIG_REDUCE)
def test_big_reduce(device, rng, op):
  """the reference is computed in float64 (torch's float32 sums are approximations too) and cast back"""
  fn, dtype, (lo, hi), rtol = BIG_REDUCE[op]
  n = small(device, BIG - 3, 1024)
  x, tx = rand_pair(rng, (n,), dtype, device, lo, hi)
  want = fn(tx)
  if want.dtype.is_floating_point: want = fn(tx.double()).to(want.dtype)
  check(fn(x), want, rtol=rtol, atol=l1_atol(fn, tx) if "sum" in op or op == "mean" else None)


def test_big_2d(device, rng):
  r, c = small(device, 256, 16), small(device, 1024, 32)
  (x, tx), (w, tw) = rand_pair(rng, (r, c), "float32", device), rand_pair(rng, (c, 64), "float32", device)
  check(x.softmax(-1), tx.softmax(-1), loose=4)
  check(x.sum(0), tx.sum(0), atol=l1_atol(lambda t: t.sum(0), tx))
  check(x.T.contiguous(), tx.T.contiguous())
  check(x.max(1).indices, tx.max(1).indices)
  check(x @ w, tx @ tw, atol=l1_atol(lambda a, b: a @ b, tx, tw))


@pytest.mark.parametrize("sizes", [(1, 129), (18, 14), (40, 24, 3)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cat_keeps_signed_zeros(device, rng, sizes, dtype):
  """cat keeps a part's -0.0 (as PyTorch's does) however its kernel is cut: parts whose bounds cut the row into at most
  64 pieces (each piece computes its own part) and parts that do not (1 and 129: the parts added up, each padded with
  -0.0, which adds nothing). Both operands of a float x + 0 and x - 0 keep IEEE's signs: -0.0 + 0 is +0.0."""
  xs = [data(rng, (3, 4, n), dtype, -3.0, 3.0) for n in sizes]
  for x in xs: x[0, 1, :2] = -0.0
  out = fg.cat([fg.tensor(x, dtype=dtype, device=device) for x in xs], -1)
  assert out.dtype.name == dtype
  out, want = out.numpy().astype(np.float64), np.concatenate(xs, -1)
  np.testing.assert_array_equal(out, want)
  assert np.array_equal(np.signbit(out), np.signbit(want))
  z, tz = both(np.array([-0.0, 0.0, 1.5], dtype=np.float32), "float32", device)
  for f in (lambda t: t + 0, lambda t: t - 0, lambda t: t + (-0.0), lambda t: t - (-0.0)):
    assert np.array_equal(np.signbit(f(z).numpy()), np.signbit(f(tz).numpy()))


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", [(2, 1), (0, 3, 1, 1), (1, 2, 0, 2, 1, 0)])
def test_pad_modes(device, rng, mode, pad):
  x, tx = rand_pair(rng, (2, 3, 4, 5), "float32", device)
  with fg.track() as t:
    out = x.pad(pad, mode=mode).realize()
  # torch pads only the last 1-3 dims of a 3-5d input in these modes: give it a 3d view for a 1d pad
  want = torch.nn.functional.pad(tx if len(pad) >= 4 else tx.reshape(6, 4, 5), pad, mode=mode)
  check(out, want.reshape(out.shape))
  assert len(t.kernels) == 1   # views of the input joined by one fused kernel


@pytest.mark.parametrize("mode", ["reflect", "circular"])
def test_pad_mode_too_wide(mode):
  with pytest.raises(RuntimeError, match=r"at most"):
    fg.ones(2, 3).pad((4, 0), mode=mode)


def test_setitem_mask_scalar(device, rng):
  x, tx = rand_pair(rng, (4, 6), "float32", device)
  x[x > 0.5] = 7.0
  tx[tx > 0.5] = 7.0
  check(x, tx)


def test_setitem_integer_and_mask_tensors(device, rng):
  """x[i, j] = v and x[mask] = values go through index_put_; a position named twice keeps the last value."""
  x, tx = rand_pair(rng, (4, 6), "float32", device)
  i = rng.integers(0, 4, 5)
  i[3] = i[0]
  j = rng.integers(0, 6, 5)
  j[3] = j[0]
  v = rng.standard_normal(5).astype(np.float32)
  x[fg.tensor(i, device=device), fg.tensor(j, device=device)] = fg.tensor(v, device=device)
  tx[torch.tensor(i), torch.tensor(j)] = torch.tensor(v)
  check(x, tx)
  x[fg.tensor([2, 0, 2], device=device)] = 3.5           # whole rows
  tx[torch.tensor([2, 0, 2])] = 3.5
  check(x, tx)
  m = rng.random((4, 6)) < 0.5
  w = rng.standard_normal(int(m.sum())).astype(np.float32)
  x[fg.tensor(m, device=device)] = fg.tensor(w, device=device)
  tx[torch.tensor(m)] = torch.tensor(w)
  check(x, tx)


MIXED_INDEX = [lambda i: (i, 1), lambda i: (i, slice(None), 2), lambda i: (slice(None), i), lambda i: (0, i),
               lambda i: ([0, 1], [1, 2]), lambda i: (i, None, i % 3), lambda i: (Ellipsis, i % 3),
               lambda i: (i, slice(1, 4, 2)), lambda i: (slice(1, None), i, [0, 2, 1])]


@pytest.mark.parametrize("case", range(len(MIXED_INDEX)))
def test_setitem_advanced_indices_among_ints_and_slices(device, rng, case):
  """x[idx, 1] = v, x[[0, 1], [1, 2]] += 1, x[:, idx] = ...: torch's positions (getitem's placement of the
  advanced dims), repeated positions keep the last value, autograd through the write, torch's shape error."""
  c = MIXED_INDEX[case]
  a = rng.standard_normal((4, 5, 3)).astype(np.float32)
  ii = rng.integers(0, 3, 3)
  ii[2] = ii[0]
  for op in ("set", "iadd"):
    x, t = fg.tensor(a, device=device, requires_grad=True), torch.tensor(a, requires_grad=True)
    y, ty = x * 2, t * 2
    ix, it = fg.tensor(ii, device=device), torch.tensor(ii)
    if op == "set":
      v = rng.standard_normal(tuple(ty[c(it)].shape)).astype(np.float32)
      y[c(ix)] = fg.tensor(v, device=device); ty[c(it)] = torch.tensor(v)
    else:
      y[c(ix)] += 1.5; ty[c(it)] += 1.5
    check(y, ty.detach())
    w = rng.standard_normal(a.shape).astype(np.float32)
    (y * fg.tensor(w, device=device)).sum().backward(); (ty * torch.tensor(w)).sum().backward()
    check(x.grad, t.grad)
  x, t = fg.zeros(4, 5, 3, device=device), torch.zeros(4, 5, 3)
  bad = (9,) * (len(t[c(it)].shape) + 1)
  with pytest.raises(RuntimeError) as theirs: t[c(it)] = torch.ones(*bad)
  with pytest.raises(RuntimeError, match="shape mismatch") as ours: x[c(ix)] = fg.ones(*bad)
  assert str(ours.value) == str(theirs.value)


def test_index_put_repeated_position_gradients(rng):
  """A position named twice keeps the last value; PyTorch's derivative still gives every value the gradient at its
  target (also the overwritten one), and the input none there (a CI run once drew such indices at random)."""
  x, v, w = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (3,), (3, 4)))
  idx = ([1, 1, 2], [3, 3, 0])
  out = {}
  for L in (torch, fg):
    X, V = L.tensor(x, requires_grad=True), L.tensor(v, requires_grad=True)
    y = X.index_put(tuple(L.tensor(i) for i in idx), V)
    (y * L.tensor(w)).sum().backward()
    out[L] = [t.detach().numpy() for t in (y, X.grad, V.grad)]
  for got, want in zip(out[fg], out[torch]):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert out[fg][2][0] == out[fg][2][1] == w[1, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_shift_counts_outside_the_width_as_torch(device):
  """A shift by a count < 0 or >= the width: 0, but a negative signed value shifted right fills its sign (-1), as
  PyTorch's; a count from a tensor (a kernel's value) and a Python count (a constant) alike."""
  rng = np.random.default_rng()
  for d, bits in (("int8", 8), ("int16", 16), ("int32", 32), ("int64", 64), ("uint8", 8)):
    lo = 0 if d == "uint8" else -100
    v = rng.integers(lo, 100, 16).astype(d)
    s = rng.integers(-3, bits + 3, 16).astype(d)
    for op in (lambda a, b: a >> b, lambda a, b: a << b):
      want = op(torch.tensor(v), torch.tensor(s))
      got = op(fg.tensor(v, device=device), fg.tensor(s, device=device))
      np.testing.assert_array_equal(got.numpy(), want.numpy())
      assert str(got.dtype).split(".")[-1] == d
      for c in (bits, bits + 1, -1, 3):
        np.testing.assert_array_equal(op(fg.tensor(v, device=device), c).numpy(), op(torch.tensor(v), c).numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_atan2_gradient_at_the_origin_is_zero(device):
  rng = np.random.default_rng()
  a0 = np.concatenate([[0.0, 1.0, 0.0], rng.standard_normal(5)]).astype(np.float32)
  b0 = np.concatenate([[0.0, 0.0, 1.0], rng.standard_normal(5)]).astype(np.float32)
  out = {}
  for L in (torch, fg):
    a, b = L.tensor(a0, requires_grad=True), L.tensor(b0, requires_grad=True)
    L.atan2(a, b).sum().backward()
    out[L] = (a.grad.numpy(), b.grad.numpy())
  for got, want in zip(out[fg], out[torch]):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_setitem_through_stepped_slices_of_any_dim(device):
  """x[::2] = v on a leading dim (it raised: the gaps were padded into the next dim), several stepped dims, an
  in-place add through them."""
  rng = np.random.default_rng()
  for shape, idx in [((6, 4), (slice(None, None, 2),)), ((6, 4), (slice(1, None, 2),)), ((5, 4), (slice(None, None, 5),)),
                     ((7, 5, 3), (slice(None, None, 3), slice(1, None, 2))),
                     ((4, 6, 5), (Ellipsis, slice(0, 5, 2), slice(1, 4, 2)))]:
    x = rng.standard_normal(shape).astype(np.float32)
    t, f = torch.tensor(x), fg.tensor(x, device=device)
    v = rng.standard_normal(tuple(t[idx].shape)).astype(np.float32)
    t[idx] = torch.tensor(v); f[idx] = fg.tensor(v, device=device)
    np.testing.assert_array_equal(f.numpy(), t.numpy())
    t[idx] += 1.5; f[idx] += 1.5
    np.testing.assert_array_equal(f.numpy(), t.numpy())


def test_semantics_found_by_a_survey_against_torch():
  """add's alpha into a bool result (cast to bool) and a float alpha into integers (refused); unique keeps every NaN;
  an empty 1-d tensor in cat still takes part in the result's dtype; a signed integer added in place into uint8."""
  rng = np.random.default_rng()
  a, b = rng.random(8) < 0.5, rng.random(8) < 0.5
  got = fg.add(fg.tensor(a), fg.tensor(b), alpha=2)
  assert got.dtype == fg.bool
  np.testing.assert_array_equal(got.numpy(), torch.add(torch.tensor(a), torch.tensor(b), alpha=2).numpy())
  with pytest.raises(RuntimeError, match="alpha must not be a floating point"):
    fg.add(fg.tensor([1, 2]), fg.tensor([3, 4]), alpha=0.5)
  v = np.array([1.0, np.nan, 2.0, np.nan, 1.0, np.nan], dtype=np.float32)
  u, inv, cnt = fg.unique(fg.tensor(v), return_inverse=True, return_counts=True)
  tu, tinv, tcnt = torch.unique(torch.tensor(v), return_inverse=True, return_counts=True)
  np.testing.assert_array_equal(u.numpy(), tu.numpy())
  np.testing.assert_array_equal(cnt.numpy(), tcnt.numpy())
  np.testing.assert_array_equal(inv.numpy(), tinv.numpy())
  c = fg.cat([fg.tensor([]), fg.tensor([1, 2])])
  assert c.dtype == fg.float32 and c.numpy().tolist() == [1.0, 2.0]
  x = fg.tensor(np.array([250, 3, 7], dtype=np.uint8))
  x += fg.tensor(np.array([10, 0, -5], dtype=np.int32))
  tx = torch.tensor(np.array([250, 3, 7], dtype=np.uint8))
  tx += torch.tensor(np.array([10, 0, -5], dtype=np.int32))
  assert x.dtype == fg.uint8 and x.numpy().tolist() == tx.numpy().tolist()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_cumsum_accumulates_in_float32(dtype):
  a = torch.randn(3, 1000).to(getattr(torch, dtype))
  got = fg.tensor(a.float().numpy(), dtype=dtype).cumsum(1)
  assert got.dtype == getattr(fg, dtype)
  # each output rounded once from a float32 sum (the order of the float32 additions may differ from torch's: an
  # output may round to the neighbouring value), where rounding every step was 2-4x further from exact
  ref = a.double().cumsum(1).numpy()
  err, terr = np.abs(got.float().numpy() - ref).max(), np.abs(a.cumsum(1).double().numpy() - ref).max()
  assert err <= 1.25 * terr, (err, terr)
  ulp = 2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -10
  np.testing.assert_allclose(got.float().numpy(), a.cumsum(1).float().numpy(), rtol=ulp, atol=ulp)


def test_median_of_all_elements_shares_its_gradient_among_ties():
  rng = np.random.default_rng()
  cases = [[[1., 3., 3.], [2., 2., 0.]], [[5., 5., 5., 5.]], [[np.inf, np.inf, 1.]], [[-np.inf, -np.inf, 1.]],
           [[1., np.nan, 2.]], rng.integers(0, 3, (4, 5)).astype(np.float32), rng.standard_normal((3, 7))]
  for v in cases:
    for name in ("median", "nanmedian"):
      out = {}
      for L in (torch, fg):
        x = L.tensor(np.asarray(v, dtype=np.float32), requires_grad=True)
        y = getattr(x, name)()
        y.backward()
        out[L] = (y.detach().numpy(), x.grad.numpy())
      np.testing.assert_array_equal(out[fg][0], out[torch][0])
      if not np.isnan(out[torch][0]): np.testing.assert_allclose(out[fg][1], out[torch][1], rtol=1e-6)
