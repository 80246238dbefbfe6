"""The kernel IR: one for every device.

A Kernel is a set of stores over explicit axes. Every axis is a symbolic loop variable with a kind
(AxisKind: run in parallel, by a work-group, as a loop, as a reduction, or expanded in registers);
lowering makes every output dim a GLOBAL or LOOP axis and every reduction dim a REDUCE axis, and the
optimizer's actions (codegen/opt) split, re-kind and reorder them. The values stored form a DAG of
frozen Val records — loads through symbolic index expressions, constants, ALU ops and reductions
whose loops are explicit. codegen/pipeline.py takes a Kernel through actions, passes (expansion of
register axes, binding of work-item indices), linearization and rendering.
"""
from __future__ import annotations
import enum
import functools
from dataclasses import dataclass, field, fields, replace
from fusegrad import dtype as dt
from fusegrad.dtype import DType
from fusegrad.graph.node import reduce_identity
from fusegrad.graph import symbolic as sym


class AxisKind(enum.Enum):
  GLOBAL = "global"              # one work item (or work-group) per index
  LOCAL = "local"                # the work items of one work-group (devices with local memory)
  LOOP = "loop"                  # a sequential loop inside each work item, over outputs
  REDUCE = "reduce"              # a reduction's sequential loop
  GROUP_REDUCE = "group_reduce"  # a reduction shared by the work items of a work-group (local memory)
  GROUP_LOOP = "group_loop"      # a loop over outputs shared by the work items of a work-group (each takes its own)
  STAGE = "stage"                # a reduction's loop over a tile of its operands that the work-group first copies
                                 # into local memory (codegen/passes.stage), once per iteration of the loops outside
  UPCAST = "upcast"              # expanded in registers: one value (vector lane) per index
  UNROLL = "unroll"              # a reduction's loop expanded in registers, updates in order
  # a tensor core's tile (codegen/opt/tc.py, OptOp.TC): the M, N and K parts of one tile, no loop: their indices are
  # spread over the lanes of a warp and the elements of each lane's fragments (codegen/passes.tensor_core)
  TC_M = "tc_m"
  TC_N = "tc_n"
  TC_K = "tc_k"
  WARP = "warp"                  # the lanes of the warp that computes a tensor core's tile together: a work-group
                                 # dimension of tc.threads items, the innermost (lane = lidx % threads)


# the kinds expanded into registers by codegen/passes.expand (no loop remains of them)
REGISTER_KINDS = frozenset({AxisKind.UPCAST, AxisKind.UNROLL})
# the kinds bound to the work-group's one shared index (codegen/passes.bind)
SHARED_KINDS = (AxisKind.GROUP_REDUCE, AxisKind.GROUP_LOOP)
# a tensor core's tile axes, replaced by its fragments' lanes and elements (codegen/passes.tensor_core)
TC_KINDS = (AxisKind.TC_M, AxisKind.TC_N, AxisKind.TC_K)


@dataclass(frozen=True)
class Axis:
  var: sym.Var
  kind: AxisKind
  # a runtime extent (over kernel arguments, sym.ArgVar) at most the size: indices at or past it compute nothing
  # (every load, reduction and store over the axis is guarded: ir.guard), and a loop over the axis stops there
  end: sym.Lin | None = None

  @property
  def size(self) -> int: return self.var.hi + 1
  def __repr__(self): return f"{self.var.name}:{self.kind.value}[{self.size}]"


class VecDType:
  """`count` lanes of a scalar dtype held in one register (a vector type where the renderer has one). Made by
  codegen/passes.expand for the lanes of a vector UPCAST axis; one object per (scalar, count), so == is identity
  as for DType. Attributes other than these read through to the scalar dtype (is_float, np, ...)."""
  __slots__ = ("scalar", "count", "name")
  _made: dict = {}

  def __init__(self, scalar: DType, count: int):
    self.scalar, self.count, self.name = scalar, count, f"{scalar.name}x{count}"

  def __getattr__(self, a): return getattr(self.scalar, a)
  def __repr__(self): return f"vec({self.scalar.name}, {self.count})"
  def __reduce__(self): return (vec, (self.scalar, self.count))
  @property
  def itemsize(self) -> int: return self.scalar.itemsize * self.count


