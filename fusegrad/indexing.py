"""Indexing and shape ops beyond basic slicing: scatter/index_* families, take, masks, roll, unfold, splits.

Every op with a static output shape is a composition of lazy graph ops, so it fuses and differentiates through
the existing rules: a scatter of `index` along dim d is a one-hot compare (index == arange(n)) reduced over the
index positions (sum, prod, max, min), then combined with self by a select. Its cost is numel(index) * n, which
is what the gather gradient already pays. Ops whose output shape depends on values (nonzero, masked_select,
repeat_interleave with tensor repeats) read those values on the host, as PyTorch does.
Attached to Tensor (and exported as fusegrad.<name>) at the bottom; tensor.py stays the home of the primitives.
"""
from __future__ import annotations
import builtins
import math
import numpy as np
from fusegrad import dtype as dt
from fusegrad.tensor import Tensor, arange, cat, where, broadcast_shapes, _norm_dim, _index_in_range, _unfold, _is_scalar

# ---- helpers -------------------------------------------------------------------------------------------------


def _known(t: Tensor) -> bool:
  """Values that exist already (checked and read on the host without running a graph)."""
  return t.node.realized or t.node.op in ("BUFFER", "CONST")


def _check_int_index(index, name: str, exc: type = RuntimeError, int64_only: bool = True) -> None:
  if not isinstance(index, Tensor):
    raise TypeError(f"{name}(): argument 'index' must be Tensor, not {type(index).__name__}")
  ok = index.dtype == dt.int64 if int64_only else index.dtype.is_int
  if not ok:
    raise exc(f"{name}(): Expected dtype int64 for index, got {index.dtype.name}")


def _ident(op: str, d) -> float | int | bool:
  """The identity element of a reduction in dtype d."""
  if op == "sum": return False if d.is_bool else 0
  if op == "prod": return True if d.is_bool else 1
  if d.is_float: return -math.inf if op == "amax" else math.inf
  if d.is_bool: return op == "amin"
  info = np.iinfo(d.np)
  return int(info.min) if op == "amax" else int(info.max)


def _reduce_hits(vals: Tensor, hit: Tensor, op: str, axis: int) -> Tensor:
  """Reduce vals over `axis` where hit, with op's identity elsewhere."""
  v = where(hit, vals, _ident(op, vals.dtype))._cast(vals.dtype)
  if op == "sum": return v.sum(axis) if not v.dtype.is_bool else v.any(axis)
  if op == "prod": return v.prod(axis)._cast(vals.dtype) if not v.dtype.is_bool else v.all(axis)
  return v.amax(axis) if op == "amax" else v.amin(axis)


def _scalar_like(self: Tensor, value) -> Tensor:
  if isinstance(value, Tensor):
    if value.ndim: raise RuntimeError(f"Expected a 0-dimensional value tensor, but got tensor with {value.ndim} dimension(s).")
    return value._cast(self.dtype)
  return self._operand(value, self.dtype)


# ---- scatter ---------------------------------------------------------------------------------------------------

