"""The PYTHON device: a numpy interpreter of the linearized kernel IR, the oracle for fuzzing.

It runs the very listing the C and OpenCL renderers print, vectorized over all work items at once
(each value is an array over the flat parallel index) with Python loops for the sequential ones.
It shares their semantics: 16-bit floats compute in float32, integer division by zero gives 0.
"""
from __future__ import annotations
import numpy as np
from fusegrad import dtype as dt
from fusegrad.graph import ops, symbolic as sym
from fusegrad.graph.node import reduce_identity
from fusegrad.runtime.device import Device
from fusegrad.codegen.ir import Gather, LaneRead, Load, Const, Index, Valid, Alu, Reduce


def _reg(d: dt.DType):
  return np.float32 if d in (dt.float16, dt.bfloat16) else d.np


def _bf16_round(x):
  u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
  r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)
  nan = np.isnan(np.asarray(x, dtype=np.float32))
  r = np.where(nan, (u >> 16).astype(np.uint32) | 0x40, r)
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
    if d == dt.float16: return x.astype(np.float32).astype(np.float16).astype(np.float32)
    if d == dt.bfloat16: return bf16_round_trip(x.astype(np.float32))
    if d.is_int and x.dtype.kind == "f":  # C leaves NaN/inf casts undefined; pick 0 deterministically
      x = np.where(np.isfinite(x), x, 0)
      if d.itemsize < 8 or d.is_unsigned:  # go through int64 so out-of-range values wrap like C would
        return np.trunc(x).astype(np.int64).astype(d.np)
    return x.astype(d.np)


class Interpreter:
  def __init__(self, kernel, listing):
    self.k, self.listing = kernel, listing

  def __call__(self, handles: list, start: int, end: int) -> None:
    k = self.k
    bufs = []
    for b, h in zip(k.bufs, handles):
      bufs.append(h[:b.size * b.dtype.itemsize].view(b.dtype.np if b.dtype != dt.bfloat16 else np.uint16))
    env = {k.gidx: np.arange(start, end, dtype=np.int64)}
    n = end - start
    self._run(self.listing, 0, len(self.listing), env, bufs, n)

  @staticmethod
  def _acc_value(x):
    return x[0] if isinstance(x, np.ndarray) and x.ndim == 2 else x

  def _block_end(self, i: int) -> int:
    depth = 0
    for j in range(i, len(self.listing)):
      if self.listing[j][0] == "loop": depth += 1
      elif self.listing[j][0] == "end":
        depth -= 1
        if depth == 0: return j
    raise AssertionError("unbalanced listing")

  def _run(self, L, i, stop, env, bufs, n):
    while i < stop:
      st = L[i]
      kind = st[0]
      if kind == "loop":
        end = self._block_end(i)
        for it in range(st[1].hi + 1):
          env[st[1]] = it
          self._run(L, i + 1, end, env, bufs, n)
        i = end + 1
        continue
      if kind == "let":
        _, name, v, args = st
        if isinstance(v, LaneRead): env[name] = env[args[0]][sym.evaluate(v.idx, env)]
        else: env[name] = self._value(v, [self._acc_value(env[a]) for a in args], env, bufs, n)
      elif kind == "acc":
        _, name, r = st
        env[name] = np.full((r.lanes, n), reduce_identity(r.op, r.dtype), dtype=_reg(r.dtype))
      elif kind in ("update", "fold"):
        r = st[2]
        fn = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}[r.op]
        if r.dtype.is_bool: fn = {"SUM": np.logical_or, "PROD": np.logical_and}.get(r.op, fn)
        acc = env[st[1]]
        with np.errstate(all="ignore"):
          if kind == "update":   # same lane order as the compiled kernels, so results match bit for bit
            lane = sym.evaluate(r.lane_index, env) if r.lanes > 1 else 0
            acc[lane] = fn(acc[lane], env[st[3]])
          else:
            out = acc[0]
            for lane in range(1, r.lanes): out = fn(out, acc[lane])
            env[st[1]] = out[None]
      elif kind == "store":
        _, buf, idx, arg = st
        d = self.k.bufs[buf].dtype
        pos = np.broadcast_to(sym.evaluate(idx, env), (n,))
        val = np.broadcast_to(np.asarray(self._acc_value(env[arg])), (n,))
        bufs[buf][pos] = _bf16_round(val) if d == dt.bfloat16 else _cast(val, d).astype(d.np if d != dt.bfloat16 else np.uint16)
      i += 1

  def _value(self, v, a, env, bufs, n):
    if isinstance(v, Const): return np.asarray(v.value, dtype=_reg(v.dtype))
    if isinstance(v, (Load, Index)):
      idx = np.asarray(sym.evaluate(v.idx, env))
      valid = np.asarray(sym.evaluate_cond(v.valid, env))
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
      ok = (pos >= 0) & (pos < v.size)
      x = bufs[v.buf][np.where(ok, pos, 0)] if v.size else np.zeros(pos.shape, bufs[v.buf].dtype)
      if v.dtype == dt.bfloat16: x = _bf16_to_f32(x)
      return np.where(ok, x.astype(_reg(v.dtype)), np.zeros((), _reg(v.dtype)))
    if isinstance(v, Alu):
      if v.op == "CAST": return _cast(a[0], v.dtype)
      info = ops.ALU[v.op]
      a = [np.asarray(x) for x in a]
      with np.errstate(all="ignore"):
        out = info.ref(*a)
      return np.asarray(out).astype(_reg(v.dtype))
    raise TypeError(v)


class PythonDevice(Device):
  def __init__(self): super().__init__("PYTHON", None)
  def alloc(self, nbytes: int): return np.zeros(max(nbytes, 1), dtype=np.uint8)
  def copyin(self, handle, src: np.ndarray) -> None: handle[:src.nbytes] = src
  def copyout(self, dst: np.ndarray, handle) -> None: dst[:] = handle[:dst.nbytes]
  def compile_listing(self, kernel, listing): return Interpreter(kernel, listing)
  def launch(self, program, kernel, handles: list) -> None: program(handles, 0, kernel.global_size)


def create() -> Device: return PythonDevice()
