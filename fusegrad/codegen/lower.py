"""Lowering: a fused group of graph nodes becomes one Kernel.

Every node is evaluated *at an index*: a tuple of symbolic expressions over the output's loop
variables. Views rewrite the index (and add validity), elementwise ops evaluate their sources at
the same index, and a reduction opens loops for its axes. Memoising (node, index) shares work, so
a reduction expanded back over the axis it reduced (softmax's max) is computed once per row and
then reused by the loop over that row.

The kernel is canonical and unoptimized: each output dim is a GLOBAL axis (run in parallel) or, when
a reduction does not depend on it, a LOOP axis (the reduction is computed once and reused along it),
and each reduction dim is a REDUCE axis. How it is then tiled, unrolled and vectorized is the
optimizer's (codegen/opt) choice, made per device.

Lowering refuses only what the canonical kernel cannot express (a reduction evaluated at several indices:
a kernel has one set of REDUCE axes per reduction): it raises NeedsRealize naming the node that must get a
kernel (and a buffer) of its own. Whether a fusion it can express is worth its cost (work recomputed, too
little parallel work) is decided by the scheduler's rules (schedule/rules.py), which read the facts that the
first pass here gathers (`Fusion`) before the kernel is built.

A constant of the graph is a literal of the source only where its value lets the compiler simplify (zero,
powers of two, infinities, small integers); any other becomes a kernel argument (ir.Param, `is_param`), so a
Python number that changes every step (a learning rate, a loss scale) reuses one compiled program.
"""
from __future__ import annotations
import math
from dataclasses import replace
from fusegrad import dtype as dt
from fusegrad.graph import ops, symbolic as sym, dims
from fusegrad.graph.node import Node
from fusegrad.graph.view import prod, contiguous_strides
from fusegrad.codegen.ir import (Gather, Load, Const, Param, Index, Valid, Alu, Reduce, BufferArg, Store, Kernel, Axis, AxisKind,
                                 toposort, dependencies, round16, is_round16, guard, arg_vars, EXACT_OPS, substitute,
                                 substitute_kernel)

# transcendental functions cost several ALU ops (a polynomial, or a libm call)
_OP_COST = {op: 4 for op in ("EXP", "LOG", "SIN", "COS", "TAN", "TANH", "ERF", "ATAN", "ATAN2")}
# ...and for the work estimate (Kernel.cost) sin/cos/tan/atan are libm calls that do not vectorize
_WORK_COST = {**_OP_COST, "SIN": 16, "COS": 16, "TAN": 16, "ATAN": 16, "ATAN2": 16}


# the range an offset argument is declared to have (one range for all, so it is no part of a kernel's structure)
OFFSET_BOUND = 1 << 48


class DimOf:
  """An argument whose value is a runtime size (graph/dims.py): dim `axis` of `node`'s shape. A kernel cached by
  structure (schedule._lower_cached) reads it from the graph at hand, never from the graph it was lowered for."""
  __slots__ = ("node", "axis")
  def __init__(self, node: Node, axis: int): self.node, self.axis = node, axis


def param_value(n):
  """The value a Param slot bound to node n takes: a constant's, a view's offset into its buffer, or a runtime
  size (DimOf)."""
  if type(n) is DimOf: return int(n.node.shape[n.axis])
  return n.arg.offset if n.op == "VIEW" else n.arg


class Fixed:
  """An argument's value that a cached schedule keeps itself: its node was made by a rewrite of the scheduler
  (schedule/rules.rewrite_reductions), so it is no node of the graph a later realize walks."""
  __slots__ = ("value",)
  def __init__(self, value): self.value = value


def param_values(k: Kernel, params: list) -> list:
  """The values of k's arguments: each node's (param_value), k's own where the slot has no node (None: a residual
  offset, fixed for the kernel), and a Fixed one's."""
  return [k.example[i] if n is None else n.value if isinstance(n, Fixed) else param_value(n)
          for i, n in enumerate(params)]


def is_param(n: Node) -> bool:
  """Does the node become a kernel argument (ir.Param) rather than a literal? (the scheduler keys its caches by
  this too: a Param's value is not part of a kernel's structure)"""
  return n.op == "CONST" and not n.realized and is_runtime_value(n.arg, n.dtype)


