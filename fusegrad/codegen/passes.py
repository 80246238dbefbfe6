"""Passes from an optimized Kernel to one the linearizer takes: register axes expanded, work-item indices bound.

expand: every UPCAST/UNROLL axis is instantiated at each of its indices. A value that depends on an upcast
output axis becomes one value per index (a register tile's outputs, each with its own accumulator sharing one
loop); an upcast reduction axis becomes several accumulators folded after the loop (and before the work-group
combines its items' partials, where the reduction is grouped); an unrolled reduction axis becomes several updates of
one accumulator per iteration, in the loop's order.

dedupe: values equal in structure become one value (a row's element that several unrolled phases load: read once,
kept in a register across them); loads only from buffers the kernel does not store to.

bind: GLOBAL axes are derived from one flat work-item index `gidx` (the first GLOBAL axis outermost), LOCAL
axes, the shared axis (every GROUP_REDUCE and GROUP_LOOP axis: one index) and a warp's lanes (WARP, innermost) from
the flat index `lidx` within a work-group; index expressions over them simplify.

read_ahead: the loads that step a cache line or more along a loop OptOp.READAHEAD named are asked for a distance
ahead (ir.Prefetch hints, placed in that loop by the linearizer); last, after bind, on the values as they are read.

tensor_core: a tensor core's tile (OptOp.TC: TC_M/TC_N/TC_K axes and a WARP axis) becomes the warp's ir.Mma over
fragments read through the tensor core's layouts; it runs first, so the register axes expand copies it.
"""
from __future__ import annotations
import dataclasses
import itertools
from dataclasses import replace
from fusegrad.graph import symbolic as sym
from fusegrad import dtype as dt
from fusegrad.codegen.ir import (Kernel, AxisKind, REGISTER_KINDS, SHARED_KINDS, TC_KINDS, Val, Stage, LocalLoad,
                                 Reduce, GroupReduce, Load, Index, Valid, Gather, Alu, Store, Vectorize, Gep, VecDType,
                                 vec, Mma, Const, children, dependencies, toposort, substitute, substitute_kernel,
                                 axis_variables, Prefetch, scalar_of)

K = AxisKind
# how the partial accumulators of an upcast reduction axis combine
FOLD_OP = {"SUM": "ADD", "PROD": "MUL", "MAX": "MAX", "MIN": "MIN"}
BOOL_FOLD_OP = {"SUM": "OR", "PROD": "AND"}


def _any_absent(vals: list, absent: set) -> bool: return any(id(x) in absent for x in vals)


def piece_axes(k: Kernel) -> set:
  """The variables of k's output axes cut into pieces (OptOp.PIECES): UNROLL axes no reduction loops over."""
  loops = {x for r in toposort([st.value for st in k.stores]) if isinstance(r, Reduce) for x in r.loops}
  return {a.var for a in k.of_kind(K.UNROLL) if a.var not in loops}


def expand_pieces(k: Kernel) -> Kernel:
  """k with its pieces (OptOp.PIECES) expanded: a copy of each store per piece, the conditions the piece decides
  folded (a concatenation's parts), so what the vector pass sees of each copy is what it will vectorize."""
  pieces = piece_axes(k)
  return _expand(k, None, pieces) if pieces else k


def expand(k: Kernel, caps=None) -> Kernel:
  return _expand(expand_pieces(k), caps)


def _expand(k: Kernel, caps=None, only: set | None = None) -> Kernel:
  """k with its register axes (those in `only` where given, then without vectors) expanded."""
  kinds = {a.var: a.kind for a in k.axes}
  reg = [a.var for a in k.axes if a.kind in REGISTER_KINDS and (only is None or a.var in only)]
  if not reg: return k
  roots = [st.value for st in k.stores]
  deps = dependencies(roots)
  us = vector_axes(k, caps, deps) if only is None else []
  regset = set(reg) - set(us)
  shared_vars = {a.var for a in k.of_kind(K.GROUP_REDUCE)}
  memo: dict = {}
  absent: set = set()   # ids of the zeros of padded reads a copy folded (kept alive by memo)

  def at(v, env: dict):
    """v with every register variable it depends on fixed by env."""
    mine = tuple(sorted(((x.name, env[x]) for x in deps[id(v)] if x in regset)))
    key = (id(v), mine)
    r = memo.get(key)
    if r is not None: return r
    senv = {x: sym.const(env[x]) for x in deps[id(v)] if x in regset}
    # (a condition a copy decides, a concatenation's part under PIECES or a padded tile's last rows, is folded: the
    # copy reads nothing and computes nothing of the terms it rules out)
    if isinstance(v, (Load, Index)) and (valid := v.valid.substitute(senv)).false:
      r = Const(False if v.dtype.is_bool else 0, v.dtype)
      if v.dtype.is_float: absent.add(id(r))
    elif isinstance(v, Load): r = Load(v.buf, sym.substitute(v.idx, senv), valid, v.dtype)
    elif isinstance(v, Index): r = Index(sym.substitute(v.idx, senv), valid, v.dtype)
    elif isinstance(v, Valid):
      cond = v.cond.substitute(senv)
      r = Const(True, v.dtype) if cond.is_true else Const(False, v.dtype) if cond.false else Valid(cond, v.dtype)
    elif isinstance(v, Alu) and v.op == "WHERE" and isinstance(c := at(v.src[0], env), Const):
      r = at(v.src[1] if c.value else v.src[2], env)
      if not c.value and isinstance(r, Const) and r.value == 0 and v.dtype.is_float:   # a padded value's 0
        r = Const(0, v.dtype)
        absent.add(id(r))
    elif isinstance(v, Alu) and v.op == "NEG" and id(at(v.src[0], env)) in absent:
      # a concatenation's padding of -0.0 (tensor.cat: -pad(-part)): absent too, -0.0 wherever else it is read
      r = Const(-0.0, v.dtype)
      absent.add(id(r))
    elif isinstance(v, Alu) and v.op == "ADD" and _any_absent(srcs := [at(c, env) for c in v.src], absent):
      # a concatenation's part the copy rules out (a padded value's 0, added to the parts beside it) adds nothing: the
      # other part as it is (a -0.0 stays -0.0, as PyTorch's cat keeps it)
      r = srcs[1] if id(srcs[0]) in absent else srcs[0]
    elif isinstance(v, Alu): r = Alu(v.op, v.dtype, tuple(at(c, env) for c in v.src))
    elif isinstance(v, Gather): r = Gather(v.buf, v.size, at(v.src, env), v.dtype)
    elif isinstance(v, LocalLoad): r = LocalLoad(v.src, sym.substitute(v.idx, senv), v.dtype)
    elif isinstance(v, Reduce): r = _expand_reduce(v, env)
    elif isinstance(v, Vectorize): r = Vectorize(tuple(at(c, env) for c in v.src), v.dtype)
    elif isinstance(v, Gep): r = Gep(at(v.src, env), v.lane, v.dtype)
    elif isinstance(v, Mma): r = Mma(v.tc, at(v.a, env), at(v.b, env), at(v.c, env), v.dtype)
    else: r = v
    memo[key] = r
    return r

  def _expand_reduce(v: Reduce, env: dict):
    keep = tuple(x for x in v.loops if x not in regset)
    up = [x for x in v.loops if kinds[x] is K.UPCAST and x in regset]
    un = [x for x in v.loops if kinds[x] is K.UNROLL and x in regset]
    # a work-group's shared axis (GROUP_REDUCE) folds last: each item folds its accumulators first, and the group
    # combines one partial per item (one local buffer and one tree, not one per accumulator)
    shared = tuple(x for x in keep if x in shared_vars) if len(up) else ()
    inner = tuple(x for x in keep if x not in shared)
    parts = []
    for cu in itertools.product(*(range(x.hi + 1) for x in up)):
      srcs = []
      for cn in itertools.product(*(range(x.hi + 1) for x in un)):
        e = {**env, **dict(zip(up, cu)), **dict(zip(un, cn))}
        srcs += [at(s, e) for s in (v.src,) + v.more]
      parts.append(Reduce(v.op, v.dtype, inner, srcs[0], tuple(srcs[1:])))
    out = parts[0]
    op = (BOOL_FOLD_OP if v.dtype.is_bool else {}).get(v.op, FOLD_OP[v.op])
    for p in parts[1:]: out = Alu(op, v.dtype, (out, p))
    return Reduce(v.op, v.dtype, shared, out) if shared else out

  stores = []
  for st in k.stores:
    mine = sorted((deps[id(st.value)] | sym.variables(st.idx) | st.valid.variables()) & regset, key=reg.index)
    for c in itertools.product(*(range(x.hi + 1) for x in mine)):
      env = dict(zip(mine, c))
      senv = {x: sym.const(i) for x, i in env.items()}
      valid = st.valid.substitute(senv)
      if not valid.false: stores.append(Store(st.buf, sym.substitute(st.idx, senv), at(st.value, env), valid))
  masked = caps is not None and caps.masked_vectors
  for u in us: stores = _vectorize(stores, u, shared_vars, masked)
  tiled = any(kinds[x] is K.UPCAST and not any(x in r.loops for r in toposort(roots) if isinstance(r, Reduce))
              for x in reg)
  return replace(k, stores=tuple(stores), axes=tuple(a for a in k.axes if a.var not in regset | set(us)),
                 tiled=k.tiled or tiled)


