"""Graph nodes: immutable, hash-consed records of one op on its sources.

The same op on the same sources with the same argument is the same Node object, so common
subexpressions are shared before any kernel exists. Constructors here check nothing the user
controls (the frontend did that) but do the local rewrites that keep the graph small: views
compose, views that change nothing vanish, constants fold.

A node that has been computed keeps its result in `buffer` and forgets its sources, so the
graph behind a realized tensor can be freed.
"""
from __future__ import annotations
import functools
import itertools
import math
import weakref
import numpy as np
from fusegrad import dtype as dt
from fusegrad.graph import ops, dims
from fusegrad.graph.view import View, prod


_seq = itertools.count()


def _gc_untracker():
  """CPython's PyObject_GC_UnTrack, or None where there is no such call (another Python).

  The garbage collector need not see nodes: a node refers only to older nodes (src), its buffer and plain values
  (dtype, shape, view, constant), so no reference cycle can pass through one, and reference counting frees every
  node. Left tracked, the thousands of nodes a training step makes while it runs are scanned by each young
  collection and, living for the step, promoted to the oldest generation, whose full collections (which scan every
  object of the process: torch's, numpy's, the user's) they set off: a small GPT's eager step spent a third of its
  time there. Untracked, a node costs the collector nothing; its tuple of sources is untracked with it (the
  collector keeps any tuple that holds instances of a class tracked, whether they are or not)."""
  try:
    import ctypes
    f = ctypes.pythonapi.PyObject_GC_UnTrack
    f.argtypes, f.restype = [ctypes.py_object], None
    return f
  except (ImportError, AttributeError, OSError):
    return None


_untrack = _gc_untracker()


class Node:
  # seq: creation order; a node's sources are always older, so sorting by seq is a topological order (the
  # scheduler's structural key walks graphs in it)
  # skey: the scheduler's structural key of this node alone (schedule._structure fills it on first use)
  __slots__ = ("op", "dtype", "src", "arg", "shape", "device", "buffer", "seq", "skey", "__weakref__")

  def __init__(self, op, dtype, src, arg, shape, device):
    self.op, self.dtype, self.src, self.arg, self.shape, self.device = op, dtype, src, arg, shape, device
    self.buffer = self.skey = None
    self.seq = next(_seq)
    if _untrack is not None:
      _untrack(self)
      if src: _untrack(src)   # (the collector keeps a tuple holding objects of a class tracked, untracked or not)

  @property
  def realized(self) -> bool: return self.buffer is not None
  @property
  def numel(self) -> int: return prod(self.shape)

  def __repr__(self):
    return f"<Node {self.op} {self.dtype.name}{list(self.shape)} {self.device}{' realized' if self.realized else ''}>"

  def toposort(self) -> list["Node"]:
    """Unrealized nodes reachable from here, sources first."""
    out, seen, stack = [], set(), [(self, False)]
    while stack:
      n, done = stack.pop()
      if done: out.append(n); continue
      if id(n) in seen: continue
      seen.add(id(n))
      stack.append((n, True))
      if not n.realized:
        for s in n.src: stack.append((s, False))
    return out


# key -> weak reference to the node. A plain dict of weakref.ref (C calls only) rather than a WeakValueDictionary,
# whose Python-level get/set cost more than the rest of building a node; dead entries are swept when the dict has
# doubled since the last sweep. An entry whose node died or was realized is a miss, as is one lost to a sweep
# racing another thread's insert (two equal nodes then: common subexpressions are shared a little less, values
# are the same).
_cache: "dict[tuple, weakref.ref]" = {}
_sweep_at = [1 << 14]

# one shared copy of each shape and view (as a plain tuple) that keys hold. The collector stops tracking a tuple of
# untracked values when a young collection sees it, but a key made of fresh tuples is seen before them (the collector
# moves objects that only young ones refer to behind those that refer to them), so it stays tracked and is promoted
# with the step's graph; keys that hold old, shared tuples are untracked at their first collection
_plain: dict = {}
PLAIN_MAX = 1 << 16


def plain(t: tuple) -> tuple:
  """t's shared copy (the first equal tuple seen)."""
  p = _plain.get(t)
  if p is None:
    if len(_plain) > PLAIN_MAX: _plain.clear()
    p = _plain[t] = t
  return p