def is_runtime_value(v, d: dt.DType) -> bool:
  """Every number but those a compiler folds into cheaper code: zero, a power of two (a division becomes a
  multiply, a multiply an add or a shift), infinities and NaN (no argument needed to spell them), small integers
  (loop-like arithmetic, masks), and bools."""
  if d.is_bool: return False
  if d.is_float:
    v = float(v)
    if v == 0 or math.isinf(v) or math.isnan(v): return False
    return math.frexp(abs(v))[0] != 0.5
  v = abs(int(v))
  return v > 16 and v & (v - 1) != 0


class NeedsRealize(Exception):
  def __init__(self, node: Node, why: str):
    super().__init__(why)
    self.node, self.why = node, why


def ravel(idx, shape) -> sym.Lin:
  out = sym.const(0)
  for i, st in zip(idx, contiguous_strides(shape)):
    if st: out = out + sym.mul(i, st)
  return out


def dim_map(v, src_shape) -> tuple | None:
  """For each dim of view v, the dim of its source it reads (-1: none, a broadcast or size-1 dim), when v only
  permutes, expands or adds and drops size-1 dims of its source's contiguous layout; None otherwise."""
  if v.offset: return None
  at = {st: j for j, st in enumerate(contiguous_strides(src_shape)) if st}
  out = []
  for st, s in zip(v.strides, v.shape):
    j = at.get(st, -2) if st else -1
    if j == -2 or (j >= 0 and (j in out or s != src_shape[j])): return None
    out.append(j)
  return tuple(out) if len([j for j in out if j >= 0]) == len(at) else None


def _per_dim(v, src_shape, idx) -> tuple | None:
  """The index into the source of view v (at idx) dim by dim (dim_map), or None: no flat position divided back
  into dims, so a runtime size (graph/dims.py) stays out of the index arithmetic."""
  m = dim_map(v, src_shape)
  if m is None: return None
  out = [sym.const(0)] * len(src_shape)
  for i, j in zip(idx, m):
    if j >= 0: out[j] = i
  return tuple(out)