# values that stand for a place in memory or a step of the work-group rather than a pure function of their fields:
# dedupe keeps each as it is (a LocalLoad reads a tile that changes between steps; a GroupReduce, a Stage and an Mma
# are work-group or warp operations with their own local memory)
_OPAQUE = (LocalLoad, Stage, GroupReduce, Mma)


def dedupe(k: Kernel) -> Kernel:
  """Values equal in structure computed once (common subexpressions): after expand, copies of a value at the same
  register index are equal records made from different nodes, e.g. a row's element that a softmax's max, its sum
  and its outputs each load when their loops are unrolled over the same indices (heuristic ROW_REGISTERS). A load
  is merged only from a buffer that no store of the kernel writes (no store can come between two reads of it);
  LocalLoads, Stages, GroupReduces and Mmas are left as they are (_OPAQUE)."""
  stored = {st.buf for st in k.stores}
  canon: dict = {}   # a value's structure (its children by canonical identity) -> the canonical value
  memo: dict = {}    # id(value) -> its canonical replacement
  changed = [False]

  def field_key(x):
    if isinstance(x, Val): return ("val", id(dd(x)))
    if isinstance(x, tuple) and x and all(isinstance(c, Val) for c in x): return ("vals", tuple(id(dd(c)) for c in x))
    # a constant by its type and spelling: 0.0 == -0.0 (and True == 1) as keys, not as values
    if isinstance(x, (bool, int, float, complex)) or type(x).__module__ == "numpy": return (type(x), repr(x))
    return x

  def rebuilt(v):
    """v over its children's canonical values (v itself when none changed)."""
    kw = {}
    for f in dataclasses.fields(v):
      x = getattr(v, f.name)
      if isinstance(x, Val): y = dd(x)
      elif isinstance(x, tuple) and x and all(isinstance(c, Val) for c in x): y = tuple(dd(c) for c in x)
      else: continue
      if y is not x and (not isinstance(x, tuple) or any(a is not b for a, b in zip(x, y))): kw[f.name] = y
    return replace(v, **kw) if kw else v

  def dd(v):
    r = memo.get(id(v))
    if r is not None: return r
    r = rebuilt(v)
    if not isinstance(v, _OPAQUE) and not (isinstance(v, (Load, Gather)) and v.buf in stored):
      key = (type(r),) + tuple(field_key(getattr(r, f.name)) for f in dataclasses.fields(r))
      try: r = canon.setdefault(key, r)
      except TypeError: pass   # a field that cannot be a key: the value stays its own
    if r is not v: changed[0] = True
    memo[id(v)] = r
    return r

  for v in toposort([st.value for st in k.stores]): dd(v)   # children first: no deep recursion
  if not changed[0]: return k
  return replace(k, stores=tuple(replace(st, value=memo[id(st.value)]) for st in k.stores))


# what a vector UPCAST axis may carry: float32 values of these ops, loads and these reductions (every renderer with
# vector types spells them lane-parallel); a kernel with anything else on the axis is expanded to scalars
VECTOR_OPS = frozenset({"ADD", "SUB", "MUL", "DIV", "RECIP", "NEG", "MAX", "MIN", "EXP", "LOG", "TANH", "ERF", "SQRT",
                        "ABS"})
VECTOR_REDUCES = frozenset({"SUM", "MAX", "MIN"})
# float64 lanes: the ops of a float32 sum accumulated in float64 (tensor._moments: a layer norm's mean and variance,
# shifted values widened and summed) and of float64 tensors' sums and products, on vectors of doubles
VECTOR_F64_OPS = frozenset({"ADD", "SUB", "MUL", "NEG"})
# 32-bit integer lanes: the ops of a counter-based random draw (a dropout mask's hash of the element's index, made in
# the kernel that reads it: tensor._random_bits) on vectors of uint32 / int32, the index itself a vector of its
# lanes, a shift only by a constant below 32 (C's shift by more is undefined, the scalar spelling guards it) and the
# bits turned into float32 by a vector CAST; without them every such kernel ran lane by lane (the word LM's LSTM
# cells with dropout, 300 us a call instead of 60). A BITCAST between float32 and these is a vector cast too (a
# view(int32) of floats masked and viewed back: the bits move, no lane is converted)
VECTOR_INT_OPS = frozenset({"ADD", "SUB", "MUL", "XOR", "AND", "OR", "SHL", "SHR"})
VECTOR_INTS = (dt.uint32, dt.int32)
# comparisons of float32 vectors give lane masks (a bool vector: every bit of a lane set where true, as C's vector
# extensions and OpenCL compare), which a select (WHERE) and a CAST to float32 read directly (`_masks`)
VECTOR_CMPS = frozenset({"CMPLT", "CMPLE", "CMPEQ", "CMPNE"})


