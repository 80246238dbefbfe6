"""Math ops PyTorch offers beside the basic ones of tensor.py: inverse trig and hyperbolic functions, copysign,
logaddexp, hypot, closeness tests, cumulative max/min/logsumexp, norms, median/mode/unique, diagonals, tensordot,
meshgrid/rot90, bincount/searchsorted/bucketize, cdist, addmm and its kin, put, and torch's elementwise in-place
forms (INPLACE) that tensor.py does not define.

Each is composed of Tensor ops (and the ATAN/ATAN2 primitives); where the composition's own gradient would be
wrong or unstable at an edge (asin at +-1, logaddexp of equal infinities), the forward runs under no_grad and a
rule of autograd.py (keyed by the op's name) gives PyTorch's derivative. They are attached to Tensor at the end,
as tensor.py attaches the sort family; fusegrad/__init__.py re-exports them as functions.
"""
from __future__ import annotations
import builtins
import functools
import math
import warnings
import numpy as np
from fusegrad import autograd
from fusegrad import dtype as dt
from fusegrad.graph import node as gn
from fusegrad.tensor import (Tensor, where, arange, cat, stack, _float32_inside, _norm_dim, _norm_dims, _windows,
                             _is_scalar, _result_type, _sqrt0, _all_if_empty, broadcast_shapes, HALF_FLOATS, ReturnMinMax)
from collections import namedtuple

LN2 = math.log(2)
ReturnCum = namedtuple("return_types", ["values", "indices"])


def _fl(x: Tensor) -> Tensor: return x._cast(x._float_dtype())


def _own(x: Tensor, kind: str, out: Tensor, *inputs: Tensor, arg=None) -> Tensor:
  """out (computed under no_grad) as a recorded op whose gradient is autograd.RULES[kind]"""
  return x._prim(kind, arg, out.node, *(inputs or (x,)))


def _zero_grad(x: Tensor, out: Tensor) -> Tensor:
  """out, differentiable in x with a zero gradient (PyTorch's sign, count of nonzeros...)"""
  if not x.requires_grad or not out.dtype.is_float: return out
  return x._prim("ZERO_GRAD", None, out.node)


# ---- unary -------------------------------------------------------------------------------------------------

def atan(self): return self._unary_float("ATAN")


@_float32_inside
def asin(self):
  x = _fl(self)
  with autograd.no_grad():   # atan(x / sqrt(1 - x^2)): +-1 gives x / 0 = +-inf and so +-pi/2; |x| > 1 gives NaN
    out = (x / ((1 - x) * (1 + x)).sqrt()).atan()
  return _own(x, "ASIN", out)


@_float32_inside
def acos(self):
  x = _fl(self)
  with autograd.no_grad():   # 2 atan(sqrt((1 - x) / (1 + x))): no cancellation near x = 1, pi at x = -1
    out = ((1 - x) / (1 + x)).sqrt().atan() * 2
  return _own(x, "ACOS", out)


@_float32_inside
def sinh(self):
  x = _fl(self)
  with autograd.no_grad():
    ax = x.abs()
    u = ax.expm1()
    small = (u + u / (u + 1)) * 0.5                       # (e^a - e^-a) / 2 without cancellation near 0
    h = (ax * 0.5).exp()
    big = h * (h * 0.5)                                   # e^a / 2 without overflowing before sinh does
    s = where(ax > 20, big, small)
    out = where(x < 0, -s, s)
  return _own(x, "SINH", out)


@_float32_inside
def cosh(self):
  x = _fl(self)
  with autograd.no_grad():
    ax = x.abs()
    e = ax.exp()
    h = (ax * 0.5).exp()
    out = where(ax > 20, h * (h * 0.5), (e + e.reciprocal()) * 0.5)
  return _own(x, "COSH", out)


@_float32_inside
def asinh(self):
  x = _fl(self)
  with autograd.no_grad():
    ax = x.abs()
    big = ax.log() + LN2                                   # log(2|x|): 1 + x^2 is x^2 there (and may overflow)
    a2 = ax * ax
    mid = (ax + a2 / (1 + (1 + a2).sqrt())).log1p()        # log1p keeps asinh(x) ~ x accurate near 0
    r = where(ax > 1e8, big, mid)
    out = where(x < 0, -r, r)
  return _own(x, "ASINH", out)


@_float32_inside
def acosh(self):
  x = _fl(self)
  with autograd.no_grad():
    t = x - 1
    mid = (t + (2 * t + t * t).sqrt()).log1p()            # NaN below 1: the sqrt or log1p of < -1
    out = where(x > 1e8, x.log() + LN2, where(x < 1, math.nan, mid))   # (t + sqrt(t^2 + 2t) cancels for x << -1)
  return _own(x, "ACOSH", out)


@_float32_inside
def atanh(self):
  x = _fl(self)
  with autograd.no_grad():
    ax = x.abs()
    r = (2 * ax / (1 - ax)).log1p() * 0.5                  # inf at 1, NaN past it
    out = where(x < 0, -r, r)
  return _own(x, "ATANH", out)


@_float32_inside
def erfc(self): return 1 - _fl(self).erf()
def deg2rad(self): return _fl(self) * (math.pi / 180)
def rad2deg(self): return _fl(self) * (180 / math.pi)


@_float32_inside
def logit(self, eps=None):
  x = _fl(self)
  if eps is not None: x = x.clamp(eps, 1 - eps)
  return (x / (1 - x)).log()


def sgn(self): return self.sign()
def positive(self):
  if self.dtype.is_bool: raise TypeError("The `+` operator, on a bool tensor is not supported.")
  return self


def signbit(self):
  if self.dtype.is_bool or self.dtype.is_unsigned: return self._new(gn.const(False, dt.bool_, self.shape, self.device))
  if not self.dtype.is_float: return self < 0
  return (self < 0) | ((self == 0) & (self.reciprocal() < 0))   # -0.0: 1 / -0.0 is -inf


_BIG = {dt.bfloat16: 3.3895313892515355e38}


def nan_to_num(self, nan: float = 0.0, posinf=None, neginf=None):
  if not self.dtype.is_float: return self.clone()
  big = _BIG.get(self.dtype, float(np.finfo(self.dtype.np).max) if self.dtype != dt.bfloat16 else 0)
  pi = big if posinf is None else posinf
  ni = -big if neginf is None else neginf
  return where(self.isnan(), nan, where(self == math.inf, pi, where(self == -math.inf, ni, self)))._cast(self.dtype)


def isneginf(self):
  if not self.dtype.is_float: return self._new(gn.const(False, dt.bool_, self.shape, self.device))
  return self == -math.inf


def isposinf(self):
  if not self.dtype.is_float: return self._new(gn.const(False, dt.bool_, self.shape, self.device))
  return self == math.inf


def isreal(self): return self._new(gn.const(True, dt.bool_, self.shape, self.device))


# ---- binary ------------------------------------------------------------------------------------------------

def atan2(self, other):
  return self._alu("ATAN2", other, dtype=self._float_dtype(other))


def _signbit_of(x, like: Tensor):
  if isinstance(x, Tensor): return signbit(x)
  return like._new(gn.const(math.copysign(1.0, float(x)) < 0, dt.bool_, (), like.device))


def copysign(self, other):
  d = self._float_dtype(other)
  a = self._cast(d).abs()
  return where(_signbit_of(other, self), -a, a)._cast(d)


def logaddexp(self, other):
  d = self._float_dtype(other)
  if d in HALF_FLOATS:   # float32 inside, one rounding
    o = other._cast(dt.float32) if isinstance(other, Tensor) else other
    return logaddexp(self._cast(dt.float32), o)._cast(d)
  a = self._cast(d)
  b = a._operand(other, d)
  shape = broadcast_shapes(a.shape, b.shape)
  a, b = a._broadcast_to(shape), b._broadcast_to(shape)
  with autograd.no_grad():   # max + log1p(exp(-|a - b|)); equal arguments (infinities too) give a + log 2
    out = where(a == b, a + LN2, a.maximum(b) + (-(a - b).abs()).exp().log1p())
  return _own(a, "LOGADDEXP", out, a, b)


def logaddexp2(self, other):
  d = self._float_dtype(other)
  o = other._cast(d) * LN2 if isinstance(other, Tensor) else other * LN2
  return (logaddexp(self._cast(d) * LN2, o) * (1 / LN2))._cast(d)


def hypot(self, other):
  d = self._float_dtype(other)
  a = self._cast(d)
  b = a._operand(other, d)
  shape = broadcast_shapes(a.shape, b.shape)
  a, b = a._broadcast_to(shape), b._broadcast_to(shape)
  with autograd.no_grad():   # scaled by the larger magnitude: no overflow of a^2 + b^2
    aa, bb = a.abs(), b.abs()
    m, n = aa.maximum(bb), aa.minimum(bb)
    q = n / where(m == 0, 1, m)
    out = where(m == math.inf, math.inf, m * (1 + q * q).sqrt())
  return _own(a, "HYPOT", out, a, b)


def xlogy(self, other):
  d = self._float_dtype(other)
  x = self._cast(d)
  y = x._operand(other, d)
  shape = broadcast_shapes(x.shape, y.shape)
  x, y = x._broadcast_to(shape), y._broadcast_to(shape)
  with autograd.no_grad():
    out = where(y.isnan(), math.nan, where(x == 0, 0.0, x * y.log()))._cast(d)
  return _own(x, "XLOGY", out, x, y)


def float_power(self, exponent):
  e = exponent._cast(dt.float64) if isinstance(exponent, Tensor) else exponent
  return self._cast(dt.float64).pow(e)


def equal(self, other) -> bool:
  if not isinstance(other, Tensor): raise TypeError(f"equal(): argument 'other' must be Tensor, not {type(other).__name__}")
  if self.shape != other.shape: return False
  return bool((self == other).all().item())


def isclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False):
  if isinstance(other, Tensor) and other.dtype != self.dtype:
    raise RuntimeError(f"isclose(): {self.dtype.name} did not match {other.dtype.name}")
  if rtol < 0: raise RuntimeError(f"rtol must be greater than or equal to zero, but got {rtol}")
  if atol < 0: raise RuntimeError(f"atol must be greater than or equal to zero, but got {atol}")
  if self.dtype.is_bool: return self == other
  o = self._operand(other, self.dtype)
  close = self == o
  if not self.dtype.is_float:   # PyTorch computes the tolerance of integers in the default float dtype
    a, b = self._cast(dt.default_float), o._cast(dt.default_float)
    return close | ((a - b).abs() <= atol + (rtol * b).abs())
  if equal_nan: close = close | (self.isnan() & o.isnan())
  err = (self - o).abs()
  return close | (err.isfinite() & (err <= atol + (rtol * o).abs()))


def allclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
  return bool(isclose(self, other, rtol, atol, equal_nan).all().item())


# ---- reductions --------------------------------------------------------------------------------------------

def nansum(self, dim=None, keepdim: bool = False, dtype=None):
  x = where(self.isnan(), 0, self) if self.dtype.is_float else self
  return x.sum(dim, keepdim, dtype=dtype)


def count_nonzero(self, dim=None):
  return (self != 0)._cast(dt.int64).sum(dim)


def _check_norm_input(x: Tensor, name: str) -> None:
  if not x.dtype.is_float:
    raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. Got {x.dtype.name}")


