"""The ops added beside the basic set, against torch (CPU) on fresh random inputs: meshgrid, rot90, bincount,
searchsorted/bucketize, cdist, addmm/addmv/addbmm/baddbmm, put/put_, the in-place elementwise forms, dtype
properties, glu, instance_norm, adaptive max pooling, max_pool3d and hardswish at -inf. Each case is one function
written for both libraries (`L` is fusegrad or torch, `F` its functional namespace): values, shapes, dtypes, the
gradient of a random-weighted sum of every float output, and the exception torch raises for a bad input."""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import fusegrad as fg
import fusegrad.nn.functional as FF


def _fg(a: np.ndarray, grad: bool) -> fg.Tensor:
  return fg.tensor(a, requires_grad=grad and a.dtype.kind == "f")


def _torch(a: np.ndarray, grad: bool) -> torch.Tensor:
  return torch.tensor(a, requires_grad=grad and a.dtype.kind == "f")


def run(fn, *arrays, grad: bool = True, rtol: float = 1e-5, atol: float = 1e-5, rng=None):
  """fn(L, F, *tensors) on both libraries: every output's shape, dtype and values, then the gradients of a
  random-weighted sum of the float outputs for every float input (None where torch's is None)."""
  ft, tt = [_fg(a, grad) for a in arrays], [_torch(a, grad) for a in arrays]
  fo, to = fn(fg, FF, *ft), fn(torch, TF, *tt)
  fos, tos = (fo, to) if isinstance(to, (tuple, list)) else ((fo,), (to,))
  assert len(fos) == len(tos)
  for i, (f, t) in enumerate(zip(fos, tos)):
    assert f.shape == tuple(t.shape), f"output {i}: shape {f.shape}, torch {tuple(t.shape)}"
    assert f.dtype.name == str(t.dtype)[6:], f"output {i}: dtype {f.dtype.name}, torch {t.dtype}"
    np.testing.assert_allclose(f.numpy().astype(np.float64), t.detach().double().numpy(), rtol=rtol, atol=atol,
                               equal_nan=True, err_msg=f"output {i}")
  if not grad: return fos
  rng = rng or np.random.default_rng()
  pairs = [(f, t) for f, t in zip(fos, tos) if t.requires_grad and t.dtype.is_floating_point and t.numel()]
  if not pairs: return fos
  ws = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for _, t in pairs]
  fl = sum((f * fg.tensor(w, dtype=f.dtype)).sum() for (f, _), w in zip(pairs, ws))
  tl = sum((t * torch.tensor(w, dtype=t.dtype)).sum() for (_, t), w in zip(pairs, ws))
  fl.backward()
  tl.backward()
  for i, (f, t) in enumerate(zip(ft, tt)):
    if t.grad is None or f.grad is None:   # (None and zeros alike: torch gives comparisons' inputs zeros)
      g = f.grad if t.grad is None else t.grad
      assert g is None or not np.any(g.numpy()), f"input {i}: a gradient where the other library has none"
      continue
    np.testing.assert_allclose(f.grad.numpy().astype(np.float64), t.grad.double().numpy(), rtol=rtol, atol=atol,
                               equal_nan=True, err_msg=f"gradient of input {i}")
  return fos


def raises_like_torch(fn, *arrays, match: str | None = None):
  """fn(L, F, *tensors) raises the exception type torch raises, with torch's message where `match` is given."""
  with pytest.raises(Exception) as te: fn(torch, TF, *[torch.tensor(a) for a in arrays])
  with pytest.raises(te.type, match=match) as fe: fn(fg, FF, *[fg.tensor(a) for a in arrays])
  return fe.value


def randn(rng, *shape, dtype=np.float32): return rng.standard_normal(shape).astype(dtype)


# ---- meshgrid, rot90 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes", [[(3,), (4,)], [(2,), (3,), (4,)], [(), (3,)], [(0,), (2,)], [(5,)]])
@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(rng, shapes, indexing):
  run(lambda L, F, *xs: L.meshgrid(*xs, indexing=indexing), *[randn(rng, *s) for s in shapes], rng=rng)
  run(lambda L, F, *xs: L.meshgrid(list(xs), indexing=indexing), *[rng.integers(0, 9, s) for s in shapes], grad=False)


def test_meshgrid_default_indexing_warns_and_is_ij(rng):
  a, b = randn(rng, 2), randn(rng, 3)
  with pytest.warns(UserWarning, match="indexing argument"): got = fg.meshgrid(fg.tensor(a), fg.tensor(b))
  assert got[0].shape == (2, 3)