def _uses(vals: list) -> dict:
  """id of a value -> [(a value reading it, which operand), ...] over vals."""
  uses: dict = {}
  for v in vals:
    for i, c in enumerate(children(v)): uses.setdefault(id(c), []).append((v, i))
  return uses


def _masks(roots: list, stores: list) -> set:
  """ids of the comparisons of float32 values, and of the loads of bools, that every use reads as a condition: each
  is a WHERE's condition or a CAST to float32 (a relu, its gradient's `x > 0`; attention's causal mask read from
  memory). As vectors they are lane masks (a bool load: its bytes widened to one); any other use (a store, a logical
  op, a reduction) leaves them scalar lanes."""
  vals = toposort(roots)
  uses = _uses(vals)
  stored = {id(st.value) for st in stores}
  reads = lambda p, i: isinstance(p, Alu) and p.dtype is dt.float32 and ((p.op == "WHERE" and i == 0) or p.op == "CAST")
  return {id(v) for v in vals if ((isinstance(v, Alu) and v.op in VECTOR_CMPS and
                                   all(c.dtype is dt.float32 for c in v.src)) or
                                  (isinstance(v, Load) and v.dtype is dt.bool_)) and id(v) not in stored and
          all(reads(p, i) for p, i in uses.get(id(v), ()))}


def _lane_valids(vals: list, u) -> set:
  """ids of the validity conditions (ir.Valid) along axis u that only bound u's lanes from above (_lane_range with
  nothing else and no lower bound inside the vector) and that every use reads as the condition of a float32 select
  that only reductions over u read: a reduction padded to whole vectors selecting its identity past the end
  (ir.guard), `r < 300` for r = 16 * b + u. As vectors each is one lane mask, `lane < 300 - 16 * b` (_lane_mask),
  so the select is a vector select. (Elsewhere, a padding's select of 0 around a load that is gathered lane by
  lane anyway, the output axis takes no vectors for it: a padded row's index divided per lane.)"""
  uses = _uses(vals)
  out = set()
  for v in vals:
    if not isinstance(v, Valid) or u not in v.cond.variables(): continue
    lr = _lane_range(v.cond, u)
    if lr is None or not lr[0].is_true or sym.bounds(lr[1][0])[1] > 0 or \
       max(abs(b) for b in sym.bounds(lr[1][1])) >= 1 << 24: continue
    if all(isinstance(p, Alu) and p.op == "WHERE" and i == 0 and p.dtype is dt.float32 and
           all(isinstance(r, Reduce) and u in r.loops for r, _ in uses.get(id(p), ())) for p, i in uses.get(id(v), ())):
      out.add(id(v))
  return out


def _lane_mask(cond: sym.Cond, u, n: int) -> Alu:
  """A lane valid of _lane_valids as a vector mask of u's n lanes: (float) lane < (float) its bound."""
  hi = _lane_range(cond, u)[1][1]
  bound = Alu("CAST", dt.float32, (Index(hi, sym.TRUE, dt.int32),))
  iota = Vectorize(tuple(Const(float(i), dt.float32) for i in range(n)), vec(dt.float32, n))
  return Alu("CMPLT", vec(dt.bool_, n), (iota, Vectorize((bound,) * n, vec(dt.float32, n))))