def vector_norm(x: Tensor, ord=2, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
  """torch.linalg.vector_norm: (sum |x|^ord)^(1/ord) over dim (all dims when None); inf/-inf: max/min |x|, 0: the
  count of nonzeros. Gradients as PyTorch's: 0 where the norm is 0."""
  if dtype is not None: x = x._cast(dt.to_dtype(dtype))
  _check_norm_input(x, "linalg.vector_norm")
  if x.dtype in HALF_FLOATS: return vector_norm(x._cast(dt.float32), ord, dim, keepdim)._cast(x.dtype)
  if isinstance(ord, str): raise RuntimeError(f"linalg.vector_norm: ord must be a number, got {ord!r}")
  dim = _all_if_empty(dim)
  if isinstance(dim, (int, np.integer)): dim = (dim,)
  axes = _norm_dims(dim, x.ndim)
  if x.numel() == 0 and ord < 0 or x.numel() == 0 and ord == math.inf and (dim is None or any(x.shape[a] == 0 for a in axes)):
    raise RuntimeError(f"linalg.vector_norm cannot compute the {ord} norm on an empty tensor because the operation does "
                       f"not have an identity")
  a = x.abs()
  if ord == math.inf: return a.amax(axes if axes else None, keepdim) if x.ndim else a
  if ord == -math.inf: return a.amin(axes if axes else None, keepdim) if x.ndim else a
  if ord == 0: return _zero_grad(x, (x != 0)._cast(x.dtype).sum(axes, keepdim))
  if ord == 1: return a.sum(axes, keepdim)
  if ord == 2: return _sqrt0((x * x).sum(axes, keepdim))
  s = a.pow(ord).sum(axes, keepdim)
  zero = s == 0
  return where(zero, 0.0, where(zero, 1.0, s).pow(1.0 / ord))


def _squeeze2(t: Tensor, dims: tuple, keepdim: bool) -> Tensor:
  return t if keepdim else t.squeeze(tuple(sorted(dims)))


def matrix_norm(x: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False, *, dtype=None) -> Tensor:
  """torch.linalg.matrix_norm for ord 'fro', 1, -1, inf, -inf (2, -2 and 'nuc' need singular values: not here)."""
  if dtype is not None: x = x._cast(dt.to_dtype(dtype))
  _check_norm_input(x, "linalg.matrix_norm")
  if x.ndim < 2: raise RuntimeError(f"linalg.matrix_norm: The input tensor A must have at least 2 dimensions (got {x.ndim})")
  if not isinstance(dim, (tuple, list)) or len(dim) != 2:
    raise RuntimeError(f"linalg.matrix_norm: dim must be a 2-tuple. Got {dim}")
  d0, d1 = _norm_dims(tuple(dim), x.ndim)
  if ord == "fro": return vector_norm(x, 2, (d0, d1), keepdim)
  if ord in ("nuc", 2, -2):
    raise NotImplementedError(f"linalg.matrix_norm: ord={ord!r} needs the singular values, which fusegrad does not compute")
  if ord not in (1, -1, math.inf, -math.inf):
    raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")
  a = x.abs()
  if ord in (1, -1): s, red = a.sum(d0, keepdim=True), d1           # column sums, then max/min over columns
  else: s, red = a.sum(d1, keepdim=True), d0                          # row sums, then max/min over rows
  r = s.amax(red, keepdim=True) if ord > 0 else s.amin(red, keepdim=True)
  return _squeeze2(r, (d0, d1), keepdim)


def linalg_norm(x: Tensor, ord=None, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
  """torch.linalg.norm: a vector norm (dim an int, or x 1-D) or a matrix norm (dim a pair, or x 2-D)."""
  if isinstance(dim, (int, np.integer)): dim = (dim,)
  if ord is None:
    if dim is not None and len(dim) == 2: return matrix_norm(x, "fro", dim, keepdim, dtype=dtype)
    return vector_norm(x, 2, dim, keepdim, dtype=dtype)
  if dim is None:
    if x.ndim == 1: return vector_norm(x, ord, None, keepdim, dtype=dtype)
    if x.ndim == 2: return matrix_norm(x, ord, (-2, -1), keepdim, dtype=dtype)
    raise RuntimeError(f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. Got {x.ndim}D.")
  if len(dim) == 1: return vector_norm(x, ord, dim, keepdim, dtype=dtype)
  if len(dim) == 2: return matrix_norm(x, ord, dim, keepdim, dtype=dtype)
  raise RuntimeError(f"linalg.norm: If dim is specified, it must be of length 1 or 2. Got {list(dim)}")


def norm(self, p="fro", dim=None, keepdim: bool = False, dtype=None):
  """torch.norm (deprecated in PyTorch, still common): 'fro' and numbers are vector norms over dim."""
  if p == "fro": p = 2
  if p == "nuc": return matrix_norm(self, "nuc", dim if dim is not None else (-2, -1), keepdim, dtype=dtype)
  if isinstance(p, str): raise RuntimeError(f"norm(): unknown p {p!r}")
  return vector_norm(self, p, dim, keepdim, dtype=dtype)


# ---- cumulative ----------------------------------------------------------------------------------------------

def _cum_minmax(self, dim, op: str):
  d = _norm_dim(dim, self.ndim)
  if self.ndim == 0: return ReturnCum(self.clone(), self._new(gn.const(0, dt.int64, (), self.device)))
  n = self.shape[d]
  if n == 0: return ReturnCum(self.clone(), self._new(gn.const(0, dt.int64, self.shape, self.device)))
  x = self.transpose(d, -1)
  with autograd.no_grad():
    ident = gn.reduce_identity(op, self.dtype)
    w = _windows(x.detach().pad((n - 1, 0), value=ident), n)
    best = w._reduce(op, -1, False)                   # the running max (min); NaN once one was seen
    # PyTorch's index: the latest j <= i whose value is the running one (a NaN: the latest NaN)
    xj, bi = x.detach().unsqueeze(-2), best.unsqueeze(-1)            # [..., 1, n], [..., n, 1]
    hit = xj == bi
    if self.dtype.is_float: hit = hit | (xj.isnan() & bi.isnan())
    j = arange(n, device=self.device)
    hit = hit & (j.reshape(1, n) <= j.reshape(n, 1))
    idx = where(hit, j, -1)._reduce("MAX", -1, False)
  vals = x.gather(x.ndim - 1, idx)   # the gradient goes to the index, as PyTorch's
  return ReturnCum(vals.transpose(d, -1), idx.transpose(d, -1))


def cummax(self, dim): return _cum_minmax(self, dim, "MAX")
def cummin(self, dim): return _cum_minmax(self, dim, "MIN")


@_float32_inside
def logcumsumexp(self, dim):
  d = _norm_dim(dim, self.ndim)
  x = _fl(self)
  if x.ndim == 0 or x.shape[d] <= 1: return x.clone()
  n = x.shape[d]
  # out[i] = logsumexp over the window x[..., i - n + 1 .. i] (-inf before the start): one fused kernel
  w = _windows(x.transpose(d, -1).pad((n - 1, 0), value=-math.inf), n)
  return w.logsumexp(-1).transpose(d, -1)


# ---- selection -----------------------------------------------------------------------------------------------

ReturnMedian = namedtuple("median", ["values", "indices"])
ReturnMode = namedtuple("mode", ["values", "indices"])


def median(self, dim=None, keepdim: bool = False):
  """The lower median ((n - 1) // 2-th smallest) and its index; NaN where a NaN is in the set, as PyTorch."""
  if dim is None:
    flat = self.reshape(-1)
    if flat.numel() == 0: return self._new(gn.const(math.nan, self.dtype, (), self.device))
    return _evenly(flat, median(flat, 0).values)
  d = _norm_dim(dim, self.ndim)
  n = self.shape[d] if self.ndim else 1
  if n == 0: raise IndexError(f"median(): Expected reduction dim {d} to have non-zero size.")
  v, i = self.kthvalue((n - 1) // 2 + 1, d, keepdim)
  if self.dtype.is_float:   # a NaN anywhere: the median is NaN (sort puts NaN last, so the max is NaN)
    hasnan = self.isnan().any(d, keepdim) if self.ndim else self.isnan()
    first = self.isnan()._cast(dt.int64).argmax(d, keepdim) if self.ndim else i
    v, i = where(hasnan, math.nan, v)._cast(self.dtype), where(hasnan, first, i)
  return ReturnMedian(v, i)


def _evenly(flat: Tensor, v: Tensor) -> Tensor:
  """v, a value of flat (its median), with PyTorch's gradient for the median of all elements: shared evenly by every
  element equal to it (NaN: by the NaNs), where the index a median along a dim returns takes it all. The maximum
  over those elements (the others at -inf; at +inf and the minimum where v is -inf) is v itself, and a max's gradient
  is shared by its ties."""
  if not (flat.requires_grad and autograd.grad_enabled()) or not flat.dtype.is_float: return v
  vd = v.detach()
  m = (flat == vd) | (flat.isnan() & vd.isnan())
  return where(vd == -math.inf, where(m, flat, math.inf).min(), where(m, flat, -math.inf).max())


def nanmedian(self, dim=None, keepdim: bool = False):
  if dim is None:
    flat = self.reshape(-1)
    return _evenly(flat, nanmedian(flat, 0).values)
  d = _norm_dim(dim, self.ndim)
  if not self.dtype.is_float: return median(self, d, keepdim)
  if self.ndim == 0: return ReturnMedian(self.clone(), self._new(gn.const(0, dt.int64, (), self.device)))
  vals, idx = self.sort(d)
  cnt = self.isnan().logical_not()._cast(dt.int64).sum(d, keepdim=True)
  k = where(cnt > 0, (cnt - 1) // 2, 0)
  v, i = vals.gather(d, k), idx.gather(d, k)
  return ReturnMedian(v, i) if keepdim else ReturnMedian(v.squeeze(d), i.squeeze(d))


def mode(self, dim: int = -1, keepdim: bool = False):
  """The most frequent value along dim (the smallest of equally frequent ones) and its last index, as PyTorch."""
  d = _norm_dim(dim, self.ndim)
  if self.ndim == 0: return ReturnMode(self.clone(), self._new(gn.const(0, dt.int64, (), self.device)))
  x = self.transpose(d, -1)
  n = x.shape[-1]
  with autograd.no_grad():
    xi, xj = x.detach().unsqueeze(-1), x.detach().unsqueeze(-2)        # [..., i, 1], [..., 1, j]
    cnt = (xi == xj)._cast(dt.int64).sum(-1)                            # [..., i]
    best = cnt.amax(-1, keepdim=True)
    cand = where(cnt == best, x.detach(), math.inf if x.dtype.is_float else gn.reduce_identity("MIN", x.dtype))
    val = cand.amin(-1, keepdim=True)
    j = arange(n, device=self.device)
    idx = where(x.detach() == val, j, -1).amax(-1, keepdim=True)
  v = x.gather(x.ndim - 1, idx)
  v, idx = v.transpose(d, -1), idx.transpose(d, -1)
  return ReturnMode(v, idx) if keepdim else ReturnMode(v.squeeze(d), idx.squeeze(d))


def unique(self, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False, dim=None):
  """Distinct values (sorted, as PyTorch's CPU unique always gives them): the shape depends on the values, so the
  input is read (realized) here."""
  a = self.detach().numpy() if self.dtype != dt.bfloat16 else self.detach().float().numpy()
  if dim is not None: d = _norm_dim(dim, self.ndim)
  # each NaN its own value, as PyTorch's (NaN != NaN; numpy merges them by default)
  u, inv, cnt = np.unique(a, return_inverse=True, return_counts=True, axis=None if dim is None else d, equal_nan=False)
  vals = Tensor(u, dtype=self.dtype, device=self.device)
  out = [vals]
  if return_inverse: out.append(Tensor(inv.reshape(self.shape if dim is None else (-1,)).astype(np.int64), device=self.device))
  if return_counts: out.append(Tensor(cnt.astype(np.int64), device=self.device))
  return out[0] if len(out) == 1 else tuple(out)


# ---- diagonals and contractions -----------------------------------------------------------------------------

def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1):
  if self.ndim < 2: raise RuntimeError(f"diagonal(): the input must have at least 2 dimensions, got {self.ndim}")
  a, b = _norm_dim(dim1, self.ndim), _norm_dim(dim2, self.ndim)
  if a == b: raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
  rest = [i for i in range(self.ndim) if i not in (a, b)]
  x = self.permute(*rest, a, b)
  r, c = x.shape[-2:]
  if offset >= 0: x = x.narrow(-1, builtins.min(offset, c), c - builtins.min(offset, c))
  else: x = x.narrow(-2, builtins.min(-offset, r), r - builtins.min(-offset, r))
  n = builtins.min(x.shape[-2], x.shape[-1])
  x = x.narrow(-2, 0, n).narrow(-1, 0, n)
  lead = x.shape[:-2]
  if n == 0: return x.reshape(*lead, 0)
  return x.reshape(*lead, n * n)[(Ellipsis, slice(None, None, n + 1))]


def _embed_last(x: Tensor, offset: int) -> Tensor:
  """[..., L] -> [..., n, n] (n = L + |offset|) with x on the offset diagonal, zeros elsewhere"""
  L = x.shape[-1]
  n = L + abs(offset)
  xp = x.pad((0, abs(offset)))                                           # [..., n]
  i, j = arange(n, device=x.device).reshape(n, 1), arange(n, device=x.device).reshape(1, n)
  vals = xp.unsqueeze(-1) if offset >= 0 else xp.unsqueeze(-2)           # x[i] on row i (offset >= 0), x[j] else
  return where(j - i == offset, vals, x._new(gn.const(0, x.dtype, (), x.device)))


def diag_embed(self, offset: int = 0, dim1: int = -2, dim2: int = -1):
  nd = self.ndim + 1
  a, b = _norm_dim(dim1, nd), _norm_dim(dim2, nd)
  if a == b: raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
  m = _embed_last(self if self.ndim else self.reshape(1), offset)
  rest = iter(range(nd - 2))
  order = [nd - 2 if p == a else nd - 1 if p == b else next(rest) for p in range(nd)]
  return m.permute(*order)


def diag(self, diagonal: int = 0):
  if self.ndim == 1: return _embed_last(self, diagonal)
  if self.ndim == 2: return self.diagonal(diagonal)
  raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {self.ndim}D")


def trace(self):
  if self.ndim != 2: raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {self.ndim}")
  return self.diagonal().sum()


def mm(self, mat2):
  if self.ndim != 2: raise RuntimeError(f"self must be a matrix (got a {self.ndim}-D tensor)")
  if not isinstance(mat2, Tensor) or mat2.ndim != 2:
    raise RuntimeError(f"mat2 must be a matrix (got a {getattr(mat2, 'ndim', 0)}-D tensor)")
  return self.matmul(mat2)


def bmm(self, mat2):
  if self.ndim != 3: raise RuntimeError(f"batch1 must be a 3D tensor (got a {self.ndim}-D tensor)")
  if not isinstance(mat2, Tensor) or mat2.ndim != 3:
    raise RuntimeError(f"batch2 must be a 3D tensor (got a {getattr(mat2, 'ndim', 0)}-D tensor)")
  if self.shape[0] != mat2.shape[0]:
    raise RuntimeError(f"batch1 and batch2 must have same number of batches, got {self.shape[0]} and {mat2.shape[0]}")
  return self.matmul(mat2)


def mv(self, vec):
  if self.ndim != 2 or not isinstance(vec, Tensor) or vec.ndim != 1:
    raise RuntimeError(f"vector + matrix @ vector expected, got {self.ndim}, {getattr(vec, 'ndim', 0)}")
  return self.matmul(vec)


def dot(self, other):
  if self.ndim != 1 or not isinstance(other, Tensor) or other.ndim != 1:
    raise RuntimeError(f"1D tensors expected, but got {self.ndim}D and {getattr(other, 'ndim', 0)}D tensors")
  if self.shape != other.shape:
    raise RuntimeError(f"inconsistent tensor size, expected tensor [{self.shape[0]}] and src [{other.shape[0]}] to have "
                       f"the same number of elements, but got {self.shape[0]} and {other.shape[0]} elements respectively")
  return self.matmul(other)


vdot = dot


def inner(self, other):
  if self.ndim == 0 or other.ndim == 0: return self * other
  return tensordot(self, other, ([-1], [-1]))


def tensordot(a: Tensor, b: Tensor, dims=2) -> Tensor:
  if isinstance(dims, (int, np.integer)):
    if dims < 0: raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
    da, db = list(range(a.ndim - dims, a.ndim)), list(range(dims))
  else:
    da, db = ([dims[0]] if isinstance(dims[0], int) else list(dims[0])), ([dims[1]] if isinstance(dims[1], int) else list(dims[1]))
  if len(da) != len(db): raise RuntimeError("both dimension lists should have same length")
  da, db = [_norm_dim(x, a.ndim) for x in da], [_norm_dim(x, b.ndim) for x in db]
  for x, y in zip(da, db):
    if a.shape[x] != b.shape[y]:
      raise RuntimeError(f"contracted dimensions need to match, but first has size {a.shape[x]} in dim {x} and second has "
                         f"size {b.shape[y]} in dim {y}")
  fa, fb = [i for i in range(a.ndim) if i not in da], [i for i in range(b.ndim) if i not in db]
  k = 1
  for x in da: k *= a.shape[x]
  am = a.permute(*fa, *da).reshape(-1, k) if a.ndim else a.reshape(1, 1)
  bm = b.permute(*db, *fb).reshape(k, -1) if b.ndim else b.reshape(1, 1)
  return (am @ bm).reshape(*[a.shape[i] for i in fa], *[b.shape[i] for i in fb])


# ---- grids, rotations, counting and searching -----------------------------------------------------------------

def meshgrid(*tensors, indexing: str | None = None):
  """torch.meshgrid: every 0-d or 1-d input expanded along its own dim of the grid (broadcast views, no copies;
  'xy' swaps the first two dims, as numpy's)."""
  if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)): tensors = tuple(tensors[0])
  if not tensors: raise RuntimeError("meshgrid expects a non-empty TensorList")
  if indexing is None:
    warnings.warn("torch.meshgrid: in an upcoming release, it will be required to pass the indexing argument.",
                  UserWarning, stacklevel=2)
    indexing = "ij"
  if indexing not in ("ij", "xy"):
    raise RuntimeError(f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}')
  for t in tensors:
    if not isinstance(t, Tensor): raise TypeError(f"meshgrid(): expected Tensor as element, but got {type(t).__name__}")
    if t.ndim > 1: raise RuntimeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {t}")
  if builtins.any(t.dtype != tensors[0].dtype for t in tensors):
    raise RuntimeError("meshgrid expects all tensors to have the same dtype")
  if builtins.any(t.device != tensors[0].device for t in tensors):
    raise RuntimeError("meshgrid expects all tensors to have the same device")
  sizes = [t.numel() for t in tensors]
  order = list(range(len(tensors)))
  if indexing == "xy" and len(tensors) >= 2: order[0], order[1] = 1, 0   # input i lies along grid dim order[i]
  grid = [sizes[order.index(g)] for g in range(len(tensors))]
  return tuple(t.reshape(*[grid[g] if g == order[i] else 1 for g in range(len(grid))]).expand(*grid)
               for i, t in enumerate(tensors))


def rot90(self, k: int = 1, dims=(0, 1)):
  """A quarter turn k times from dims[0] towards dims[1]: flips and a transpose, as torch's."""
  dims = list(dims)
  if len(dims) != 2: raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
  if self.ndim < 2: raise RuntimeError(f"expected total dims >= 2, but got total dims = {self.ndim}")
  if dims[0] == dims[1] or abs(dims[0] - dims[1]) == self.ndim:
    raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {dims[0]} and dim1 = {dims[1]}")
  a, b = _norm_dim(dims[0], self.ndim), _norm_dim(dims[1], self.ndim)
  k %= 4
  if k == 1: return self.flip(b).transpose(a, b)
  if k == 2: return self.flip(a, b)
  if k == 3: return self.flip(a).transpose(a, b)
  return self.clone()


def bincount(self, weights=None, minlength: int = 0):
  """How often each value 0..max occurs (the weights summed instead, when given). The length depends on the largest
  value, so the input is read on the host (as torch's); the counting is a lazy one-hot sum, differentiable in the
  weights."""
  if not self.dtype.is_int: raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{dt.scalar_name(self.dtype)}'")
  if minlength < 0: raise RuntimeError("minlength should be >= 0")
  bad = RuntimeError("bincount only supports 1-d non-negative integral inputs.")
  if self.ndim != 1: raise bad
  v = self.numpy() if self.numel() else np.zeros(0, np.int64)
  if v.size and v.min() < 0: raise bad
  if weights is not None and (not isinstance(weights, Tensor) or weights.ndim != 1 or weights.shape[0] != self.shape[0]):
    raise RuntimeError("weights should be 1-d and have the same length as input")
  n = builtins.max(int(v.max()) + 1 if v.size else 0, int(minlength))
  hit = self.reshape(-1, 1) == arange(n, device=self.device)                     # [len, n]
  if weights is None or self.numel() == 0: return hit._cast(dt.int64).sum(0)   # (torch: int64 zeros when empty)
  d = dt.float32 if weights.dtype == dt.float32 else dt.float64                   # (torch's: float stays, else double)
  return where(hit, weights._cast(d).reshape(-1, 1), 0.0)._cast(d).sum(0)


def searchsorted(sorted_sequence: Tensor, values, *, out_int32: bool = False, right: bool = False, side=None,
                 sorter=None) -> Tensor:
  """torch.searchsorted by counting: a value's insertion index is how many boundaries of its row lie before it
  (not >= v for the left side, not > v for the right: a NaN value goes last, as in torch's binary search). Every
  value is compared with its whole row: lazy, one fused reduction, values x boundaries work where torch's binary
  search does values x log(boundaries)."""
  if side is not None:
    if side not in ("left", "right"):
      raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if right and side == "left":
      raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left while right "
                         "was True")
    right = side == "right"
  b = sorted_sequence
  if not isinstance(b, Tensor):
    raise TypeError(f"searchsorted(): argument 'sorted_sequence' must be Tensor, not {type(b).__name__}")
  if b.ndim == 0:
    raise RuntimeError("torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 dimension")
  scalar = not isinstance(values, Tensor)
  if scalar:
    if b.ndim != 1:
      raise RuntimeError(f"torch.searchsorted(): input value can be a scalar only when boundaries tensor dimension is "
                         f"1, but we got boundaries tensor dim({b.ndim}) and input value's dim(0) numel(1)")
    values = b._new(gn.const(values, _result_type(b, values), (), b.device))
  if b.dtype.is_bool: raise NotImplementedError("\"searchsorted_out_cpu\" not implemented for 'Bool'")
  if b.ndim != 1 and (b.ndim != values.ndim or b.shape[:-1] != values.shape[:-1]):
    raise RuntimeError(f"torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of "
                       f"boundaries tensor and input value tensor must match, but we got boundaries tensor "
                       f"{list(b.shape)} and input value tensor {list(values.shape)}")
  if sorter is not None:
    if sorter.dtype != dt.int64:
      raise RuntimeError(f"torch.searchsorted(): sorter must be a tensor of long dtype but got dtype "
                         f"{dt.scalar_name(sorter.dtype)}")
    if sorter.shape != b.shape:
      raise RuntimeError(f"torch.searchsorted(): boundary and sorter must have the same size, but got boundary tensor "
                         f"{list(b.shape)}and got sorter tensor {list(sorter.shape)}")
    if (sorter.node.realized or sorter.node.op in ("BUFFER", "CONST")) and sorter.numel():
      s = sorter.numpy()
      if s.min() < 0 or s.max() >= b.shape[-1]: raise RuntimeError("torch.searchsorted(): sorter index out of range")
    b = b.gather(b.ndim - 1, sorter)
  d = _result_type(b, values)
  v, bb = values._cast(d).detach().unsqueeze(-1), b._cast(d).detach()            # [..., K, 1]
  if b.ndim > 1: bb = bb.unsqueeze(-2)                                            # [..., 1, M]
  before = (bb > v) if right else (bb >= v)
  out = before.logical_not()._cast(dt.int64).sum(-1)
  return out._cast(dt.int32) if out_int32 else out


def bucketize(input, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:
  """torch.bucketize: searchsorted with the arguments the other way round and 1-d boundaries only."""
  if not isinstance(boundaries, Tensor):
    raise TypeError(f"bucketize(): argument 'boundaries' must be Tensor, not {type(boundaries).__name__}")
  if boundaries.ndim != 1: raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
  return searchsorted(boundaries, input, out_int32=out_int32, right=right)


_CDIST_MODES = (None, "use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")


def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode=None) -> Tensor:
  """torch.cdist: the p-norm distance between every row of x1 [..., P, M] and every row of x2 [..., R, M] (batch
  dims broadcast). Always the differences' norm (one fused reduction over [..., P, R, M]), never torch's
  |a|^2 + |b|^2 - 2ab matmul form for large inputs: that form cancels for nearby points, so results there differ
  from torch's by its rounding. Gradients as torch's: 0 where a distance is 0."""
  if compute_mode not in _CDIST_MODES: raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
  for name, x in (("X1", x1), ("X2", x2)):
    if not isinstance(x, Tensor): raise TypeError(f"cdist(): argument '{name.lower()}' must be Tensor, not {type(x).__name__}")
    if x.ndim < 2: raise RuntimeError(f"cdist only supports at least 2D tensors, {name} got: {x.ndim}D")
    if not x.dtype.is_float:
      raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: {dt.scalar_name(x.dtype)}")
  if x1.shape[-1] != x2.shape[-1]:
    raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
  if p < 0: raise RuntimeError("cdist only supports non-negative p values")
  if x1.dtype != x2.dtype:
    raise RuntimeError(f"expected scalar type {dt.scalar_name(x1.dtype)} but found {dt.scalar_name(x2.dtype)}")
  batch = broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
  P, R, M = x1.shape[-2], x2.shape[-2], x1.shape[-1]
  diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)                                      # [..., P, R, M]
  if M == 0: return diff.abs().sum(-1)._broadcast_to(batch + (P, R))              # (0 for every p; no max of nothing)
  return vector_norm(diff._broadcast_to(batch + (P, R, M)), p, -1)