@pytest.mark.parametrize("fn, arrays, match", [
  (lambda L, F, a, b: L.meshgrid(a, b, indexing="ij"), (np.zeros(2, np.float32), np.zeros(3, np.int64)), "same dtype"),
  (lambda L, F, a, b: L.meshgrid(a, b, indexing="ji"), (np.zeros(2), np.zeros(3)), "indexing must be one of"),
  (lambda L, F, a, b: L.meshgrid(a, b, indexing="ij"), (np.zeros((2, 2)), np.zeros(3)), "Expected 0D or 1D tensor"),
  (lambda L, F: L.meshgrid([], indexing="ij"), (), "non-empty TensorList"),
])
def test_meshgrid_errors(fn, arrays, match):
  raises_like_torch(fn, *arrays, match=match)


@pytest.mark.parametrize("shape, dims", [((3, 4), (0, 1)), ((3, 4), (1, 0)), ((2, 3, 4), (0, 2)), ((2, 3, 4), (-1, 1)),
                                         ((2, 0, 3), (1, 2))])
@pytest.mark.parametrize("k", [-1, 0, 1, 2, 5])
def test_rot90(rng, shape, dims, k):
  run(lambda L, F, x: L.rot90(x, k, dims), randn(rng, *shape), rng=rng)
  run(lambda L, F, x: x.rot90(k, dims), rng.integers(-5, 5, shape), grad=False)


@pytest.mark.parametrize("shape, dims, match", [((3, 4), (0, 0), "rotation dims to be different"),
                                                ((3,), (0, 1), "total dims >= 2"),
                                                ((3, 4), (0, 1, 2), "total rotation dims == 2"),
                                                ((3, 4), (0, 5), "Dimension out of range")])
def test_rot90_errors(shape, dims, match):
  raises_like_torch(lambda L, F, x: L.rot90(x, 1, dims), np.zeros(shape, np.float32), match=match)


# ---- bincount, searchsorted, bucketize --------------------------------------------------------------------------

@pytest.mark.parametrize("n, hi, minlength", [(20, 6, 0), (7, 3, 10), (0, 1, 0), (0, 1, 4), (50, 30, 5)])
@pytest.mark.parametrize("wdtype", [None, np.float32, np.float64, np.int64])
def test_bincount(rng, n, hi, minlength, wdtype):
  x = rng.integers(0, hi, n).astype(rng.choice([np.int64, np.int32, np.uint8]))
  if wdtype is None:
    run(lambda L, F, x: L.bincount(x, minlength=minlength), x, grad=False)
  else:
    w = rng.standard_normal(n).astype(wdtype) if wdtype != np.int64 else rng.integers(-3, 4, n)
    run(lambda L, F, x, w: x.bincount(w, minlength), x, w, grad=False)


@pytest.mark.parametrize("fn, arrays, exc_match", [
  (lambda L, F, x: L.bincount(x), (np.array([1.0, 2.0], np.float32),), "not implemented for 'Float'"),
  (lambda L, F, x: L.bincount(x), (np.array([-1, 2]),), "non-negative integral"),
  (lambda L, F, x: L.bincount(x), (np.array([[1, 2]]),), "1-d non-negative"),
  (lambda L, F, x: L.bincount(x, minlength=-1), (np.array([1, 2]),), "minlength should be >= 0"),
  (lambda L, F, x, w: L.bincount(x, w), (np.array([1, 2]), np.ones(3, np.float32)), "same length as input"),
])
def test_bincount_errors(fn, arrays, exc_match):
  raises_like_torch(fn, *arrays, match=exc_match)


def _sorted(rng, *shape, ints: bool = False):
  a = rng.integers(-4, 5, shape).astype(np.float32) if ints else randn(rng, *shape)   # ints: ties
  return np.sort(a, axis=-1)


@pytest.mark.parametrize("bshape, vshape", [((7,), (5,)), ((7,), (2, 3, 4)), ((7,), ()), ((0,), (3,)), ((7,), (0,)),
                                            ((2, 3, 6), (2, 3, 4)), ((4, 1), (4, 3))])
@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("ints", [False, True])
def test_searchsorted(rng, bshape, vshape, right, ints):
  b = _sorted(rng, *bshape, ints=ints)
  v = rng.integers(-5, 6, vshape).astype(np.float32) if ints else randn(rng, *vshape)
  out = run(lambda L, F, b, v: L.searchsorted(b, v, right=right), b, v, grad=False)
  run(lambda L, F, b, v: L.searchsorted(b, v, side="right" if right else "left", out_int32=True), b, v, grad=False)
  assert out[0].dtype == fg.int64
  if len(bshape) == 1:
    run(lambda L, F, v, b: L.bucketize(v, b, right=right), v, b, grad=False)
    run(lambda L, F, b: L.searchsorted(b, 0.25, right=right), b, grad=False)
    run(lambda L, F, b: L.bucketize(1, b, out_int32=True), b, grad=False)