def vec(d: DType, count: int) -> VecDType:
  v = VecDType._made.get((d, count))
  if v is None: v = VecDType._made.setdefault((d, count), VecDType(d, count))
  return v


def scalar_of(d) -> DType:
  return d.scalar if isinstance(d, VecDType) else d


class Val:
  __slots__ = ()


@dataclass(frozen=True, eq=True)
class Load(Val):
  buf: int               # index into Kernel.bufs
  idx: sym.Lin
  valid: sym.Cond        # where false the value is 0 and memory is not touched
  dtype: DType
  # of a vector load: (lo, hi), index expressions; only lanes lo <= i < hi are read, the others are 0 and their
  # memory is not touched (a masked load: the lanes that run past a padded axis's end, codegen/passes._vectorize
  # where the renderer has them, Caps.masked_vectors). () reads every lane
  lanes: tuple = ()


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
class Param(Val):
  """A scalar argument of the kernel, bound at each launch (Kernel.params[slot] is its dtype): a Python number
  of the graph that is not compiled into the source, so one program serves every value (a learning rate, a
  loss scale, a changing step size). Where a device keeps 16-bit floats in float32 registers, so is a Param."""
  slot: int
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
  op: str                # a name from graph/ops.ALU, or CAST / BITCAST (ops.CONVERT)
  dtype: DType
  src: tuple


@dataclass(frozen=True, eq=True)
class Reduce(Val):
  op: str                # SUM PROD MAX MIN
  dtype: DType
  loops: tuple           # tuple[sym.Var]: the axes this reduction runs over, outermost first
  src: Val
  more: tuple = ()       # further values folded into the accumulator after src, in order, in each
                         # iteration (an UNROLL axis expanded: the same order as the loop it replaces)


def tree_top(n: int) -> int:
  """The first step of a tree fold of n values: half the power of two at or above n."""
  p = 1
  while p < n: p *= 2
  return p // 2


@dataclass(frozen=True, eq=True)
class GroupReduce(Val):
  """The reduction of every work item's partial `src` over one axis of its work-group (GROUP_REDUCE, made by
  codegen/passes.group): each item writes its partial into local memory at `mine`, the group meets at a
  barrier, and the slots `slots` (its own position with the grouped axis at each index) fold as a tree: for
  s = tree_top(len(slots)), s / 2, ..., 1, slot i folds slot i + s into itself (i < s, i + s < len(slots));
  the result is the first slot. log2 steps, each a barrier, instead of every item reading every slot."""
  op: str
  dtype: DType
  src: Val
  var: sym.Var           # the grouped axis (gone from every index once the partials are in local memory)
  mine: sym.Lin          # this item's slot: its flat position in the work-group
  slots: tuple           # tuple[sym.Lin]: the slots folded, in order
  size: int              # slots in the local buffer (the work-group's size)


