"""Linearize a Kernel into a flat listing of statements for one parallel work item.

Each value goes to the outermost scope where everything it depends on exists, so loop-invariant
code motion falls out: a value of the row is computed before the loop over the row's columns, a
reduction's accumulator lives just outside its own loops. Statements:

  ("loop", var)                     open `for var in range(var.hi + 1)`
  ("end",)                          close the innermost loop
  ("let", name, val, arg_names)     name = val applied to the named arguments
  ("acc", name, reduce)             name = the reduction's identity
  ("update", name, reduce, arg)     name = reduce.op(name, arg)   (per lane when reduce.lanes > 1)
  ("fold", name, reduce)            name = the lanes' partial results combined (after the loops)
  ("store", buf, idx, arg)          bufs[buf][idx] = arg
"""
from __future__ import annotations
from fusegrad.graph import symbolic as sym
from fusegrad.codegen.ir import Kernel, LaneRead, Reduce, Store, children, dependencies, toposort


def linearize(k: Kernel) -> list:
  roots = [st.value for st in k.stores]
  deps = dependencies(roots)
  owner = {}                        # reduce loop var -> (Reduce, position)
  for v in toposort(roots):
    if isinstance(v, Reduce):
      for i, var in enumerate(v.loops): owner[var] = (v, i)
  out_path = {var: tuple(k.loops[:i + 1]) for i, var in enumerate(k.loops)}
  memo: dict = {}

  def var_path(var) -> tuple:
    if var in out_path: return out_path[var]
    if var in owner:
      r, i = owner[var]
      return scope(r) + r.loops[:i + 1]
    return ()                       # gidx: the root scope

  def scope(v) -> tuple:
    s = memo.get(id(v))
    if s is None:
      s = ()
      for var in deps[id(v)]:
        if isinstance(v, Reduce) and var in v.lane_of: continue   # its lanes live outside those loops
        p = var_path(var)
        if len(p) > len(s): s = p
      memo[id(v)] = s
    return s

  lists: dict = {(): []}
  names: dict = {}
  counter = [0, 0]

  def close(p: tuple, var) -> tuple:
    body = lists.pop(p)
    p = p[:-1]
    lists[p] += [("loop", var), *body, ("end",)]
    return p

  def emit(v) -> str:
    if id(v) in names: return names[id(v)]
    s = scope(v)
    if isinstance(v, Reduce):
      acc = f"acc{counter[1]}"
      counter[1] += 1
      lists[s].append(("acc", acc, v))
      p = s
      for var in v.loops:
        p = p + (var,)
        lists[p] = []
      lists[p].append(("update", acc, v, emit(v.src)))
      for var in reversed(v.loops): p = close(p, var)
      if v.lane_of:   # consumers read their own lane inside the output lane loops
        name = f"v{counter[0]}"
        counter[0] += 1
        idx = sym.const(0)
        for var in v.lane_of: idx = idx * (var.hi + 1) + var
        lists[max((var_path(x) for x in v.lane_of), key=len)].append(("let", name, LaneRead(v, idx, v.dtype), (acc,)))
        names[id(v)] = name
        return name
      if v.lanes > 1: lists[p].append(("fold", acc, v))
      names[id(v)] = acc
      return acc
    args = tuple(emit(c) for c in children(v))
    name = f"v{counter[0]}"
    counter[0] += 1
    lists[s].append(("let", name, v, args))
    names[id(v)] = name
    return name

  p = ()
  for var in k.loops:
    p = p + (var,)
    lists[p] = []
  for st in k.stores: lists[p].append(("store", st.buf, st.idx, emit(st.value)))
  for var in reversed(k.loops): p = close(p, var)
  return lists[()]


def format_listing(listing: list) -> str:
  """A readable rendering of a listing (the PYTHON device shows this as its 'source')."""
  lines, ind = [], ""
  for st in listing:
    if st[0] == "loop": lines.append(f"{ind}for {st[1].name} in range({st[1].hi + 1}):"); ind += "  "
    elif st[0] == "end": ind = ind[:-2]
    elif st[0] == "let":
      v = st[2]
      what = type(v).__name__ + (f" {v.op}" if hasattr(v, "op") else "")
      extra = f" b{v.buf}[{v.idx!r}]" if hasattr(v, "idx") and hasattr(v, "buf") else \
          f" b{v.buf}" if hasattr(v, "buf") else f" {v.value!r}" if hasattr(v, "value") else ""
      lines.append(f"{ind}{st[1]} = {what}{extra}({', '.join(st[3])})")
    elif st[0] == "acc": lines.append(f"{ind}{st[1]} = identity of {st[2].op}")
    elif st[0] == "update": lines.append(f"{ind}{st[1]} = {st[2].op}({st[1]}, {st[3]})")
    elif st[0] == "fold": lines.append(f"{ind}{st[1]} = {st[2].op} of its {st[2].lanes} lanes")
    elif st[0] == "store": lines.append(f"{ind}b{st[1]}[{st[2]!r}] = {st[3]}")
  return "\n".join(lines)