def make(op, dtype, src, arg, shape, device) -> Node:
  a = arg
  if op == "CONST":   # 1 and True, 0.0 and -0.0 are equal keys but different constants
    a = (type(arg), arg) if arg or type(arg) is not float else (float, arg, math.copysign(1.0, arg))
  elif type(arg) is float and arg != arg: a = ("nan",)
  elif op == "VIEW": a = tuple(arg)
  # plain values only (the dtype by name, a view as a shared plain tuple): such a tuple leaves the garbage
  # collector's tracking at its first young collection instead of being promoted with the graph it keys and scanned
  # in every full collection (a training step makes thousands of nodes that live for the step)
  if dims.bound_any[0]:   # (not shared: a runtime size equals a plain int, yet is not one; graph/dims.py)
    shape = tuple(shape)
    key = (op, dtype.name, a, shape, device, dims.tags(shape), *map(id, src))
  else:
    shape = plain(tuple(shape))
    if op == "VIEW": a = plain(a)
    key = (op, dtype.name, a, shape, device, *map(id, src))   # one flat tuple: one object for the collector to track
  r = _cache.get(key)
  if r is not None:
    n = r()
    if n is not None and n.buffer is None: return n
  n = Node(op, dtype, tuple(src), arg, shape, device)
  _cache[key] = weakref.ref(n)   # (left tracked: untracking it too measured no faster)
  if len(_cache) > _sweep_at[0]: _sweep()
  return n


def _sweep() -> None:
  global _cache
  # a copy first: copying runs no Python code, so no other thread's make() can add to the dict while it is read (a
  # garbage collection set off by building the item list could: "dictionary changed size during iteration")
  live = {k: r for k, r in _cache.copy().items() if (n := r()) is not None and n.buffer is None}
  _cache = live
  _sweep_at[0] = max(1 << 14, 2 * len(live))


def forget(n: Node) -> None:
  """Drop a realized node's sources and its hash-cons entry (its buffer now stands for it)."""
  n.src = ()


# ---- leaves -------------------------------------------------------------------------------------------

def buffer_node(buf, dtype, shape, device) -> Node:
  n = Node("BUFFER", dtype, (), None, tuple(shape), device)
  n.buffer = buf
  return n


def cast_scalar(v, d: dt.DType):
  """A Python scalar converted exactly as a store of dtype d would convert it."""
  t = type(v)
  if t in (int, bool) or (t is float and v != 0.0 and v == v):   # cached; not +-0.0 (equal keys) nor NaN
    return _cast_scalar_cached(t, v, d)
  return _cast_scalar(v, d)


@functools.lru_cache(maxsize=4096)
def _cast_scalar_cached(_type, v, d: dt.DType): return _cast_scalar(v, d)


def _cast_scalar(v, d: dt.DType):
  if d.is_bool: return bool(v)
  if d.is_int:
    if isinstance(v, float):
      if math.isnan(v) or math.isinf(v): return 0
      v = int(v)
    return int(np.array(v).astype(np.int64).astype(d.np)) if d != dt.int64 else int(np.int64(v))
  v = float(v)
  if d == dt.float64: return v
  # through float32 first, as PyTorch converts a double to float16/bfloat16 (the rare double rounding included)
  f = np.array(v, dtype=np.float64).astype(np.float32)
  if d == dt.float16: return float(f.astype(np.float16))
  if d == dt.bfloat16:
    from fusegrad.runtime.python import bf16_round_trip
    return float(bf16_round_trip(f))
  return float(f)


def const(value, dtype: dt.DType, shape=(), device="CPU") -> Node:
  return make("CONST", dtype, (), cast_scalar(value, dtype), tuple(shape), device)


def iota(n: int, dtype: dt.DType, device: str) -> Node:
  """0, 1, …, n-1 computed inside the kernel from the index (no buffer)."""
  return make("IOTA", dtype, (), None, (n,), device)


def is_const(n: Node) -> bool: return n.op == "CONST"


# ---- elementwise ----------------------------------------------------------------------------------------

def alu(op: str, *src: Node) -> Node:
  info = ops.ALU[op]
  if op == "WHERE": d = src[1].dtype
  elif info.bool_result: d = dt.bool_
  else: d = src[0].dtype
  if all(is_const(s) for s in src):  # constant folding
    with np.errstate(all="ignore"):
      # in the kernels' register types (16-bit floats compute in float32); const() rounds the result
      vals = [np.array(s.arg, dtype=s.dtype.np if s.dtype not in (dt.float16, dt.bfloat16) else np.float32) for s in src]
      v = info.ref(*vals)
    return const(v.item(), d, src[0].shape, src[0].device)
  s0 = src[0]
  # x + 0 is x only for -0.0 where floats have signed zeros (-0.0 + 0.0 = +0.0), x - 0 only for +0.0
  if op in ("ADD", "SUB") and is_const(src[1]) and src[1].arg == 0 and not d.is_bool and \
     (not d.is_float or (math.copysign(1.0, src[1].arg) < 0) == (op == "ADD")): return s0
  if op == "MUL" and is_const(src[1]) and src[1].arg == 1: return s0
  if op == "DIV" and is_const(src[1]) and src[1].arg == 1: return s0
  if op == "WHERE" and is_const(s0): return src[1] if s0.arg else src[2]
  return make(op, d, src, None, dims.merge(src) if dims.bound_any[0] else s0.shape, s0.device)


def cast(src: Node, dtype: dt.DType) -> Node:
  if src.dtype == dtype: return src
  if is_const(src): return const(src.arg, dtype, src.shape, src.device)
  return make("CAST", dtype, (src,), None, src.shape, src.device)