def test_searchsorted_sorter_nan_and_mixed_dtypes(rng):
  b = randn(rng, 9)
  sorter = np.argsort(b).astype(np.int64)
  v = np.concatenate([randn(rng, 6), [np.nan, np.inf, -np.inf]]).astype(np.float32)
  for right in (False, True):
    run(lambda L, F, b, v, s: L.searchsorted(b, v, right=right, sorter=s), b, v, sorter, grad=False)
  run(lambda L, F, b, v: L.searchsorted(b, v), _sorted(rng, 6), rng.integers(-2, 3, 5), grad=False)
  run(lambda L, F, b, v: L.bucketize(v, b), np.sort(rng.integers(-5, 5, 6)), randn(rng, 4), grad=False)


@pytest.mark.parametrize("fn, arrays, match", [
  (lambda L, F, b, v: L.searchsorted(b, v), (np.zeros((1, 2), np.float32), np.zeros(2, np.float32)),
   "first N-1 dimensions"),
  (lambda L, F, b, v: L.searchsorted(b, v, side="middle"), (np.zeros(2), np.zeros(2)), "side can only be"),
  (lambda L, F, b, v: L.searchsorted(b, v, side="left", right=True), (np.zeros(2), np.zeros(2)), "opposites"),
  (lambda L, F, b, v: L.searchsorted(b, v), (np.zeros((), np.float32), np.zeros(2, np.float32)), "positive dimension"),
  (lambda L, F, b, v, s: L.searchsorted(b, v, sorter=s), (np.zeros(2), np.zeros(2), np.array([0, 5])),
   "sorter index out of range"),
  (lambda L, F, b, v, s: L.searchsorted(b, v, sorter=s), (np.zeros(2), np.zeros(2), np.array([0])), "same size"),
  (lambda L, F, b, v, s: L.searchsorted(b, v, sorter=s), (np.zeros(2), np.zeros(2), np.array([0, 1], np.int32)),
   "long dtype"),
  (lambda L, F, b, v: L.searchsorted(b, v), (np.array([False, True]), np.array([True])), "not implemented for 'Bool'"),
  (lambda L, F, v, b: L.bucketize(v, b), (np.zeros(2), np.zeros((2, 2))), "must be 1 dimension"),
])
def test_searchsorted_errors(fn, arrays, match):
  raises_like_torch(fn, *arrays, match=match)


# ---- cdist ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("s1, s2", [((5, 3), (4, 3)), ((2, 5, 3), (2, 4, 3)), ((2, 1, 5, 3), (3, 4, 3)), ((0, 3), (4, 3)),
                                    ((3, 0), (2, 0)), ((1, 7), (30, 7)), ((2, 3, 4), (4, 4))])
@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, math.inf, 3.0, 0.5])
def test_cdist(rng, s1, s2, p):
  a, b = randn(rng, *s1, dtype=np.float64), randn(rng, *s2, dtype=np.float64)
  if p == 0.0 and a.size and b.size: a[..., :1, :1] = b.reshape(-1, b.shape[-1])[0, 0]   # some equal coordinates
  run(lambda L, F, a, b: L.cdist(a, b, p), a, b, grad=p != 0.5, rtol=1e-7, atol=1e-9, rng=rng)


def test_cdist_float32_and_zero_distance_gradient(rng):
  a = randn(rng, 6, 5)
  run(lambda L, F, a, b: L.cdist(a, b), a, np.concatenate([a[:2], randn(rng, 3, 5)]), rtol=1e-4, atol=1e-5, rng=rng)
  for p in (1.0, 2.0, math.inf):   # identical rows: distance 0, gradient 0 (not NaN)
    run(lambda L, F, a, b: L.cdist(a, b, p), a[:3], a[:3].copy(), rtol=1e-4, atol=1e-5, rng=rng)


