"""Lowering: a fused group of graph nodes becomes one Kernel.

Every node is evaluated *at an index*: a tuple of symbolic expressions over the output's loop
variables. Views rewrite the index (and add validity), elementwise ops evaluate their sources at
the same index, and a reduction opens loops for its axes. Memoising (node, index) shares work, so
a reduction expanded back over the axis it reduced (softmax's max) is computed once per row and
then reused by the loop over that row.

The lowering also judges the fusion it was handed: if a reduction would be computed redundantly
or would leave too little parallel work, it raises NeedsRealize naming the node that should get a
kernel (and a buffer) of its own; the scheduler then cuts there and tries again.
"""
from __future__ import annotations
from fusegrad import dtype as dt
from fusegrad.graph import symbolic as sym
from fusegrad.graph.node import Node
from fusegrad.graph.view import prod, contiguous_strides
from fusegrad.codegen.ir import (Gather, Load, Const, Index, Valid, Alu, Reduce, BufferArg, Store, Kernel, toposort,
                                 dependencies, substitute, round16, is_round16, EXACT_OPS)

# a fused kernel must keep at least this many independent work items, unless the output is smaller
MIN_PARALLEL = 64
# partial accumulators for a reduction whose innermost axis divides evenly (see ir.Reduce.lanes)
REDUCE_LANES = 8
# register blocking of a reduction kernel: each work item computes a ROW_LANES x OUT_LANES block of
# outputs over the last two parallel dims (or OUT_LANES over the last one), so a matmul's inner loop
# reads a contiguous row of the right operand once for ROW_LANES rows
OUT_LANES = (16,)   # candidates, the first dividing the columns wins (32 measured far slower with gcc's SLP)
ROW_LANES = 4
# ...but a kernel this small runs fused anyway: splitting it would cost more launches than it saves
SERIAL_OK = 1 << 14
# a reduction of at least this many elements, recomputed inside another reduction's loop, gets its own kernel
NESTED_MIN = 8
# a computed value broadcast by a view is recomputed for every element it is broadcast to; past
# this many ALU ops it gets a buffer of its own instead (randn feeding a matmul, say)
EXPAND_RECOMPUTE_OPS = 6


# a computed operand of a register-blocked kernel is recomputed once per block of rows (the column operand)
# or of columns (the row operand): past this many blocks it is stored instead
BLOCK_RECOMPUTE = 16
# transcendental functions cost several ALU ops (a polynomial, or a libm call)
_OP_COST = {op: 4 for op in ("EXP", "LOG", "SIN", "COS", "TAN", "TANH", "ERF", "ATAN", "ATAN2")}
# ...and for the work estimate (Kernel.cost) sin/cos/tan/atan are libm calls that do not vectorize
_WORK_COST = {**_OP_COST, "SIN": 16, "COS": 16, "TAN": 16, "ATAN": 16, "ATAN2": 16}


class NeedsRealize(Exception):
  def __init__(self, node: Node, why: str):
    super().__init__(why)
    self.node, self.why = node, why


def ravel(idx, shape) -> sym.Lin:
  out = sym.const(0)
  for i, st in zip(idx, contiguous_strides(shape)):
    if st: out = out + sym.mul(i, st)
  return out


def unravel(flat, shape) -> tuple:
  out = []
  for d, (s, st) in enumerate(zip(shape, contiguous_strides(shape))):
    if s == 1: out.append(sym.const(0)); continue
    q = sym.div(flat, st)
    out.append(q if d == 0 else sym.mod(q, s))
  return tuple(out)