# ---- matrix products with an added term ------------------------------------------------------------------------

def _added(input: Tensor, prod: Tensor, beta, alpha) -> Tensor:
  """beta * input + alpha * prod, input broadcast to the product's shape. Integral results take the scalars as
  integers (torch casts them to the result type). beta == 0 does not read input (a NaN or inf there does not reach
  the result, as torch documents), but input still gets its gradient, zeros, as torch's."""
  d = prod.dtype
  if not d.is_float: beta, alpha = (bool(beta), bool(alpha)) if d.is_bool else (int(beta), int(alpha))
  inp = input.expand(*prod.shape)
  out = prod if alpha == 1 else prod * alpha
  if beta == 0:   # (a zero constant recorded as a function of input with a zero gradient)
    return out + inp._prim("ZERO_GRAD", None, gn.const(0, d, inp.shape, inp.device))
  return out + (inp if beta == 1 else inp * beta)


def _same_dtype(a: Tensor, b: Tensor, na: str, nb: str) -> None:
  if a.dtype != b.dtype:
    raise RuntimeError(f"{na} and {nb} must have the same dtype, but got {dt.scalar_name(a.dtype)} and "
                       f"{dt.scalar_name(b.dtype)}")


def _product_in_float32(fn, input: Tensor, a: Tensor, b: Tensor, beta, alpha) -> Tensor:
  """fn(input, a, b, beta, alpha) of float16/bfloat16 operands computed in float32 and rounded once (torch's CPU
  kernels accumulate in float32); other dtypes as they are."""
  if a.dtype not in HALF_FLOATS: return fn(input, a, b, beta, alpha)
  f = dt.float32
  return fn(input._cast(f), a._cast(f), b._cast(f), beta, alpha)._cast(a.dtype)