_SCATTER_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _scatter(self: Tensor, dim: int, index: Tensor, src, reduce: str | None, include_self: bool, name: str) -> Tensor:
  """out = self with src's values reduced into the positions index names along dim (PyTorch's scatter family)."""
  d = _norm_dim(dim, self.ndim)
  _check_int_index(index, name, int64_only=False)
  if isinstance(src, Tensor):
    if src.dtype != self.dtype:
      raise RuntimeError(f"{name}(): Expected self.dtype to be equal to src.dtype (got {self.dtype.name} and "
                         f"{src.dtype.name})")
  elif _is_scalar(src): src = self._operand(src, self.dtype)
  else: raise TypeError(f"{name}(): argument 'src' must be Tensor or a number, not {type(src).__name__}")
  if index.numel() == 0: return self.clone()
  if index.ndim != builtins.max(self.ndim, 1) and not (self.ndim == 0 and index.ndim == 0):
    raise RuntimeError(f"Index tensor must have the same number of dimensions as self tensor (self {list(self.shape)}, "
                       f"index {list(index.shape)})")
  if src.ndim and src.ndim != index.ndim:
    raise RuntimeError(f"Index tensor must have the same number of dimensions as src tensor (src {list(src.shape)}, "
                       f"index {list(index.shape)})")
  if self.ndim == 0:   # one element: the 1-element case, reshaped back
    out = _scatter(self.reshape(1), 0, index.reshape(1), src.reshape(1) if src.ndim else src, reduce, include_self, name)
    return out.reshape(())
  for k, (a, s) in enumerate(zip(index.shape, self.shape)):
    if (src.ndim and a > src.shape[k]) or (k != d and a > s):
      raise RuntimeError(f"Expected index {list(index.shape)} to be smaller than self {list(self.shape)} apart from "
                         f"dimension {d} and to be smaller size than src {list(src.shape)}")
  n = self.shape[d]
  if _known(index): _index_in_range(index, n, RuntimeError, lambda v: f"index {v} is out of bounds for dimension {d} with size {n}")
  # [I..., n]: which of the n positions along dim each index entry names (out-of-range lazy indices name none)
  sub = src._shrink([(0, a) for a in index.shape]) if src.ndim else src._broadcast_to(index.shape)
  hit = index.movedim(d, -1).unsqueeze(-1) == arange(n, device=self.device)
  vals = sub.movedim(d, -1).unsqueeze(-1)
  op = {None: "sum", "add": "sum", "multiply": "prod", "mean": "sum"}.get(reduce, reduce)
  red = _reduce_hits(vals, hit, op, -2).movedim(-1, d)          # index's shape, n along d
  cnt = hit.sum(-2).movedim(-1, d)
  # index may cover fewer positions than self in the other dims: pad those with "no hit"
  pads = []
  for k in reversed(range(self.ndim)): pads += [0, 0 if k == d else self.shape[k] - index.shape[k]]
  if builtins.any(pads):
    red, cnt = red.pad(tuple(pads), value=_ident(op, red.dtype)), cnt.pad(tuple(pads))
  hitany = cnt > 0
  if reduce is None:
    return where(hitany, red, self)._cast(self.dtype)
  if reduce == "mean":
    total = red + self if include_self else red
    c = cnt + 1 if include_self else cnt
    m = total / c.clamp_min(1) if self.dtype.is_float else total.div(c.clamp_min(1), rounding_mode="floor")
    return where(hitany, m, self)._cast(self.dtype)
  if not include_self: return where(hitany, red, self)._cast(self.dtype)
  if op == "sum": return (self + red)._cast(self.dtype) if not self.dtype.is_bool else self | red
  if op == "prod": return (self * red)._cast(self.dtype) if not self.dtype.is_bool else self & red
  both = self.maximum(red) if op == "amax" else self.minimum(red)
  return where(hitany, both, self)._cast(self.dtype)


def scatter(self: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce: str | None = None) -> Tensor:
  if src is None: src = value
  if src is None: raise TypeError("scatter() missing 1 required positional argument: 'src' (or 'value')")
  if reduce not in (None, "add", "multiply"):
    raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce!r}")
  return _scatter(self, dim, index, src, reduce, True, "scatter")


def scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
  return _scatter(self, dim, index, src, "add", True, "scatter_add")


def scatter_reduce(self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *, include_self: bool = True) -> Tensor:
  reduce = {"max": "amax", "min": "amin"}.get(reduce, reduce)   # PyTorch takes these spellings too
  if reduce not in _SCATTER_REDUCES:
    raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
  return _scatter(self, dim, index, src, reduce, include_self, "scatter_reduce")


# ---- index_* along one dim -------------------------------------------------------------------------------------

def _index_hits(self: Tensor, dim: int, index: Tensor, name: str, source=None) -> tuple[int, Tensor]:
  """(dim, hit[L, n]) for a 1-D (or 0-d) index along dim; checks index and source shapes as PyTorch."""
  d = _norm_dim(dim, self.ndim)
  _check_int_index(index, name, IndexError, int64_only=False)
  if index.ndim > 1: raise IndexError(f"{name}(): Index is supposed to be a vector, got shape {list(index.shape)}")
  n = self.shape[d] if self.ndim else 1
  if _known(index):
    _index_in_range(index, n, IndexError, lambda v: f"{name}(): index {v} is out of bounds for dimension {d} with size {n}")
  idx = index.reshape(-1)
  if self.ndim == 0 and idx.shape[0] != 1:
    raise RuntimeError(f"{name}(): Index to scalar can have only 1 value, got {idx.shape[0]} value(s)")
  if source is not None:
    want = tuple(idx.shape[0] if k == d else s for k, s in enumerate(self.shape))
    if self.ndim == 0: want = () if source.ndim == 0 else (idx.shape[0],)
    if source.shape != want:
      raise RuntimeError(f"{name}(): source of shape {list(source.shape)} does not fit self {list(self.shape)} with "
                         f"{idx.shape[0]} indices along dim {d} (expected {list(want)})")
  return d, idx.reshape(-1, 1) == arange(n, device=self.device)


