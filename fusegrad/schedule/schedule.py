"""Fusion: cut the graph behind some nodes into as few kernels as possible.

A node gets a kernel (and a buffer) of its own only when it must: it was asked for, it is a
CONTIGUOUS or a COPY boundary, one kernel cannot express the fusion (lowering refuses: codegen/lower.py), or
fusing it would cost work — a reduction that several kernels need, or a cost rule of schedule/rules.py (a big
reduction recomputed in another's loop, a value recomputed per element, too little parallel work). Everything
else — elementwise chains, views, reductions and what follows them — is inlined into the kernel that consumes it.
Each cut records its rule and reason (`ScheduleItem.why`).
"""
from __future__ import annotations
import heapq
import math
import operator
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from fusegrad import config
from fusegrad.graph import ops, dims
from fusegrad.graph.node import Node, plain
from fusegrad.codegen.lower import (analyze, build, dim_map, is_param, param_value, param_values, DimOf, Fixed,
                                    NeedsRealize, _alu_count, _OP_COST)
from fusegrad.schedule import rules
from fusegrad.codegen.ir import Gather, Kernel, Reduce, toposort

# Threads: realize reads nodes (realized or not, their sources) while it builds a schedule, and another
# thread's realize sets nodes' buffers and drops their sources. `lock` makes the two exclusive: a schedule
# is built from one consistent state of the graph (a node realized half-way would make its key, its lowering
# and its input slots disagree), and it also guards the two caches below. Compiling and running kernels
# happen outside it. Re-entrant: a buffer's __del__ may run anywhere.
lock = threading.RLock()

# lowering results by the structure of the fused subgraph (not its buffers): a training loop or
# a benchmark that rebuilds the same graph each step lowers each kernel once
LOWER_CACHE_SIZE = 4096
_lower_cache: "OrderedDict[tuple, tuple]" = OrderedDict()


@dataclass
class ScheduleItem:
  kind: str                 # "KERNEL", "COPY" or "EMPTY" (no elements: a buffer and nothing to run)
  outputs: list
  inputs: list
  kernel: Kernel | None = None
  why: str = ""             # why these outputs are not fused into their consumers (FUSEGRAD_DEBUG=3 prints it)
  params: list = field(default_factory=list)   # the nodes bound to the kernel's arguments, by slot (None: the
                                               # kernel's own value, Kernel.example)

  def param_values(self) -> list: return param_values(self.kernel, self.params)


def _needs_kernel(n: Node) -> bool:
  return not n.realized and n.op not in ("BUFFER",)


_PARAM = ("param",)   # a kernel argument's place in a structure: its value is bound at launch (lower.is_param)


def _view_key(v) -> tuple:
  """A view over a buffer, keyed without its offset: lowering makes the offset a kernel argument."""
  return ("view", v.shape, v.strides, v.mask)


def _bound_view_key(v, src: Node, leaf: bool) -> tuple:
  """A view keyed with its runtime sizes by their Variable (the rest, strides and masks included, by value),
  without its offset where lowering makes that an argument (a view of a plain leaf: _view_key), and by the dims it
  maps where its source has runtime sizes and lowering maps it dim by dim (lower.dim_map: its strides hold them)."""
  if dims.tags(src.shape):
    m = dim_map(v, src.shape)
    if m is not None: return ("view", dims.shape_key(v.shape), m, v.mask)
    return ("view", dims.shape_key(v.shape), v.strides, v.offset, v.mask)
  return ("view", dims.shape_key(v.shape), v.strides, None if leaf else v.offset, v.mask)


def _arg_key(arg):
  if isinstance(arg, float):
    if arg != arg: return ("nan",)
    if arg == 0.0 and math.copysign(1.0, arg) < 0: return ("-0.0",)   # equal to 0.0, yet 1/x tells them apart
    return (float, arg)
  return (type(arg), arg) if isinstance(arg, (bool, int)) else arg