@pytest.mark.parametrize("fn, arrays, match", [
  (lambda L, F, a, b: L.cdist(a, b), (np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32)), "same number of columns"),
  (lambda L, F, a, b: L.cdist(a, b), (np.zeros(3, np.float32), np.zeros((4, 3), np.float32)), "at least 2D"),
  (lambda L, F, a, b: L.cdist(a, b, -1.0), (np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32)), "non-negative p"),
  (lambda L, F, a, b: L.cdist(a, b), (np.zeros((2, 3), np.int64), np.zeros((4, 3), np.int64)), "floating-point dtypes"),
  (lambda L, F, a, b: L.cdist(a, b), (np.zeros((2, 3)), np.zeros((4, 3), np.float32)), "expected scalar type Double"),
  (lambda L, F, a, b: L.cdist(a, b), (np.zeros((2, 2, 3), np.float32), np.zeros((3, 4, 3), np.float32)), None),
])
def test_cdist_errors(fn, arrays, match):
  raises_like_torch(fn, *arrays, match=match)


# ---- addmm, addmv, addbmm, baddbmm ---------------------------------------------------------------------------------

SCALES = [dict(), dict(beta=0.5, alpha=2.0), dict(beta=0, alpha=-1.5), dict(beta=2)]


@pytest.mark.parametrize("ishape", [(2, 4), (4,), (1, 4), (2, 1), ()])
@pytest.mark.parametrize("kw", SCALES)
def test_addmm(rng, ishape, kw):
  run(lambda L, F, i, a, b: L.addmm(i, a, b, **kw), randn(rng, *ishape), randn(rng, 2, 3), randn(rng, 3, 4), rng=rng)
  run(lambda L, F, i, a, b: i.addmm(a, b, **kw), randn(rng, *ishape), randn(rng, 2, 0), randn(rng, 0, 4), rng=rng)


@pytest.mark.parametrize("kw", SCALES)
def test_addmv_addbmm_baddbmm(rng, kw):
  for ishape in ((5,), (1,), ()):
    run(lambda L, F, i, m, v: L.addmv(i, m, v, **kw), randn(rng, *ishape), randn(rng, 5, 3), randn(rng, 3), rng=rng)
  for ishape in ((2, 4), (4,), ()):
    run(lambda L, F, i, a, b: L.addbmm(i, a, b, **kw), randn(rng, *ishape), randn(rng, 3, 2, 5), randn(rng, 3, 5, 4),
        rng=rng)
  for ishape in ((3, 2, 4), (2, 4), (3, 1, 4), ()):
    run(lambda L, F, i, a, b: L.baddbmm(i, a, b, **kw), randn(rng, *ishape), randn(rng, 3, 2, 5),
        randn(rng, 3, 5, 4), rng=rng)


def test_add_products_beta_zero_ignores_nan_and_integers(rng):
  nan = np.full((2, 4), np.nan, np.float32)
  run(lambda L, F, i, a, b: L.addmm(i, a, b, beta=0), nan, randn(rng, 2, 3), randn(rng, 3, 4), rng=rng)
  run(lambda L, F, i, a, b: L.baddbmm(i, a, b, beta=0, alpha=0.5), np.full((3, 2, 4), np.inf, np.float32),
      randn(rng, 3, 2, 5), randn(rng, 3, 5, 4), rng=rng)
  run(lambda L, F, i, m, v: L.addmv(i, m, v, beta=0), np.full(5, np.nan, np.float32), randn(rng, 5, 3), randn(rng, 3),
      rng=rng)
  ints = lambda *s: rng.integers(-5, 5, s)
  run(lambda L, F, i, a, b: L.addmm(i, a, b, beta=0.5, alpha=1.7), ints(2, 4), ints(2, 3), ints(3, 4), grad=False)
  run(lambda L, F, i, a, b: L.addbmm(i, a, b, beta=3, alpha=2), ints(2, 4), ints(3, 2, 5), ints(3, 5, 4), grad=False)
  run(lambda L, F, i, a, b: L.addmm(i, a, b), randn(rng, 2, 4, dtype=np.float64), randn(rng, 2, 3, dtype=np.float64),
      randn(rng, 3, 4, dtype=np.float64), rng=rng)


def test_add_products_in_place(rng):
  for name, shapes in (("addmm_", [(2, 4), (2, 3), (3, 4)]), ("addmv_", [(5,), (5, 3), (3,)]),
                       ("addbmm_", [(2, 4), (3, 2, 5), (3, 5, 4)]), ("baddbmm_", [(3, 2, 4), (3, 2, 5), (3, 5, 4)])):
    arrays = [randn(rng, *s) for s in shapes]
    def fn(L, F, i, a, b):
      y = i * 1.0
      r = getattr(y, name)(a, b, beta=0.5, alpha=2)
      assert r is y
      return y
    run(fn, *arrays, rng=rng)


