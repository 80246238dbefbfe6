"""The kernel IR: one for every device.

A Kernel is a set of stores over a parallel (global) index space. The values stored form a DAG of
frozen Val records — loads through symbolic index expressions, constants, ALU ops and reductions
whose loops are explicit. `linearize` (codegen/linearize.py) turns a Kernel into the flat
statement listing that every renderer and the numpy interpreter walk.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from fusegrad.dtype import DType
from fusegrad.graph import symbolic as sym


class Val:
  __slots__ = ()


@dataclass(frozen=True, eq=True)
class Load(Val):
  buf: int               # index into Kernel.bufs
  idx: sym.Lin
  valid: sym.Cond        # where false the value is 0 and memory is not touched
  dtype: DType


@dataclass(frozen=True, eq=True)
class Gather(Val):
  """A load at a position computed at run time (an integer value); 0 outside the buffer."""
  buf: int
  size: int
  src: Val               # the flat position
  dtype: DType


@dataclass(frozen=True, eq=True)
class Const(Val):
  value: object
  dtype: DType


@dataclass(frozen=True, eq=True)
class Index(Val):
  """The integer value of an index expression (IOTA), 0 where not valid."""
  idx: sym.Lin
  valid: sym.Cond
  dtype: DType


@dataclass(frozen=True, eq=True)
class Valid(Val):
  """A validity condition as a bool value (padding turns into a select on it)."""
  cond: sym.Cond
  dtype: DType


@dataclass(frozen=True, eq=True)
class Alu(Val):
  op: str                # a name from graph/ops.ALU, or CAST
  dtype: DType
  src: tuple


@dataclass(frozen=True, eq=True)
class Reduce(Val):
  op: str                # SUM PROD MAX MIN
  dtype: DType
  loops: tuple           # tuple[sym.Var]: the loop variables this reduction runs over
  src: Val
  lanes: int = 1         # >1: the last loop is a lane loop with one partial accumulator per lane,
                         # folded after the loops (independent chains the compiler can vectorize)
  lane_of: tuple = ()    # output loop vars: the lanes are that block of outputs, not folded, and the
                         # value of this Reduce inside those loops is its lane (register blocking);
                         # the last len(lane_of) loops of `loops` run over the same block

  @property
  def lane_index(self) -> sym.Lin:
    """Which partial accumulator an update goes to, over the lane loops."""
    lane_loops = self.loops[-len(self.lane_of):] if self.lane_of else self.loops[-1:]
    out = sym.const(0)
    for v in lane_loops: out = out * (v.hi + 1) + v
    return out


@dataclass(frozen=True, eq=True)
class LaneRead(Val):
  """Inside the output lane loops: the lane of an unfolded Reduce (made by the linearizer only)."""
  reduce: Reduce
  idx: sym.Lin           # over the Reduce's lane_of vars
  dtype: DType


@dataclass(frozen=True)
class BufferArg:
  dtype: DType
  size: int
  output: bool


@dataclass(frozen=True)
class Store:
  buf: int
  idx: sym.Lin
  value: Val


@dataclass(frozen=True)
class Kernel:
  name: str
  bufs: tuple            # tuple[BufferArg]
  gvars: tuple           # parallel dims (sym.Var), outermost first
  loops: tuple           # sequential output loops (sym.Var) inside each parallel item
  stores: tuple          # tuple[Store]
  flops: int = 0         # estimated, for reporting
  gidx: sym.Var | None = None  # the flat parallel index the gvars are derived from
  local_size: tuple | None = None  # work-group shape for devices that have one (None: the driver picks)
  cost: int = 0          # estimated work: flops with transcendental functions weighted, plus elements moved

  @property
  def global_size(self) -> int:
    n = 1
    for v in self.gvars: n *= v.hi + 1
    return n


# 16-bit floats live in float32 registers; every computed value of such a dtype is rounded to it (see round16)
HALF_FLOATS = frozenset({"float16", "bfloat16"})
# ops whose result is exactly one of their operands (or a function of one that stays representable in the
# operand's dtype): they need no rounding
EXACT_OPS = frozenset({"MAX", "MIN", "NEG", "ABS", "WHERE", "FLOOR", "CEIL", "TRUNC", "RINT", "CAST"})


def round16(v: Val) -> Val:
  """v rounded to its 16-bit float dtype and widened back to float32: a CAST to the dtype it already has
  (every renderer spells CAST to float16/bfloat16 as that round trip). Other dtypes pass unchanged."""
  return Alu("CAST", v.dtype, (v,)) if v.dtype.name in HALF_FLOATS else v


def is_round16(v: Val) -> bool:
  """Is v a round16 (not a cast from another dtype)?"""
  return isinstance(v, Alu) and v.op == "CAST" and v.src[0].dtype == v.dtype


def children(v: Val) -> tuple:
  if isinstance(v, Alu): return v.src
  if isinstance(v, (Reduce, Gather)): return (v.src,)
  return ()


def toposort(roots) -> list:
  out, seen = [], set()
  def visit(v):
    stack = [(v, False)]
    while stack:
      x, done = stack.pop()
      if done:
        out.append(x); continue
      if id(x) in seen: continue
      seen.add(id(x))
      stack.append((x, True))
      for c in reversed(children(x)): stack.append((c, False))
  for r in roots: visit(r)
  return out


def dependencies(roots) -> dict:
  """id(val) -> frozenset of the symbolic Vars the value depends on (a reduction's own loops excluded)."""
  deps = {}
  for v in toposort(roots):
    if isinstance(v, (Load, Index)): d = sym.variables(v.idx) | v.valid.variables()
    elif isinstance(v, Valid): d = v.cond.variables()
    elif isinstance(v, Const): d = set()
    elif isinstance(v, Reduce):
      d = deps[id(v.src)] - set(v.loops)
      d = d | set(v.lane_of)
    elif isinstance(v, Gather): d = deps[id(v.src)]
    else:
      d = set()
      for c in v.src: d |= deps[id(c)]
    deps[id(v)] = frozenset(d)
  return deps


def substitute(roots, env: dict) -> list:
  """The value DAG with index variables replaced (sym.substitute on every index and condition)."""
  memo: dict = {}
  def sub(v):
    r = memo.get(id(v))
    if r is not None: return r
    if isinstance(v, Load): r = Load(v.buf, sym.substitute(v.idx, env), v.valid.substitute(env), v.dtype)
    elif isinstance(v, Index): r = Index(sym.substitute(v.idx, env), v.valid.substitute(env), v.dtype)
    elif isinstance(v, Valid): r = Valid(v.cond.substitute(env), v.dtype)
    elif isinstance(v, Alu): r = Alu(v.op, v.dtype, tuple(sub(c) for c in v.src))
    elif isinstance(v, Gather): r = Gather(v.buf, v.size, sub(v.src), v.dtype)
    elif isinstance(v, Reduce): r = Reduce(v.op, v.dtype, v.loops, sub(v.src), v.lanes, v.lane_of)
    else: r = v
    memo[id(v)] = r
    return r
  return [sub(v) for v in roots]