def _structure(roots: list[Node]) -> tuple[tuple, list[Node]]:
  """The whole graph behind roots as a flat hashable record (what a schedule depends on: each node's op, dtype,
  shape, device, argument and sources; a realized node is an input slot), and its nodes in creation order (a
  topological order: sources are older). It runs on every realize, a cache hit included, so it is one lean walk;
  equal records mean isomorphic graphs whatever order produced them, so the order only decides hits, never
  correctness."""
  # (nodes hash and compare by identity, in C: sets and dicts of them need no id() calls)
  seen: set = set()
  add = seen.add
  stack = list(roots)
  pop, extend = stack.pop, stack.extend
  while stack:
    n = pop()
    if n in seen: continue
    add(n)
    if n.buffer is None: extend(n.src)
  nodes = sorted(seen, key=_by_seq)
  index = dict(zip(nodes, range(len(nodes))))
  at = index.__getitem__
  flat: list = []
  push, extend = flat.append, flat.extend
  tagged = dims.bound_any[0]   # runtime sizes are keyed by their Variable too (graph/dims.py)
  if tagged: return _structure_tagged(roots, nodes, index)
  for n in nodes:
    if n.buffer is not None:
      push(("IN", n.dtype.name, n.shape, n.device))
      continue
    src = n.src
    if n.op == "VIEW" and src[0].buffer is not None:   # a view of a buffer: keyed without its offset
      push(("VIEW", n.dtype.name, n.shape, n.device, _view_key(n.arg), 1))
    else:
      k = n.skey
      if k is None:   # the node's own part, kept on it (nothing in it changes while the node is unrealized)
        # plain values only (a dtype by name, a view as a tuple), as node.make's keys: the collector stops tracking
        # such a tuple at its first young collection, rather than promoting one per node with the step's graph
        a = n.arg
        k = n.skey = (n.op, n.dtype.name, n.shape, n.device, plain(tuple(a)) if n.op == "VIEW" else a
                      if a is None or not isinstance(a, (bool, int, float)) else
                      _PARAM if is_param(n) else _arg_key(a), len(src))
      push(k)
    for x in src: push(at(x))
  extend(map(at, roots))
  return tuple(flat), nodes


def _structure_tagged(roots: list[Node], nodes: list[Node], index: dict) -> tuple[tuple, list[Node]]:
  """_structure's record where runtime sizes exist: each shape also keyed by its Variables."""
  flat: list = []
  push = flat.append
  for n in nodes:
    if n.buffer is not None:
      push("IN"); push(n.dtype); push(n.shape); push(n.device); push(dims.tags(n.shape))
      continue
    a, src = n.arg, n.src
    push(n.op); push(n.dtype); push(n.shape); push(n.device); push(dims.tags(n.shape))
    if n.op == "VIEW" and src[0].buffer is not None and not dims.tags(src[0].shape): push(_view_key(a))
    else: push(a if a is None or not isinstance(a, (bool, int, float)) else _PARAM if is_param(n) else _arg_key(a))
    push(len(src))
    for x in src: push(index[x])
  for r in roots: push(index[r])
  return tuple(flat), nodes


_by_seq = operator.attrgetter("seq")


def _signature(roots: list[Node], is_boundary) -> tuple[tuple, list[Node], list[Node]]:
  """The fused subgraph under roots as a hashable structure, its boundary inputs in walk order, and
  the node of each entry (for mapping a cached answer back onto this graph)."""
  index: dict[int, int] = {}
  entries, nodes, inputs = [], [], []
  root_ids = {id(r) for r in roots}
  bound = dims.bound_any[0]
  shape_of = dims.shape_key if bound else (lambda s: s)   # runtime sizes by their Variable (_lower_cached)
  stack = [(r, False) for r in reversed(roots)]
  while stack:
    n, done = stack.pop()
    if done:
      index[id(n)] = len(entries)
      src = tuple(index[id(s)] for s in n.src)
      arg = _PARAM if is_param(n) else \
          _bound_view_key(n.arg, n.src[0], entries[src[0]][0] == "IN") if bound and n.op == "VIEW" \
          else _view_key(n.arg) if n.op == "VIEW" and entries[src[0]][0] == "IN" else _arg_key(n.arg)
      entries.append((n.op, n.dtype, shape_of(n.shape), n.device, arg, src))
      nodes.append(n)
      continue
    if id(n) in index: continue
    # a boundary is an input slot, except unrealized constants and iotas: lowering inlines those, so their
    # values belong to the structure (a kernel cached for one constant must not serve another)
    if id(n) not in root_ids and (n.realized or (is_boundary(n) and n.op not in ("CONST", "IOTA"))):
      index[id(n)] = len(entries)
      entries.append(("IN", n.dtype, shape_of(n.shape), n.device, len(inputs)))
      nodes.append(n)
      inputs.append(n)
      continue
    stack.append((n, True))
    for s in reversed(n.src): stack.append((s, False))
  return tuple(entries) + (tuple(index[id(r)] for r in roots),), inputs, nodes