@pytest.mark.parametrize("fn, arrays, match", [
  (lambda L, F, i, a, b: L.addmm(i, a, b), ((3,), (2, 3), (4, 3)), "cannot be multiplied"),
  (lambda L, F, i, a, b: L.addmm(i, a, b), ((4, 3), (2, 3), (3, 3)), "expanded size"),
  (lambda L, F, i, a, b: L.addmm(i, a, b), ((3,), (2, 3, 1), (3, 3)), "mat1 must be a matrix, got 3-D"),
  (lambda L, F, i, m, v: L.addmv(i, m, v), ((2,), (2, 3), (4,)), "size mismatch"),
  (lambda L, F, i, m, v: L.addmv(i, m, v), ((2,), (2, 3, 3), (3,)), "vector \\+ matrix @ vector expected"),
  (lambda L, F, i, a, b: L.addbmm(i, a, b), ((2, 4), (3, 2, 5), (3, 6, 4)), "Incompatible matrix sizes"),
  (lambda L, F, i, a, b: L.addbmm(i, a, b), ((2, 4), (3, 2, 5), (2, 5, 4)), "same number of batches"),
  (lambda L, F, i, a, b: L.baddbmm(i, a, b), ((3, 2, 4), (3, 2, 5), (3, 6, 4)), "first two dimensions of batch2"),
  (lambda L, F, i, a, b: L.baddbmm(i, a, b), ((3, 3, 4), (3, 2, 5), (3, 5, 4)), "expanded size"),
])
def test_add_products_errors(fn, arrays, match):
  raises_like_torch(fn, *[np.zeros(s, np.float32) for s in arrays], match=match)


def test_addmm_dtype_mismatch():
  raises_like_torch(lambda L, F, i, a, b: L.addmm(i, a, b), np.zeros(3, np.float32), np.zeros((2, 3), np.float32),
                    np.zeros((3, 3)), match="self and mat2 must have the same dtype, but got Float and Double")


# ---- put, in-place forms, dtypes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, idx", [((3, 4), [0, 5, -1, 7]), ((6,), [2]), ((2, 3), []), ((2, 2, 2), [[1, -8], [3, 6]])])
@pytest.mark.parametrize("accumulate", [False, True])
def test_put(rng, shape, idx, accumulate):
  idx = np.array(idx, np.int64)
  src = randn(rng, *idx.shape)
  run(lambda L, F, x, i, s: x.put(i, s, accumulate), randn(rng, *shape), idx, src, rng=rng)
  def inplace(L, F, x, i, s):
    y = x * 2
    v = y.reshape(-1)    # a view sees the write
    assert y.put_(i, s, accumulate=accumulate) is y
    return y, v
  run(inplace, randn(rng, *shape), idx, src, rng=rng)
  if accumulate and idx.size > 1:   # repeated positions add up
    rep = np.array([1, 1, 2, 1], np.int64)
    run(lambda L, F, x, i, s: L.put(x, i, s, True), randn(rng, *shape), rep, randn(rng, 4), rng=rng)


@pytest.mark.parametrize("fn, arrays, exc_match", [
  (lambda L, F, x, i, s: x.put_(i, s), (np.zeros(3, np.float32), np.array([5]), np.ones(1, np.float32)), "out of range"),
  (lambda L, F, x, i, s: x.put_(i, s), (np.zeros(3, np.float32), np.array([1]), np.ones(2, np.float32)),
   "same number of elements"),
  (lambda L, F, x, i, s: x.put_(i, s), (np.zeros(3, np.float32), np.array([1.0], np.float32), np.ones(1, np.float32)),
   "Expected a long tensor for index"),
  (lambda L, F, x, i, s: x.put(i, s), (np.zeros(3, np.float32), np.array([1]), np.ones(1)), "same dtype"),
])
def test_put_errors(fn, arrays, exc_match):
  raises_like_torch(fn, *arrays, match=exc_match)


UNARY_INPLACE = ("floor ceil round trunc frac fix absolute acos acosh arccos arcsin arcsinh arctan arctanh asin asinh "
                 "atan atanh cos cosh deg2rad erf erfc exp2 expm1 log10 log1p log2 logit negative rad2deg reciprocal "
                 "rsqrt sgn sign sin sinh square tan nan_to_num logical_not").split()