def _aligned(v, src_shape, idx) -> tuple | None:
  """The index into the source of view v (at idx) dim by dim, or None, when each dim of v steps along one dim of
  its source's contiguous layout (a pad, a crop, a flip, a stride, a window: `_unfold`'s view over a padded map)
  and, over v's valid region, each source dim's index stays within its size: then it is the flat position's
  unraveling, without the divisions. A padded source's flat position (o * 64 + (y - 1) * 8 + x - 1) unraveled
  divides a sum that can be negative outside the padding's guard, which no range rule simplifies: an im2col copy
  of a batch-normalized map computed every channel and row index by floor divisions in its inner loop."""
  cs = contiguous_strides(src_shape)
  dims_ = [j for j, n in enumerate(src_shape) if n > 1]
  mask = v.mask or tuple((0, n) for n in v.shape)
  terms = [[] for _ in src_shape]   # per source dim: (view dim, steps)
  for d, (st, n) in enumerate(zip(v.strides, v.shape)):
    if st == 0 or n == 1: continue
    j = next((j for j in dims_ if st % cs[j] == 0 and (j == dims_[0] or abs(st) < cs[j] * src_shape[j])), None)
    if j is None: return None
    terms[j].append((d, st // cs[j]))
  # the valid region's first element fixes each source dim's offset
  first = v.offset + sum(st * lo for st, (lo, _hi) in zip(v.strides, mask))
  if first < 0 or first >= prod(src_shape): return None
  out = []
  for j, n in enumerate(src_shape):
    at = (first // cs[j]) % n if n > 1 else 0
    off = at - sum(k * mask[d][0] for d, k in terms[j])
    lo = off + sum(k * (mask[d][0] if k > 0 else mask[d][1] - 1) for d, k in terms[j])
    hi = off + sum(k * (mask[d][1] - 1 if k > 0 else mask[d][0]) for d, k in terms[j])
    if lo < 0 or hi >= n: return None
    x = sym.const(off)
    for d, k in terms[j]: x = x + sym.mul(idx[d], k)
    out.append(x)
  return tuple(out)


class _Builder:
  def __init__(self, outputs: list[Node], is_boundary, on_expand=None, on_pad=None):
    self.outputs, self.is_boundary = outputs, is_boundary
    # the scheduler's broadcast rule, asked as each broadcast source is met: a cut stops the evaluation there (a
    # long recurrent chain evaluated whole before each cut made scheduling quadratic in its length)
    self.on_expand, self.on_pad = on_expand, on_pad
    self.inputs: list[Node] = []          # boundary nodes in order of first use
    self.input_pos: dict[int, int] = {}
    self.params: list = []                # the nodes whose values are kernel arguments (param_value), by slot;
    self.param_pos: dict = {}             # None for a load's residual offset (its value in `residuals`)
    self.residuals: dict[int, int] = {}
    self.memo: dict = {}
    self.reduce_instances: dict[int, list] = {}
    self.instances: dict[int, int] = {}   # id(node) -> how many different indices it was evaluated at
    self.nloop = 0
    self.ends: dict = {}          # loop variable of a runtime-sized dim (graph/dims.py) -> its size's argument
    self.broadcasts: list = []    # (source node, its value, elements it is broadcast to) of each broadcasting view
    self.expanded: list = []      # computed sources of broadcasting views, in evaluation order (schedule rules judge them)

  def buf(self, n: Node) -> int:
    if id(n) not in self.input_pos:
      self.input_pos[id(n)] = len(self.outputs) + len(self.inputs)
      self.inputs.append(n)
    return self.input_pos[id(n)]

  def _slot(self, key, n: Node | None, residual: int = 0) -> int:
    """The argument slot of key (a node's id, or a residual offset), made on first use."""
    if key not in self.param_pos:
      self.param_pos[key] = len(self.params)
      self.params.append(n)
      if n is None: self.residuals[len(self.params) - 1] = residual
    return self.param_pos[key]

  def param(self, n: Node) -> Param:
    return Param(self._slot(id(n), n), n.dtype)

  def offset_param(self, n: Node) -> sym.ArgVar:
    """The offset of view n into the buffer it reads (a leaf's), as a kernel argument: reads of the same buffer
    at another offset (a cache position, a slice's start) share the program, and the scheduler keys such a view
    without its offset (schedule._view_key), so they share the kernel too."""
    slot = self._slot(id(n), n)
    return sym.ArgVar(f"p{slot}", -OFFSET_BOUND, OFFSET_BOUND, slot)

  def residual_param(self, value: int) -> sym.ArgVar:
    """What is left of a load's constant offset once its own view's is an argument (outer views' offsets folded
    through elementwise ops: an RNN's step t reading a projection plus a bias): an argument too, whose value
    belongs to this kernel (it is part of the structure the kernel was lowered for), so the program is shared."""
    slot = self._slot(("residual", value), None, value)
    return sym.ArgVar(f"p{slot}", -OFFSET_BOUND, OFFSET_BOUND, slot)

  def dim_var(self, name: str, n: Node, axis: int) -> sym.Var | None:
    """The loop variable of dim `axis` of n (None for a plain dim of size 1). A runtime size (graph/dims.BoundDim)
    loops over its Variable's bound; its value is an argument (one per Variable and value) that ends the loop and
    guards it (build)."""
    size = n.shape[axis]
    if not dims.is_bound(size): return sym.Var(name, 0, size - 1) if size > 1 else None
    v = sym.Var(name, 0, size.var.hi - 1)
    slot = self._slot(("dim", size.var, int(size)), DimOf(n, axis))
    self.ends[v] = sym.ArgVar(f"p{slot}", size.var.lo, size.var.hi, slot)
    return v

  def _below_negations(self, src: Node) -> Node:
    """The node a cut of src stores: below a negation (free; a concatenation's part is negated twice to be padded
    with -0.0, tensor.cat) and the views that read each element once around it, so the value stored is the one its
    other readers share (an LSTM step's h, unsqueezed and stacked: not a copy of it)."""
    x, negated = src, False
    while not self._is_leaf(x) and x.op in ("NEG", "VIEW") and not self._is_leaf(x.src[0]):
      if x.op == "VIEW" and (x.arg.mask is not None or x.numel != x.src[0].numel or
                             any(st == 0 and n > 1 for st, n in zip(x.arg.strides, x.arg.shape))): break
      negated |= x.op == "NEG"
      x = x.src[0]
    return x if negated else src

  def ev(self, n: Node, idx: tuple, gate: sym.Cond):
    key = (id(n), idx, gate)
    v = self.memo.get(key)
    if v is None:
      self.instances[id(n)] = self.instances.get(id(n), 0) + 1
      v = self.memo[key] = self._ev(n, idx, gate)
    return v

  def _leaf(self, n: Node, flat, valid: sym.Cond):
    """A load-like value at a flat position of a contiguous leaf."""
    if valid.false: return Const(0 if not n.dtype.is_bool else False, n.dtype)
    if n.op == "CONST" and not n.realized:
      c = self.param(n) if is_runtime_value(n.arg, n.dtype) else Const(n.arg, n.dtype)
      return c if valid.is_true else Alu("WHERE", n.dtype, (Valid(valid, dt.bool_), c, Const(n.dtype.np(0).item(), n.dtype)))
    if n.op == "IOTA" and not n.realized: return round16(Index(flat, valid, n.dtype))   # 2049 is no float16
    flat = sym.simplify_under(flat, valid)   # the index is used only where valid holds
    if flat.const: flat = flat - flat.const + self.residual_param(flat.const)
    return Load(self.buf(n), flat, valid, n.dtype)

  def operands(self, col: sym.Var, merged: dict | None = None) -> list:
    """The broadcast operands of a register-tiled reduction (a matmul's a and b) whose tile's column axis is `col`:
    (source node, its value varies along col, it is more than stride-1 loads along col, elements it is broadcast
    to), for the schedule's rule on operands recomputed per block (schedule/rules.tile_operands). `merged`: the
    output variables the built kernel merged (merge_axes), as expressions over its own."""
    out = []
    for src, val, bcast in self.broadcasts:
      if merged: val = substitute([val], merged)[0]
      along = col in dependencies([val])[id(val)]
      strided = False
      if along:
        loads = [x for x in toposort([val]) if isinstance(x, (Load, Gather))]
        strided = any(not isinstance(x, Load) or not x.valid.is_true or dict(x.idx.terms).get(col) not in (0, 1)
                      for x in loads)
      out.append((src, along, strided, bcast))
    return out

  def _is_leaf(self, n: Node) -> bool:
    return (self.is_boundary(n) and n not in self.outputs) or n.op in ("CONST", "IOTA") or n.realized

  def _ev(self, n: Node, idx, gate):
    if self._is_leaf(n):   # a buffer is laid out by its storage shape (a runtime size at its bound: graph/dims.py)
      buffer = n.op not in ("CONST", "IOTA") or n.realized
      return self._leaf(n, ravel(idx, dims.storage_shape(n.shape) if buffer else n.shape), gate)
    if n.op == "VIEW":
      flat, valid = n.arg.index(idx)
      src = n.src[0]
      if valid.false: return Const(n.dtype.np(0).item(), n.dtype)   # padding only: the source is not read
      if self._is_leaf(src):
        if src.op not in ("CONST", "IOTA") or src.realized:   # a load: its offset is an argument
          if dims.tags(src.shape):   # a buffer laid out by its storage shape: the view's position moved there (the
            # offset stays: schedule._view_key keys such a view with it)
            flat = ravel(_per_dim(n.arg, src.shape, idx) or sym.unravel(flat, src.shape), dims.storage_shape(src.shape))
          else: flat = flat - n.arg.offset + self.offset_param(n)
        return self._leaf(src, flat, gate & valid)
      if not valid.is_true and self.on_pad is not None:
        why = self.on_pad(src, self._is_leaf)
        if why: raise NeedsRealize(self._below_negations(src), why)
      if any(st == 0 and s > 1 for st, s in zip(n.arg.strides, n.arg.shape)) and src not in self.expanded:
        self.expanded.append(src)
        why = self.on_expand(src, self._is_leaf) if self.on_expand is not None else None
        if why: raise NeedsRealize(self._below_negations(src), why)
      inner = self.ev(src, (dims.tags(src.shape) and _per_dim(n.arg, src.shape, idx)) or
                      (not dims.tags(src.shape) and _aligned(n.arg, src.shape, idx)) or sym.unravel(flat, src.shape),
                      gate & valid)
      bcast = prod(sz for st, sz in zip(n.arg.strides, n.arg.shape) if st == 0)
      if bcast > 1: self.broadcasts.append((src, inner, bcast))
      if valid.is_true: return inner
      return Alu("WHERE", n.dtype, (Valid(valid, dt.bool_), inner, Const(n.dtype.np(0).item(), n.dtype)))
    if n.op == "REDUCE":
      op, axes = n.arg
      src = n.src[0]
      loops, new_idx = [], list(idx)
      for a in axes:
        v = self.dim_var(f"r{self.nloop}", src, a) or sym.Var(f"r{self.nloop}", 0, 0)
        self.nloop += 1
        loops.append(v)
        new_idx[a] = sym.lin(v)
      r = Reduce(op, n.dtype, tuple(loops), self.ev(src, tuple(new_idx), gate))
      self.reduce_instances.setdefault(id(n), []).append((n, r))
      # a 16-bit sum accumulates in float32 and rounds once, as PyTorch's does
      return round16(r) if op in ("SUM", "PROD") else r
    if n.op == "GATHER":  # the data is a realized contiguous buffer (the scheduler made sure)
      data = n.src[0]
      return Gather(self.buf(data), dims.storage_numel(data.shape), self.ev(n.src[1], idx, gate), n.dtype)
    if n.op == "CONTIGUOUS": return self.ev(n.src[0], idx, gate)
    if n.op in ops.CONVERT: return Alu(n.op, n.dtype, (self.ev(n.src[0], idx, gate),))
    v = Alu(n.op, n.dtype, tuple(self.ev(s, idx, gate) for s in n.src))
    # every op's result is the value of its dtype, whatever the kernel cut: 16-bit floats round after each op
    return v if n.op in EXACT_OPS else round16(v)


def _alu_count(n: Node, is_leaf, limit: int, cost: dict | None = None, masked: int = 0) -> int:
  """ALU ops computing n inside a kernel (up to leaves and reductions), counting no further than limit;
  `cost` weighs some ops more than one, and a read through padding (a view with a mask) counts `masked`. A negation
  counts nothing (a sign flip; tensor.cat negates each part twice to pad it with -0.0)."""
  seen, stack, count = set(), [n], 0
  while stack and count <= limit:
    x = stack.pop()
    if id(x) in seen or is_leaf(x) or x.op == "REDUCE": continue
    seen.add(id(x))
    # widening a 16-bit float to float32 is free: its load already gives float32
    widen = x.op == "CAST" and x.dtype == dt.float32 and x.src[0].dtype in (dt.float16, dt.bfloat16)
    if x.op not in ("VIEW", "CONTIGUOUS", "NEG") and not widen: count += cost.get(x.op, 1) if cost else 1
    elif masked and x.op == "VIEW" and x.arg.mask is not None: count += masked
    stack.extend(x.src)
  return count


def _nodes_below(outputs: list[Node], is_leaf) -> list[Node]:
  out, seen, stack = [], set(), list(outputs)
  while stack:
    x = stack.pop()
    if id(x) in seen: continue
    seen.add(id(x))
    out.append(x)
    if not (is_leaf(x) and x not in outputs): stack.extend(x.src)
  return out


class Fusion:
  """What lowering's first pass found in a fused group: the facts the schedule's cost rules (schedule/rules.py)
  judge before the kernel is built. Extents are element counts of loop variables."""

  def __init__(self, outputs: list[Node], b: _Builder, vals: list, ovars: tuple, oidx: tuple):
    self.outputs, self.b, self.vals, self.ovars, self.oidx = outputs, b, vals, ovars, oidx
    self.is_leaf = b._is_leaf
    self.numel = prod(outputs[0].shape)
    self.deps = deps = dependencies(vals)
    self.out_vars = out_vars = {v for v in ovars if v is not None}
    self.reduces = reduces = [(inst[0][0], inst[0][1]) for inst in b.reduce_instances.values()]
    gset = set(out_vars)
    for _, r in reduces: gset &= deps[id(r)]
    self.gset = gset
    # computed sources of broadcasting views, and the non-reduction nodes evaluated at several indices
    self.expanded: list[Node] = b.expanded
    self.repeated = [n for n in _nodes_below(outputs, b._is_leaf) if b.instances.get(id(n), 0) > 1 and n.op != "REDUCE"]
    # (inner reduction node, its loop extent, the extent of the outer loop vars it depends on) for each reduction
    # evaluated inside another's loop (it runs again in each of those iterations)
    node_of = {id(r): n for n, r in reduces}
    self.nested = []
    for _, r in reduces:
      for x in toposort([r.src]):
        if isinstance(x, Reduce) and x is not r and not any(node_of[id(x)] is o for o in outputs):
          self.nested.append((node_of[id(x)], _extent(x.loops), _extent(deps[id(x)] & set(r.loops))))
    # parallel work: the extent of the dims every reduction depends on (GLOBAL), of all output dims, and per
    # reduction that is not an output the extent of the output dims it depends on
    self.parallel, self.full = _extent(gset), _extent(out_vars)
    self.inner = [(n, _extent(deps[id(r)] & out_vars)) for n, r in reduces if not any(n is o for o in outputs)]

  # the output variables the built kernel merged (build: merge_axes), as expressions over the kernel's own
  merged: dict = {}

  def operands(self, col: sym.Var) -> list: return self.b.operands(col, self.merged)


def _extent(vs) -> int: return prod(v.hi + 1 for v in vs)


def analyze(outputs: list[Node], is_boundary, on_expand=None, on_pad=None) -> Fusion:
  """Lowering's first pass over the nodes `outputs` (one shape, one device): each node evaluated at its index.
  Raises NeedsRealize where the fusion cannot be expressed as one kernel, or where `on_expand(source, is_leaf)`
  names a reason to cut a broadcast source (`on_pad`: a source read through padding)."""
  shape = outputs[0].shape
  b = _Builder(outputs, is_boundary, on_expand, on_pad)
  ovars = tuple(b.dim_var(f"o{d}", outputs[0], d) for d in range(len(shape)))
  oidx = tuple(sym.lin(v) if v is not None else sym.const(0) for v in ovars)
  vals = [b.ev(n, oidx, sym.TRUE) for n in outputs]
  # the canonical kernel has one set of REDUCE axes per reduction
  for nid, inst in b.reduce_instances.items():
    if len(inst) > 1: raise NeedsRealize(inst[0][0], "structural: a reduction evaluated at several indices")
  return Fusion(outputs, b, vals, ovars, oidx)


def build(f: Fusion) -> tuple[Kernel, list[Node]]:
  """The canonical kernel of an analyzed fusion: parallel dims GLOBAL, the others LOOP (in output order), then
  the reductions' axes. Returns it and its input nodes (its Param nodes, by slot, are f.b.params)."""
  b, vals, ovars, oidx, gset, reduces = f.b, f.vals, f.ovars, f.oidx, f.gset, f.reduces
  shape = f.outputs[0].shape
  gvars = tuple(v for v in ovars if v in gset)
  gsize = _extent(gvars)
  ends = b.ends
  axes = [Axis(v, AxisKind.GLOBAL if v in gset else AxisKind.LOOP, ends.get(v)) for v in ovars if v is not None]
  for _, r in reduces: axes += [Axis(v, AxisKind.REDUCE, ends.get(v)) for v in r.loops]
  flat_out = ravel(oidx, dims.storage_shape(shape))
  # a store of a 16-bit float rounds by itself: the value's own round16 would be done twice
  stores = tuple(Store(i, flat_out, v.src[0] if is_round16(v) else v) for i, v in enumerate(vals))
  bufs = tuple(BufferArg(n.dtype, dims.storage_numel(n.shape), True) for n in f.outputs) + \
         tuple(BufferArg(n.dtype, dims.storage_numel(n.shape), False) for n in b.inputs)
  kind = "r" if reduces else "E"
  name = f"{kind}_{'_'.join(str(s) for s in dims.dim_key(shape)) or 'scalar'}"
  flops, weighted = _estimate_flops(vals, gsize, gvars)
  k = Kernel(name, bufs, tuple(axes), stores, flops, cost=weighted + sum(b.size for b in bufs),
             params=tuple(dt.int64 if n is None or type(n) is DimOf or n.op == "VIEW" else n.dtype for n in b.params),
             example=tuple(b.residuals[i] if n is None else param_value(n) for i, n in enumerate(b.params)))
  k, f.merged = merge_axes(k)
  # a runtime-sized dim computes nothing past its size (its loop also ends there: Axis.end)
  for v, end in ends.items(): k = guard(k, v, sym.Cond.range(sym.lin(v) - end, sym.bounds(sym.lin(v) - end)[0], 0))
  return replace(k, arg_vars=arg_vars(k)), b.inputs


def merge_axes(k: Kernel) -> tuple[Kernel, dict]:
  """k with each pair of neighbouring output axes of one kind (GLOBAL or LOOP) that every index and condition reads
  as one position merged into one axis, and {old variable: expression over the merged one}. a and b are read as one
  where neither is inside a floor division or modulo and every expression's coefficient of a is size(b) times its
  coefficient of b (both may be 0): contiguous in every buffer that moves along them, a reshape's dims. The optimizer
  then sees the output as the memory holds it: a reduction stored through a reshape ([8, 9216] as [8, 64, 12, 12], a
  Linear layer's input gradient shaped as the pooled activation) has a column axis a register tile's vectors divide,
  and an index needs no division back into dims. Axes of a runtime size are left alone."""
  exprs = [st.idx for st in k.stores] + [x for st in k.stores for x, _, _ in st.valid.parts]
  for x in toposort([st.value for st in k.stores]):
    if isinstance(x, (Load, Index)): exprs += [x.idx] + [e for e, _, _ in x.valid.parts]
    elif isinstance(x, Valid): exprs += [e for e, _, _ in x.cond.parts]
  # each expression's coefficients of the variables it holds as terms; the variables inside a division or modulo
  table, nested = [], set()
  for e in exprs:
    coefs: dict = {}
    for atom, c in sym.lin(e).terms:
      if isinstance(atom, sym.Var): coefs[atom] = coefs.get(atom, 0) + c
      else: nested |= sym.variables(atom)
    table.append(coefs)
  axes, groups = list(k.axes), [[a] for a in k.axes]   # the canonical axes each axis stands for
  i = 0
  while i + 1 < len(axes):
    a, b = axes[i], axes[i + 1]
    if a.kind is b.kind and a.kind in (AxisKind.GLOBAL, AxisKind.LOOP) and a.end is None and b.end is None and \
       a.var not in nested and b.var not in nested and all(t.get(a.var, 0) == b.size * t.get(b.var, 0) for t in table):
      v = sym.Var(groups[i][0].var.name, 0, a.size * b.size - 1)
      for t in table:
        cb = t.pop(b.var, 0)
        t.pop(a.var, None)
        if cb: t[v] = cb
      axes[i:i + 2], groups[i:i + 2] = [Axis(v, a.kind)], [groups[i] + groups[i + 1]]
      continue
    i += 1
  env = {}
  for ax, g in zip(axes, groups):
    if len(g) > 1: env.update(zip((x.var for x in g), sym.unravel(sym.lin(ax.var), tuple(x.size for x in g))))
  return (substitute_kernel(k, env, axes=tuple(axes)), env) if env else (k, env)


def lower(outputs: list[Node], is_boundary) -> tuple[Kernel, list[Node]]:
  """Lower the nodes `outputs` (one shape, one device) into a Kernel, whatever it costs (the scheduler asks its
  rules first: schedule.lower_cached); returns it and its input nodes."""
  return build(analyze(outputs, is_boundary))


def _estimate_flops(vals, gsize: int, gvars: tuple) -> tuple[int, int]:
  """(flops, the same with transcendental functions weighted by their cost)."""
  deps = dependencies(vals)
  total = weighted = 0
  for v in toposort(vals):
    if isinstance(v, (Alu, Reduce)) and not (isinstance(v, Alu) and v.op in ("CAST", "BITCAST", "WHERE")):
      n = gsize
      for var in deps[id(v)] if isinstance(v, Alu) else deps[id(v.src)]:
        if var not in gvars: n *= var.hi + 1
      total += n
      weighted += n * (_WORK_COST.get(v.op, 1) if isinstance(v, Alu) else 1)
  return total, weighted