# work counters, read by tests that bound how much scheduling a graph costs (never by the scheduler itself)
stats = {"lower_calls": 0, "nodes_walked": 0, "region_visits": 0, "schedule_hits": 0, "schedule_misses": 0, "replays": 0,
         "bound_verified": 0, "bound_by_value": 0}


def lower_cached(roots: list[Node], is_boundary) -> tuple[Kernel, list[Node], list[Node]]:
  """(the kernel computing roots, its input nodes, the CONST nodes bound to its Params)"""
  with lock: return _lower_cached(roots, is_boundary)


def _lower_cached(roots: list[Node], is_boundary) -> tuple[Kernel, list[Node], list[Node]]:
  key, inputs, nodes = _signature(roots, is_boundary)
  stats["lower_calls"] += 1
  stats["nodes_walked"] += len(nodes)
  hit = _lower_cache.get(key)
  if dims.bound_any[0] and hit is not None:
    hit = _bound_hit(key, hit, roots, is_boundary, inputs, nodes)
  if hit is None:
    hit = _lower_entry(roots, is_boundary, inputs, nodes)
    _lower_cache[key] = hit
    if len(_lower_cache) > LOWER_CACHE_SIZE: _lower_cache.popitem(last=False)
  else:
    _lower_cache.move_to_end(key)
  if hit[0] == "cut": raise NeedsRealize(nodes[hit[1]], hit[2])
  return hit[1], [inputs[i] for i in hit[2]], [_param_node(i, nodes) for i in hit[3]]


def _lower_entry(roots, is_boundary, inputs, nodes) -> tuple:
  """A lowering cache entry: ("ok", kernel, input positions, argument specs, runtime sizes, verified) or ("cut",
  node position, why, runtime sizes, verified); positions are in the signature walk's nodes."""
  sizes = _sizes(nodes)
  try:
    k, ins, params = _lower_judged(roots, is_boundary)
    pos = {id(x): i for i, x in enumerate(inputs)}
    at = {id(x): i for i, x in enumerate(nodes)}
    specs = tuple(None if x is None else ("dim", at[id(x.node)], x.axis) if type(x) is DimOf else at[id(x)]
                  for x in params)
    return ("ok", k, tuple(pos[id(x)] for x in ins), specs, sizes, False)
  except NeedsRealize as e:
    return ("cut", nodes.index(e.node), e.why, sizes, False)


def _sizes(nodes) -> tuple:
  """The values of the runtime sizes (graph/dims.py) in the walk's nodes, in walk order."""
  if not dims.bound_any[0]: return ()
  return tuple(v for n in nodes for v in dims.values(n.shape))