@pytest.mark.parametrize("name", UNARY_INPLACE)
def test_unary_inplace(rng, name):
  x = rng.uniform(0.05, 0.95, (3, 4)).astype(np.float32)
  if name in ("acosh", "arccosh"): x = x + 1.5
  if name in ("floor", "ceil", "round", "trunc", "frac", "fix", "sign", "sgn", "negative", "sin"): x = x * 8 - 4
  def fn(L, F, x):
    y = x * 1.0
    v = y[1]                # a view of y follows the write
    assert getattr(y, name + "_")() is y
    return y, v
  # (torch has no derivative for the in-place inverse hyperbolics)
  # (torch's in-place logical_not_ passes the gradient through unchanged: not followed)
  run(fn, x, rtol=2e-5, grad=name not in ("acosh", "asinh", "atanh", "arccosh", "arcsinh", "arctanh", "logical_not"),
      rng=rng)


def test_inplace_with_arguments(rng):
  a, b = randn(rng, 3, 4), rng.uniform(0.5, 2, (3, 4)).astype(np.float32)
  cases = [("round_", dict(decimals=1)), ("lerp_", (b, 0.3)), ("lerp_", (b, b / 4)), ("atan2_", (b,)),
           ("copysign_", (b,)), ("hypot_", (b,)), ("fmod_", (b,)), ("remainder_", (b,)), ("xlogy_", (b,)),
           ("addcmul_", (b, b)), ("addcdiv_", (b, b)), ("clip_", (-0.5, 0.5)), ("cumsum_", (1,)), ("cumprod_", (0,)),
           ("tril_", ()), ("triu_", (1,)), ("multiply_", (b,)), ("divide_", (b,)), ("subtract_", (b,)),
           ("true_divide_", (b,)), ("floor_divide_", (b,)), ("lt_", (b,)), ("ge_", (0.0,)), ("not_equal_", (b,)),
           ("logical_and_", (b,)), ("nan_to_num_", dict(nan=1.0))]
  for name, args in cases:
    def fn(L, F, a, b):
      y = a * 1.0
      k = args if isinstance(args, dict) else {}
      p = [L.tensor(v) if isinstance(v, np.ndarray) else v for v in (() if isinstance(args, dict) else args)]
      assert getattr(y, name)(*p, **k) is y
      return y
    # (torch's in-place comparisons pass the gradient through unchanged: not followed)
    nograd = ("fmod_", "remainder_", "floor_divide_", "lt_", "ge_", "not_equal_", "logical_and_")
    run(fn, a, b, grad=name not in nograd, rtol=2e-5, rng=rng)
  d = rng.uniform(1, 3, (4,))
  run(lambda L, F, x: (x * 1.0).float_power_(2.5), d, rng=rng)
  ints = rng.integers(0, 60, (5,))
  for name, args in (("bitwise_and_", (5,)), ("bitwise_or_", (5,)), ("bitwise_xor_", (5,)), ("bitwise_not_", ()),
                     ("bitwise_left_shift_", (2,)), ("bitwise_right_shift_", (1,)), ("floor_", ()), ("eq_", (3,))):
    run(lambda L, F, x: getattr(x.clone(), name)(*args), ints, grad=False)


@pytest.mark.parametrize("fn, arrays, match", [
  (lambda L, F, x: x.sqrt_(), (np.arange(3),), "can't be cast to the desired output type"),
  (lambda L, F, x, e: x.lerp_(e, 0.5), (np.zeros(3, np.float32), np.zeros(3)), "expected dtype float for `end`"),
  (lambda L, F, x, e: x.lerp_(e, 0.5), (np.zeros(3, np.float32), np.zeros((2, 3), np.float32)), "doesn't match"),
  (lambda L, F, x: x.float_power_(2), (np.zeros(3, np.float32),), "float_power_ has dtype Float"),
])
def test_inplace_errors(fn, arrays, match):
  raises_like_torch(fn, *arrays, match=match)


def test_dtype_properties():
  for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"):
    ours, theirs = getattr(fg, name), getattr(torch, name)
    for prop in ("is_floating_point", "is_signed", "is_complex"):
      assert getattr(ours, prop) == getattr(theirs, prop), (name, prop)


# ---- glu, instance_norm --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, dim", [((4, 6), -1), ((4, 6), 0), ((2, 4, 3), 1), ((2,), 0), ((0, 4), 1)])
def test_glu(rng, shape, dim):
  run(lambda L, F, x: F.glu(x, dim), randn(rng, *shape), rng=rng)
  run(lambda L, F, x: L.nn.GLU(dim)(x), randn(rng, *shape), rng=rng)
  run(lambda L, F, x: F.glu(x.double(), dim), randn(rng, *shape), rng=rng)
  x = randn(rng, *shape)
  got = FF.glu(fg.tensor(x, dtype=fg.bfloat16), dim)
  want = TF.glu(torch.tensor(x, dtype=torch.bfloat16), dim)
  assert got.dtype == fg.bfloat16
  np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shape, dim, match", [((2, 3), -1, "Halving dimension must be even, but dimension 1 is size 3"),
                                               ((), 0, "does not support scalars"),
                                               ((2, 4), 5, "Dimension out of range")])