def addmm(self, mat1, mat2, *, beta=1, alpha=1):
  """beta * self + alpha * (mat1 @ mat2)."""
  for name, m in (("mat1", mat1), ("mat2", mat2)):
    if not isinstance(m, Tensor): raise TypeError(f"addmm(): argument '{name}' must be Tensor, not {type(m).__name__}")
    if m.ndim != 2: raise RuntimeError(f"{name} must be a matrix, got {m.ndim}-D tensor")
  _same_dtype(self, mat2, "self", "mat2")
  _same_dtype(mat1, mat2, "mat1", "mat2")
  if mat1.shape[1] != mat2.shape[0]:
    raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({mat1.shape[0]}x{mat1.shape[1]} and "
                       f"{mat2.shape[0]}x{mat2.shape[1]})")
  return _product_in_float32(lambda i, a, b, be, al: _added(i, a @ b, be, al), self, mat1, mat2, beta, alpha)


def addmv(self, mat, vec, *, beta=1, alpha=1):
  """beta * self + alpha * (mat @ vec)."""
  if not (isinstance(mat, Tensor) and isinstance(vec, Tensor) and mat.ndim == 2 and vec.ndim == 1 and self.ndim <= 1):
    raise RuntimeError(f"vector + matrix @ vector expected, got {self.ndim}, {getattr(mat, 'ndim', 0)}, "
                       f"{getattr(vec, 'ndim', 0)}")
  if mat.shape[1] != vec.shape[0] or (self.ndim == 1 and self.shape[0] not in (1, mat.shape[0])):
    raise RuntimeError(f"size mismatch, got input ({self.shape[0] if self.ndim else 1}), mat "
                       f"({mat.shape[0]}x{mat.shape[1]}), vec ({vec.shape[0]})")
  _same_dtype(mat, vec, "mat", "vec")
  _same_dtype(self, mat, "self", "mat")
  return _product_in_float32(lambda i, a, b, be, al: _added(i, a @ b, be, al), self, mat, vec, beta, alpha)


def _check_batches(b1, b2, name: str) -> None:
  for n, b in (("batch1", b1), ("batch2", b2)):
    if not isinstance(b, Tensor): raise TypeError(f"{name}(): argument '{n}' must be Tensor, not {type(b).__name__}")
    if b.ndim != 3: raise RuntimeError(f"{n} must be a 3D tensor")
  _same_dtype(b1, b2, "batch1", "batch2")


def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
  """beta * self + alpha * sum over b of batch1[b] @ batch2[b]: one matmul, the batches laid side by side along k."""
  _check_batches(batch1, batch2, "addbmm")
  if batch1.shape[0] != batch2.shape[0]:
    raise RuntimeError(f"batch1 and batch2 must have same number of batches, got {batch1.shape[0]} and {batch2.shape[0]}")
  (B, n, k), (_, k2, m) = batch1.shape, batch2.shape
  if k != k2: raise RuntimeError(f"Incompatible matrix sizes for bmm ({n}x{k} and {k2}x{m})")
  _same_dtype(self, batch1, "self", "batch1")
  prod = lambda a, b: a.permute(1, 0, 2).reshape(n, B * k) @ b.reshape(B * k, m)
  return _product_in_float32(lambda i, a, b, be, al: _added(i, prod(a, b), be, al), self, batch1, batch2,
                             beta, alpha)


def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
  """beta * self + alpha * (batch1 @ batch2), batch by batch."""
  _check_batches(batch1, batch2, "baddbmm")
  (B, _, k), (B2, k2, _) = batch1.shape, batch2.shape
  if (B2, k2) != (B, k):
    raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: [{B}, {k}] but got: "
                       f"[{B2}, {k2}].")
  _same_dtype(self, batch1, "self", "batch1")
  return _product_in_float32(lambda i, a, b, be, al: _added(i, a @ b, be, al), self, batch1, batch2,
                             beta, alpha)


# ---- put ---------------------------------------------------------------------------------------------------------

def put(self, index, source, accumulate: bool = False):
  """self with source written at the flat positions index (negative ones count from the end), through index_put on
  the flattened tensor: lazy, differentiable in self and source."""
  if not isinstance(index, Tensor): raise TypeError(f"put(): argument 'index' must be Tensor, not {type(index).__name__}")
  if not isinstance(source, Tensor): raise TypeError(f"put(): argument 'source' must be Tensor, not {type(source).__name__}")
  if index.dtype != dt.int64:
    raise RuntimeError(f"put_(): Expected a long tensor for index, but got {dt.scalar_name(index.dtype)}")
  if source.dtype != self.dtype:
    raise RuntimeError(f"put_(): self and source expected to have the same dtype, but got self.dtype = "
                       f"{dt.scalar_name(self.dtype)} and source.dtype = {dt.scalar_name(source.dtype)}")
  if index.numel() != source.numel():
    raise IndexError(f"put_(): Expected source and index to have the same number of elements, but got source.numel() = "
                     f"{source.numel()}, index.numel() = {index.numel()}")
  n = self.numel()
  if index.numel() and (index.node.realized or index.node.op in ("BUFFER", "CONST")):
    v = index.numpy()
    if v.min() < -n or v.max() >= n:
      raise IndexError(f"out of range: tried to access index {int(v.max()) if v.max() >= n else int(v.min())} on a "
                       f"tensor of {n} elements.")
  if index.numel() == 0: return self.clone()
  return self.reshape(-1).index_put((index.reshape(-1),), source.reshape(-1), accumulate).reshape(self.shape)


# ---- in-place forms ------------------------------------------------------------------------------------------------

def _inplace_of(name: str):
  def f(self, *args, **kwargs): return self._inplace(getattr(self, name)(*args, **kwargs))
  f.__name__ = name + "_"
  f.__doc__ = f"In-place {name}: self rebound to self.{name}(...) in self's dtype (alias.py carries it to views)."
  return f


def lerp_(self, end, weight):
  if isinstance(end, Tensor) and end.dtype != self.dtype:
    raise RuntimeError(f"expected dtype {dt.scalar_name(self.dtype).lower()} for `end` but got dtype "
                       f"{dt.scalar_name(end.dtype).lower()}")
  if not self.dtype.is_float:
    raise NotImplementedError(f"\"lerp_kernel_scalar\" not implemented for '{dt.scalar_name(self.dtype)}'")
  return self._inplace(self.lerp(end, weight))


def float_power_(self, exponent):
  if self.dtype != dt.float64:
    raise RuntimeError(f"the base given to float_power_ has dtype {dt.scalar_name(self.dtype)} but the operation's "
                       f"result requires dtype Double")
  return self._inplace(float_power(self, exponent))


def put_(self, index, source, accumulate: bool = False): return self._inplace(put(self, index, source, accumulate))


# torch's elementwise in-place forms (shape kept) whose out-of-place op fusegrad has; those tensor.py defines itself
# are left alone
INPLACE = ("absolute acos acosh arccos arccosh arcsin arcsinh arctan arctan2 arctanh asin asinh atan atan2 atanh "
           "addcdiv addcmul addmm addmv addbmm baddbmm bitwise_and bitwise_left_shift bitwise_not bitwise_or "
           "bitwise_right_shift bitwise_xor ceil clip copysign cos cosh cumprod cumsum deg2rad divide eq erf erfc exp2 "
           "expm1 fix floor floor_divide fmod frac ge greater greater_equal gt hypot le less less_equal log10 log1p log2 "
           "logical_and logical_not logical_or logical_xor logit lt masked_scatter multiply nan_to_num ne negative "
           "not_equal rad2deg reciprocal remainder round rsqrt sgn sign sin sinh square subtract tan tril triu "
           "true_divide trunc xlogy").split()


# ---- attaching -----------------------------------------------------------------------------------------------

METHODS = dict(
  atan=atan, arctan=atan, asin=asin, arcsin=asin, acos=acos, arccos=acos, sinh=sinh, cosh=cosh, asinh=asinh,
  arcsinh=asinh, acosh=acosh, arccosh=acosh, atanh=atanh, arctanh=atanh, erfc=erfc, deg2rad=deg2rad, rad2deg=rad2deg,
  logit=logit, sgn=sgn, positive=positive, signbit=signbit, nan_to_num=nan_to_num, isneginf=isneginf,
  isposinf=isposinf, isreal=isreal, atan2=atan2, arctan2=atan2, copysign=copysign, logaddexp=logaddexp,
  logaddexp2=logaddexp2, hypot=hypot, xlogy=xlogy, float_power=float_power, equal=equal, isclose=isclose,
  allclose=allclose, nansum=nansum, count_nonzero=count_nonzero, norm=norm, cummax=cummax, cummin=cummin,
  logcumsumexp=logcumsumexp, median=median, nanmedian=nanmedian, mode=mode, unique=unique, diagonal=diagonal,
  diag_embed=diag_embed, diag=diag, trace=trace, mm=mm, bmm=bmm, mv=mv, dot=dot, vdot=vdot, inner=inner,
  fix=Tensor.trunc, absolute=Tensor.abs, negative=Tensor.neg, multiply=Tensor.mul, subtract=Tensor.sub,
  divide=Tensor.div, greater=Tensor.gt, greater_equal=Tensor.ge, less=Tensor.lt, less_equal=Tensor.le,
  not_equal=Tensor.ne, rot90=rot90, bincount=bincount, addmm=addmm, addmv=addmv, addbmm=addbmm, baddbmm=baddbmm,
  put=put,
)
for _n, _f in METHODS.items(): setattr(Tensor, _n, _f)
for _n in INPLACE:
  if not hasattr(Tensor, _n + "_"): setattr(Tensor, _n + "_", _inplace_of(_n))
for _f in (lerp_, float_power_, put_):
  if not hasattr(Tensor, _f.__name__): setattr(Tensor, _f.__name__, _f)