def _bound_hit(key, hit, roots, is_boundary, inputs, nodes):
  """A cache entry keyed with runtime sizes by their Variable serves every value only if lowering does not depend
  on the value: the first time another value meets an entry, it is lowered again and compared. The same kernel (and
  the same cut): the entry is verified and serves every value from then on. Another one: the entry is keyed by
  value from then on ("by value": each value its own entry)."""
  if hit[0] == "byvalue":
    vkey = key + (_sizes(nodes),)
    h = _lower_cache.get(vkey)
    if h is None:
      h = _lower_cache[vkey] = _lower_entry(roots, is_boundary, inputs, nodes)
      if len(_lower_cache) > LOWER_CACHE_SIZE: _lower_cache.popitem(last=False)
    return h
  n = 4 if hit[0] == "ok" else 3
  if hit[n + 1] or not hit[n] or hit[n] == _sizes(nodes): return hit
  fresh = _lower_entry(roots, is_boundary, inputs, nodes)
  if fresh[:n] == hit[:n]:
    hit = hit[:n + 1] + (True,)
    stats["bound_verified"] += 1
  else:
    _lower_cache[key + (hit[n],)] = hit
    _lower_cache[key + (fresh[n],)] = hit = fresh
    _lower_cache[key] = ("byvalue",)
    stats["bound_by_value"] += 1
    return hit
  _lower_cache[key] = hit
  return hit


def _param_node(spec, nodes):
  if spec is None: return None
  return DimOf(nodes[spec[1]], spec[2]) if type(spec) is tuple else nodes[spec]


def _lower_judged(roots: list[Node], is_boundary) -> tuple[Kernel, list[Node], list[Node]]:
  """Lower roots unless the fusion cannot be expressed (lowering's refusal) or a cost rule cuts it: either raises
  NeedsRealize naming the node to cut, with the reason for the log."""
  p = rules.params(roots[0].device)
  f = analyze(roots, is_boundary, lambda src, is_leaf: rules.broadcast_cut(src, is_leaf, p),
              lambda src, is_leaf: rules.padded_reduction(src, is_leaf, p))
  cut = rules.judge(f, p)
  if cut is None:
    k, ins = build(f)
    hit = rules.tile_operands(f, k, p)
    if hit is None: return k, ins, f.b.params
    cut = hit[0], rules.reason("tile_operands", hit[1])
  raise NeedsRealize(*cut)


# whole schedules by the structure of the graph behind the roots: a training step rebuilds the same
# graph every iteration, and its cuts, kernels and buffer wiring are decided once
SCHEDULE_CACHE_SIZE = 256
_schedule_cache: "OrderedDict[tuple, CachedSchedule]" = OrderedDict()


class CachedSchedule:
  """A schedule stored by structure: each item as positions in the signature walk's node list, and the plan that
  engine/realize.py builds on its first run (the compiled kernels and their buffer wiring, replayed from then on).
  A rewrite (rules.rewrite_reductions) adds nodes of its own: their positions follow the walk's, and `extra` keeps
  what stands in for each on a later hit (its op, dtype, shape and device: a buffer to allocate, nothing else)."""
  __slots__ = ("entries", "plan", "extra")

  def __init__(self, entries: list, extra: tuple = ()):
    self.entries, self.plan, self.extra = entries, None, extra

  def extend(self, nodes: list[Node]) -> list[Node]:
    """The walk's nodes, then a stand-in for each node the rewrite made."""
    if not self.extra: return nodes
    return nodes + [Node(op, d, (), None, shape, dev) for op, d, shape, dev in self.extra]

  def items(self, nodes: list[Node]) -> list[ScheduleItem]:
    return [ScheduleItem(kind, [nodes[i] for i in outs], [nodes[i] for i in ins], k, why, bind_params(ps, nodes))
            for kind, outs, ins, k, why, ps in self.entries]


def bind_params(specs, nodes: list) -> list:
  """A cached schedule's argument specs (_param_spec) as ScheduleItem.params for the walk's nodes."""
  return [i if i is None or isinstance(i, Fixed) else _param_node(i, nodes) for i in specs]


def _param_spec(x, pos: dict):
  """How a cached schedule finds an argument's value again: a walk position, None (the kernel's own), or the value
  itself (a node the rewrite made: the same structure makes it with the same value)."""
  if x is None: return None
  if type(x) is DimOf: return ("dim", pos[id(x.node)], x.axis) if id(x.node) in pos else Fixed(param_value(x))
  return pos[id(x)] if id(x) in pos else Fixed(param_value(x))