class _Builder:
  def __init__(self, outputs: list[Node], is_boundary):
    self.outputs, self.is_boundary = outputs, is_boundary
    self.inputs: list[Node] = []          # boundary nodes in order of first use
    self.input_pos: dict[int, int] = {}
    self.memo: dict = {}
    self.reduce_instances: dict[int, list] = {}
    self.instances: dict[int, int] = {}   # id(node) -> how many different indices it was evaluated at
    self.nloop = 0
    self.out_lanes = ()      # the output lane loop variables, when the kernel is register-blocked

  def buf(self, n: Node) -> int:
    if id(n) not in self.input_pos:
      self.input_pos[id(n)] = len(self.outputs) + len(self.inputs)
      self.inputs.append(n)
    return self.input_pos[id(n)]

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
      return Const(n.arg, n.dtype) if valid.is_true else \
        Alu("WHERE", n.dtype, (Valid(valid, dt.bool_), Const(n.arg, n.dtype), Const(n.dtype.np(0).item(), n.dtype)))
    if n.op == "IOTA" and not n.realized: return round16(Index(flat, valid, n.dtype))   # 2049 is no float16
    return Load(self.buf(n), flat, valid, n.dtype)

  def _check_operand(self, src: Node, val, bcast: int) -> None:
    """A broadcast operand of a register-blocked reduction (a matmul's a or b). The one that varies along
    the column lanes is the vectorized inner loop: it must be a plain stride-1 load. The other is computed
    once per block of columns: an expensive one is stored once instead of recomputed per block."""
    col = self.out_lanes[-1]
    ops = _alu_count(src, self._is_leaf, EXPAND_RECOMPUTE_OPS, _OP_COST)
    if col in dependencies([val])[id(val)]:
      loads = [x for x in toposort([val]) if isinstance(x, (Load, Gather))]
      strided = any(not isinstance(x, Load) or not x.valid.is_true or dict(x.idx.terms).get(col) not in (0, 1)
                    for x in loads)
      # each element is recomputed once per block of the rows it is broadcast over
      if strided or ops > EXPAND_RECOMPUTE_OPS or (ops and bcast // ROW_LANES >= BLOCK_RECOMPUTE):
        raise NeedsRealize(src, "a computed operand read across the vectorized column lanes")
    elif ops > EXPAND_RECOMPUTE_OPS or (ops and bcast // (col.hi + 1) >= BLOCK_RECOMPUTE):
      raise NeedsRealize(src, "a computed operand recomputed for every block of columns")

  def _is_leaf(self, n: Node) -> bool:
    return (self.is_boundary(n) and n not in self.outputs) or n.op in ("CONST", "IOTA") or n.realized

  def _ev(self, n: Node, idx, gate):
    if self._is_leaf(n): return self._leaf(n, ravel(idx, n.shape), gate)
    if n.op == "VIEW":
      flat, valid = n.arg.index(idx)
      src = n.src[0]
      if valid.false: return Const(n.dtype.np(0).item(), n.dtype)   # padding only: the source is not read
      if self._is_leaf(src): return self._leaf(src, flat, gate & valid)
      if any(st == 0 and s > 1 for st, s in zip(n.arg.strides, n.arg.shape)) and \
         _alu_count(src, self._is_leaf, EXPAND_RECOMPUTE_OPS) > EXPAND_RECOMPUTE_OPS:
        raise NeedsRealize(src, "an expensive value broadcast by a view would be recomputed per element")
      inner = self.ev(src, unravel(flat, src.shape), gate & valid)
      bcast = prod(sz for st, sz in zip(n.arg.strides, n.arg.shape) if st == 0)
      if self.out_lanes and bcast > 1: self._check_operand(src, inner, bcast)
      if valid.is_true: return inner
      return Alu("WHERE", n.dtype, (Valid(valid, dt.bool_), inner, Const(n.dtype.np(0).item(), n.dtype)))
    if n.op == "REDUCE":
      op, axes = n.arg
      src = n.src[0]
      loops, new_idx = [], list(idx)
      lanes = 1
      for a in axes:
        size = src.shape[a]
        if a == axes[-1] and size % REDUCE_LANES == 0 and size >= 4 * REDUCE_LANES and not self.out_lanes:
          lanes = REDUCE_LANES
          v = sym.Var(f"r{self.nloop}", 0, size // lanes - 1)
          u = sym.Var(f"u{self.nloop}", 0, lanes - 1)
          loops += [v, u]
          new_idx[a] = sym.lin(v) * lanes + u
        else:
          v = sym.Var(f"r{self.nloop}", 0, size - 1)
          loops.append(v)
          new_idx[a] = sym.lin(v)
        self.nloop += 1
      body = self.ev(src, tuple(new_idx), gate)
      bdeps = dependencies([body])[id(body)]
      lvs = tuple(v for v in self.out_lanes if v in bdeps)
      if lvs:
        # one accumulator per output lane: the lane loops run innermost, inside the reduction's loops
        ws = tuple(sym.Var(f"w{self.nloop}_{i}", 0, lv.hi) for i, lv in enumerate(lvs))
        body = substitute([body], {lv: sym.lin(w) for lv, w in zip(lvs, ws)})[0]
        r = Reduce(op, n.dtype, tuple(loops) + ws, body, prod(lv.hi + 1 for lv in lvs), lvs)
      else:
        r = Reduce(op, n.dtype, tuple(loops), body, lanes)
      self.reduce_instances.setdefault(id(n), []).append((n, r))
      # a 16-bit sum accumulates in float32 and rounds once, as PyTorch's does
      return round16(r) if op in ("SUM", "PROD") else r
    if n.op == "GATHER":  # the data is a realized contiguous buffer (the scheduler made sure)
      data = n.src[0]
      return Gather(self.buf(data), data.numel, self.ev(n.src[1], idx, gate), n.dtype)
    if n.op == "CONTIGUOUS": return self.ev(n.src[0], idx, gate)
    if n.op == "CAST": return Alu(n.op, n.dtype, (self.ev(n.src[0], idx, gate),))
    v = Alu(n.op, n.dtype, tuple(self.ev(s, idx, gate) for s in n.src))
    # every op's result is the value of its dtype, whatever the kernel cut: 16-bit floats round after each op
    return v if n.op in EXACT_OPS else round16(v)


def _alu_count(n: Node, is_leaf, limit: int, cost: dict | None = None) -> int:
  """ALU ops computing n inside a kernel (up to leaves and reductions), counting no further than limit;
  `cost` weighs some ops more than one."""
  seen, stack, count = set(), [n], 0
  while stack and count <= limit:
    x = stack.pop()
    if id(x) in seen or is_leaf(x) or x.op == "REDUCE": continue
    seen.add(id(x))
    # widening a 16-bit float to float32 is free: its load already gives float32
    widen = x.op == "CAST" and x.dtype == dt.float32 and x.src[0].dtype in (dt.float16, dt.bfloat16)
    if x.op not in ("VIEW", "CONTIGUOUS") and not widen: count += cost.get(x.op, 1) if cost else 1
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


def _reused_without(var, reduces, deps) -> bool:
  """Does some reduction read memory, inside its loops, at an index that does not depend on var?
  Then a block of outputs along var shares that read: register blocking along var pays."""
  for _, r in reduces:
    loops = set(r.loops)
    for x in toposort([r.src]):
      if isinstance(x, (Load, Gather)) and var not in deps[id(x)] and deps[id(x)] & loops: return True
  return False


def _columns_contiguous(var, reduces) -> bool:
  """Does every read inside the reductions step by 1 along var and by more along the reduction (a sum
  over rows, a bias gradient)? Then a block of columns per work item is one vector add per row."""
  loads = [x for _, r in reduces for x in toposort([r.src]) if isinstance(x, (Load, Gather))]
  if not loads: return False
  for x in loads:
    if not isinstance(x, Load): return False
    terms = dict(sym.lin(x.idx).terms)
    if terms.get(var) != 1: return False
    if any(isinstance(a, sym.Var) and a.name[0] in "ru" and k == 1 for a, k in terms.items()): return False
  return True


def lower(outputs: list[Node], is_boundary) -> tuple[Kernel, list[Node]]:
  """Lower the nodes `outputs` (one shape, one device) into a Kernel; returns it and its input nodes."""
  shape = outputs[0].shape
  ovars = tuple(sym.Var(f"o{d}", 0, s - 1) if s > 1 else None for d, s in enumerate(shape))
  oidx = tuple(sym.lin(v) if v is not None else sym.const(0) for v in ovars)

  # pass 1: build with one variable per output dim, to decide which dims run in parallel
  b = _Builder(outputs, is_boundary)
  vals = [b.ev(n, oidx, sym.TRUE) for n in outputs]
  for nid, inst in b.reduce_instances.items():
    if len(inst) > 1: raise NeedsRealize(inst[0][0], "reduction evaluated at several indices")
  for n in _nodes_below(outputs, b._is_leaf):
    if b.instances.get(id(n), 0) > 1 and n.op != "REDUCE" and \
       _alu_count(n, b._is_leaf, EXPAND_RECOMPUTE_OPS) > EXPAND_RECOMPUTE_OPS:
      raise NeedsRealize(n, "an expensive value would be computed at several indices")
  deps = dependencies(vals)
  out_vars = {v for v in ovars if v is not None}
  reduces = [(inst[0][0], inst[0][1]) for inst in b.reduce_instances.values()]
  gset = set(out_vars)
  for _, r in reduces: gset &= deps[id(r)]
  extent = lambda vs: prod(v.hi + 1 for v in vs)
  # a reduction recomputed in every iteration of another's loop ((a @ b).sum()) runs serially and unblocked;
  # stored by a kernel of its own it gets the parallel dims and register blocking a matmul needs
  node_of = {id(r): n for n, r in reduces}
  for _, r in reduces:
    for x in toposort([r.src]):
      if isinstance(x, Reduce) and x is not r and not any(node_of[id(x)] is o for o in outputs):
        per = deps[id(x)] & set(r.loops)
        if extent(x.loops) >= NESTED_MIN and extent(x.loops) * extent(per) >= SERIAL_OK:
          raise NeedsRealize(node_of[id(x)], "a reduction recomputed in every iteration of another's loop")
  if reduces and extent(gset) < min(MIN_PARALLEL, prod(shape)) and extent(gset) < extent(out_vars) and \
     prod(shape) >= SERIAL_OK:
    # too little parallel work: give the reduction that depends on the fewest dims its own kernel (an output
    # of this kernel already is one: its dims it does not depend on become loops, there is no better cut)
    inner = [nr for nr in reduces if not any(nr[0] is o for o in outputs)]
    if inner:
      n, _ = min(inner, key=lambda nr: extent(deps[id(nr[1])] & out_vars))
      raise NeedsRealize(n, "fusing this reduction leaves too little parallel work")

  # pass 2: rebuild with the parallel dims expressed through one flat index
  gvars = tuple(v for v in ovars if v in gset)
  loops = tuple(v for v in ovars if v is not None and v not in gset)
  blocked = []    # (original parallel var, lane var)
  nested = any(isinstance(x, Reduce) for _, r in reduces for x in toposort([r.src]))
  cols = next((c for c in OUT_LANES if gvars and (gvars[-1].hi + 1) % c == 0), None)
  if reduces and not loops and not nested and cols and \
     ((extent(gvars) // cols >= MIN_PARALLEL and _reused_without(gvars[-1], reduces, deps)) or
      (extent(gvars) // cols >= 4 and _columns_contiguous(gvars[-1], reduces))):
    # register blocking: the last parallel dims become (parallel, lane)
    blocked.append((gvars[-1], cols))
    if len(gvars) >= 2 and (gvars[-2].hi + 1) % ROW_LANES == 0 and \
       extent(gvars) // (cols * ROW_LANES) >= MIN_PARALLEL and _reused_without(gvars[-2], reduces, deps):
      blocked.insert(0, (gvars[-2], ROW_LANES))
    blocked = [(g, sym.Var(g.name + "o", 0, (g.hi + 1) // n - 1), sym.Var(f"l{i}", 0, n - 1))
               for i, (g, n) in enumerate(blocked)]
    swap = {g: go for g, go, _ in blocked}
    gvars = tuple(swap.get(g, g) for g in gvars)
    if len(blocked) == 2:   # walk row blocks fastest: neighbouring work items share a panel of columns in cache
      gvars = gvars[:-2] + (gvars[-1], gvars[-2])
    loops = tuple(lv for _, _, lv in blocked)
  gsize = extent(gvars)
  gidx = sym.Var("gidx", 0, max(gsize - 1, 0))
  env: dict = {}
  acc = 1
  for v in reversed(gvars):
    q = sym.div(gidx, acc)
    env[v] = q if v is gvars[0] else sym.mod(q, v.hi + 1)
    acc *= v.hi + 1
  for g, go, lv in blocked: env[g] = env.pop(go) * (lv.hi + 1) + lv
  idx = tuple(env.get(v, sym.lin(v)) if v is not None else sym.const(0) for v in ovars)
  b = _Builder(outputs, is_boundary)
  b.out_lanes = tuple(lv for _, _, lv in blocked)
  vals = [b.ev(n, idx, sym.TRUE) for n in outputs]
  flat_out = ravel(idx, shape)
  # a store of a 16-bit float rounds by itself: the value's own round16 would be done twice
  stores = tuple(Store(i, flat_out, v.src[0] if is_round16(v) else v) for i, v in enumerate(vals))
  bufs = tuple(BufferArg(n.dtype, n.numel, True) for n in outputs) + \
         tuple(BufferArg(n.dtype, n.numel, False) for n in b.inputs)
  kind = "r" if reduces else "E"
  name = f"{kind}_{'_'.join(str(s) for s in shape) or 'scalar'}"
  flops, weighted = _estimate_flops(vals, gsize)
  k = Kernel(name, bufs, gvars, loops, stores, flops, gidx, cost=weighted + sum(b.size for b in bufs))
  return k, b.inputs


def _estimate_flops(vals, gsize: int) -> tuple[int, int]:
  """(flops, the same with transcendental functions weighted by their cost)."""
  deps = dependencies(vals)
  total = weighted = 0
  for v in toposort(vals):
    if isinstance(v, (Alu, Reduce)) and not (isinstance(v, Alu) and v.op in ("CAST", "WHERE")):
      n = gsize
      for var in deps[id(v)] if isinstance(v, Alu) else deps[id(v.src)]:
        if var.name != "gidx": n *= var.hi + 1
      total += n
      weighted += n * (_WORK_COST.get(v.op, 1) if isinstance(v, Alu) else 1)
  return total, weighted
