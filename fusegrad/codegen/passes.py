"""Passes from an optimized Kernel to one the linearizer takes: register axes expanded, work-item indices bound.

expand: every UPCAST/UNROLL axis is instantiated at each of its indices. A value that depends on an upcast
output axis becomes one value per index (a register tile's outputs, each with its own accumulator sharing one
loop); an upcast reduction axis becomes several accumulators folded after the loop; an unrolled reduction axis
becomes several updates of one accumulator per iteration, in the loop's order.

bind: GLOBAL axes are derived from one flat work-item index `gidx` (the first GLOBAL axis outermost), LOCAL
and GROUP_REDUCE axes from the flat index `lidx` within a work-group; index expressions over them simplify.
"""
from __future__ import annotations
import itertools
from dataclasses import replace
from fusegrad.graph import symbolic as sym
from fusegrad.codegen.ir import (Kernel, AxisKind, REGISTER_KINDS, Reduce, GroupReduce, Load, Index, Valid, Gather, Alu, Store,
                                 dependencies, toposort, substitute_kernel)

K = AxisKind
# how the partial accumulators of an upcast reduction axis combine
FOLD_OP = {"SUM": "ADD", "PROD": "MUL", "MAX": "MAX", "MIN": "MIN"}
BOOL_FOLD_OP = {"SUM": "OR", "PROD": "AND"}


def expand(k: Kernel) -> Kernel:
  kinds = {a.var: a.kind for a in k.axes}
  reg = [a.var for a in k.axes if a.kind in REGISTER_KINDS]
  if not reg: return k
  regset = set(reg)
  roots = [st.value for st in k.stores]
  deps = dependencies(roots)
  memo: dict = {}

  def at(v, env: dict):
    """v with every register variable it depends on fixed by env."""
    mine = tuple(sorted(((x.name, env[x]) for x in deps[id(v)] if x in regset)))
    key = (id(v), mine)
    r = memo.get(key)
    if r is not None: return r
    senv = {x: sym.const(env[x]) for x in deps[id(v)] if x in regset}
    if isinstance(v, Load): r = Load(v.buf, sym.substitute(v.idx, senv), v.valid.substitute(senv), v.dtype)
    elif isinstance(v, Index): r = Index(sym.substitute(v.idx, senv), v.valid.substitute(senv), v.dtype)
    elif isinstance(v, Valid): r = Valid(v.cond.substitute(senv), v.dtype)
    elif isinstance(v, Alu): r = Alu(v.op, v.dtype, tuple(at(c, env) for c in v.src))
    elif isinstance(v, Gather): r = Gather(v.buf, v.size, at(v.src, env), v.dtype)
    elif isinstance(v, Reduce): r = _expand_reduce(v, env)
    else: r = v
    memo[key] = r
    return r

  def _expand_reduce(v: Reduce, env: dict):
    keep = tuple(x for x in v.loops if x not in regset)
    up = [x for x in v.loops if kinds[x] is K.UPCAST]
    un = [x for x in v.loops if kinds[x] is K.UNROLL]
    parts = []
    for cu in itertools.product(*(range(x.hi + 1) for x in up)):
      srcs = []
      for cn in itertools.product(*(range(x.hi + 1) for x in un)):
        e = {**env, **dict(zip(up, cu)), **dict(zip(un, cn))}
        srcs += [at(s, e) for s in (v.src,) + v.more]
      parts.append(Reduce(v.op, v.dtype, keep, srcs[0], tuple(srcs[1:])))
    out = parts[0]
    op = (BOOL_FOLD_OP if v.dtype.is_bool else {}).get(v.op, FOLD_OP[v.op])
    for p in parts[1:]: out = Alu(op, v.dtype, (out, p))
    return out

  stores = []
  for st in k.stores:
    mine = sorted((deps[id(st.value)] | sym.variables(st.idx) | st.valid.variables()) & regset, key=reg.index)
    for c in itertools.product(*(range(x.hi + 1) for x in mine)):
      env = dict(zip(mine, c))
      senv = {x: sym.const(i) for x, i in env.items()}
      stores.append(Store(st.buf, sym.substitute(st.idx, senv), at(st.value, env), st.valid.substitute(senv)))
  tiled = any(kinds[x] is K.UPCAST and not any(x in r.loops for r in toposort(roots) if isinstance(r, Reduce))
              for x in reg)
  return replace(k, stores=tuple(stores), axes=tuple(a for a in k.axes if a.kind not in REGISTER_KINDS),
                 tiled=k.tiled or tiled)


def group(k: Kernel) -> Kernel:
  """A GROUP_REDUCE axis g: each reduction over g becomes every work item's partial over its other loops,
  combined across the work-group (ir.GroupReduce); every item then holds the result, and only the items
  with g == 0 store."""
  gs = k.of_kind(K.GROUP_REDUCE)
  if not gs: return k
  g = gs[0].var
  loc = [a.var for a in k.of_kind(K.LOCAL, K.GROUP_REDUCE)]
  mine, stride = sym.const(0), 1
  for v in reversed(loc):
    mine = mine + sym.lin(v) * stride
    stride *= v.hi + 1
  slots = tuple(sym.substitute(mine, {g: sym.const(c)}) for c in range(g.hi + 1))
  memo: dict = {}
  def rw(v):
    r = memo.get(id(v))
    if r is not None: return r
    if isinstance(v, Alu): r = Alu(v.op, v.dtype, tuple(rw(c) for c in v.src))
    elif isinstance(v, Gather): r = Gather(v.buf, v.size, rw(v.src), v.dtype)
    elif isinstance(v, Reduce):
      srcs = [rw(c) for c in (v.src,) + v.more]
      if g in v.loops:
        part = Reduce(v.op, v.dtype, tuple(x for x in v.loops if x != g), srcs[0], tuple(srcs[1:]))
        r = GroupReduce(v.op, v.dtype, part, g, mine, slots, stride)
      else: r = Reduce(v.op, v.dtype, v.loops, srcs[0], tuple(srcs[1:]))
    else: r = v
    memo[id(v)] = r
    return r
  first = sym.Cond.range(sym.lin(g), 0, 1)
  stores = tuple(Store(st.buf, st.idx, rw(st.value), st.valid & first) for st in k.stores)
  return replace(k, stores=stores)


GIDX, LIDX = "gidx", "lidx"


def bind(k: Kernel) -> tuple[Kernel, sym.Var, sym.Var | None]:
  """(k with GLOBAL and LOCAL axes written over the flat indices, the gidx Var, the lidx Var or None)."""
  glob = [a.var for a in k.of_kind(K.GLOBAL)]
  loc = [a.var for a in k.of_kind(K.LOCAL, K.GROUP_REDUCE)]
  gidx = sym.Var(GIDX, 0, max(k.groups - 1, 0))
  lidx = sym.Var(LIDX, 0, k.local_size[0] - 1) if loc else None
  env: dict = {}
  for flat, vs in ((gidx, glob), (lidx, loc)):
    acc = 1
    for v in reversed(vs):
      q = sym.div(flat, acc)
      env[v] = q if v is vs[0] else sym.mod(q, v.hi + 1)
      acc *= v.hi + 1
  return substitute_kernel(k, env), gidx, lidx