def _axis_alias(fn):
  """PyTorch's argument parser takes `axis=` for `dim=` (numpy's spelling) in every op with a dim."""
  @functools.wraps(fn)
  def wrapper(self, *args, **kwargs):
    if "axis" in kwargs:
      if "dim" in kwargs: raise TypeError(f"{fn.__name__}() got both 'dim' and its alias 'axis'")
      kwargs["dim"] = kwargs.pop("axis")
    return fn(self, *args, **kwargs)
  return wrapper


for _n in ("sum mean prod amax amin max min argmax argmin var std var_mean std_mean logsumexp all any cumsum cumprod "
           "cummax cummin logcumsumexp nansum count_nonzero median nanmedian mode kthvalue sort argsort").split():
  setattr(Tensor, _n, _axis_alias(getattr(Tensor, _n)))


# ---- more of torch's API: metadata, in-place view ops, random fills and samplers, constructors ---------------------
# (attached below with their own loop: none of these is a module-level function through METHODS)

import struct as _struct  # noqa: E402
import weakref as _weakref  # noqa: E402
from fusegrad import alias as _alias  # noqa: E402
from fusegrad.engine import jit as _jit, trace as _trace  # noqa: E402
from fusegrad.runtime import device as _rd  # noqa: E402
import sys as _sys  # noqa: E402
_tm = _sys.modules["fusegrad.tensor"]   # (the module: `fusegrad.tensor` the attribute is the function)


def _g(x) -> str:
  """A number as C++'s ostream writes it in torch's messages (-1, 0.5, 1e+10)."""
  return f"{x:g}" if isinstance(x, float) else str(x)


def stride(self, dim=None):
  """self's strides in elements, as torch's: a view's from its view ops over its storage (a transpose's swapped, a
  slice's its base's), any other tensor's contiguous (a size-0 dim counts as 1, as torch's)."""
  out = _alias.layout(self)[0]
  if dim is None: return out
  if self.ndim == 0: raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
  return out[_norm_dim(dim, self.ndim)]


def storage_offset(self) -> int: return _alias.layout(self)[1]


def is_contiguous(self, memory_format=None) -> bool: return _tm._is_contiguous(self)


def data_ptr(self) -> int:
  """A stable int naming self's storage (alias.py's Storage): the same for self and its views, kept across in-place
  ops, different for another tensor's. No address: a lazy tensor may have no buffer yet."""
  return id(_alias.storage_of(self))


# -- view(dtype): bit casts

_BITS = {1: dt.uint8, 2: dt.int16, 4: dt.int32, 8: dt.int64}   # the integers a size-changing view computes in


def _view_dtype_arg(x):
  """view's dtype argument (a fusegrad or torch dtype, or Python's int/float/bool as torch takes them)."""
  if isinstance(x, dt.DType) or any(x is t for t in (builtins.int, builtins.float, builtins.bool)) or \
     (type(x).__module__ == "torch" and type(x).__name__ == "dtype"):
    return dt.to_dtype(x)
  n = type(x).__name__
  bad = f"      didn't match because some of the arguments have invalid types: (!{n}!)\n"
  raise TypeError(f"view() received an invalid combination of arguments - got ({n}), but expected one of:\n"
                  f" * (torch.dtype dtype)\n{bad} * (tuple of ints size)\n{bad}")


def view_dtype(self, dtype) -> Tensor:
  """torch's Tensor.view(dtype): self's bits read as dtype, little-endian (as torch on x86 and ARM). Of the same
  itemsize, one BITCAST node (elementwise: it fuses with what reads it); of another, torch's rule: the last dim must
  have stride 1 (and, growing the element, a size, offset and strides divisible by the ratio; torch's errors), and it
  shrinks or grows by the ratio: each element's bits shifted apart into the smaller ones, or the smaller ones'
  shifted and or-ed together, between BITCASTs of the same size. The result needs no gradient (torch's view(dtype)
  is not differentiable). Unlike torch's it is a new value, not a view of self's storage: in-place writes to either
  do not reach the other (a view as self's own dtype is self.detach(), which shares them). A bool reads a byte as
  x != 0 (torch keeps the byte: a byte of 2 viewed as bool and back is 1 here, 2 there)."""
  d, s = _view_dtype_arg(dtype), self.dtype
  if d is s: return self.detach()
  _tm._check_device_dtype(self.device, d)
  if d.itemsize == s.itemsize: return Tensor(_node=gn.bitcast(self.node, d))
  what = f"to view {dt.scalar_name(s)} as {dt.scalar_name(d)} (different element sizes)"
  if self.ndim == 0: raise RuntimeError(f"self.dim() cannot be 0 {what}")
  strides, offset = _alias.layout(self)
  lead, n, dev = self.shape[:-1], self.shape[-1], self.device
  if s.itemsize > d.itemsize:
    if strides[-1] != 1: raise RuntimeError(f"self.stride(-1) must be 1 {what}, but got {strides[-1]}")
    r = s.itemsize // d.itemsize
    shape = lead + (n * r,)
    if self.numel() == 0: return Tensor(_node=gn.const(0, d, shape, dev))
    # [..., n] -> [..., n, r]: element j's bits >> 8 * itemsize * k, truncated to the small integer
    wide = lead + (n, r)
    b = gn.bitcast(self.node, _BITS[s.itemsize])
    b = gn.broadcast(gn.movement(b, "RESHAPE", lead + (n, 1)), wide)
    by = gn.alu("MUL", gn.iota(r, b.dtype, dev), gn.const(8 * d.itemsize, b.dtype, (r,), dev))
    parts = gn.cast(gn.alu("SHR", b, gn.broadcast(by, wide)), _BITS[d.itemsize])
    return Tensor(_node=gn.bitcast(gn.movement(parts, "RESHAPE", shape), d))
  r = d.itemsize // s.itemsize
  if n % r: raise RuntimeError(f"self.size(-1) must be divisible by {r} {what}, but got {n}")
  if offset % r: raise RuntimeError(f"self.storage_offset() must be divisible by {r} {what}, but got {offset}")
  if strides[-1] != 1: raise RuntimeError(f"self.stride(-1) must be 1 {what}, but got {strides[-1]}")
  for i, st in enumerate(strides[:-1]):
    if st % r: raise RuntimeError(f"self.stride({i}) must be divisible by {r} {what}, but got {st}")
  m, big = n // r, _BITS[d.itemsize]
  if self.numel() == 0: return Tensor(_node=gn.const(0, d, lead + (m,), dev))
  # [..., m, r] small integers, zero-extended: part k shifted left by 8 * itemsize * k, or-ed
  b = gn.cast(gn.bitcast(self.node, {1: dt.uint8, 2: dt.int16, 4: dt.uint32}[s.itemsize]), big)
  if s.itemsize == 2: b = gn.alu("AND", b, gn.const(0xFFFF, big, b.shape, dev))   # (no uint16: sign-extended)
  b = gn.movement(b, "RESHAPE", lead + (m, r))
  out = None
  for k in range(r):
    part = gn.movement(gn.movement(b, "SHRINK", tuple((0, x) for x in lead) + ((0, m), (k, k + 1))), "RESHAPE",
                       lead + (m,))
    if k: part = gn.alu("SHL", part, gn.const(8 * s.itemsize * k, big, part.shape, dev))
    out = part if out is None else gn.alu("OR", out, part)
  return Tensor(_node=gn.bitcast(out, d))


def _H(self):
  if self.ndim == 0: return self
  if self.ndim != 2:
    raise RuntimeError(f"tensor.H is only supported on matrices (2-D tensors). Got {self.ndim}-D tensor."
                       + (" For batches of matrices, consider using tensor.mH" if self.ndim > 2 else ""))
  return self.transpose(0, 1)


def _mH(self):
  if self.ndim == 0: return self
  if self.ndim < 2:
    raise RuntimeError(f"tensor.mH is only supported on matrices or batches of matrices. Got {self.ndim}-D tensor.")
  return self.transpose(-2, -1)


def adjoint(self):
  """The conjugate transpose of the last two dims (fusegrad's tensors are real: the transpose); 0-D: self."""
  if self.ndim == 0: return self
  if self.ndim < 2:
    raise RuntimeError(f"tensor.adjoint() is only supported on matrices or batches of matrices. Got {self.ndim}-D "
                       f"tensor.")
  return self.transpose(-2, -1)


# -- in place metadata: the tensor becomes a view of its own storage with the new shape

def _inplace_view(self, fn, name: str):
  """self becomes fn(self) (a view of self's storage: alias.py registers it), in place, as torch's t_() and kin: self
  joins its storage as a member whose chain ends with the new view op, the storage's base value kept (self stops
  being the base: the storage's value lives on as a base gone, alias.write's case), so views taken before and after
  share writes. Autograd: a non-leaf takes the view's recipe (autograd.rebind: recipes recorded before see a
  stand-in of its earlier state); a leaf that requires grad is refused under grad mode, as torch's in-place ops."""
  if self.requires_grad and self._ctx is None and autograd.grad_enabled():
    raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
  _trace.off(f"an in-place view op ({name})")   # the checked traces do not follow a tensor changing its shape
  new = fn(self)
  if new is self: return self
  _jit.note_rebind(self)
  a, na = self._alias, new._alias
  if na is None or type(na[1]) is not tuple or a is None or na[0] is not a[0]:   # no view was registered
    if new._ctx is None: self.node = new.node
    else:
      _alias.storage_of(self)
      autograd.rebind(self, new, next(autograd._seq))
    return self
  st = na[0]
  if st.ref() is self: st.node, st.ref = self.node, _alias._dead
  if new._ctx is not None:
    autograd.rebind(self, new, next(autograd._seq))
  else:
    self.node = new.node
  self._alias = (st, na[1], self._alias[2])
  if not any(w() is self for w in st.members): st.members.append(_weakref.ref(self))
  return self


