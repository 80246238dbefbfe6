"""Linearize an expanded, bound Kernel (codegen/passes) into a flat listing of typed statements for one work
item; every renderer and the numpy interpreter walk this listing through one dispatch on the statement type.

Each value goes to the outermost scope where everything it depends on exists, so loop-invariant code motion
falls out: a value of the row is computed before the loop over the row's columns, a reduction's accumulator
lives just outside its own loops. Reductions that share their loops (the copies of a register tile) share
one loop nest. Within a scope, statements and inner loops are ordered by their dependencies.

A read-ahead hint (ir.Prefetch) is a PrefetchSt first in the innermost loop its index runs over.

A prefetched local tile (ir.Stage.prefetch, the loop over the tiles p) is three statements: its Let copies the first
tile just before p's loop; in p's loop a Fetch loads the item's share of the next tile into registers before the
step's reads of the tile (LocalLoads), and after them one Refill per loop stores every fetched tile into local
memory.
"""
from __future__ import annotations
import heapq
from dataclasses import dataclass
from fusegrad.graph import symbolic as sym
from fusegrad.codegen.ir import (Kernel, AxisKind, Reduce, Stage, LocalLoad, Val, VecDType, children, dependencies,
                                 toposort, axis_variables)


@dataclass(frozen=True)
class Loop:
  var: sym.Var              # for var in range(var.hi + 1)...
  end: sym.Lin | None = None   # ...or up to this runtime end (ir.Axis.end: over kernel arguments), at most that

@dataclass(frozen=True)
class End:
  pass

@dataclass(frozen=True)
class Let:
  name: str
  val: Val
  args: tuple               # the names of the value's children

@dataclass(frozen=True)
class Acc:
  name: str
  reduce: Reduce            # name = the reduction's identity

@dataclass(frozen=True)
class Update:
  name: str
  reduce: Reduce
  args: tuple               # name = op(name, arg) for each arg in order

@dataclass(frozen=True)
class StoreSt:
  buf: int
  idx: sym.Lin
  valid: sym.Cond
  arg: str                  # where valid: bufs[buf][idx] = arg
  vec: object = None        # ir.VecDType of a vector value: bufs[buf][idx:idx+count] = arg
  lanes: tuple = ()         # of a vector value: only lanes lo <= i < hi stored (ir.Store.lanes)


@dataclass(frozen=True)
class PrefetchSt:
  """Ask for bufs[buf][idx] ahead of its use (ir.Prefetch: a hint; nothing is read or written)."""
  buf: int
  idx: sym.Lin


@dataclass(frozen=True)
class Fetch:
  """Where `valid` holds (the loop over the tiles has a next step), the work item's copy steps of the next step's
  tile of the prefetched Stage named `name` (ir.Stage.item_steps) loaded into its registers `name`_r0, _r1, ..."""
  name: str
  stage: Stage
  valid: sym.Cond

@dataclass(frozen=True)
class Refill:
  """The registers that the Fetches of `names` (their `stages`) loaded, stored into their tiles' local memory where
  `valid` holds (the step had a next one): with one buffer between two barriers (the step's reads are done, the
  stores are seen), with two into the buffer of the next step, then one barrier."""
  names: tuple
  stages: tuple
  valid: sym.Cond


class LinearizeError(RuntimeError):
  """The kernel's loops cannot be nested as its values need (a bug in an earlier stage)."""