def test_glu_errors(shape, dim, match):
  raises_like_torch(lambda L, F, x: F.glu(x, dim), np.zeros(shape, np.float32), match=match)
  raises_like_torch(lambda L, F, x: F.glu(x), np.zeros((2, 4), np.int64), match="not implemented for 'Long'")


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 2, 3, 4), (3, 2, 2)])
@pytest.mark.parametrize("affine", [False, True])
def test_instance_norm_functional(rng, shape, affine):
  C = shape[1]
  x = randn(rng, *shape) * 3 + 1
  # (atol 1e-3: over 2 spatial elements the input gradient is a cancellation of terms near 1 down to the eps term)
  if affine:
    run(lambda L, F, x, w, b: F.instance_norm(x, weight=w, bias=b, eps=1e-3), x, randn(rng, C), randn(rng, C),
        rtol=1e-4, atol=1e-3, rng=rng)
  else:
    run(lambda L, F, x: F.instance_norm(x), x, rtol=1e-4, atol=1e-3, rng=rng)
  # running statistics: updated from the batch's instances; without use_input_stats they normalize
  rm, rv = randn(rng, C), rng.uniform(0.5, 2, C).astype(np.float32)
  def stats(L, F, x, rm, rv):
    rm, rv = rm.detach().clone(), rv.detach().clone()
    y = F.instance_norm(x, rm, rv, momentum=0.3)
    return y, rm, rv
  run(stats, x, rm, rv, rtol=1e-4, atol=1e-4, rng=rng)
  run(lambda L, F, x, rm, rv: F.instance_norm(x, rm.detach(), rv.detach(), use_input_stats=False), x, rm, rv,
      rtol=1e-4, atol=1e-4, rng=rng)


@pytest.mark.parametrize("nd, shape", [(1, (2, 3, 6)), (1, (3, 6)), (2, (2, 3, 4, 5)), (2, (3, 4, 5)), (3, (2, 3, 2, 3, 4)),
                                       (3, (3, 2, 3, 4))])