def t_(self):
  if self.ndim > 2: raise RuntimeError(f"t_() expects a tensor with <= 2 dimensions, but self is {self.ndim}D")
  return _inplace_view(self, lambda x: x.t() if x.ndim == 2 else x, "t_")


def transpose_(self, dim0: int, dim1: int):
  if self.ndim: _norm_dim(dim0, self.ndim), _norm_dim(dim1, self.ndim)
  return _inplace_view(self, lambda x: x.transpose(dim0, dim1), "transpose_")


def swapaxes_(self, axis0: int, axis1: int): return transpose_(self, axis0, axis1)
def swapdims_(self, dim0: int, dim1: int): return transpose_(self, dim0, dim1)


def squeeze_(self, dim=None):
  if dim is not None and self.ndim: _norm_dims(dim, self.ndim)
  return _inplace_view(self, lambda x: x.squeeze(dim) if dim is not None else x.squeeze(), "squeeze_")


def unsqueeze_(self, dim: int):
  _norm_dim(dim, self.ndim + 1)
  return _inplace_view(self, lambda x: x.unsqueeze(dim), "unsqueeze_")


def detach_(self):
  """self leaves the autograd graph in place (requires_grad False, a leaf), keeping its value; recipes recorded
  before still see its earlier state (a stand-in, as autograd.rebind keeps). torch refuses views in the graph."""
  a = self._alias
  if self._ctx is not None and a is not None and type(a[1]) is tuple and any(op != "DETACH" for op, _ in a[1]):
    raise RuntimeError("Can't detach views in-place. Use detach() instead. If you are using DistributedDataParallel "
                       "(DDP) for training, and gradient_as_bucket_view is set as True, gradients are views of DDP "
                       "buckets, and hence detach_() cannot be called on these gradients. To fix this error, please "
                       "refer to the Optimizer.zero_grad() function in torch/optim/optimizer.py as the solution.")
  _trace.off("detach_")
  if self._ctx is not None:
    st = _alias.storage_of(self)
    a = self._alias
    old = Tensor(_node=self.node)
    old._ctx, old.requires_grad = self._ctx, self.requires_grad
    old._alias = (st, False, a[2])
    self._alias = (a[0], a[1], (next(autograd._seq), old))
  self._ctx, self.requires_grad = None, False
  return self


# -- in place fills

def fill_diagonal_(self, fill_value, wrap: bool = False):
  """The main diagonal (every dim's index equal) set to fill_value; a tall matrix with wrap=True starts again every
  ncols + 1 rows, as torch's. The positions are a constant mask: one where."""
  if self.ndim < 2: raise RuntimeError("dimensions must larger than 1")
  if self.ndim > 2 and len(set(self.shape)) != 1: raise RuntimeError("all dimensions of input must be of equal length")
  mask = np.zeros(self.numel(), dtype=bool)
  if self.ndim == 2:
    h, w = self.shape
    step = w + 1
    end = self.numel() if wrap else builtins.min(h, w) * w
    mask[0:end:step] = True
  else:
    n = self.shape[0]
    mask[0:self.numel():builtins.sum(n ** i for i in range(self.ndim))] = True
  m = Tensor(mask.reshape(self.shape), device=self.device)
  return self._assign(where(m, _tm.full(self.shape, fill_value, dtype=self.dtype, device=self.device), self))


def _rand_for(self, generator, shape=None, d=None):
  """Uniform [0, 1) values of self's shape, float64 for a float64 tensor, else float32."""
  d = d or (dt.float64 if self.dtype == dt.float64 else dt.float32)
  return _tm.rand(*(self.shape if shape is None else shape), generator=generator, dtype=d, device=self.device)


def _continuous(self, what: str) -> None:
  if not self.dtype.is_float:
    raise RuntimeError(f"{what} distribution is a continuous probability distribution. dtype must be a floating point "
                       f"but you specified {dt.scalar_name(self.dtype)}")


def bernoulli_(self, p=0.5, *, generator=None):
  """Each element 1 with probability p (a float, or a tensor broadcast to self's shape), else 0, in self's dtype."""
  if isinstance(p, Tensor):
    if not p.dtype.is_float:
      raise NotImplementedError(f"\"bernoulli_tensor_cpu_p_\" not implemented for '{dt.scalar_name(p.dtype)}'")
    p = p.detach()._broadcast_to(self.shape) if p.shape != self.shape else p.detach()
  elif not 0 <= p <= 1: raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={_g(p)}")
  u = _rand_for(self, generator, d=dt.float64 if isinstance(p, Tensor) and p.dtype == dt.float64 else None)
  return self._assign((u < p)._cast(self.dtype))


def bernoulli(self, p=None, *, generator=None):
  """Draws of 0/1 with the probabilities self (or p, a float, for every element), in self's dtype. Values outside
  [0, 1] are not checked (it would read them on the host): a negative one gives 0, one over 1 gives 1. No
  gradient flows (torch's is zero)."""
  if p is not None: return Tensor(_node=self.node).bernoulli_(p, generator=generator)
  if not self.dtype.is_float:
    raise NotImplementedError(f"\"bernoulli_tensor_cpu_p_\" not implemented for '{dt.scalar_name(self.dtype)}'")
  probs = Tensor(_node=self.node)
  return (_rand_for(probs, generator) < probs)._cast(self.dtype)


def exponential_(self, lambd: float = 1.0, *, generator=None):
  _continuous(self, "Exponential")
  if not lambd > 0: raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={_g(lambd)}")
  return self.copy_(-(1 - _rand_for(self, generator)).log() * (1.0 / lambd))


def geometric_(self, p: float, *, generator=None):
  """The number of Bernoulli(p) trials up to the first success (>= 1): floor(log(u) / log(1 - p)) + 1, u in (0, 1]."""
  if not 0 < p < 1: raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={_g(p)}")
  u = 1 - _rand_for(self, generator, d=dt.float64 if _f64_ok(self.device) else dt.float32)
  return self.copy_((u.log() * (1.0 / math.log1p(-p))).floor() + 1)


def cauchy_(self, median: float = 0.0, sigma: float = 1.0, *, generator=None):
  _continuous(self, "Cauchy")
  if not sigma > 0: raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={_g(sigma)}")
  return self.copy_(((_rand_for(self, generator) - 0.5) * math.pi).tan() * sigma + median)


def log_normal_(self, mean: float = 1.0, std: float = 2.0, *, generator=None):
  if not self.dtype.is_float:
    raise NotImplementedError(f"\"log_normal_cpu\" not implemented for '{dt.scalar_name(self.dtype)}'")
  if not std > 0: raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={_g(std)}")
  d = dt.float64 if self.dtype == dt.float64 else dt.float32
  z = _tm.randn(*self.shape, generator=generator, dtype=d, device=self.device)
  return self.copy_((z * std + mean).exp())


_C_NAMES = {"bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short", "int32": "int",
            "uint32": "unsigned int", "int64": "int64_t"}
_FLOAT_DIGITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


def random_(self, *args, generator=None, **kwargs):
  """random_() (integers in [0, 2**mantissa] for a float, the dtype's non-negative range for an integer),
  random_(to) and random_(from, to) (to excluded), in self's dtype, as torch's."""
  names = ("from", "to")
  if len(args) > 2: raise TypeError(f"random_() takes at most 2 positional arguments ({len(args)} given)")
  vals = dict(zip(("to",) if len(args) == 1 else names, args))
  for k, v in kwargs.items():
    if k not in names: raise TypeError(f"random_() got an unexpected keyword argument '{k}'")
    vals[k] = v
  lo, hi = int(vals.get("from", 0)), vals.get("to")
  d = self.dtype
  if hi is None:
    if d.is_bool: hi = 2
    elif d.is_float: hi = (1 << _FLOAT_DIGITS[d.name]) + 1
    else: hi = int(np.iinfo(d.np).max) + 1
  hi = int(hi)
  if lo >= hi: raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={lo} >= to={hi}")
  if not d.is_float:
    lim = (0, 1) if d.is_bool else (int(np.iinfo(d.np).min), int(np.iinfo(d.np).max))
    if not lim[0] <= lo <= lim[1]: raise RuntimeError(f"from is out of bounds for {_C_NAMES[d.name]}")
    if not lim[0] <= hi - 1 <= lim[1]: raise RuntimeError(f"to - 1 is out of bounds for {_C_NAMES[d.name]}")
  span = hi - lo
  if span < (1 << 31):
    v = _tm.randint(lo, hi, self.shape, generator=generator, device=self.device)
  else:   # 63 random bits (two draws), reduced to the span
    b = _tm._random_bits(2 * self.numel(), self.device, generator).reshape(2, self.numel())._cast(dt.int64)
    v = ((b[0] >> 1) << 32) | b[1]
    if span < (1 << 63): v = v % span
    v = (v + lo).reshape(self.shape)
  return self.copy_(v)


def _f64_ok(device) -> bool: return dt.float64 in _rd.get(device).supported


# -- samplers and constructors (module-level functions; fusegrad/__init__.py exports them)

def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None, requires_grad: bool = False):
  """torch.normal: normal(Tensor mean, Tensor std), normal(Tensor mean, float std=1), normal(float mean, Tensor std),
  normal(float mean, float std, size). The tensor forms broadcast mean and std; no gradient flows to them (torch's
  is zero)."""
  mt, sd = isinstance(mean, Tensor), isinstance(std, Tensor)
  if not isinstance(std, Tensor) and not std >= 0:
    raise RuntimeError(f"normal expects std >= 0.0, but found std {_g(std)}")
  if not mt and not sd:
    if size is None:
      raise TypeError(f"normal() received an invalid combination of arguments - got ({type(mean).__name__}, "
                      f"{type(std).__name__}), but expected one of: (Tensor mean, Tensor std), (Tensor mean, float "
                      f"std), (float mean, Tensor std), (float mean, float std, tuple of ints size)")
    out = _tm.randn(*(size if isinstance(size, (tuple, list)) else (size,)), generator=generator, dtype=dtype,
                    device=device) * std + mean
    return out.requires_grad_() if requires_grad else out
  ts = [t for t in (mean, std) if isinstance(t, Tensor)]
  for t in ts:
    if not t.dtype.is_float:
      raise NotImplementedError(f"\"normal_kernel_cpu\" not implemented for '{dt.scalar_name(t.dtype)}'")
  d = ts[0].dtype if len(ts) == 1 else dt.promote_types(ts[0].dtype, ts[1].dtype)
  shape = broadcast_shapes(*[t.shape for t in ts])
  m = mean.detach() if mt else mean
  s = std.detach() if sd else std
  z = _tm.randn(*shape, generator=generator, dtype=d, device=ts[0].device)
  return (z * s + m)._cast(d)