def create_schedule(roots: list[Node]) -> list[ScheduleItem]:
  with lock:
    items, entry, walked = schedule(roots)
    return items if items is not None else entry.items(walked)   # a cached schedule with a plan: its items


def schedule(roots: list[Node]) -> tuple[list[ScheduleItem] | None, CachedSchedule | None, list[Node]]:
  """(items, the cache entry or None, the signature walk's nodes), under `lock`. On a cache hit whose entry has a
  plan, items is None: the caller replays the plan on the nodes (CachedSchedule.items builds them if it must)."""
  roots = [r for r in roots if _needs_kernel(r)]
  if not roots: return [], None, []
  key, nodes = _structure(roots)
  hit = _schedule_cache.get(key)
  if hit is not None:
    stats["schedule_hits"] += 1
    _schedule_cache.move_to_end(key)
    nodes = hit.extend(nodes)
    return (None if hit.plan is not None else hit.items(nodes)), hit, nodes
  stats["schedule_misses"] += 1
  # graph rewrites first (a big reduction into few outputs becomes two): the schedule is made for the rewritten
  # graph, and each item then names the original node wherever a new one replaced it
  new_roots, back, cuts = rules.rewrite_reductions(roots)
  items = _create_schedule(new_roots, cuts)
  if back:
    orig = lambda xs: [back.get(id(x), x) for x in xs]
    items = [ScheduleItem(it.kind, orig(it.outputs), orig(it.inputs), it.kernel, it.why, it.params) for it in items]
  if config.DEBUG >= 3:
    for it in items: print(f"schedule: {it.kind.lower()} {it.outputs[0].op} {list(it.outputs[0].shape)}: {it.why}")
  pos = {id(n): i for i, n in enumerate(nodes)}
  extra = []
  for it in items:   # outputs outside the walk: nodes the rewrite made (the partial results of a split)
    for o in it.outputs:
      if id(o) not in pos:
        pos[id(o)] = len(nodes) + len(extra)
        extra.append(o)
  try:
    entry = CachedSchedule([(it.kind, tuple(pos[id(o)] for o in it.outputs), tuple(pos[id(x)] for x in it.inputs),
                             it.kernel, it.why, tuple(_param_spec(x, pos) for x in it.params)) for it in items],
                           tuple((o.op, o.dtype, o.shape, o.device) for o in extra))
  except KeyError:    # an item refers to a node outside the walked graph: do not cache this one
    return items, None, nodes + extra
  _schedule_cache[key] = entry
  if len(_schedule_cache) > SCHEDULE_CACHE_SIZE: _schedule_cache.popitem(last=False)
  return items, entry, nodes + extra


