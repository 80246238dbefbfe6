"""Math ops PyTorch offers beside the basic ones of tensor.py: inverse trig and hyperbolic functions, copysign,
logaddexp, hypot, closeness tests, cumulative max/min/logsumexp, norms, median/mode/unique, diagonals, tensordot.

Each is composed of Tensor ops (and the ATAN/ATAN2 primitives); where the composition's own gradient would be
wrong or unstable at an edge (asin at +-1, logaddexp of equal infinities), the forward runs under no_grad and a
rule of autograd.py (keyed by the op's name) gives PyTorch's derivative. They are attached to Tensor at the end,
as tensor.py attaches the sort family; fusegrad/__init__.py re-exports them as functions.
"""
from __future__ import annotations
import builtins
import functools
import math
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
  not_equal=Tensor.ne,
)
for _n, _f in METHODS.items(): setattr(Tensor, _n, _f)


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