def linearize(k: Kernel) -> list:
  roots = [st.value for st in k.stores]
  vals = toposort(roots)
  deps = dependencies(roots)
  reduces = [v for v in vals if isinstance(v, Reduce)]
  out_loops = [a.var for a in k.of_kind(AxisKind.LOOP)]
  out_path = {var: tuple(out_loops[:i + 1]) for i, var in enumerate(out_loops)}
  # reductions sharing their first loop variable share the loop nest: one scope for the group
  group_of = {id(r): r.loops[0] for r in reduces if r.loops}
  members: dict = {}
  for r in reduces:
    if r.loops: members.setdefault(r.loops[0], []).append(r)
  owner = {var: (r, i) for r in reduces for i, var in enumerate(r.loops)}
  gpath_memo: dict = {}

  def longest(paths) -> tuple:
    best = ()
    for p in paths:
      if len(p) > len(best): best, p = p, best
      if best[:len(p)] != p: raise LinearizeError(f"scopes {best} and {p} do not nest in kernel {k.name}")
    return best

  def var_path(var) -> tuple:
    if var in out_path: return out_path[var]
    if var in owner:
      r, i = owner[var]
      return group_path(r) + r.loops[:i + 1]
    return ()                       # gidx, lidx: the root scope

  def group_path(r: Reduce) -> tuple:
    g = group_of.get(id(r))
    key = g if g is not None else id(r)
    p = gpath_memo.get(key)
    if p is None:
      rs = members[g] if g is not None else [r]
      p = gpath_memo[key] = longest(var_path(x) for m in rs for x in deps[id(m)])
    return p

  # the scope of every value: its own variables' and its children's scopes (a reduction: its group's); a prefetched
  # tile's copy of its first step: just outside the loop over the tiles
  path: dict = {}
  for v in vals:
    if isinstance(v, Reduce): path[id(v)] = group_path(v)
    elif isinstance(v, Stage) and v.prefetch is not None: path[id(v)] = var_path(v.prefetch)[:-1]
    else:
      # a value's own index variables (a leaf's all; a read of a local tile's, beside its tile's scope)
      own = deps[id(v)] if not children(v) else axis_variables(v.idx) if isinstance(v, LocalLoad) else ()
      path[id(v)] = longest([var_path(x) for x in own] + [path[id(c)] for c in children(v)])
  # every statement in its scope's block; a block's items are statements and inner loops (by their variable)
  stmts: list = []
  where: list = []                  # the scope of each statement
  names: dict = {}
  done_at: dict = {}                # id(val) -> (scope, item) after which the value exists
  items: dict = {(): []}
  edges: dict = {}
  counter = [0, 0]

  def item_in(scope: tuple, p: tuple, st: int):
    """The item of block `scope` that holds a statement at scope p (itself, or the inner loop around it)."""
    return ("st", st) if len(p) == len(scope) else ("loop", p[len(scope)])

  def add(st, p: tuple) -> int:
    i = len(stmts)
    stmts.append(st)
    where.append(p)
    for n in range(len(p) + 1):     # register the statement's enclosing loops as items of their blocks
      items.setdefault(p[:n], [])
      it = item_in(p[:n], p, i)
      if it not in items[p[:n]]: items[p[:n]].append(it)
    return i

  def after(i: int, dep_scope: tuple, dep_stmt: int) -> None:
    """Statement i runs after statement dep_stmt (at dep_scope) has: an edge in their common block."""
    p = where[i]
    n = 0
    while n < min(len(p), len(dep_scope)) and p[n] == dep_scope[n]: n += 1
    c = p[:n]
    a, b = item_in(c, dep_scope, dep_stmt), item_in(c, p, i)
    if a != b: edges.setdefault(c, set()).add((a, b))

  def use(i: int, v) -> str:
    scope, st = done_at[id(v)]
    after(i, scope, st)
    return names[id(v)]

  for v in vals:
    if isinstance(v, Reduce):
      gp = path[id(v)]
      name = f"acc{counter[1]}"
      counter[1] += 1
      a = add(Acc(name, v), gp)
      names[id(v)] = name
      u = add(Update(name, v, ()), gp + v.loops)
      after(u, gp, a)
      args = tuple(use(u, c) for c in children(v))
      stmts[u] = Update(name, v, args)
      # the result exists once the loop nest is done: a statement placed in the group's scope stands for it
      done_at[id(v)] = (gp + v.loops, u)
    else:
      name = f"v{counter[0]}"
      counter[0] += 1
      i = add(None, path[id(v)])
      stmts[i] = Let(name, v, tuple(use(i, c) for c in children(v)))
      names[id(v)] = name
      done_at[id(v)] = (path[id(v)], i)
  ends = {a.var: a.end for a in k.axes if a.end is not None}
  # prefetched tiles: the next tile's loads before the step's first read of it, the stores after its last
  refills: dict = {}
  for v in vals:
    if not (isinstance(v, Stage) and v.prefetch is not None): continue
    p = v.prefetch
    if longest(var_path(x) for x in deps[id(v)]) != var_path(p):   # (the tile changes along p and the loops outside)
      raise LinearizeError(f"the prefetched tile {names[id(v)]} of kernel {k.name} depends on a loop inside {p}")
    nxt = sym.Cond.range(p, 0, p.hi)   # p + 1 <= p.hi
    if p in ends: nxt = nxt & sym.Cond.range(ends[p] - p, 2, (1 << 62))   # p + 1 < its runtime end
    f = add(Fetch(names[id(v)], v, nxt), var_path(p))
    after(f, *done_at[id(v)])
    if p not in refills: refills[p] = add(Refill((), (), nxt), var_path(p))
    r = refills[p]
    stmts[r] = Refill(stmts[r].names + (names[id(v)],), stmts[r].stages + (v,), nxt)
    after(r, where[f], f)
    for i, st in enumerate(stmts):
      if isinstance(st, Let) and isinstance(st.val, LocalLoad) and st.val.src is v:
        after(i, where[f], f)
        after(r, where[i], i)
  for st in k.stores:
    over = sym.variables(st.idx) | st.valid.variables()
    for x in st.lanes: over |= sym.variables(x)
    p = longest([var_path(x) for x in over] + [path[id(st.value)]])
    i = add(None, p)
    vd = st.value.dtype
    stmts[i] = StoreSt(st.buf, st.idx, st.valid, use(i, st.value), vd if isinstance(vd, VecDType) else None, st.lanes)

  # read-ahead hints (ir.Prefetch) in the innermost loop their index runs over, before the loop's other statements
  for pf in k.prefetches:
    p = longest([var_path(x) for x in sym.variables(pf.idx)])
    i = add(PrefetchSt(pf.buf, pf.idx), p)
    block = items[p]
    block.insert(0, block.pop(block.index(("st", i))))

  out: list = []
  def emit(scope: tuple) -> None:
    order = _toposort(items.get(scope, []), edges.get(scope, set()), k)
    for it in order:
      if it[0] == "st": out.append(stmts[it[1]])
      else:
        out.append(Loop(it[1], ends.get(it[1])))
        emit(scope + (it[1],))
        out.append(End())
  emit(())
  return out