_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _lgamma1p(k):
  """lgamma(k + 1) for k >= 0: Stirling's series at k + 7 and the six factors below it taken off."""
  x = k + 1
  z = x + 6
  zi = 1 / z
  s = (z - 0.5) * z.log() - z + _LOG_SQRT_2PI + zi * (1 / 12 - zi * zi * (1 / 360 - zi * zi / 1260))
  for i in range(6): s = s - (x + i).log()
  return s


def poisson(input, generator=None):
  """Poisson draws with the rates input, as torch.poisson: rates below 10 by the inverse of the CDF (48 terms), the
  others by Hörmann's transformed rejection (PTRS, torch's and numpy's method) with 12 candidates per element
  (all lazy: one kernel, no value read on the host; the chance that every candidate is rejected is below 1e-11:
  then the last one is taken). Computed in float64 where the device has it. A negative rate gives NaN (torch
  raises, reading the values). No gradient (torch's is zero)."""
  if not isinstance(input, Tensor): raise TypeError(f"poisson(): argument 'input' must be Tensor, not {type(input).__name__}")
  if not input.dtype.is_float:
    raise NotImplementedError(f"\"poisson_cpu\" not implemented for '{dt.scalar_name(input.dtype)}'")
  w = dt.float64 if _f64_ok(input.device) else dt.float32
  lam = Tensor(_node=input.node)._cast(w)
  shape, dev = input.shape, input.device
  # small rates: X = #{j >= 0: u >= CDF(j)}
  small = lam < 10
  ls = where(small, lam, 0.0)
  u = _tm.rand(*shape, generator=generator, dtype=w, device=dev)
  p = (-ls).exp()
  c, ks = p, (u >= p)._cast(w)
  for j in range(1, 48):
    p = p * ls * (1.0 / j)
    c = c + p
    ks = ks + (u >= c)._cast(w)
  # large rates: PTRS, R candidates, the first accepted one
  R = 12
  ll = where(small, 10.0, lam)
  slam, loglam = ll.sqrt(), ll.log()
  b = 0.931 + 2.53 * slam
  a = -0.059 + 0.02483 * b
  log_invalpha = (1.1239 + 1.1328 / (b - 3.4)).log()
  vr = 0.9277 - 3.6224 / (b - 2)
  U = _tm.rand(R, *shape, generator=generator, dtype=w, device=dev) - 0.5
  V = _tm.rand(R, *shape, generator=generator, dtype=w, device=dev)
  kl = None
  for r in reversed(range(R)):
    Ur, Vr = U[r], V[r]
    us = 0.5 - Ur.abs()
    us_safe = where(us > 0, us, 1.0)
    k = ((2 * a / us_safe + b) * Ur + ll + 0.43).floor()
    k0 = where(k >= 0, k, 0.0)
    fast = (us >= 0.07) & (Vr <= vr)
    rej = (us <= 0) | (k < 0) | ((us < 0.013) & (Vr > us))
    slow = (Vr.log() + log_invalpha - (a / (us_safe * us_safe) + b).log()) <= (-ll + k0 * loglam - _lgamma1p(k0))
    acc = fast | (rej.logical_not() & slow)
    kl = k0 if kl is None else where(acc, k0, kl)
  out = where(small, ks, kl)
  out = where((lam >= 0).logical_not(), math.nan, out)
  return out._cast(input.dtype)


def initial_seed() -> int:
  """The seed of the global generator (fusegrad.manual_seed's, or fusegrad.seed's; 0 when never seeded)."""
  return _tm._RNG.seed


def get_rng_state() -> Tensor:
  """The global generator's state as a uint8 tensor of 16 bytes (its seed and its counter, little-endian);
  set_rng_state(state) restores it, so the draws after it repeat."""
  return Tensor(np.frombuffer(_struct.pack("<QQ", _tm._RNG.seed & 0xFFFFFFFFFFFFFFFF, _tm._RNG.counter), np.uint8).copy())


def set_rng_state(new_state) -> None:
  if not isinstance(new_state, Tensor):
    raise TypeError(f"set_rng_state(): argument 'new_state' must be Tensor, not {type(new_state).__name__}")
  if new_state.dtype != dt.uint8 or new_state.numel() != 16:
    raise RuntimeError(f"RNG state is wrong size or type: expected a uint8 tensor of 16 elements (get_rng_state()'s), "
                       f"got {dt.scalar_name(new_state.dtype)} of {new_state.numel()}")
  s, c = _struct.unpack("<QQ", new_state.numpy().astype(np.uint8).tobytes())
  def restore(): _tm._RNG.seed, _tm._RNG.counter = s, c
  _jit.host(restore)   # (inside a captured step, every replay restores it, as manual_seed seeds)


def _default_dtype_for(data, d):
  """Python floats (not a numpy scalar or array) take the default dtype, as torch's constructors give them."""
  if d is not None or isinstance(data, (np.ndarray, np.generic, Tensor)): return d
  try: arr = np.asarray(data)
  except Exception: return d
  return dt.default_float if arr.dtype.kind == "f" else d


def as_tensor(data, dtype=None, device=None) -> Tensor:
  """data as a tensor without a copy where it can: a fusegrad tensor of that dtype and device is returned itself (else
  converted, `.to`), a CPU-compatible numpy array is shared (from_numpy), other data is copied."""
  d = dt.to_dtype(dtype) if dtype is not None else None
  if isinstance(data, Tensor):
    out = data
    if device is not None and _rd.canonical(device) != out.device: out = out.to(_rd.canonical(device))
    return out if d is None or d == out.dtype else out.to(d)
  if isinstance(data, np.ndarray) and _rd.canonical(device) == "CPU" and data.dtype.kind in "biuf" and \
     data.dtype != np.uint16 and (d is None or (d != dt.bfloat16 and np.dtype(d.np) == data.dtype)):
    from fusegrad.compat import from_numpy
    return from_numpy(data)
  return Tensor(data, dtype=_default_dtype_for(data, d), device=device)


def asarray(obj, *, dtype=None, device=None, copy=None, requires_grad: bool = False) -> Tensor:
  """torch.asarray: as_tensor, or a copy when copy=True."""
  out = as_tensor(obj, dtype=dtype, device=device)
  if copy and (out is obj or isinstance(obj, np.ndarray)): out = out.clone()
  if requires_grad: out.requires_grad_()
  return out


def logspace(start, end, steps: int, base: float = 10.0, *, dtype=None, device=None, requires_grad: bool = False):
  """base ** linspace(start, end, steps): computed in float64 on the host, then cast (integers truncate)."""
  if isinstance(start, Tensor): start = start.item()
  if isinstance(end, Tensor): end = end.item()
  if isinstance(steps, Tensor): steps = steps.item()
  if steps < 0: raise RuntimeError("number of steps must be non-negative")
  d = dt.to_dtype(dtype) if dtype is not None else dt.default_float
  with np.errstate(all="ignore"):
    v = np.power(float(base), np.linspace(float(start), float(end), int(steps), dtype=np.float64))
  out = Tensor(v, dtype=d, device=device)
  return out.requires_grad_() if requires_grad else out


def set_default_dtype(d) -> None:
  """The dtype of factories' floats (zeros, rand, arange of floats, fusegrad.tensor of Python floats, ...) and of a
  Python float in a result type, as torch's."""
  d = dt.to_dtype(d)
  if not d.is_float: raise TypeError("only floating-point types are supported as the default type")
  dt.default_float = d


def get_default_dtype(): return dt.default_float


def scalar_tensor(s, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
  """A 0-d tensor of s, in the default float dtype unless dtype says otherwise (torch's: even for an int)."""
  if isinstance(s, Tensor): s = s.item()
  out = _tm.full((), s, dtype=dt.to_dtype(dtype) if dtype is not None else dt.default_float, device=device)
  return out.requires_grad_() if requires_grad else out


def empty_strided(size, stride, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
  """A tensor of size (zeros): fusegrad has one layout, so stride is checked for its length and otherwise ignored."""
  size, stride = tuple(size), tuple(stride)
  if len(size) != len(stride):
    raise RuntimeError(f"dimensionality of sizes ({len(size)}) must match dimensionality of strides ({len(stride)})")
  return _tm.empty(*size, dtype=dtype, device=device, requires_grad=requires_grad)


def clone(input, *, memory_format=None) -> Tensor: return input.clone(memory_format=memory_format)


for _f in (stride, storage_offset, is_contiguous, data_ptr, adjoint, t_, transpose_, swapaxes_, swapdims_, squeeze_,
           unsqueeze_, detach_, fill_diagonal_, bernoulli_, bernoulli, exponential_, geometric_, cauchy_, log_normal_,
           random_):
  if not hasattr(Tensor, _f.__name__): setattr(Tensor, _f.__name__, _f)
for _n, _p in (("H", property(_H)), ("mH", property(_mH)), ("itemsize", property(lambda self: self.dtype.itemsize)),
               ("nbytes", property(lambda self: self.numel() * self.dtype.itemsize))):
  if not hasattr(Tensor, _n): setattr(Tensor, _n, _p)