def _create_schedule(roots: list[Node], cuts: dict[int, str] | None = None) -> list[ScheduleItem]:
  """The kernels computing roots; `cuts`: node ids a rewrite already cut, with their reasons."""
  order: list[Node] = []
  seen = set()
  for r in roots:
    for n in r.toposort():
      if id(n) not in seen:
        seen.add(id(n)); order.append(n)
  # why each cut node has a kernel of its own: the "why not fused" log
  why: dict[int, str] = {id(r): "requested" for r in roots}
  for x, w in (cuts or {}).items(): why.setdefault(x, w)
  for n in order:
    if n.realized: continue
    if n.op in ("CONTIGUOUS", "COPY"): why.setdefault(id(n), rules.reason("boundary", f"{n.op.lower()} is a kernel boundary"))
    if n.op in ("COPY", "GATHER") and not n.src[0].realized:
      why.setdefault(id(n.src[0]), rules.reason("gather_source" if n.op == "GATHER" else "boundary",
                                                f"a {n.op.lower()} reads it from memory"))
  cut = set(why)
  # graph rules, in one pass before any lowering: a big reduction feeding another's loop is stored
  for x, w in rules.nested_reduction_cuts(order, lambda n: id(n) in cut).values():
    why.setdefault(id(x), w)
    cut.add(id(x))

  is_boundary = lambda n: id(n) in cut or n.realized
  consumers: dict[int, list] = {}
  for n in order:
    if n.realized: continue
    for s in n.src: consumers.setdefault(id(s), []).append(n)
  for r in roots: consumers.setdefault(id(r), []).append(None)   # read by whoever asked for it
  pos = {id(n): i for i, n in enumerate(order)}
  share_ops = rules.params(roots[0].device).share_ops if roots else 0

  # Cuts only ever get added, and each addition re-walks only the kernels whose fused region held the new cut,
  # so deciding them costs about one walk of the graph per cut's neighbourhood (never a restart from scratch).
  region: dict[int, list] = {}          # kernel root id -> the unrealized, uncut nodes it computes inline
  member_of: dict[int, set] = {}        # node id -> kernel roots whose region holds it
  lowered: dict[int, tuple] = {}
  todo: list = []                       # order positions of kernels to lower (a heap: graph order)
  byid = {id(n): n for n in order}

  def walk(k: Node) -> None:
    for x in region.pop(id(k), ()):
      if x in member_of: member_of[x].discard(id(k))   # (a node cut since has no entry)
    lowered.pop(id(k), None)
    heapq.heappush(todo, pos[id(k)])
    if k.op == "COPY": return
    inside, stack = [], [k]
    seen_k: set = set()
    while stack:
      x = stack.pop()
      for s in x.src:
        if s.realized or id(s) in cut or id(s) in seen_k: continue
        seen_k.add(id(s)); inside.append(id(s)); stack.append(s)
    region[id(k)] = inside
    stats["region_visits"] += len(inside)
    for x in inside: member_of.setdefault(x, set()).add(id(k))

  def add_cuts(xs: list) -> list:
    """Cut at each of xs; the kernels that held one of them inline (and their own) are walked again, once
    each, and returned."""
    touched = {}
    for x in xs:
      for k in member_of.pop(id(x), ()): touched[k] = byid[k]
      touched[id(x)] = x
    for k in touched.values(): walk(k)
    return list(touched.values())

  def share_reductions(touched: list) -> None:
    """A reduction that two kernels would both compute gets its own kernel (or one at the end of the elementwise
    chain all its uses go through), and so does a long elementwise value (past `share_ops`; sources first, each
    judged with the cuts before it; not a product a reduction reads, which cost rules judge), until none is shared.
    A recurrence's chain, c_t = f(c_{t-1}) read by every step's kernel, is so stored every few steps instead of
    being recomputed whole by each step's kernel: quadratic work at run time, and more in scheduling (every cut
    lowering found in it re-walked every later step's region)."""
    while touched:
      shared = {x for k in touched for x in region.get(id(k), ()) if len(member_of.get(x, ())) > 1}
      new, covered = [], set()   # (the terms of a sum of reductions cut whole this round: shared no more)
      for x in sorted(shared, key=pos.__getitem__):
        if x in cut or x in covered: continue
        n = byid[x]
        if n.op != "REDUCE":
          if n.op in ops.ELEMENTWISE and \
             not any(u is not None and u.op == "REDUCE" for u in consumers.get(x, ())) and \
             _alu_count(n, is_boundary, share_ops, _OP_COST) > share_ops:
            e = _chain_end(n, consumers, cut)
            if id(e) in cut: continue   # (its chain ends at a stored value, cut this round: no longer shared)
            why[id(e)] = rules.reason("shared_value", f"a long elementwise value {len(member_of[x])} kernels would "
                                      "compute" + ("" if e is n else " (stored where its only use chain ends)"))
            cut.add(id(e)); new.append(e)
          continue
        e, terms = _accumulation_end(_epilogue_end(n, consumers, cut), consumers, cut)
        covered |= {id(t) for t in terms}
        if id(e) not in cut:
          what = f"a sum of {len(terms) + 1} reductions" if terms else "a reduction"
          why[id(e)] = rules.reason("shared_reduction", f"{what} {len(member_of[x])} kernels read" +
                                    ("" if e is n else " (stored after its epilogue)"))
          cut.add(id(e)); new.append(e)
      touched = add_cuts(new)

  kernels = [n for n in order if id(n) in cut]
  for n in kernels: walk(n)
  share_reductions(kernels)
  # lower the kernels in graph order; a refusal (lowering's, or a cost rule's on what lowering's first pass found)
  # cuts the node it names and re-lowers only what that changed
  while todo:
    n = order[heapq.heappop(todo)]
    if id(n) in lowered or n.op == "COPY" or n.numel == 0: continue
    try:
      lowered[id(n)] = lower_cached([n], is_boundary)
    except NeedsRealize as e:
      if is_boundary(e.node):   # a cut that is already there: lowering would refuse forever
        raise RuntimeError(f"internal error: lowering refused {e.node.op} {e.node.shape} ({e.why}), "
                           "which already has a kernel of its own") from None
      cut.add(id(e.node))
      why[id(e.node)] = e.why
      share_reductions(add_cuts([e.node]))
      heapq.heappush(todo, pos[id(n)])

  items = []
  for n in order:
    if id(n) not in cut: continue
    if n.numel == 0: items.append(ScheduleItem("EMPTY", [n], [], why=why[id(n)]))
    elif n.op == "COPY": items.append(ScheduleItem("COPY", [n], [n.src[0]], why=why[id(n)]))
    else:
      k, inputs, params = lowered[id(n)]
      items.append(ScheduleItem("KERNEL", [n], inputs, k, why[id(n)], params))
  return _merge_elementwise(items, is_boundary)