def _toposort(its: list, edges: set, k: Kernel) -> list:
  """The items in dependency order, otherwise in the order they were made."""
  pos = {it: i for i, it in enumerate(its)}
  indeg = {it: 0 for it in its}
  succ: dict = {}
  for a, b in edges:
    succ.setdefault(a, []).append(b)
    indeg[b] += 1
  ready = [(pos[it], it) for it in its if indeg[it] == 0]
  heapq.heapify(ready)
  out = []
  while ready:
    _, it = heapq.heappop(ready)
    out.append(it)
    for b in succ.get(it, ()):
      indeg[b] -= 1
      if indeg[b] == 0: heapq.heappush(ready, (pos[b], b))
  if len(out) != len(its): raise LinearizeError(f"the statements of kernel {k.name} depend on each other in a cycle")
  return out


def format_listing(listing: list) -> str:
  """A readable rendering of a listing (the PYTHON device shows this as its 'source')."""
  lines, ind = [], ""
  for st in listing:
    if isinstance(st, Loop):
      lines.append(f"{ind}for {st.var.name} in range({st.var.hi + 1 if st.end is None else repr(st.end)}):"); ind += "  "
    elif isinstance(st, End): ind = ind[:-2]
    elif isinstance(st, Let):
      v = st.val
      what = type(v).__name__ + (f" {v.op}" if hasattr(v, "op") else f" {v.tc.name}" if hasattr(v, "tc") else "")
      extra = f" b{v.buf}[{v.idx!r}]" if hasattr(v, "idx") and hasattr(v, "buf") else \
          f" b{v.buf}" if hasattr(v, "buf") else f" {v.value!r}" if hasattr(v, "value") else \
          f" p{v.slot}" if hasattr(v, "slot") else ""
      lines.append(f"{ind}{st.name} = {what}{extra}({', '.join(st.args)})")
    elif isinstance(st, Acc): lines.append(f"{ind}{st.name} = identity of {st.reduce.op}")
    elif isinstance(st, Update): lines.append(f"{ind}{st.name} = {st.reduce.op}({st.name}, {', '.join(st.args)})")
    elif isinstance(st, StoreSt):
      guard = "" if st.valid.is_true else f"if {st.valid!r}: "
      lines.append(f"{ind}{guard}b{st.buf}[{st.idx!r}] = {st.arg}")
    elif isinstance(st, Fetch):
      lines.append(f"{ind}if {st.valid!r}: {st.name}_r* = Fetch b{st.stage.buf}[{st.stage.idx!r}] at "
                   f"{st.stage.prefetch.name}+1")
    elif isinstance(st, PrefetchSt): lines.append(f"{ind}prefetch b{st.buf}[{st.idx!r}]")
    elif isinstance(st, Refill):
      lines.append(f"{ind}if {st.valid!r}: Refill({', '.join(n + '_r*' for n in st.names)})")
  return "\n".join(lines)