def bitcast(src: Node, dtype: dt.DType) -> Node:
  """src's bits read as dtype, of the same itemsize (PyTorch's view(dtype); a bool reads a byte as x != 0)."""
  if dtype.itemsize != src.dtype.itemsize:
    raise ValueError(f"bitcast {src.dtype.name} -> {dtype.name}: itemsizes differ (the frontend splits such a view)")
  if src.dtype == dtype: return src
  below = src.src   # (read before `realized`, as _base_view: a realized node has dropped its sources)
  if src.op == "BITCAST" and below and not src.realized and not src.dtype.is_bool:   # (through a bool: x != 0)
    return bitcast(below[0], dtype)
  if is_const(src):
    v = _const_bits(src.arg, src.dtype, dtype)
    # (a float NaN is no constant: a literal keeps no payload, a BITCAST of the integer one renders it exactly)
    if not (dtype.is_float and math.isnan(v)): return const(v, dtype, src.shape, src.device)
  return make("BITCAST", dtype, (src,), None, src.shape, src.device)


def _const_bits(v, src: dt.DType, d: dt.DType):
  """The constant v of dtype src, its bits read as d (a Python scalar)."""
  from fusegrad.runtime.python import bitcast_values
  return bitcast_values(np.array(v, dtype=np.float32 if src.name in ("float16", "bfloat16") else src.np), src, d).item()


# ---- reductions -------------------------------------------------------------------------------------------

def reduce_identity(op: str, d: dt.DType):
  ident = ops.REDUCE[op][0]
  if ident == "min": return d.min
  if ident == "max": return d.max
  return ident


def reduce(src: Node, op: str, axes: tuple) -> Node:
  """Reduce over axes, keeping them as size-1 dims."""
  axes = tuple(sorted(a for a in axes if src.shape[a] != 1 or dims.is_bound(src.shape[a])))   # (dims.py: still reduces)
  shape = tuple(1 if i in axes else s for i, s in enumerate(src.shape))
  if not axes: return src
  if prod(src.shape) == 0:
    return const(reduce_identity(op, src.dtype), src.dtype, shape, src.device)
  if is_const(src):
    n = prod(src.shape[a] for a in axes)
    if op == "SUM" and not src.dtype.is_bool: return const(src.arg * n, src.dtype, shape, src.device)
    if op in ("MAX", "MIN"): return const(src.arg, src.dtype, shape, src.device)
  return make("REDUCE", src.dtype, (src,), (op, axes), shape, src.device)


# ---- movement: compose into one View where possible ------------------------------------------------------

def _base_view(n: Node) -> tuple[Node, View]:
  src = n.src   # read before `realized`: realize (maybe on another thread) sets the buffer, then drops src
  if n.op == "VIEW" and src and not n.realized: return src[0], n.arg   # a realized view is a buffer now
  return n, View.contiguous(n.shape)


def _with_view(base: Node, v: View) -> Node:
  if v.shape == base.shape and v.is_contiguous and dims.tags(v.shape) == dims.tags(base.shape): return base
  if is_const(base) and v.mask is None: return const(base.arg, base.dtype, v.shape, base.device)
  return make("VIEW", base.dtype, (base,), v, v.shape, base.device)


def movement(n: Node, op: str, arg) -> Node:
  base, v = _base_view(n)
  if op == "RESHAPE":
    if tuple(arg) == n.shape: return n
    nv = v.reshape(arg)
    if nv is None: return _with_view(n, View.contiguous(n.shape).reshape(arg))
    return _with_view(base, nv)
  nv = {"PERMUTE": v.permute, "EXPAND": v.expand, "PAD": v.pad, "SHRINK": v.shrink,
        "FLIP": v.flip, "STRIDE": v.stride}[op](arg)
  return _with_view(base, nv)


def broadcast(n: Node, shape: tuple) -> Node:
  """n broadcast to shape (leading dims added, size-1 dims expanded): one view node, as a reshape then an expand
  would make, without the intermediate one."""
  if shape == n.shape: return n
  if len(shape) == len(n.shape): return movement(n, "EXPAND", shape)
  base, v = _base_view(n)
  lead = (1,) * (len(shape) - len(n.shape)) + n.shape
  nv = v.reshape(lead)
  if nv is None: return movement(movement(n, "RESHAPE", lead), "EXPAND", shape)
  return _with_view(base, nv.expand(shape))


def gather(data: Node, pos: Node) -> Node:
  """out[i] = data (its buffer, in its storage layout: graph/dims.py) at position pos[i]; 0 where pos is out of
  range."""
  return make("GATHER", data.dtype, (data, pos), None, pos.shape, data.device)


# ---- boundaries -----------------------------------------------------------------------------------------------

def contiguous(src: Node) -> Node:
  if src.realized or src.op == "BUFFER": return src
  return make("CONTIGUOUS", src.dtype, (src,), None, src.shape, src.device)


def copy_to(src: Node, device: str) -> Node:
  if src.device == device: return src
  return make("COPY", src.dtype, (src,), device, src.shape, device)