# how far the elementwise chain after a shared reduction may be followed (see _epilogue_end)
EPILOGUE_NODES = 8
EPILOGUE_OTHER_OPS = 6


def _epilogue_end(r: Node, consumers: dict, cut: set) -> Node:
  """Where to cut for a reduction r that several kernels read: at the end of the elementwise chain that every
  use of r goes through, if there is one (relu(x @ w + b): the matmul's kernel stores the activation). Its
  consumers then read a plain buffer instead of recomputing the chain, and nothing else needs r itself."""
  region = {id(r): r}
  end = r
  def cheap(x: Node) -> bool:   # another operand of the chain: a few elementwise ops over buffers and constants
    count, stack, seen = 0, [x], set()
    while stack:
      y = stack.pop()
      if id(y) in seen or id(y) in region or y.realized or id(y) in cut or y.op in ("CONST", "IOTA", "BUFFER"): continue
      seen.add(id(y))
      if y.op in ("REDUCE", "GATHER", "COPY", "CONTIGUOUS"): return False
      if y.op != "VIEW": count += 1
      if count > EPILOGUE_OTHER_OPS: return False
      stack.extend(y.src)
    return True
  for _ in range(EPILOGUE_NODES):
    nxt = None
    for n in list(region.values()):
      for u in consumers.get(id(n), ()):
        if u is not None and id(u) not in region and id(u) not in cut and _pointwise(u, r) and \
           all(id(s) in region or cheap(s) for s in u.src):
          nxt = u
          break
      if nxt is not None: break
    if nxt is None: break
    region[id(nxt)] = nxt
    exits = [n for n in region.values() if any(u is None or id(u) not in region for u in consumers.get(id(n), ()))]
    if len(exits) == 1 and exits[0] is nxt: end = nxt
  return end


def _chain_end(n: Node, consumers: dict, cut: set) -> Node:
  """Where to store an elementwise value n that several kernels would compute: where every use of it goes through
  one pointwise consumer after another, the last of them. A sum accumulated term by term (a [35, 20, 800] gradient
  added up from the steps' slices, s_k = s_(k-1) + pad(g_k)), read at its end by 4 kernels, was stored every few
  terms, each partial sum a full-size output (15 of them: 2.1 ms a call); at its end it is one output, each term
  read once. A value with uses of its own (a recurrence's c_t, read by its step's kernel and the next) stays where
  it is. A chain that reaches a stored value ends there (the caller then cuts nothing)."""
  while True:
    us = consumers.get(id(n), ())
    if len(us) != 1 or us[0] is None or not _pointwise(us[0], n): return n
    n = us[0]
    if id(n) in cut: return n