@dataclass(frozen=True, eq=True)
class Stage(Val):
  """A tile of a buffer copied into the work-group's local memory (made by codegen/passes.stage): every work item
  of the group copies some of the copy steps 0 .. size-1; step j stands for the copy variables `over` (fresh
  variables, the first outermost: neighbouring steps read neighbouring addresses) at their mixed-radix digits of j,
  and stores buf[idx] (0 where not valid) at the local position of those variables in `layout` order (neighbouring
  items read neighbouring positions). The group meets at a barrier before the copy (the last tile's readers are
  done) and after it.

  A prefetched tile (`prefetch`, OptOp.PREFETCH) is copied before the loop over the tiles (`prefetch`: the loop just
  outside the tile), at its first index; in each step every item first loads its share of the next step's tile
  into registers (copy steps lidx, lidx + L, ..., L the group's size: `item_steps`), then the step reads its tile,
  then the registers are stored into local memory: the global loads' latency hides behind the step's arithmetic.
  With one buffer the store sits between two barriers; with two (`buffers`) tile t lives in buffer t % 2 (its
  LocalLoads' positions say so), the next tile is stored into the other one and a barrier after the store is all a
  step needs (the other buffer's readers were done at the last step's barrier)."""
  buf: int
  idx: sym.Lin           # over `over`, the kernel's global axes and the loops outside the tile
  valid: sym.Cond
  over: tuple            # tuple[sym.Var]: the copy's variables, outermost first
  dtype: DType
  layout: tuple = ()     # the same variables in the order of the local position (outermost first; () = `over`)
  inner: int = 0         # the innermost `inner` variables of the layout form rows of the tile padded by `pad`
  pad: int = 1           # positions (a row of 32 banks' multiple would put a column's values in one bank)
  prefetch: sym.Var | None = None   # the loop over the tiles whose next tile each step loads into registers (or None)
  buffers: int = 1       # local buffers of the tile (2: alternating, tile t in buffer t % 2; prefetched tiles only)

  def _strides(self) -> list:
    out, stride = [], 1
    lay = self.layout or self.over
    for i, x in enumerate(reversed(lay)):
      out.append(stride)
      stride *= x.hi + 1
      if i + 1 == self.inner and i + 1 < len(lay): stride += self.pad
    return out[::-1]

  def position(self, env: dict | None = None) -> sym.Lin:
    """The local position of the value at the copy variables (or at env's expressions for them)."""
    pos = sym.const(0)
    for x, st in zip(self.layout or self.over, self._strides()):
      pos = pos + (env[x] if env else sym.lin(x)) * st
    return pos

  def copy_digits(self, j) -> dict:
    """The copy variables at copy step j (an index expression): its mixed-radix digits."""
    return dict(zip(self.over, sym.unravel(j, tuple(v.hi + 1 for v in self.over))))

  @property
  def positions(self) -> int:
    """The local buffer's length (the size and the rows' padding)."""
    lay = self.layout or self.over
    return self._strides()[0] * (lay[0].hi + 1) if lay else 1

  @property
  def size(self) -> int:
    n = 1
    for v in self.over: n *= v.hi + 1
    return n

  @property
  def buffer_stride(self) -> int:
    """The distance between the starts of two buffers: the positions rounded up to 4 (aligned vector reads stay
    aligned in the second one)."""
    return -(-self.positions // 4) * 4

  @property
  def length(self) -> int:
    """The local memory the tile takes, in values (every buffer)."""
    return self.positions if self.buffers == 1 else self.buffer_stride * self.buffers

  def buffer_at(self, step) -> sym.Lin:
    """The start of the buffer that holds the tile of step `step` (an index expression of the prefetched loop)."""
    return sym.mod(sym.lin(step), self.buffers) * self.buffer_stride if self.buffers > 1 else sym.const(0)

  def item_steps(self, lidx, local: int) -> list:
    """The copy steps one work item (at index lidx of a group of `local`) makes: [(step, where it exists)], the
    step lidx + i * local for each i, the last ones guarded where local does not divide the size."""
    out = []
    for i in range(-(-self.size // local)):
      j = sym.lin(lidx) + i * local
      out.append((j, sym.TRUE if (i + 1) * local <= self.size else sym.Cond.range(j, 0, self.size)))
    return out

  def at_step(self, step) -> tuple:
    """(idx, valid) of the prefetched loop's tile at index expression `step` (its first: 0; the next: step + 1)."""
    env = {self.prefetch: sym.lin(step)}
    return sym.substitute(self.idx, env), self.valid.substitute(env)


@dataclass(frozen=True, eq=True)
class LocalLoad(Val):
  """A read of a Stage's local copy at position idx."""
  src: Stage
  idx: sym.Lin
  dtype: DType


@dataclass(frozen=True, eq=True)
class Vectorize(Val):
  """A vector made of scalar values, one per lane (all the same one: a broadcast)."""
  src: tuple
  dtype: VecDType


@dataclass(frozen=True, eq=True)
class Gep(Val):
  """One lane of a vector value."""
  src: Val
  lane: int
  dtype: DType


@dataclass(frozen=True, eq=True)
class Mma(Val):
  """A warp's matrix multiply-accumulate on a tensor core (codegen/opt/tc.py; made by codegen/passes.tensor_core):
  every lane of the warp holds `a`, `b` and `c` as vectors of its fragments' elements (element e of lane l is the
  matrix position tc.a[l][e], tc.b[l][e], tc.c[l][e]); the result is the lane's fragment of D = A @ B + C, made by
  the warp's lanes together, so every lane must reach it (no value under a lane's own condition). The lane is the
  work item's index along the kernel's WARP axis."""
  tc: object             # codegen/opt/tc.TensorCore
  a: Val                 # vec(tc.dtype_in, elements of A per lane)
  b: Val
  c: Val                 # vec(tc.dtype_acc, elements of C per lane)
  dtype: VecDType        # the lane's D fragment


def _val_repr(v, depth: int = 3) -> str:
  """A value's fields, its operands to `depth` levels (then "..."): a kernel's values share operands (one exp read by
  a max, a sum and a store), and the dataclass repr spells a shared operand once per path, exponentially many (a
  failed test's traceback, which reprs the arguments, never finished)."""
  def one(x):
    if isinstance(x, Val): return _val_repr(x, depth - 1) if depth > 0 else f"{type(x).__name__}(...)"
    if isinstance(x, tuple) and any(isinstance(e, Val) for e in x): return "(" + ", ".join(one(e) for e in x) + ")"
    return repr(x)
  return f"{type(v).__name__}(" + ", ".join(f"{f.name}={one(getattr(v, f.name))}" for f in fields(v)) + ")"


for _cls in Val.__subclasses__(): _cls.__repr__ = _val_repr   # (every value class is defined above)


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
  valid: sym.Cond = sym.TRUE   # where false nothing is stored (an axis padded past its size)
  lanes: tuple = ()            # of a vector store: (lo, hi), only lanes lo <= i < hi are stored (as Load.lanes)


@dataclass(frozen=True)
class Prefetch:
  """A hint that bufs[buf][idx] will be read soon (codegen/passes.read_ahead makes these for OptOp.READAHEAD): the C
  renderer asks the cache for that line (__builtin_prefetch), the interpreter ignores it. It is no load: an index past
  the buffer's end (the last steps of a loop read ahead of) touches nothing."""
  buf: int
  idx: sym.Lin


@dataclass(frozen=True)
class Kernel:
  name: str
  bufs: tuple            # tuple[BufferArg]
  axes: tuple            # tuple[Axis]: output axes in nesting/flattening order, then the reductions' axes
  stores: tuple          # tuple[Store]
  flops: int = 0         # estimated, for reporting
  cost: int = 0          # estimated work: flops with transcendental functions weighted, plus elements moved
  opts: tuple = ()       # the optimizer's actions applied to the canonical kernel (codegen/opt), in order
  tiled: bool = False    # output axes were expanded in registers (codegen/passes.expand): a register tile
  params: tuple = ()     # tuple[DType]: the dtype of each scalar argument (ir.Param), bound at launch
  arg_vars: tuple = ()   # tuple[sym.ArgVar]: the arguments used in index expressions (their slots are int64 params)
  # the arguments' values where the kernel was first lowered (for a search's trial runs: an index argument must
  # keep reads in bounds); not part of what the kernel is
  example: tuple = field(default=(), compare=False, repr=False)
  tensor_core: object = None   # the codegen/opt/tc.TensorCore whose tile the TC_M/TC_N/TC_K axes hold (OptOp.TC)
  prefetch: int = 0      # OptOp.PREFETCH: the STAGE axis's tiles prefetched through registers into this many local
                         # buffers (0: each step copies its own tile; codegen/passes.stage)
  # OptOp.READAHEAD: ((loop variable, bytes), ...): the loads that step at least a cache line along that reduction
  # loop are asked for `bytes` ahead (codegen/passes.read_ahead; a later split of the axis drops its hint)
  read_ahead: tuple = ()
  prefetches: tuple = () # tuple[Prefetch]: made from read_ahead after expansion, placed in their loops by linearize

  def of_kind(self, *kinds) -> tuple:
    return tuple(a for a in self.axes if a.kind in kinds)

  def axis_index(self, var: sym.Var) -> int:
    for i, a in enumerate(self.axes):
      if a.var == var: return i
    raise KeyError(var)

  # the launch geometry below is read at every launch: computed once per (frozen) kernel
  @functools.cached_property
  def global_dims(self) -> tuple: return tuple(a.size for a in self.of_kind(AxisKind.GLOBAL))
  @functools.cached_property
  def shared_size(self) -> int:
    """The size of the work-group's shared axis: every GROUP_REDUCE and GROUP_LOOP axis is bound to one index of
    the group (they are phases of one kernel: its reductions one after another, then its outputs), so they have one
    size; 0 when the kernel has none."""
    return max((a.size for a in self.of_kind(*SHARED_KINDS)), default=0)

  @functools.cached_property
  def local_dims(self) -> tuple:
    """The work-group's dims: its LOCAL axes, then the shared axis, then the lanes of a warp (WARP, innermost)."""
    return tuple(a.size for a in self.of_kind(AxisKind.LOCAL)) + ((self.shared_size,) if self.shared_size else ()) + \
        tuple(a.size for a in self.of_kind(AxisKind.WARP))

  @functools.cached_property
  def groups(self) -> int:
    n = 1
    for s in self.global_dims: n *= s
    return n

  @functools.cached_property
  def local_size(self) -> tuple | None:
    """Work items per work-group, or None (no LOCAL axes: the driver picks)."""
    n = 1
    for s in self.local_dims: n *= s
    return (n,) if self.local_dims else None

  @functools.cached_property
  def global_size(self) -> int:
    """Work items in all: the groups times their local size."""
    return self.groups * (self.local_size[0] if self.local_size else 1)


# 16-bit floats live in float32 registers; every computed value of such a dtype is rounded to it (see round16)
HALF_FLOATS = frozenset({"float16", "bfloat16"})
# ops whose result is exactly one of their operands (or a function of one that stays representable in the
# operand's dtype): they need no rounding
EXACT_OPS = frozenset({"MAX", "MIN", "NEG", "ABS", "WHERE", "FLOOR", "CEIL", "TRUNC", "RINT", "CAST", "BITCAST"})


def round16(v: Val) -> Val:
  """v rounded to its 16-bit float dtype and widened back to float32: a CAST to the dtype it already has
  (every renderer spells CAST to float16/bfloat16 as that round trip). Other dtypes pass unchanged."""
  return Alu("CAST", v.dtype, (v,)) if v.dtype.name in HALF_FLOATS else v


def is_round16(v: Val) -> bool:
  """Is v a round16 (not a cast from another dtype)?"""
  return isinstance(v, Alu) and v.op == "CAST" and v.src[0].dtype == v.dtype


def children(v: Val) -> tuple:
  if isinstance(v, (Alu, Vectorize)): return v.src
  if isinstance(v, Gep): return (v.src,)
  if isinstance(v, Reduce): return (v.src,) + v.more
  if isinstance(v, (Gather, GroupReduce, LocalLoad)): return (v.src,)
  if isinstance(v, Mma): return (v.a, v.b, v.c)
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


def axis_variables(idx) -> set:
  """The loop variables of an index (its kernel arguments, sym.ArgVar, are no loop)."""
  return {x for x in sym.variables(idx) if not isinstance(x, sym.ArgVar)}


def dependencies(roots) -> dict:
  """id(val) -> frozenset of the symbolic Vars the value depends on (a reduction's own loops excluded)."""
  deps = {}
  for v in toposort(roots):
    if isinstance(v, (Load, Index)):
      d = axis_variables(v.idx) | v.valid.variables()
      if isinstance(v, Load) and v.lanes: d |= axis_variables(v.lanes[0]) | axis_variables(v.lanes[1])
    elif isinstance(v, Valid): d = v.cond.variables()
    elif isinstance(v, (Const, Param)): d = set()
    elif isinstance(v, Stage): d = (axis_variables(v.idx) | v.valid.variables()) - set(v.over)
    elif isinstance(v, LocalLoad): d = axis_variables(v.idx) | deps[id(v.src)]
    elif isinstance(v, Reduce):
      d = set()
      for c in children(v): d |= deps[id(c)]
      d -= set(v.loops)
    elif isinstance(v, (Gather, Gep)): d = deps[id(v.src)]
    elif isinstance(v, GroupReduce): d = (deps[id(v.src)] | sym.variables(v.mine)) - {v.var}
    else:
      d = set()
      for c in children(v): d |= deps[id(c)]
    deps[id(v)] = frozenset(d)
  return deps


def sub_lanes(lanes: tuple, env: dict) -> tuple:
  """A masked load's or store's lane bounds (Load.lanes) with index variables replaced."""
  return tuple(sym.substitute(x, env) for x in lanes)


def substitute(roots, env: dict, loops: dict | None = None, replaced: dict | None = None) -> list:
  """The value DAG with index variables replaced (sym.substitute on every index and condition); `loops` maps a
  reduction's loop variable to the variables that replace it in its loops (an axis split in two); `replaced` maps
  id(value) to the value that stands for it, taken as it is (a reduction's result computed another way)."""
  loops = loops or {}
  memo: dict = dict(replaced or {})
  def sub(v):
    r = memo.get(id(v))
    if r is not None: return r
    if isinstance(v, Load):
      r = Load(v.buf, sym.substitute(v.idx, env), v.valid.substitute(env), v.dtype, sub_lanes(v.lanes, env))
    elif isinstance(v, Index): r = Index(sym.substitute(v.idx, env), v.valid.substitute(env), v.dtype)
    elif isinstance(v, Valid): r = Valid(v.cond.substitute(env), v.dtype)
    elif isinstance(v, Alu): r = Alu(v.op, v.dtype, tuple(sub(c) for c in v.src))
    elif isinstance(v, Gather): r = Gather(v.buf, v.size, sub(v.src), v.dtype)
    elif isinstance(v, Vectorize): r = Vectorize(tuple(sub(c) for c in v.src), v.dtype)
    elif isinstance(v, Gep): r = Gep(sub(v.src), v.lane, v.dtype)
    elif isinstance(v, Mma): r = Mma(v.tc, sub(v.a), sub(v.b), sub(v.c), v.dtype)
    elif isinstance(v, Stage): r = replace(v, idx=sym.substitute(v.idx, env), valid=v.valid.substitute(env))
    elif isinstance(v, LocalLoad): r = LocalLoad(sub(v.src), sym.substitute(v.idx, env), v.dtype)
    elif isinstance(v, GroupReduce):
      r = GroupReduce(v.op, v.dtype, sub(v.src), v.var, sym.substitute(v.mine, env),
                      tuple(sym.substitute(x, env) for x in v.slots), v.size)
    elif isinstance(v, Reduce):
      r = Reduce(v.op, v.dtype, tuple(y for x in v.loops for y in loops.get(x, (x,))), sub(v.src), tuple(sub(c) for c in v.more))
    else: r = v
    memo[id(v)] = r
    return r
  return [sub(v) for v in roots]


def substitute_kernel(k: Kernel, env: dict, loops: dict | None = None, axes: tuple | None = None, **changes) -> Kernel:
  """k with index variables replaced in every value and store (see substitute), and new axes if given."""
  vals = substitute([st.value for st in k.stores], env, loops)
  stores = tuple(Store(st.buf, sym.substitute(st.idx, env), v, st.valid.substitute(env), sub_lanes(st.lanes, env))
                 for st, v in zip(k.stores, vals))
  return replace(k, stores=stores, axes=k.axes if axes is None else axes, **changes)


def guard(k: Kernel, var: sym.Var, inside: sym.Cond, wrap: int = 0) -> Kernel:
  """k computing nothing where `inside` fails: every load and index that uses var is guarded by it, a reduction
  over var adds its identity there, and a store over var stores nothing there (an axis padded past its size,
  codegen/opt PADTO; a dimension sized at run time, codegen/lower).
  wrap (PADTO: the axis's size, var < 2 * wrap): where no reduction folds var (an output axis), what is computed at
  its padded indices reaches only the stores it guards, so a load reads at var % wrap, in bounds, instead of being
  guarded: a register tile's padded rows then read without a condition per load (gcc kept a branch per row inside
  the reduction loop: a 12-row matmul tile 114 -> 158 GFLOP/s a core on an AVX-512 Xeon)."""
  memo: dict = {}
  if wrap and any(var in r.loops for r in toposort([st.value for st in k.stores]) if isinstance(r, Reduce)): wrap = 0
  env = {var: sym.mod(sym.lin(var), wrap)} if wrap else None
  def g(v):
    r = memo.get(id(v))
    if r is not None: return r
    if isinstance(v, Load) and env is not None and var in sym.variables(v.idx) | v.valid.variables():
      r = Load(v.buf, sym.substitute(v.idx, env), v.valid.substitute(env), v.dtype)
    elif isinstance(v, Load) and var in sym.variables(v.idx): r = Load(v.buf, v.idx, v.valid & inside, v.dtype)
    elif isinstance(v, Index) and var in sym.variables(v.idx): r = Index(v.idx, v.valid & inside, v.dtype)
    elif isinstance(v, Alu): r = Alu(v.op, v.dtype, tuple(g(c) for c in v.src))
    elif isinstance(v, Gather): r = Gather(v.buf, v.size, g(v.src), v.dtype)
    elif isinstance(v, Reduce):
      srcs = tuple(g(c) for c in (v.src,) + v.more)
      if var in v.loops:
        ident = Const(reduce_identity(v.op, v.dtype), v.dtype)
        srcs = tuple(Alu("WHERE", v.dtype, (Valid(inside, dt.bool_), s, ident)) for s in srcs)
      r = Reduce(v.op, v.dtype, v.loops, srcs[0], srcs[1:])
    else: r = v
    memo[id(v)] = r
    return r
  stores = tuple(Store(st.buf, st.idx, g(st.value), st.valid & inside if var in sym.variables(st.idx) else st.valid)
                 for st in k.stores)
  return replace(k, stores=stores)


def index_exprs(k: Kernel):
  """Every index expression of k: its stores' and loads' indices and the expressions their conditions (and Valid
  values') bound."""
  for st in k.stores:
    yield st.idx
    yield from (x for x, _lo, _hi in st.valid.parts)
    yield from st.lanes
    for v in toposort([st.value]):
      if isinstance(v, (Load, Index)):
        yield v.idx
        yield from (x for x, _lo, _hi in v.valid.parts)
        if isinstance(v, Load): yield from v.lanes
      elif isinstance(v, Valid): yield from (x for x, _lo, _hi in v.cond.parts)


def arg_vars(k: Kernel) -> tuple:
  """The kernel arguments used as integers (sym.ArgVar) in its indices, conditions and axis ends, by slot."""
  exprs = list(index_exprs(k)) + [a.end for a in k.axes if a.end is not None]
  out = {a for x in exprs for a in sym.variables(x) if isinstance(a, sym.ArgVar)}
  return tuple(sorted(out, key=lambda x: x.slot))