@pytest.mark.parametrize("affine, track", [(False, False), (True, False), (True, True), (False, True)])
def test_instance_norm_modules(rng, nd, shape, affine, track):
  m = getattr(fg.nn, f"InstanceNorm{nd}d")(3, affine=affine, track_running_stats=track, momentum=0.2)
  tm = getattr(torch.nn, f"InstanceNorm{nd}d")(3, affine=affine, track_running_stats=track, momentum=0.2)
  assert sorted(m.state_dict()) == sorted(tm.state_dict())
  if affine:
    w, b = randn(rng, 3), randn(rng, 3)
    with torch.no_grad(): tm.weight.copy_(torch.tensor(w)); tm.bias.copy_(torch.tensor(b))
    with fg.no_grad(): m.weight.copy_(fg.tensor(w)); m.bias.copy_(fg.tensor(b))
  for step in range(2):
    x = randn(rng, *shape) * 2
    xf, xt = fg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yf, yt = m(xf), tm(xt)
    np.testing.assert_allclose(yf.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-4)
    w = randn(rng, *shape)
    (yf * fg.tensor(w)).sum().backward()
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    if affine: np.testing.assert_allclose(m.weight.grad.numpy(), tm.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
  if track:
    np.testing.assert_allclose(m.running_mean.numpy(), tm.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.running_var.numpy(), tm.running_var.numpy(), rtol=1e-5, atol=1e-6)
    m.eval(); tm.eval()
    x = randn(rng, *shape)
    np.testing.assert_allclose(m(fg.tensor(x)).numpy(), tm(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_instance_norm_errors():
  raises_like_torch(lambda L, F, x: F.instance_norm(x), np.zeros((2, 3, 1), np.float32), match="more than 1 spatial")
  raises_like_torch(lambda L, F, x, w: F.instance_norm(x, weight=w), np.zeros((2, 3, 4), np.float32),
                    np.ones(2, np.float32), match="weight should contain 6 elements not 4")
  raises_like_torch(lambda L, F, x: F.instance_norm(x, use_input_stats=False), np.zeros((2, 3, 4), np.float32),
                    match="running_mean and running_var to be defined")
  raises_like_torch(lambda L, F, x: L.nn.InstanceNorm1d(3)(x), np.zeros((2, 3, 4, 5), np.float32),
                    match="expected 2D or 3D input \\(got 4D input\\)")
  raises_like_torch(lambda L, F, x: L.nn.InstanceNorm2d(3, affine=True)(x), np.zeros((2, 4, 5, 5), np.float32),
                    match="match num_features")


# ---- pooling -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, osz", [((2, 3, 10), 4), ((2, 3, 10), 5), ((3, 7), 3), ((2, 3, 5), 7), ((2, 3, 6), 1),
                                        ((0, 3, 6), 2), ((2, 3, 6), 0)])
def test_adaptive_max_pool1d(rng, shape, osz):
  run(lambda L, F, x: F.adaptive_max_pool1d(x, osz, return_indices=True), randn(rng, *shape), rng=rng)
  run(lambda L, F, x: L.nn.AdaptiveMaxPool1d(osz)(x), randn(rng, *shape), rng=rng)


@pytest.mark.parametrize("shape, osz", [((2, 3, 7, 5), (3, 2)), ((2, 3, 8, 6), 4), ((3, 9, 4), (4, None)), ((1, 2, 3, 5), 7),
                                        ((2, 3, 6, 6), (1, 1)), ((0, 2, 4, 4), 2), ((2, 3, 5, 7), (None, 3))])
def test_adaptive_max_pool2d(rng, shape, osz):
  run(lambda L, F, x: F.adaptive_max_pool2d(x, osz, return_indices=True), randn(rng, *shape), rng=rng)
  run(lambda L, F, x: L.nn.AdaptiveMaxPool2d(osz, return_indices=True)(x.double()), randn(rng, *shape), rng=rng)


@pytest.mark.parametrize("fn, shape, dtype, match", [
  (lambda L, F, x: F.adaptive_max_pool1d(x, (2, 3)), (2, 3, 5), np.float32, "should contain one int"),
  (lambda L, F, x: F.adaptive_max_pool2d(x, 2), (3, 5), np.float32, "Expected 3D or 4D tensor"),
  (lambda L, F, x: F.adaptive_max_pool1d(x, 2), (2, 3, 5, 5), np.float32, "Expected 2 to 3 dimensions"),
  (lambda L, F, x: F.adaptive_max_pool2d(x, 2), (2, 3, 0, 4), np.float32, "dimension 2 being empty"),
  (lambda L, F, x: F.adaptive_max_pool1d(x, 2), (3, 5), np.int64, "not implemented for 'Long'"),
])
def test_adaptive_max_pool_errors(fn, shape, dtype, match):
  raises_like_torch(fn, np.zeros(shape, dtype), match=match)


@pytest.mark.parametrize("shape, kw", [
  ((2, 3, 6, 5, 7), dict(kernel_size=2)),
  ((2, 3, 6, 5, 7), dict(kernel_size=3, stride=2, padding=1)),
  ((1, 2, 7, 7, 6), dict(kernel_size=(2, 3, 2), stride=(1, 2, 2), dilation=(2, 1, 1))),
  ((2, 5, 6, 7), dict(kernel_size=2, stride=2, ceil_mode=True)),
  ((1, 1, 4, 4, 4), dict(kernel_size=4)),
])
def test_max_pool3d(rng, shape, kw):
  run(lambda L, F, x: F.max_pool3d(x, return_indices=True, **kw), randn(rng, *shape), rng=rng)
  run(lambda L, F, x: L.nn.MaxPool3d(**kw)(x), randn(rng, *shape), rng=rng)


def test_max_pool3d_errors():
  raises_like_torch(lambda L, F, x: F.max_pool3d(x, 2, padding=2), np.zeros((2, 3, 5, 5, 5), np.float32),
                    match="pad should be at most half of effective kernel size")


# ---- hardswish -----------------------------------------------------------------------------------------------------

def test_hardswish_edges(rng):
  x = np.concatenate([[-np.inf, -5.0, -3.0, -1.5, 0.0, 1.5, 3.0, 5.0, np.inf, np.nan], randn(rng, 20) * 4])
  x = x.astype(np.float32)
  out = run(lambda L, F, x: F.hardswish(x), x[np.isfinite(x)], rng=rng)
  run(lambda L, F, x: F.hardswish(x), x, grad=False)
  got = FF.hardswish(fg.tensor(x)).numpy()
  want = TF.hardswish(torch.tensor(x)).numpy()
  assert np.isnan(got[0]) and np.array_equal(np.signbit(got), np.signbit(want))   # -inf -> NaN, -5 -> -0.0
  assert out[0].dtype == fg.float32