def _accumulation_end(e: Node, consumers: dict, cut: set) -> tuple[Node, list]:
  """Where a reduction's value e (after its epilogue) is one term of a sum of reductions of its size
  (rules.reduction_sum: a recurrent weight's gradient over the steps), the root of that sum, while it holds at most
  rules.ACCUMULATE_MAX reductions: one kernel computes them all and stores the sum, which its readers (the
  gradient's norm, the update) read; cut at each term, every term was a kernel and a buffer, and every reader added
  up all of them again. (The root, the other terms' reductions): e itself and none where its value has another use."""
  end, terms, budget, is_cut = e, [], [rules.ACCUMULATE_MAX - 1], lambda x: id(x) in cut
  while True:
    us = consumers.get(id(end), ())
    if len(us) != 1 or us[0] is None or us[0].op != "ADD" or us[0].numel != e.numel or id(us[0]) in cut: break
    others = [rules.reduction_sum(s, is_cut, budget) for s in us[0].src if s is not end]
    if any(t is None for t in others): break
    end = us[0]
    for t in others: terms += t
  return end, terms


def _pointwise(u: Node, r: Node) -> bool:
  """u reads its sources at its own element (an ALU op or a cast of r's size, or a reshape: the matmul's
  [n, 1, m] sum seen as [n, m])."""
  if u.op in ops.ELEMENTWISE: return u.numel == r.numel
  return u.op == "VIEW" and u.numel == r.numel and u.arg.mask is None and u.arg.is_contiguous


def _elementwise(k: Kernel) -> bool:
  """No reductions (and no gathers, whose data must stay a buffer of its own)."""
  return not any(isinstance(v, (Reduce, Gather)) for v in toposort([st.value for st in k.stores]))


def _merge_elementwise(items: list[ScheduleItem], is_boundary) -> list[ScheduleItem]:
  """Elementwise kernels of one shape where one reads another's output become one kernel with
  several outputs (an optimizer's parameter, momentum and variance update in one pass). In graph order, a
  consumer takes in a producer's group when nothing outside the group reads a member before the consumer runs
  (the merged kernel runs at its last member): a recurrence's steps (an LSTM's h_t and c_t, then the next step's
  matmul reading h_t) merge step by step, not into one group that the first outside reader refuses."""
  producer = {id(it.outputs[0]): i for i, it in enumerate(items)}
  readers: dict[int, list[int]] = {}
  for i, it in enumerate(items):
    for inp in it.inputs:
      j = producer.get(id(inp))
      if j is not None: readers.setdefault(j, []).append(i)
  group_of = list(range(len(items)))
  members: dict[int, list[int]] = {i: [i] for i in range(len(items))}
  ok = lambda it: it.kind == "KERNEL" and _elementwise(it.kernel)
  for i, it in enumerate(items):
    if not ok(it): continue
    for inp in it.inputs:
      j = producer.get(id(inp))
      if j is None or not ok(items[j]) or items[j].outputs[0].shape != it.outputs[0].shape or \
         items[j].outputs[0].device != it.outputs[0].device: continue
      g, gi = group_of[j], group_of[i]
      if g == gi: continue
      if all(r >= i or group_of[r] == g for m in members[g] for r in readers.get(m, ())):
        for m in members[g]: group_of[m] = gi
        members[gi] += members.pop(g)
  merged: dict[int, ScheduleItem] = {}    # last member's position -> the merged kernel
  skip: set[int] = set()
  for g in members.values():
    if len(g) == 1: continue
    g = sorted(g)
    ids = {id(items[j].outputs[0]) for j in g}
    outputs = [items[j].outputs[0] for j in g]
    try:
      k, inputs, params = lower_cached(outputs, lambda n: is_boundary(n) and id(n) not in ids)
    except NeedsRealize:
      continue
    merged[max(g)] = ScheduleItem("KERNEL", outputs, inputs, k, "; ".join(items[j].why for j in g), params)
    skip.update(g)
  out = []
  for i, it in enumerate(items):
    if i in merged: out.append(merged[i])
    elif i not in skip: out.append(it)
  return out