def _placed(self: Tensor, d: int, hit: Tensor, source: Tensor, op: str = "sum") -> tuple[Tensor, Tensor]:
  """source's slices summed onto the positions hit names along d; and which positions got one."""
  if self.ndim == 0: self, source = self.reshape(1), source.reshape(1)
  v = source.movedim(d, -1).unsqueeze(-1)                     # [..., L, 1]
  red = _reduce_hits(v, hit, op, -2).movedim(-1, d)
  return red, hit.any(0).reshape(*[-1 if k == d else 1 for k in range(self.ndim)])


def index_add(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
  d, hit = _index_hits(self, dim, index, "index_add", source)
  red, _ = _placed(self, d, hit, source)
  if alpha != 1: red = red * alpha
  return (self + red.reshape(self.shape))._cast(self.dtype)


def index_copy(self: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
  d, hit = _index_hits(self, dim, index, "index_copy", source)
  red, any_ = _placed(self, d, hit, source)
  return where(any_.reshape(any_.shape if self.ndim else ()), red.reshape(self.shape), self)._cast(self.dtype)


def index_fill(self: Tensor, dim: int, index: Tensor, value) -> Tensor:
  d, hit = _index_hits(self, dim, index, "index_fill")
  any_ = hit.any(0).reshape(*[-1 if k == d else 1 for k in range(self.ndim)]) if self.ndim else hit.any()
  return where(any_, _scalar_like(self, value), self)._cast(self.dtype)


def _flat_positions(self: Tensor, indices, name: str) -> tuple[Tensor, int]:
  """Integer (or bool) index tensors on self's leading dims -> (flat position into those dims, how many dims)."""
  if not isinstance(indices, (tuple, list)): raise TypeError(f"{name}(): argument 'indices' must be tuple of Tensors")
  idx = []
  for i in indices:
    if not isinstance(i, Tensor): raise TypeError(f"{name}(): indices must be Tensors, got {type(i).__name__}")
    if i.dtype.is_bool:     # a mask names its nonzero positions (a host read, as PyTorch)
      idx.extend(Tensor(c, device=self.device) for c in np.nonzero(i.numpy()))
    elif i.dtype.is_int: idx.append(i)
    else: raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors, got {i.dtype.name}")
  k = len(idx)
  if k > self.ndim: raise IndexError(f"too many indices for tensor of dimension {self.ndim} (got {k})")
  bshape = broadcast_shapes(*[t.shape for t in idx]) if idx else ()
  flat = None
  for j, t in enumerate(idx):
    n = self.shape[j]
    if _known(t):
      v = t.numpy()
      if v.size and (v.min() < -n or v.max() >= n):
        raise IndexError(f"index {int(v.max()) if v.max() >= n else int(v.min())} is out of bounds for dimension {j} "
                         f"with size {n}")
    t = t._cast(dt.int64)
    t = where(t < 0, t + n, t)
    flat = t if flat is None else flat * n + t
  return flat._broadcast_to(bshape), k


def index_put(self: Tensor, indices, values, accumulate: bool = False) -> Tensor:
  if not indices: return self.clone()
  flat, k = _flat_positions(self, indices, "index_put")
  P, rest = math.prod(self.shape[:k]), self.shape[k:]
  vals = values if isinstance(values, Tensor) else self._operand(values, self.dtype)
  if vals.dtype != self.dtype and isinstance(values, Tensor):
    raise RuntimeError(f"Index put requires the source and destination dtypes match, got {self.dtype.name} for the "
                       f"destination and {vals.dtype.name} for the source.")
  if len(vals.shape) > len(flat.shape + rest) or broadcast_shapes(vals.shape, flat.shape + rest) != flat.shape + rest:
    raise RuntimeError(f"shape mismatch: value tensor of shape {list(vals.shape)} cannot be broadcast to indexing "
                       f"result of shape {list(flat.shape + rest)}")
  vals = vals._broadcast_to(flat.shape + rest)
  hit = every_hit = flat.reshape(-1, 1) == arange(P, device=self.device)     # [M, P]
  if not accumulate and flat.numel() > 1:
    # a position written twice keeps the last value written (PyTorch's CPU order), not their sum
    later = hit._cast(dt.int32).flip(0).cumsum(0).flip(0) - hit._cast(dt.int32)
    hit = hit & (later == 0)
  v = vals.reshape(-1, 1, *rest)                                            # [M, 1, *rest]
  h = hit.reshape(*hit.shape, *(1,) * len(rest))
  red = _reduce_hits(v, h, "sum", 0).reshape(self.shape)
  if not accumulate and flat.numel() > 1 and vals.requires_grad:
    # PyTorch's derivative gives every value the gradient at its target, also a value a later one overwrote
    every = _reduce_hits(v, every_hit.reshape(h.shape), "sum", 0).reshape(self.shape)
    red = every + (red - every).detach()
  if accumulate: return (self + red)._cast(self.dtype) if not self.dtype.is_bool else self | red
  got = hit.any(0).reshape(*self.shape[:k], *(1,) * len(rest))
  return where(got, red, self)._cast(self.dtype)


def _index_put_(self: Tensor, indices, values, accumulate: bool = False) -> Tensor:
  return self._inplace(index_put(self, indices, values, accumulate))


def take(self: Tensor, index: Tensor) -> Tensor:
  if not isinstance(index, Tensor): raise TypeError(f"take(): argument 'index' must be Tensor, not {type(index).__name__}")
  if index.dtype != dt.int64: raise RuntimeError(f"take(): Expected a long tensor for index, but got {index.dtype.name}")
  n = self.numel()
  if _known(index) and index.numel():
    v = index.numpy()
    if v.min() < -n or v.max() >= n:
      raise IndexError(f"out of range: tried to access index {int(v.max()) if v.max() >= n else int(v.min())} on a "
                       f"tensor of {n} elements.")
  if index.numel() == 0: return self.reshape(-1)[:0].reshape(index.shape)
  return self.reshape(-1)[index]


def take_along_dim(self: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
  _check_int_index(indices, "take_along_dim", int64_only=True)
  if dim is None: return self.reshape(-1).gather(0, indices.reshape(-1))
  d = _norm_dim(dim, self.ndim)
  if indices.ndim != self.ndim:
    raise RuntimeError(f"torch.take_along_dim(): input and indices should have the same number of dimensions, but got "
                       f"{self.ndim} dimensions for input, and {indices.ndim} dimensions for indices")
  sx, si = list(self.shape), list(indices.shape)
  sx[d] = si[d] = 1
  b = broadcast_shapes(tuple(sx), tuple(si))
  x = self.expand(*[self.shape[k] if k == d else b[k] for k in range(self.ndim)])
  i = indices.expand(*[indices.shape[k] if k == d else b[k] for k in range(self.ndim)])
  return x.gather(d, i)


# ---- masks -------------------------------------------------------------------------------------------------------

def _check_mask(mask, name: str) -> None:
  if not isinstance(mask, Tensor): raise TypeError(f"{name}(): argument 'mask' must be Tensor, not {type(mask).__name__}")
  if not mask.dtype.is_bool: raise RuntimeError(f"{name}: expected BoolTensor for mask, got {mask.dtype.name}")


def masked_select(self: Tensor, mask: Tensor) -> Tensor:
  """The elements where mask (broadcast with self) is True, as a 1-D tensor; reads the mask on the host."""
  _check_mask(mask, "masked_select")
  shape = broadcast_shapes(self.shape, mask.shape)
  pos = np.flatnonzero(mask._broadcast_to(shape).numpy())
  return self._broadcast_to(shape).reshape(-1)[Tensor(pos.astype(np.int64), device=self.device)]


def masked_scatter(self: Tensor, mask: Tensor, source: Tensor) -> Tensor:
  """self with the True positions of mask (in row-major order) taking source's leading values: a running count
  of the mask gives each position its source element (lazy, one gather)."""
  _check_mask(mask, "masked_scatter")
  if not isinstance(source, Tensor): raise TypeError(f"masked_scatter(): argument 'source' must be Tensor")
  if source.dtype != self.dtype:
    raise RuntimeError(f"masked_scatter: expected self and source to have same dtypes but got {self.dtype.name} and "
                       f"{source.dtype.name}")
  broadcast_shapes(self.shape, mask.shape)
  m = mask._broadcast_to(self.shape).reshape(-1)
  if _known(mask) and int(m.numpy().sum()) > source.numel():
    raise RuntimeError(f"masked_scatter: expected source to have at least as many elements as the ones in mask "
                       f"({int(m.numpy().sum())}), got {source.numel()}")
  if self.numel() == 0: return self.clone()
  if source.numel() == 0: return where(m, 0, self.reshape(-1))._cast(self.dtype).reshape(self.shape)
  pos = (m.cumsum(0) - 1).clamp(0, source.numel() - 1)
  picked = source.reshape(-1)[pos]
  return where(m, picked, self.reshape(-1))._cast(self.dtype).reshape(self.shape)


def nonzero(self: Tensor, *, as_tuple: bool = False):
  v = self.numpy()
  if as_tuple:
    if v.ndim == 0: return (Tensor(np.flatnonzero(v.reshape(1)).astype(np.int64), device=self.device),)
    return tuple(Tensor(c.astype(np.int64), device=self.device) for c in np.nonzero(v))
  return Tensor(np.argwhere(v).astype(np.int64), device=self.device)


def argwhere(self: Tensor) -> Tensor: return nonzero(self)


# ---- repeats, rolls, windows, splits -----------------------------------------------------------------------------

def repeat_interleave(self: Tensor, repeats=None, dim: int | None = None, *, output_size: int | None = None) -> Tensor:
  if repeats is None:   # torch.repeat_interleave(repeats): each index i, repeats[i] times
    if self.ndim > 1: raise RuntimeError(f"repeat_interleave: repeats must be 0-dim or 1-dim tensor, got {self.ndim}-D")
    return repeat_interleave(arange(self.numel(), device=self.device), self.reshape(-1), 0)
  x = self.reshape(-1) if dim is None else self
  d = 0 if dim is None else _norm_dim(dim, self.ndim)
  if x.ndim == 0: x = x.reshape(1)
  if isinstance(repeats, Tensor) and repeats.ndim == 0: repeats = int(repeats.item())
  if isinstance(repeats, (int, np.integer)) and not isinstance(repeats, bool):
    r = int(repeats)
    if r < 0: raise RuntimeError(f"repeat_interleave: repeats can not be negative, got {r}")
    shp = x.shape
    y = x.unsqueeze(d + 1).expand(*shp[:d + 1], r, *shp[d + 1:])
    return y.reshape(*shp[:d], shp[d] * r, *shp[d + 1:])
  if not isinstance(repeats, Tensor): raise TypeError(f"repeat_interleave(): repeats must be an int or a Tensor")
  if repeats.dtype.is_float or repeats.dtype.is_bool:
    raise RuntimeError(f"repeat_interleave: repeats has to be Long or Int tensor, got {repeats.dtype.name}")
  if repeats.ndim != 1: raise RuntimeError(f"repeat_interleave: repeats must be 0-dim or 1-dim tensor, got {list(repeats.shape)}")
  rv = repeats.numpy().astype(np.int64)
  if rv.shape[0] != x.shape[d]:
    raise RuntimeError(f"repeat_interleave: repeats must have the same size as input along dim, but got "
                       f"repeats.size(0) = {rv.shape[0]} and input.size({d}) = {x.shape[d]}")
  if rv.size and rv.min() < 0: raise RuntimeError("repeat_interleave: repeats can not be negative")
  idx = np.repeat(np.arange(rv.shape[0]), rv).astype(np.int64)
  return x.index_select(d, Tensor(idx, device=self.device))


def roll(self: Tensor, shifts, dims=None) -> Tensor:
  shifts = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
  if dims is None:
    if len(shifts) != 1: raise RuntimeError(f"roll: shifts and dimensions must align. shifts: {len(shifts)}, dims: 0")
    return roll(self.reshape(-1), shifts, 0).reshape(self.shape)
  dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
  if len(shifts) != len(dims) or not dims:
    raise RuntimeError(f"roll: shifts and dimensions must align. shifts: {len(shifts)}, dims: {len(dims)}")
  x = self if self.ndim else self.reshape(1)
  for s, dim in zip(shifts, dims):
    d = _norm_dim(dim, self.ndim)
    n = x.shape[d]
    if n == 0: continue
    s = int(s) % n
    if s == 0: continue
    x = cat([x.narrow(d, n - s, s), x.narrow(d, 0, n - s)], d)
  return x.reshape(self.shape) if x is not self else self.clone()


def unfold(self: Tensor, dimension: int, size: int, step: int) -> Tensor:
  """Windows of `size` every `step` along dimension, as a new last dim (a strided view: no copy)."""
  d = _norm_dim(dimension, self.ndim)
  n = self.shape[d] if self.ndim else 1
  if size < 0: raise RuntimeError(f"size is {size} but must be >= 0")
  if size > n: raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
  if step <= 0: raise RuntimeError(f"step is {step} but must be > 0")
  if self.ndim == 0: return self.reshape(1)
  if size == 0:   # n // step + 1 empty windows
    return self.new_zeros(*[n // step + 1 if i == d else v for i, v in enumerate(self.shape)], 0)
  w = _unfold(self.movedim(d, -1), (size,), (step,), (1,))      # [..., out, size]
  return w.movedim(-2, d)


def tensor_split(self: Tensor, indices_or_sections, dim: int = 0):
  d = _norm_dim(dim, self.ndim)
  if self.ndim == 0: raise RuntimeError("tensor_split expected at least a 1-dimensional tensor, but got a tensor with 0 dims")
  n = self.shape[d]
  ios = indices_or_sections
  if isinstance(ios, Tensor):
    if ios.dtype.is_float or ios.dtype.is_bool:
      raise RuntimeError(f"tensor_split expected tensor_indices_or_sections to have integer dtype, but got {ios.dtype.name}")
    if ios.ndim > 1: raise RuntimeError(f"tensor_split expected tensor_indices_or_sections to be a zero-dimensional or "
                                        f"one-dimensional tensor, but got a tensor with {ios.ndim} dims")
    ios = int(ios.item()) if ios.ndim == 0 else [int(v) for v in ios.numpy()]
  if isinstance(ios, (int, np.integer)):
    k = int(ios)
    if k <= 0: raise RuntimeError(f"number of sections must be larger than 0, got {k}")
    q, r = divmod(n, k)
    sizes = [q + 1] * r + [q] * (k - r)
    bounds, s = [], 0
    for z in sizes:
      bounds.append((s, s + z)); s += z
  else:
    cuts = [builtins.min(builtins.max(int(i) + (n if i < 0 else 0), 0), n) for i in ios]
    edges = [0] + cuts + [n]
    bounds = [(a, builtins.max(a, b)) for a, b in zip(edges[:-1], edges[1:])]
  return tuple(self.narrow(d, a, b - a) for a, b in bounds)


# ---- registration ------------------------------------------------------------------------------------------------

_METHODS = dict(scatter=scatter, scatter_add=scatter_add, scatter_reduce=scatter_reduce, index_add=index_add,
                index_copy=index_copy, index_fill=index_fill, index_put=index_put, index_put_=_index_put_, take=take,
                take_along_dim=take_along_dim, masked_select=masked_select, masked_scatter=masked_scatter,
                nonzero=nonzero, argwhere=argwhere, repeat_interleave=repeat_interleave, roll=roll, unfold=unfold,
                tensor_split=tensor_split)
for _n, _f in _METHODS.items(): setattr(Tensor, _n, _f)
for _n in ("scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_fill", "index_put"):
  # the in-place forms rebind self to the out-of-place result (alias.py carries it to views)
  setattr(Tensor, _n + "_", (lambda f: lambda self, *a, **k: self._inplace(f(self, *a, **k)))(getattr(Tensor, _n)))
del _n, _f

def gather(input: Tensor, dim: int, index: Tensor) -> Tensor: return input.gather(dim, index)
def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor: return input.index_select(dim, index)
def masked_fill(input: Tensor, mask: Tensor, value) -> Tensor: return input.masked_fill(mask, value)


__all__ = ["gather", "index_select", "masked_fill", "scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_fill", "index_put", "take",
           "take_along_dim", "masked_select", "masked_scatter", "nonzero", "argwhere", "repeat_interleave", "roll",
           "tensor_split"]
