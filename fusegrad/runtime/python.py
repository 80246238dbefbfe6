"""The PYTHON device: a numpy interpreter of the linearized kernel IR, the oracle for fuzzing.

It runs the very listing the C and OpenCL renderers print, vectorized over all work items at once
(each value is an array over the flat parallel index) with Python loops for the sequential ones.
It shares their semantics: 16-bit floats compute in float32, integer division by zero gives 0. It also runs a
tensor core's warp-level matrix multiply-accumulate (ir.Mma) exactly, for any entry of codegen/opt/tc.py's table the
device is told to emulate (PythonDevice.emulate): the tests of the TC action need no GPU.
"""
from __future__ import annotations
import contextlib
import functools
from dataclasses import replace
import numpy as np
from fusegrad import dtype as dt
from fusegrad.graph import ops, symbolic as sym
from fusegrad.graph.node import reduce_identity
from fusegrad.runtime.device import Device
from fusegrad.codegen.ir import (tree_top, Stage, LocalLoad, Gather, GroupReduce, Load, Const, Param, Index, Valid, Alu,
                                 Vectorize, Gep, VecDType, Mma, scalar_of)
from fusegrad.codegen.linearize import Loop, End, Let, Acc, Update, StoreSt, Fetch, Refill, PrefetchSt
from fusegrad.codegen.renderer.base import Caps
from fusegrad.codegen import passes


def _reg(d: dt.DType):
  return np.float32 if d in (dt.float16, dt.bfloat16) else d.np


def _bf16_round(x):
  u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
  r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)
  nan = np.isnan(np.asarray(x, dtype=np.float32))
  # a NaN keeps its upper bits where they are one (a payload survives, a bitcast's signalling NaN stays one: the
  # renderers' fg_f32_to_bf16), else the quiet bit keeps it a NaN
  r = np.where(nan, (u >> 16).astype(np.uint32) | np.where(u & 0x7F0000, 0, 0x40).astype(np.uint32), r)
  return r.astype(np.uint16)


def _bf16_to_f32(h): return (np.asarray(h, dtype=np.uint32) << 16).view(np.float32)


def bf16_round_trip(x):
  """float32 values rounded to bfloat16 (nearest, ties to even; NaN stays NaN) and widened back."""
  return _bf16_to_f32(_bf16_round(x))


def _cast(x, d: dt.DType):
  x = np.asarray(x)
  with np.errstate(all="ignore"):
    if d.is_bool: return x != 0
    # through float32, as the C/OpenCL casts (and PyTorch) go: a double is not rounded to 16 bits directly
    if d == dt.float16:   # (a NaN as it is: its payload is the store's to keep, _half_bits)
      x = x.astype(np.float32)
      return np.where(np.isnan(x), x, x.astype(np.float16).astype(np.float32))
    if d == dt.bfloat16: return bf16_round_trip(x.astype(np.float32))
    if d.is_int and x.dtype.kind == "f":  # C leaves NaN/inf casts undefined; pick 0 deterministically
      x = np.where(np.isfinite(x), x, 0)
      if d.itemsize < 8 or d.is_unsigned:  # go through int64 so out-of-range values wrap like C would
        return np.trunc(x).astype(np.int64).astype(d.np)
    return x.astype(d.np)


def _half_bits(x) -> np.ndarray:
  """float32 values that are float16 values as float16's bits (int16), exactly: a NaN's from its bits (the upper
  ten of its payload, a signalling one kept so), not left to numpy's conversion, as the renderers' fg_f32_to_half."""
  x = np.asarray(x, dtype=np.float32)
  with np.errstate(all="ignore"): h = x.astype(np.float16).view(np.int16)
  u = x.view(np.uint32)
  top = ((u >> 13) & 0x3FF).astype(np.int32)
  nan = ((u >> 16) & 0x8000).astype(np.int32) | 0x7C00 | np.where(top != 0, top, 0x200)
  return np.where(np.isnan(x), nan.astype(np.uint16).view(np.int16), h)


def _half_value(h) -> np.ndarray:
  """float16's bits (16-bit integers) as float32 values, exactly (a NaN's payload in the upper bits, as
  fg_half_to_f32)."""
  h = np.asarray(h).astype(np.uint16)
  f = h.view(np.float16).astype(np.float32)
  nan = (h.astype(np.uint32) & 0x8000) << 16 | 0x7F800000 | (h.astype(np.uint32) & 0x3FF) << 13
  return np.where((h & 0x7C00) == 0x7C00, nan.view(np.float32), f)


_BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def bitcast_values(x, src: dt.DType, d: dt.DType) -> np.ndarray:
  """BITCAST's meaning on register values (16-bit floats as float32, bools as numpy bools): x's bits as d, of the
  same size; a bool reads its byte as x != 0."""
  x = np.asarray(x)
  if src == dt.float16: bits = _half_bits(x)
  elif src == dt.bfloat16: bits = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)   # (exact values)
  else: bits = x.astype(src.np)
  bits = bits.view(_BITS[d.itemsize])
  if d == dt.float16: return _half_value(bits)
  if d == dt.bfloat16: return _bf16_to_f32(bits.view(np.uint16))
  if d.is_bool: return bits != 0
  return bits.view(d.np)


def tf32_round(x):
  """float32 values rounded to tf32 (10 mantissa bits; nearest, ties away from zero: cvt.rna.tf32.f32), as float32."""
  x = np.asarray(x, dtype=np.float32)
  u = x.view(np.uint32).astype(np.uint64)
  r = ((u + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)
  return np.where(np.isfinite(x), r, x)


# how a tensor core reads its multiplicands (codegen/opt/tc.INPUT_FORMATS), from the float32 registers that hold them
_TC_INPUT = {"f16": lambda x: _cast(x, dt.float16), "bf16": bf16_round_trip, "tf32": tf32_round}


@functools.lru_cache(maxsize=None)
def _positions(layout: tuple) -> tuple:
  """(rows, cols): [lanes, elements] arrays of a fragment layout's matrix positions."""
  a = np.array(layout, dtype=np.int64)
  return a[..., 0], a[..., 1]


def mma(tc, a, b, c, n: int) -> np.ndarray:
  """ir.Mma over n work items (whole warps of tc.threads consecutive items, lane = item % threads): each warp's
  fragments gathered into A, B and C by the tensor core's layouts, the multiplicands rounded as the unit reads them,
  D = A @ B + C summed in float64 (the products of 16-bit or tf32 values are exact there) and rounded once to float32
  (the hardware's order and precision of accumulation are not specified; this is their ideal), scattered back into
  each lane's D fragment: [n, elements of C]."""
  t = tc.threads
  M, N, K = tc.dims
  def gather(x, layout, rows, cols, fmt=None):
    e = len(layout[0])
    x = np.broadcast_to(np.asarray(x, dtype=np.float32), (n, e)).reshape(n // t, t, e)
    if fmt is not None: x = _TC_INPUT[fmt](x)
    out = np.zeros((n // t, rows, cols), dtype=np.float64)
    r, cc = _positions(layout)
    out[:, r, cc] = x
    return out
  A = gather(a, tc.a, M, K, tc.input_format)
  B = gather(b, tc.b, K, N, tc.input_format)
  C = gather(c, tc.c, M, N)
  D = (A @ B + C).astype(np.float32)
  r, cc = _positions(tc.c)
  return D[:, r, cc].reshape(n, len(tc.c[0]))


_FOLD = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}
_BOOL_FOLD = {"SUM": np.logical_or, "PROD": np.logical_and}


class Interpreter:
  """Runs a listing over a range of work items at once: each value is an array over the items."""
  def __init__(self, kernel, listing):
    self.k, self.listing = kernel, listing
    self.ends = self._match_loops(listing)

  @staticmethod
  def _match_loops(listing) -> dict:
    ends, stack = {}, []
    for i, st in enumerate(listing):
      if isinstance(st, Loop): stack.append(i)
      elif isinstance(st, End): ends[stack.pop()] = i
    return ends

  def __call__(self, handles: list, start: int, end: int) -> None:
    k = self.k
    bufs = []
    for b, h in zip(k.bufs, handles):
      bufs.append(h[:b.size * b.dtype.itemsize].view(b.dtype.np if b.dtype != dt.bfloat16 else np.uint16))
    items = np.arange(start, end, dtype=np.int64)
    local = k.local_size[0] if k.local_size else 1
    env = {sym.Var(passes.GIDX, 0, max(k.groups - 1, 0)): items // local}
    if k.local_size: env[sym.Var(passes.LIDX, 0, local - 1)] = items % local
    if k.params:   # Device.param_handles: one block of 8-byte slots after the buffers
      blk = np.asarray(handles[len(k.bufs)]).view(np.int64)
      for i, d in enumerate(k.params):
        v = blk[i:i + 1].view(np.float64)[0] if d.is_float else blk[i:i + 1].astype(d.np)[0]
        env[("param", i)] = _cast(v, d).astype(_reg(d))
      for a in k.arg_vars: env[a] = int(blk[a.slot])
    self._run(0, len(self.listing), env, bufs, end - start)

  def _run(self, i, stop, env, bufs, n):
    L = self.listing
    while i < stop:
      st = L[i]
      if isinstance(st, Loop):
        end = self.ends[i]
        for it in range(st.var.hi + 1 if st.end is None else int(sym.evaluate(st.end, env))):
          env[st.var] = it
          self._run(i + 1, end, env, bufs, n)
        i = end + 1
        continue
      if isinstance(st, Let): env[st.name] = self._value(st.val, [env[a] for a in st.args], env, bufs, n)
      elif isinstance(st, Acc):
        r = st.reduce
        shape = (n, r.dtype.count) if isinstance(r.dtype, VecDType) else (n,)
        env[st.name] = np.full(shape, reduce_identity(r.op, r.dtype.scalar if shape[1:] else r.dtype), dtype=_reg(r.dtype))
      elif isinstance(st, Update):
        r = st.reduce
        fn = (_BOOL_FOLD if r.dtype.is_bool else {}).get(r.op, _FOLD[r.op])
        with np.errstate(all="ignore"):
          for a in st.args: env[st.name] = fn(env[st.name], env[a]).astype(_reg(r.dtype), copy=False)
      elif isinstance(st, PrefetchSt): pass   # a hint to a cache: nothing to compute
      elif isinstance(st, Fetch): self._fetch(st, env, bufs, n)
      elif isinstance(st, Refill): self._refill(st, env, n)
      elif isinstance(st, StoreSt):
        d = self.k.bufs[st.buf].dtype
        ok = np.broadcast_to(np.asarray(sym.evaluate_cond(st.valid, env)), (n,))
        pos = np.broadcast_to(sym.evaluate(st.idx, env), (n,))
        shape = (n,)
        if st.vec is not None:   # a vector value: lanes at consecutive positions (a masked store: some of them)
          pos, shape = pos[:, None] + np.arange(st.vec.count), (n, st.vec.count)
          ok = ok[:, None] & (self._lanes(st.lanes, st.vec.count, env, n) if st.lanes else True)
          ok = np.broadcast_to(ok, shape)
        pos = pos[ok]
        val = np.broadcast_to(np.asarray(env[st.arg]), shape)[ok]
        bufs[st.buf][pos] = _bf16_round(val) if d == dt.bfloat16 else _half_bits(_cast(val, d)).view(np.float16) \
            if d == dt.float16 else _cast(val, d).astype(d.np)
      i += 1

  @staticmethod
  def _lanes(lanes: tuple, count: int, env, n: int) -> np.ndarray:
    """[items, lanes]: the lanes lo <= i < hi a masked load or store touches (ir.Load.lanes)."""
    lo, hi = (np.broadcast_to(np.asarray(sym.evaluate(x, env)), (n,))[:, None] for x in lanes)
    i = np.arange(count)
    return (i >= lo) & (i < hi)

  def _uniform(self, c: sym.Cond, env) -> bool:
    """A condition over the loops of the work-group (the same for every item: a prefetch's next step)."""
    return bool(np.all(sym.evaluate_cond(c, env)))

  def _share(self, v: Stage, idx, valid, at, env, bufs, n) -> list:
    """The values of a tile (at index idx where valid) that each item copies, as the renderers copy them: its copy
    steps (ir.Stage.item_steps), [(values, local positions (plus the buffer's start `at`), where the step exists)],
    arrays over the items."""
    local = self.k.local_size[0]
    jv = sym.Var("j", 0, v.size - 1)
    digits = v.copy_digits(sym.lin(jv))
    b = bufs[v.buf]
    out = []
    for j, ok in v.item_steps(sym.Var(passes.LIDX, 0, local - 1), local):
      j = np.broadcast_to(np.asarray(sym.evaluate(j, env)), (n,))
      ok = np.broadcast_to(np.asarray(sym.evaluate_cond(ok, env)), (n,))
      jenv = dict(env)
      for x, e in digits.items(): jenv[x] = sym.evaluate(e, {jv: np.where(ok, j, 0)})
      pos = np.broadcast_to(np.asarray(sym.evaluate(idx, jenv)), (n,))
      good = ok & np.broadcast_to(np.asarray(sym.evaluate_cond(valid, jenv)), (n,))
      x = b[np.where(good, pos, 0)] if b.size else np.zeros(n, b.dtype)
      if v.dtype == dt.bfloat16: x = _bf16_to_f32(x)
      where = np.broadcast_to(np.asarray(sym.evaluate(sym.lin(v.position()) + at, jenv)), (n,))
      out.append((np.where(good, x.astype(_reg(v.dtype)), np.zeros((), _reg(v.dtype))), where, ok))
    return out

  def _scatter(self, tile: np.ndarray, share: list, n: int) -> None:
    """The copy steps every item of each group made (`_share`) stored into its group's tile, which every item holds
    a copy of ([items, positions]; a group's items are neighbours in the launch): a tile whose items copied
    different values, or missed a position, reads as it would on a device."""
    local = self.k.local_size[0]
    if n % local: raise AssertionError(f"a local tile over {n} work items: not whole groups of {local}")
    tile = tile.view()
    tile.shape = (n // local, local, tile.shape[-1])   # (in place: a view, never a copy)
    for val, pos, ok in share:
      g, t = np.nonzero(ok.reshape(n // local, local))
      tile[g[:, None], np.arange(local)[None, :], pos.reshape(n // local, local)[g, t][:, None]] = \
          val.reshape(n // local, local)[g, t][:, None]

  def _fetch(self, st: Fetch, env, bufs, n) -> None:
    """Each item's copy steps of the next step's tile, into its registers (kept as `name`_share)."""
    v = st.stage
    if not self._uniform(st.valid, env): return
    nxt = sym.lin(v.prefetch) + 1
    env[f"{st.name}_share"] = self._share(v, *v.at_step(nxt), v.buffer_at(nxt), env, bufs, n)

  def _refill(self, st: Refill, env, n) -> None:
    """The registers the group's items fetched, stored into the group's tile."""
    if not self._uniform(st.valid, env): return
    for name in st.names: self._scatter(env[name], env[f"{name}_share"], n)

  def _value(self, v, a, env, bufs, n):
    if isinstance(v, Const): return np.asarray(v.value, dtype=_reg(v.dtype))
    if isinstance(v, Param): return env[("param", v.slot)]
    if isinstance(v, Vectorize): return np.stack([np.broadcast_to(np.asarray(x), (n,)) for x in a], axis=-1)
    if isinstance(v, Gep): return np.asarray(a[0])[..., v.lane]
    if isinstance(v, (Load, Index)):
      idx = np.asarray(sym.evaluate(v.idx, env))
      valid = np.asarray(sym.evaluate_cond(v.valid, env))
      if isinstance(v.dtype, VecDType):   # lanes at consecutive positions, under the item's one condition
        idx = np.broadcast_to(idx, (n,))[:, None] + np.arange(v.dtype.count)
        valid = np.broadcast_to(valid, (n,))[:, None]
        if isinstance(v, Load) and v.lanes: valid = valid & self._lanes(v.lanes, v.dtype.count, env, n)
      if isinstance(v, Index): return np.where(valid, idx, 0).astype(_reg(v.dtype))
      b = bufs[v.buf]
      safe = np.where(valid, idx, 0) if b.size else idx
      x = b[safe] if b.size else np.zeros(np.shape(idx), dtype=b.dtype)
      if v.dtype == dt.bfloat16: x = _bf16_to_f32(x)
      x = x.astype(_reg(v.dtype))
      return np.where(valid, x, np.zeros((), _reg(v.dtype)))
    if isinstance(v, Valid): return np.asarray(sym.evaluate_cond(v.cond, env))
    if isinstance(v, Gather):
      pos = np.asarray(a[0]).astype(np.int64)
      if isinstance(v.dtype, VecDType):   # lanes at consecutive positions from the item's own
        pos = np.broadcast_to(pos, (n,))[:, None] + np.arange(v.dtype.count)
      ok = (pos >= 0) & (pos < v.size)
      x = bufs[v.buf][np.where(ok, pos, 0)] if v.size else np.zeros(pos.shape, bufs[v.buf].dtype)
      if v.dtype == dt.bfloat16: x = _bf16_to_f32(x)
      return np.where(ok, x.astype(_reg(v.dtype)), np.zeros((), _reg(v.dtype)))
    if isinstance(v, Stage):   # every item holds its group's tile: [items, positions] (a prefetched one: its first)
      tile = np.zeros((n, v.length), _reg(v.dtype))
      idx, valid = v.at_step(0) if v.prefetch is not None else (v.idx, v.valid)
      self._scatter(tile, self._share(v, idx, valid, sym.const(0), env, bufs, n), n)
      return tile
    if isinstance(v, LocalLoad):
      pos = np.broadcast_to(np.asarray(sym.evaluate(v.idx, env)), (n,))
      if isinstance(v.dtype, VecDType): return a[0][np.arange(n)[:, None], pos[:, None] + np.arange(v.dtype.count)]
      return a[0][np.arange(n), pos]
    if isinstance(v, GroupReduce):   # the launch is every work item at once: a group's items are neighbours
      part = np.broadcast_to(np.asarray(a[0]), (n,))
      base = np.arange(n) - np.broadcast_to(sym.evaluate(v.mine, env), (n,))
      fn = (_BOOL_FOLD if v.dtype.is_bool else {}).get(v.op, _FOLD[v.op])
      vals = [part[base + np.broadcast_to(sym.evaluate(sl, env), (n,))] for sl in v.slots]
      s = tree_top(len(vals))
      with np.errstate(all="ignore"):
        while s > 0:   # ir.GroupReduce's tree: slot i folds slot i + s
          for i in range(min(s, len(vals) - s)): vals[i] = fn(vals[i], vals[i + s])
          s //= 2
      return vals[0].astype(_reg(v.dtype), copy=False)
    if isinstance(v, Mma):
      if n % v.tc.threads: raise AssertionError(f"Mma over {n} work items: not whole warps of {v.tc.threads}")
      return mma(v.tc, a[0], a[1], a[2], n)
    if isinstance(v, Alu):
      if v.op == "CAST": return _cast(a[0], v.dtype)
      if v.op == "BITCAST": return bitcast_values(a[0], scalar_of(v.src[0].dtype), scalar_of(v.dtype))
      info = ops.ALU[v.op]
      a = [np.asarray(x) for x in a]
      if isinstance(v.dtype, VecDType):   # one condition for every lane of a select: [items] -> [items, 1]
        a = [x[:, None] if x.ndim == 1 else x for x in a]
      with np.errstate(all="ignore"):
        out = info.ref(*a)
      return np.asarray(out).astype(_reg(v.dtype))
    raise TypeError(v)


class PythonDevice(Device):
  # the oracle for every action: it runs work-groups (flattened), any number of values in registers and vectors
  # (a trailing axis of lanes); the default heuristic picks the CPU's tiles, so it checks the kernels the CPU runs
  # (this CPU's vector registers too, so register tiles come out as the CPU device's)
  def __init__(self):
    super().__init__("PYTHON", None)
    from fusegrad.runtime.cpu import host_vectors, host_vector_widths, tile_caps
    regs, lanes, _ = host_vectors()
    self._caps = Caps(has_local=True, max_local=1024, local_bytes=1 << 16, vector_widths=host_vector_widths((4, 8, 16)),
                      masked_vectors=True,
                      vector_registers=regs, native_lanes=lanes, **tile_caps(regs, lanes))
  @property
  def caps(self): return self._caps

  @contextlib.contextmanager
  def emulate(self, tensor_cores):
    """Inside the block the device declares these tensor cores (codegen/opt/tc.py records, or an architecture of its
    TENSOR_CORES table such as "sm_80") in its caps, so the TC action, its heuristic and the search run here on the
    interpreter's exact emulation; no GPU needed. Kernels compiled before the block (or in it) are compiled again
    after it: the caps are no part of a compiled kernel's key. Not for threads that compile meanwhile."""
    from fusegrad.codegen.opt.tc import TENSOR_CORES
    cores = TENSOR_CORES[tensor_cores] if isinstance(tensor_cores, str) else tuple(tensor_cores)
    old = self._caps
    with self.cache_lock: self.by_kernel.clear()
    self._caps = replace(old, tensor_cores=cores)
    try:
      yield self
    finally:
      self._caps = old
      with self.cache_lock: self.by_kernel.clear()

  def alloc(self, nbytes: int): return np.zeros(max(nbytes, 1), dtype=np.uint8)
  def copyin(self, handle, src: np.ndarray) -> None: handle[:src.nbytes] = src
  def copyout(self, dst: np.ndarray, handle) -> None: dst[:] = handle[:dst.nbytes]
  def compile_listing(self, kernel, listing): return Interpreter(kernel, listing)
  def launch(self, program, kernel, handles: list) -> None: program(handles, 0, kernel.global_size)


def create() -> Device: return PythonDevice()