def vector_axes(k: Kernel, caps, deps: dict) -> list:
  """The UPCAST axes expand turns into vector values, in the order it does: of those whose size is a vector width
  of the device, the one whose lanes save most work first (`_vector_saving`), then most loads and stores stepping
  along them by 1 (the last on a tie), each when every value
  along it is a float32 load, arithmetic op, comparison read as a condition (`_masks`) or reduction (float64 ones
  too where a vector of them fits a register: `_f64_lanes`), and no value is
  along an axis taken before (a softmax's max lanes, its sum's lanes and its output's lanes: three vectors). An
  axis after the first needs a stride-1 load or store (else its lanes as scalars are as good). Values after an
  axis's reductions (an epilogue: a mask, a transcendental function) may be anything: they run lane by lane.
  In a kernel with a work-group's reduction (GROUP_REDUCE) only a reduction's own lanes that a load steps along by
  1 (the vector loads of a long sum: its lanes fold before the group combines its items' partials, which stay
  scalars in local memory)."""
  widths = caps.vector_widths if caps is not None else ()
  cands = [a.var for a in k.axes if a.kind is K.UPCAST and a.size in widths]
  if not cands: return []
  vals = toposort([st.value for st in k.stores])
  grouped = bool(k.of_kind(K.GROUP_REDUCE))
  if grouped:
    lanes = {x for v in vals if isinstance(v, Reduce) for x in v.loops}
    cands = [c for c in cands if c in lanes]
    if not cands: return []
  if any(isinstance(v, Mma) for v in vals): return []   # a tensor core's fragments are vectors of their own
  idxs = [x.idx for x in vals if isinstance(x, (Load, LocalLoad))] + [st.idx for st in k.stores]
  score = {c: sum(_stride(i, c) == 1 for i in idxs) for c in cands}
  masks = _masks([st.value for st in k.stores], k.stores)
  # (per axis, the padded reductions' lane bounds read as masks too: _lane_valids)
  lane_masks = {c: masks | _lane_valids(vals, c) for c in cands}
  # (float64 lanes where a vector of them fits one register: 16 doubles in two AVX-512 registers ran a float64 sum
  # 15-20% slower than scalar lanes)
  f64 = (caps.native_lanes // 2) if caps is not None and caps.native_lanes else 0
  regions = {c: _vector_region(c, vals, deps, lane_masks[c], c.hi + 1 <= f64) for c in cands}
  saved = {c: _vector_saving(k, c, vals, deps, lane_masks[c]) if regions[c] is not None else 0 for c in cands}
  out, taken = [], set()
  # stable: the last axis first on a tie
  for u in sorted(reversed(cands), key=lambda c: (-saved[c], -score[c])):
    if (out or grouped) and not score[u]: continue
    region = regions[u]
    if region is None or region & taken: continue
    out.append(u)
    taken |= region
  return out


# the work of one scalar op, in additions, where it is more than one (the C prelude's fg_expf and its kin are
# polynomials of 15-25 operations; fg_vexp and its kin are the same steps on whole vectors)
OP_WORK = {"EXP": 16, "LOG": 16, "TANH": 16, "ERF": 16, "DIV": 4, "RECIP": 4, "SQRT": 4}


def _vector_saving(k: Kernel, u, vals: list, deps: dict, masks: set) -> float:
  """The scalar operations a work item saves when axis u's lanes are vectors (passes expand's copies of each value
  times the loops it runs in, weighted by OP_WORK): every vector op along u does the work of u's lanes at the cost of
  one; a load or store that steps along u by 1 is one vector access, one that does not is gathered (or scattered)
  lane by lane, an insert per lane more than scalar loads. Values after u's reductions (an epilogue, lane by lane)
  save nothing. The axis that saves most is the first vector axis: a register tile whose row operand is an exp per
  element (attention's softmax fused into its product with v) has its rows in vectors rather than its columns."""
  sizes = {a.var: a.size for a in k.axes}
  per_item = {a.var for a in k.axes if a.kind in (K.UPCAST, K.UNROLL, K.REDUCE, K.LOOP, K.STAGE)}
  def runs(vs) -> int:
    n = 1
    for x in vs:
      if x in per_item: n *= sizes[x]
    return n
  n = sizes[u]
  on_u = lambda v: u in deps[id(v)] or (isinstance(v, Reduce) and u in v.loops)
  reduces = [v for v in vals if isinstance(v, Reduce) and on_u(v)]
  inside = {id(x) for r in reduces for x in toposort((r.src,) + r.more)} | {id(r) for r in reduces}
  total = 0.0
  for v in vals:
    if not on_u(v) or (reduces and id(v) not in inside) or id(v) in masks: continue
    if isinstance(v, Reduce): total += runs(deps[id(v.src)] | set(v.loops)) * (1 - 1 / n)
    elif isinstance(v, (Load, LocalLoad)):
      total += runs(deps[id(v)]) * ((1 - 1 / n) if _stride(v.idx, u) == 1 else -1)
    elif isinstance(v, Alu): total += runs(deps[id(v)]) * OP_WORK.get(v.op, 1) * (1 - 1 / n)
  for st in k.stores:
    if on_u(st.value) and _stride(st.idx, u) == 1:
      total += runs(deps[id(st.value)] | sym.variables(st.idx)) * (1 - 1 / n)
  return total


def _int_lanes(v, u=None) -> bool:
  """Is v a 32-bit integer value that vectors of it compute lane by lane (VECTOR_INT_OPS, an index, a load that
  steps by 1 along the vector axis u: a random draw's bits kept in a buffer, a vector load where no guard bounds u's
  lanes, else lane by lane into a vector)?"""
  if v.dtype not in VECTOR_INTS: return False
  if isinstance(v, Index): return True
  if isinstance(v, Load): return u is not None and _stride(v.idx, u) == 1
  if isinstance(v, Alu) and v.op == "BITCAST": return v.src[0].dtype in (dt.float32,) + VECTOR_INTS   # (its bits)
  if not isinstance(v, Alu) or v.op not in VECTOR_INT_OPS or any(c.dtype is not v.dtype for c in v.src): return False
  return v.op not in ("SHL", "SHR") or (isinstance(v.src[1], Const) and 0 <= v.src[1].value < 32)


def _f64_lanes(v, u) -> bool:
  """Is v a float64 value that vectors of doubles compute lane by lane (VECTOR_F64_OPS, a float32 value widened, a
  sum; a load that steps by 1 along u, unguarded along it)?"""
  if isinstance(v, Load): return _stride(v.idx, u) == 1 and u not in v.valid.variables()
  if isinstance(v, Reduce): return v.op == "SUM"
  return isinstance(v, Alu) and (v.op in VECTOR_F64_OPS or (v.op == "CAST" and v.src[0].dtype is dt.float32))


def _contiguous_base(x, u, on_u):
  """The value at lane 0 of u of an integer value x that steps by exactly 1 per lane of u (a gathered row's position:
  its start, a value of the row's index, plus the position along the row), else None. on_u: does a value depend on
  u?"""
  if isinstance(x, Index):
    if _stride(x.idx, u) != 1 or u in x.valid.variables(): return None
    return Index(sym.substitute(x.idx, {u: sym.const(0)}), x.valid, x.dtype)
  if not isinstance(x, Alu): return None
  if x.op == "CAST" and x.dtype.is_int and x.src[0].dtype.is_int and x.dtype.itemsize >= x.src[0].dtype.itemsize:
    b = _contiguous_base(x.src[0], u, on_u)
    return None if b is None else Alu("CAST", x.dtype, (b,))
  if x.op == "ADD" and on_u(x.src[0]) != on_u(x.src[1]):
    i = 0 if on_u(x.src[0]) else 1
    b = _contiguous_base(x.src[i], u, on_u)
    return None if b is None else Alu("ADD", x.dtype, tuple(b if j == i else c for j, c in enumerate(x.src)))
  return None


def _vector_region(u, vals: list, deps: dict, masks: set, f64: bool = False) -> set | None:
  """ids of the values along axis u (depending on it, or reducing over it), or None when one of those that must be
  a vector op is not one (float64 values only where `f64`: _f64_lanes; a float32 gather only where its position
  steps by 1 along u, _contiguous_base, the integer values computing that position then being no vector values)."""
  on_u = lambda v: u in deps[id(v)] or (isinstance(v, Reduce) and u in v.loops)
  reduces = [v for v in vals if isinstance(v, Reduce) and on_u(v)]
  inside = {id(x) for r in reduces for x in toposort((r.src,) + r.more)} | {id(r) for r in reduces}
  rows = {id(v) for v in vals if isinstance(v, Gather) and v.dtype is dt.float32 and on_u(v) and
          _contiguous_base(v.src, u, on_u) is not None}
  positions = {id(x) for v in vals if id(v) in rows for x in toposort([v.src])}
  region = set()
  for v in vals:
    if not on_u(v): continue
    region.add(id(v))
    if (reduces and id(v) not in inside) or id(v) in masks or id(v) in rows or id(v) in positions: continue
    if _int_lanes(v, u) or (isinstance(v, Alu) and v.op in ("CAST", "BITCAST") and v.dtype is dt.float32 and
                            _int_lanes(v.src[0], u)):
      continue
    if v.dtype is dt.float64:
      if not (f64 and _f64_lanes(v, u)): return None
      continue
    if v.dtype is not dt.float32: return None
    ok = isinstance(v, (Load, LocalLoad)) or (isinstance(v, Alu) and v.op in VECTOR_OPS) or \
        (isinstance(v, Alu) and v.op == "CAST" and v.src[0].dtype is dt.float64) or \
        (isinstance(v, Alu) and v.op == "WHERE" and (id(v.src[0]) in masks or not on_u(v.src[0]))) or \
        (isinstance(v, Alu) and v.op == "CAST" and id(v.src[0]) in masks) or \
        (isinstance(v, Reduce) and v.op in VECTOR_REDUCES)
    if not ok: return None
  return region


def _stride(idx: sym.Lin, u: sym.Var) -> int | None:
  """idx's step per index of u, when u appears only as a plain term (None inside a division or modulo)."""
  step = 0
  for atom, c in sym.lin(idx).terms:
    if atom == u: step = c
    elif u in sym.variables(atom): return None
  return step


def _lane_range(valid: sym.Cond, u: sym.Var) -> tuple | None:
  """(the parts of valid that do not depend on u, (lo, hi)) where the parts that do are ranges over u plus one term
  without it, up to constants (lo <= x + u < hi: a padded axis's guard, x its vector's first index; with a padded
  window's `1 <= x + u < 57` beside it, their intersection): the lanes lo - x <= u < hi - x hold them. None
  otherwise."""
  mine = [p for p in valid.parts if u in sym.variables(p[0])]
  if not mine or any(_stride(p[0], u) != 1 for p in mine): return None
  rest = sym.lin(mine[0][0]) - sym.lin(u)
  lo, hi = None, None
  for x, plo, phi in mine:
    d = sym.lin(sym.lin(x) - sym.lin(u) - rest)   # this part's term beyond the first's: a constant, or no range
    if d.terms: return None
    lo = plo - d.const if lo is None else max(lo, plo - d.const)
    hi = phi - d.const if hi is None else min(hi, phi - d.const)
  return sym.Cond(tuple(p for p in valid.parts if p not in mine)), (sym.lin(lo) - rest, sym.lin(hi) - rest)


def _vectorize(stores: list, u: sym.Var, shared: set = frozenset(), masked: bool = False) -> list:
  """Stores whose values still depend on the vector axis u, with those values as vectors of u's lanes: loads
  contiguous along u become vector loads (others one load per lane), arithmetic and reductions run on vectors,
  a reduction over u keeps a vector accumulator folded lane by lane in order (as expand's scalar accumulators
  are; over a work-group's shared axis too, the lanes fold first: the group combines scalars), and stores
  contiguous along u become vector stores. With `masked` (Caps.masked_vectors), a contiguous load or store whose
  condition bounds u's lanes (a padded axis's last vector: `o < 200` for o = 16*b + u) is a masked one
  (Load.lanes) instead of one per lane."""
  n = u.hi + 1
  roots = [st.value for st in stores]
  deps = dependencies(roots)
  mentions = set()              # values with u in their DAG: on it, or over a reduction over it
  for v in toposort(roots):
    if u in deps[id(v)] or (isinstance(v, Reduce) and u in v.loops) or any(id(c) in mentions for c in children(v)):
      mentions.add(id(v))
  at = [{u: sym.const(i)} for i in range(n)]
  memo: dict = {}
  masks = _masks(roots, stores)
  lane_valids = _lane_valids(toposort(roots), u)
  isvec = lambda x: isinstance(x, Val) and isinstance(x.dtype, VecDType)
  # a value that is no vector op (vector_axes admits them after the reductions only) is a tuple of its lanes
  islanes = lambda x: isinstance(x, tuple)

  def lane(x, i):
    if islanes(x): return x[i]
    return Gep(x, i, x.dtype.scalar) if isvec(x) else x

  def as_vec(x):
    if isvec(x): return x
    r = memo.get(("bcast", id(x)))
    if r is None:
      r = memo[("bcast", id(x))] = Vectorize(tuple(x) if islanes(x) else (x,) * n, vec(lane(x, 0).dtype, n))
    return r

  def rebuild(v):
    """v, which is not along u but holds a reduction over it, over its rebuilt children: the same node (a vector
    of another axis taken before stays one)."""
    if isinstance(v, Alu): return Alu(v.op, v.dtype, tuple(vz(c) for c in v.src))
    if isinstance(v, Reduce): return Reduce(v.op, v.dtype, v.loops, vz(v.src), tuple(vz(c) for c in v.more))
    if isinstance(v, Gep): return Gep(vz(v.src), v.lane, v.dtype)
    if isinstance(v, Vectorize): return Vectorize(tuple(vz(c) for c in v.src), v.dtype)
    if isinstance(v, Gather): return Gather(v.buf, v.size, vz(v.src), v.dtype)
    raise AssertionError(f"not vectorizable: {type(v).__name__}")

  def vz(v):
    """v over u's lanes: a vector where v depends on u, else the scalar v (rebuilt over what it reads of u)."""
    if id(v) not in mentions: return v
    r = memo.get(id(v))
    if r is not None: return r
    if not (u in deps[id(v)] or (isinstance(v, Reduce) and u in v.loops)):
      memo[id(v)] = r = rebuild(v)
      return r
    vd = vec(v.dtype, n)
    if isinstance(v, Load):   # (32-bit integer loads along u as float32 ones: _int_lanes; masked ones float32 only)
      if v.dtype is dt.bool_ and id(v) in masks and _stride(v.idx, u) == 1 and u not in v.valid.variables():
        r = Load(v.buf, sym.substitute(v.idx, at[0]), v.valid, vd)   # bytes along u read as one lane mask
      elif v.dtype is not dt.float32 and not _int_lanes(v, u) and not (v.dtype is dt.float64 and _f64_lanes(v, u)):
        r = tuple(Load(v.buf, sym.substitute(v.idx, e), v.valid.substitute(e), v.dtype) for e in at)
      elif _stride(v.idx, u) == 1 and u not in v.valid.variables():
        r = Load(v.buf, sym.substitute(v.idx, at[0]), v.valid, vd)
      elif masked and v.dtype is dt.float32 and _stride(v.idx, u) == 1 and (lr := _lane_range(v.valid, u)) is not None:
        r = Load(v.buf, sym.substitute(v.idx, at[0]), lr[0], vd, lr[1])
      else:
        r = Vectorize(tuple(Load(v.buf, sym.substitute(v.idx, e), v.valid.substitute(e), v.dtype) for e in at), vd)
    elif isinstance(v, LocalLoad):
      if _stride(v.idx, u) == 1: r = LocalLoad(v.src, sym.substitute(v.idx, at[0]), vd)
      else: r = Vectorize(tuple(LocalLoad(v.src, sym.substitute(v.idx, e), v.dtype) for e in at), vd)
    elif isinstance(v, Index):
      r = tuple(Index(sym.substitute(v.idx, e), v.valid.substitute(e), v.dtype) for e in at)
      if _int_lanes(v): r = Vectorize(r, vd)    # (its lanes' indices, one vector for the integer ops it feeds)
    elif isinstance(v, Valid):
      r = _lane_mask(v.cond, u, n) if id(v) in lane_valids else tuple(Valid(v.cond.substitute(e), v.dtype) for e in at)
    elif isinstance(v, Alu):
      srcs = [vz(c) for c in v.src]
      if not any(isvec(c) or islanes(c) for c in srcs): r = Alu(v.op, v.dtype, tuple(srcs))
      elif ((v.op in VECTOR_OPS and v.dtype is dt.float32) or (v.op in VECTOR_F64_OPS and v.dtype is dt.float64)) \
          and not any(islanes(c) for c in srcs):
        r = Alu(v.op, vd, tuple(as_vec(c) for c in srcs))
      elif v.op == "CAST" and {v.dtype, srcs[0].dtype.scalar if isvec(srcs[0]) else None} == {dt.float32, dt.float64}:
        r = Alu(v.op, vd, (srcs[0],))   # float32 lanes widened to float64 (or narrowed back)
      elif id(v) in masks and not any(islanes(c) for c in srcs):
        r = Alu(v.op, vd, tuple(as_vec(c) for c in srcs))
      elif v.op == "WHERE" and v.dtype is dt.float32 and not any(islanes(c) for c in srcs):
        # a lane mask, or one condition for every lane (then a plain select of two vectors)
        r = Alu(v.op, vd, (srcs[0], as_vec(srcs[1]), as_vec(srcs[2])))
      elif v.op == "CAST" and v.dtype is dt.float32 and isvec(srcs[0]) and srcs[0].dtype.scalar in (dt.bool_,) + VECTOR_INTS:
        r = Alu(v.op, vd, (srcs[0],))
      elif v.op == "BITCAST" and v.dtype is dt.float32 and isvec(srcs[0]) and srcs[0].dtype.scalar in VECTOR_INTS:
        r = Alu(v.op, vd, (srcs[0],))   # 32-bit integer lanes' bits as float32 ones (a vector cast)
      elif _int_lanes(v) and not any(islanes(c) for c in srcs):
        r = Alu(v.op, vd, tuple(as_vec(c) for c in srcs))
      else: r = tuple(Alu(v.op, v.dtype, tuple(lane(c, i) for c in srcs)) for i in range(n))
    elif isinstance(v, Reduce):
      srcs = [vz(c) for c in (v.src,) + v.more]
      if u not in v.loops and not any(isvec(c) or islanes(c) for c in srcs):
        r = Reduce(v.op, v.dtype, v.loops, srcs[0], tuple(srcs[1:]))
      else:
        srcs = [as_vec(c) for c in srcs]
        outer = tuple(x for x in v.loops if x in shared) if u in v.loops else ()
        acc = Reduce(v.op, vd, tuple(x for x in v.loops if x != u and x not in outer), srcs[0], tuple(srcs[1:]))
        if u not in v.loops: r = acc
        else:   # the lanes folded in order, as expand folds its scalar accumulators
          r = Gep(acc, 0, v.dtype)
          for i in range(1, n): r = Alu(FOLD_OP[v.op], v.dtype, (r, Gep(acc, i, v.dtype)))
          if outer: r = Reduce(v.op, v.dtype, outer, r)
    elif isinstance(v, Gather):
      on_u = lambda x: u in deps[id(x)]
      base = _contiguous_base(v.src, u, on_u) if v.dtype is dt.float32 and on_u(v) else None
      if base is not None:   # u's lanes at consecutive positions: one vector (each lane 0 outside the buffer)
        r = Gather(v.buf, v.size, vz(base), vd)
      else:
        src = vz(v.src)
        r = tuple(Gather(v.buf, v.size, lane(src, i), v.dtype) for i in range(n)) if isvec(src) or islanes(src) else \
            Gather(v.buf, v.size, src, v.dtype)
    else: raise AssertionError(f"not vectorizable: {type(v).__name__}")   # vector_axes admitted only those above
    memo[id(v)] = r
    return r

  out = []
  for st in stores:
    val = vz(st.value)
    on_u = u in sym.variables(st.idx) or u in st.valid.variables()
    if not on_u and u not in deps[id(st.value)]:   # not along u (maybe a vector of another axis): as it is
      out.append(Store(st.buf, st.idx, val, st.valid, st.lanes))
    elif (isvec(val) or (not islanes(val) and val.dtype is dt.float32)) and _stride(st.idx, u) == 1 and \
        u not in st.valid.variables():   # (a value the same in every lane, a constant: broadcast)
      out.append(Store(st.buf, sym.substitute(st.idx, at[0]), as_vec(val), st.valid))
    elif masked and isvec(val) and val.dtype.scalar is dt.float32 and _stride(st.idx, u) == 1 and \
        (lr := _lane_range(st.valid, u)) is not None:
      out.append(Store(st.buf, sym.substitute(st.idx, at[0]), val, lr[0], lr[1]))
    else:
      for i, e in enumerate(at):
        out.append(Store(st.buf, sym.substitute(st.idx, e), lane(val, i), st.valid.substitute(e)))
  return out


# pad a tile's rows whose length is a multiple of 32 banks (H100, f32 4096^3 matmul: 23.3 TFLOP/s padded, 21.9 not)
STAGE_PAD = True


def stage(k: Kernel) -> Kernel:
  """A STAGE axis s (a reduction's inner loop over a tile): every load inside the reductions over s that depends
  on s and on a LOCAL axis, and otherwise only on the work-group's own indices (GLOBAL axes, the loops outside the
  tile), reads a local copy of its tile instead (ir.Stage, ir.LocalLoad): the tile holds its values at all indices
  of the LOCAL, register and s axes it depends on, copied in the order of their strides in memory (neighbouring
  items of the copy read neighbouring addresses) and laid out with the LOCAL axes innermost (neighbouring items
  read neighbouring positions; an item's 8 neighbouring lanes innermost, read as vectors, measured 20% slower;
  lanes in groups of 4 next to the LOCAL axis keep memory order and are read 4 at a time, aligned), in rows
  padded by one (by 4 in the grouped layout) where a row is a multiple of 32 banks. Each work item reads a value
  the group copied once, not its own global load (a matmul's rows and columns are read by many items of a group).

  With k.prefetch (OptOp.PREFETCH) a tile that changes along the loop just outside s (the step: the reduction's
  innermost loop outside the tile that stays a loop) is prefetched through registers (ir.Stage.prefetch), in
  k.prefetch local buffers: with two, a read of tile t is at its buffer's offset (t % 2)."""
  st = k.of_kind(K.STAGE)
  if not st: return k
  s = st[0].var
  kinds = {a.var: a.kind for a in k.axes}
  copyable = {v for v, kd in kinds.items() if kd in (K.LOCAL, K.UPCAST, K.UNROLL)} | {s}
  local = {v for v, kd in kinds.items() if kd is K.LOCAL}
  fixed = {v for v, kd in kinds.items() if kd is K.GLOBAL}
  steps = set()
  for r in toposort([x.value for x in k.stores]):
    if isinstance(r, Reduce) and s in r.loops:
      # (a loop the work-group shares, GROUP_REDUCE, is the items' own index: a tile along it is no one tile)
      fixed |= {x for x in r.loops[:r.loops.index(s)] if kinds[x] not in SHARED_KINDS}
      outside = [x for x in r.loops[:r.loops.index(s)] if kinds[x] is K.REDUCE]
      steps.add(outside[-1] if outside else None)
  # the loop over the tiles (one for every reduction over s) whose steps prefetch the next one
  step = next(iter(steps)) if k.prefetch and len(steps) == 1 else None
  stages: dict = {}
  memo: dict = {}
  def staged(v: Load):
    # (a runtime size's argument, sym.ArgVar, in a guard is no loop)
    vs = axis_variables(v.idx) | {x for x in v.valid.variables() if not isinstance(x, sym.ArgVar)}
    if s not in vs or not vs & local or not vs <= copyable | fixed: return v
    terms = dict(sym.lin(v.idx).terms)
    over = sorted(vs & copyable, key=lambda x: -(terms.get(x) or 0))
    regs = {x for x in over if kinds[x] in (K.UPCAST, K.UNROLL)}
    rest = [x for x in over if x is not s]
    # an item's register lanes in groups of at most 4 neighbours in memory, next to the LOCAL axis (a matmul's tile
    # as heuristic.MM_VECTOR splits it): the tile in memory order, the reduction's step outermost, so the group's
    # items read one contiguous run, 4 aligned values at a time; otherwise the LOCAL axes innermost
    vector = len(rest) >= 2 and rest[-1] in regs and rest[-1].hi + 1 <= 4 and rest[-2] in local
    layout = [s] + rest if vector else [x for x in over if x not in local] + [x for x in over if x in local]
    fresh = {x: sym.Var(f"c{x.name}", 0, x.hi) for x in over}
    env = {x: sym.lin(y) for x, y in fresh.items()}
    # rows of the tile: padded by one (by 4 in the vector layout: its reads of 4 stay aligned) where a row is a
    # multiple of 32 banks (the copy's stores down a column would all meet one bank)
    inner = len(rest) if vector else sum(1 for x in over if x in local or x in regs)
    row = 1
    for x in layout[len(layout) - inner:]: row *= x.hi + 1
    ahead = step if step is not None and step in vs else None
    t = Stage(v.buf, sym.substitute(v.idx, env), v.valid.substitute(env), tuple(fresh[x] for x in over), v.dtype,
              tuple(fresh[x] for x in layout), inner if row % 32 == 0 and STAGE_PAD else 0, 4 if vector else 1,
              ahead, k.prefetch if ahead is not None else 1)
    t = stages.setdefault(t, t)
    pos = t.position({fresh[x]: sym.lin(x) for x in over})
    return LocalLoad(t, pos + t.buffer_at(step) if ahead is not None else pos, v.dtype)
  def rw(v, inside: bool):
    key = (id(v), inside)
    r = memo.get(key)
    if r is not None: return r
    if isinstance(v, Load): r = staged(v) if inside else v
    elif isinstance(v, Alu): r = Alu(v.op, v.dtype, tuple(rw(c, inside) for c in v.src))
    elif isinstance(v, Gather): r = Gather(v.buf, v.size, rw(v.src, inside), v.dtype)
    elif isinstance(v, Reduce):
      ins = inside or s in v.loops
      r = Reduce(v.op, v.dtype, v.loops, rw(v.src, ins), tuple(rw(c, ins) for c in v.more))
    else: r = v
    memo[key] = r
    return r
  return replace(k, stores=tuple(Store(x.buf, x.idx, rw(x.value, False), x.valid) for x in k.stores))


def stages(k: Kernel) -> list:
  """The local copies a kernel's values read (after `stage`)."""
  return [v for v in toposort([st.value for st in k.stores]) if isinstance(v, Stage)]


def group(k: Kernel) -> Kernel:
  """GROUP_REDUCE axes: each reduction over one (g) becomes every work item's partial over its other loops,
  combined across the work-group (ir.GroupReduce); every item then holds the result. All shared axes (GROUP_REDUCE,
  GROUP_LOOP) are the one shared index of the group (bind), so a slot is the item's LOCAL position and g; a store
  that depends on no shared axis is made by the items with that index 0 only."""
  shared = [a.var for a in k.of_kind(*SHARED_KINDS)]
  if not shared: return k
  loc = [a.var for a in k.of_kind(K.LOCAL)]
  def flat(g):
    mine, stride = sym.lin(g), g.hi + 1
    for v in reversed(loc):
      mine = mine + sym.lin(v) * stride
      stride *= v.hi + 1
    return mine, stride
  memo: dict = {}
  def rw(v):
    r = memo.get(id(v))
    if r is not None: return r
    if isinstance(v, Alu): r = Alu(v.op, v.dtype, tuple(rw(c) for c in v.src))
    elif isinstance(v, Gather): r = Gather(v.buf, v.size, rw(v.src), v.dtype)
    # (a grouped reduction's result broadcast into a vector, or a vector reduction's lane: expand's vectors)
    elif isinstance(v, Vectorize): r = Vectorize(tuple(rw(c) for c in v.src), v.dtype)
    elif isinstance(v, Gep): r = Gep(rw(v.src), v.lane, v.dtype)
    elif isinstance(v, Reduce):
      srcs = [rw(c) for c in (v.src,) + v.more]
      g = next((x for x in v.loops if x in shared), None)
      if g is not None:
        rest = tuple(x for x in v.loops if x != g)
        # (no loop left: the item's partial is its value, folded already: expand's accumulators, a vector's lanes)
        part = Reduce(v.op, v.dtype, rest, srcs[0], tuple(srcs[1:])) if rest or v.more else srcs[0]
        mine, size = flat(g)
        slots = tuple(sym.substitute(mine, {g: sym.const(c)}) for c in range(g.hi + 1))
        r = GroupReduce(v.op, v.dtype, part, g, mine, slots, size)
      else: r = Reduce(v.op, v.dtype, v.loops, srcs[0], tuple(srcs[1:]))
    else: r = v
    memo[id(v)] = r
    return r
  first = sym.Cond.range(sym.lin(shared[0]), 0, 1)
  loops = {a.var for a in k.of_kind(K.GROUP_LOOP)}
  stores = []
  for st in k.stores:
    own = (sym.variables(st.idx) | st.valid.variables()) & loops
    stores.append(replace(st, value=rw(st.value), valid=st.valid if own else st.valid & first))
  return replace(k, stores=tuple(stores))


GIDX, LIDX = "gidx", "lidx"


def bind(k: Kernel) -> tuple[Kernel, sym.Var, sym.Var | None]:
  """(k with GLOBAL and LOCAL axes written over the flat indices, the gidx Var, the lidx Var or None)."""
  glob = [a.var for a in k.of_kind(K.GLOBAL)]
  shared = [a.var for a in k.of_kind(*SHARED_KINDS)]
  loc = [a.var for a in k.of_kind(K.LOCAL)] + shared[:1] + [a.var for a in k.of_kind(K.WARP)]
  gidx = sym.Var(GIDX, 0, max(k.groups - 1, 0))
  lidx = sym.Var(LIDX, 0, k.local_size[0] - 1) if loc else None
  env: dict = {}
  for flat, vs in ((gidx, glob), (lidx, loc)):
    if vs: env.update(zip(vs, sym.unravel(sym.lin(flat), tuple(v.hi + 1 for v in vs))))
  for v in shared[1:]: env[v] = env[shared[0]]   # one shared index: the group's reductions and output loops
  return substitute_kernel(k, env), gidx, lidx


def tensor_core(k: Kernel) -> Kernel:
  """A tensor core's tile (OptOp.TC) as the warp's matrix multiply-accumulate: the reduction over K (its TC_K part)
  becomes one ir.Mma per step of its other loops, whose A and B fragments are the product's two loads read at each
  lane's (row, col) of the tensor core's layouts (the TC_M/TC_K or TC_K/TC_N variables replaced by index expressions
  of the lane, codegen/opt/tc.lane_exprs), summed into a vector accumulator of the lane's D fragment. Every store over
  M or N becomes one store per element of that fragment, at its (row, col) of C's layout, with the reduction's value
  that element (Gep): each lane writes the outputs it holds, and the epilogue (a bias, a cast) runs on them."""
  tc = k.tensor_core
  if tc is None or not k.of_kind(*TC_KINDS): return k
  from fusegrad.codegen.opt.tc import product_loads, lane_exprs
  (m,), (n,), (kk,), (lane,) = ([a.var for a in k.of_kind(kd)] for kd in TC_KINDS + (K.WARP,))
  roots = [st.value for st in k.stores]
  r = next(v for v in toposort(roots) if isinstance(v, Reduce) and kk in v.loops)
  loads = product_loads(r.src, tc)
  if isinstance(loads, str): raise AssertionError(f"tensor_core: {loads} in kernel {k.name}")   # OptOp.TC checked it
  la, lb = loads if m in axis_variables(loads[0].idx) | loads[0].valid.variables() else loads[::-1]
  def fragment(ld, layout, row, col):
    vals = [substitute([ld], {row: re, col: ce})[0] for re, ce in lane_exprs(layout, lane)]
    return Vectorize(tuple(vals), vec(ld.dtype, len(vals)))
  acc, nc = tc.dtype_acc, len(tc.c[0])
  zero = Vectorize((Const(0.0, acc),) * nc, vec(acc, nc))
  d = Mma(tc, fragment(la, tc.a, m, kk), fragment(lb, tc.b, kk, n), zero, vec(acc, nc))
  loops = tuple(x for x in r.loops if x != kk)
  # a renderer spells SUM(acc, Mma(a, b, 0)) as the Mma accumulating into acc (its C operand)
  total = Reduce("SUM", vec(acc, nc), loops, d) if loops else d
  stores = []
  for st in k.stores:
    if not (dependencies([st.value])[id(st.value)] | sym.variables(st.idx) | st.valid.variables()) & {m, n}:
      stores.append(st)
      continue
    for e, (re, ce) in enumerate(lane_exprs(tc.c, lane)):
      env = {m: re, n: ce}
      val = substitute([st.value], env, replaced={id(r): Gep(total, e, acc)})[0]
      stores.append(Store(st.buf, sym.substitute(st.idx, env), val, st.valid.substitute(env)))
  return replace(k, stores=tuple(stores), axes=tuple(a for a in k.axes if a.kind not in TC_KINDS))


LINE_BYTES = 64   # a cache line: a load stepping this far per iteration reads a new line every iteration


def streamed_loads(roots: list, u: sym.Var) -> list:
  """(load, step) of the unconditional loads inside a reduction over loop u that step at least a cache line per
  index of u (step: elements per index of u)."""
  out = []
  for v in toposort(roots):
    if not (isinstance(v, Reduce) and u in v.loops): continue
    for x in toposort([v.src, *v.more]):
      if not isinstance(x, Load) or not x.valid.is_true: continue
      s = _stride(x.idx, u)
      if s and abs(s) * scalar_of(x.dtype).itemsize >= LINE_BYTES: out.append((x, s))
  return out


def read_ahead(k: Kernel) -> Kernel:
  """ir.Prefetch hints for Kernel.read_ahead: the streamed loads of a loop that reads ahead (streamed_loads), each
  at the index it reads some whole steps of the loop later (at least one). The distance is in time, the same number
  of steps for every stream of the loop: the given bytes of its nearest-stepping stream (1024 bytes of a matmul's
  panel of 16 floats: 16 steps; its rows, a weight gradient's 2 KB apart, as many steps ahead). Loads of one buffer
  whose indices differ by a constant share a hint per cache line (a register tile's rows, consecutive floats: one or
  two lines, not one hint per row). A loop that a later action split (its variable gone from every reduction) has
  none."""
  if not k.read_ahead: return k
  roots = [st.value for st in k.stores]
  hints, seen = [], set()
  for u, nbytes in k.read_ahead:
    loads = streamed_loads(roots, u)
    if not loads: continue
    ahead = max(1, nbytes // min(abs(s) * scalar_of(x.dtype).itemsize for x, s in loads))
    groups: dict = {}   # (buffer, index less its constant) -> its loads' (constant, step)
    for x, s in loads:
      idx = sym.lin(x.idx)
      groups.setdefault((x.buf, idx.terms, LINE_BYTES // scalar_of(x.dtype).itemsize), []).append((idx.const, s))
    for (buf, terms, line), cs in groups.items():
      cs.sort()
      kept = [cs[0]]   # a line apart, and the last (its line may be the next: the first's alignment is not known)
      for c in cs[1:]:
        if c[0] - kept[-1][0] >= line or c is cs[-1]: kept.append(c)
      for c, s in kept:
        p = Prefetch(buf, sym.Lin(terms, c) + s * ahead)
        if p not in seen:
          seen.add(p)
          hints.append(p)
  return replace(k, prefetches=tuple(hints))
