"""Graph templates: the nodes a piece of graph-building code made, recorded once and made again directly.

Building a graph through the frontend costs several microseconds of Python per node (Tensors, argument checks,
broadcasting, views, autograd records, hash-consing); code that builds the same graph over inputs of the same
structure every call (a backward pass, layer_norm, softmax) can be recorded as a template: each node it made as
(op, dtype, sources, arg, shape, device), a source being an external node (by its place in a list the caller
keys: autograd's forward walk, a function's inputs) or an earlier template node. Making the nodes again from the
template costs about a microsecond each. What may be recorded (`record`) and what a template is keyed by are the
callers' business (autograd._template_key, fusegrad/templates.py); what must hold for both: the code reads no
value on the host, draws no random numbers, writes nothing, and makes no buffer — a template reproduces nodes,
nothing else.
"""
from __future__ import annotations
from fusegrad.graph.node import Node, make


class Untemplatable(Exception):
  """The recorded code made a graph a template cannot reproduce (the message says what)."""


MAX_ENTRIES = 1 << 17


def record(roots: list, ext_nodes: list, copy_old) -> tuple[tuple, tuple]:
  """(entries, the roots' refs) for the graph below roots: a node of `ext_nodes` is referred to by its (first) place
  there; any other node is an entry (a pure function of its sources) if it is unrealized and either new or one
  `copy_old(node)` accepts; a realized node or a buffer outside ext raises Untemplatable. A ref is a place in ext
  (>= 0) or ~j for entry j. Entries are in the order their nodes were made, so the nodes made from them are in
  the same order (the scheduler's structural keys walk graphs in creation order: the same order, the same key)."""
  ext: dict = {}
  for i, n in enumerate(ext_nodes): ext.setdefault(id(n), i)
  seen: set = set(ext)
  nodes: list = []
  for root in roots:
    stack = [root]
    while stack:
      n = stack.pop()
      if id(n) in seen: continue
      seen.add(id(n))
      if n.buffer is not None or n.op == "BUFFER": raise Untemplatable("a realized node outside the template's inputs")
      if not copy_old(n): raise Untemplatable(f"a {n.op} node made before the recorded code")
      nodes.append(n)
      if len(nodes) > MAX_ENTRIES: raise Untemplatable("too many nodes")
      stack += n.src
  nodes.sort(key=lambda n: n.seq)   # sources are older: a topological order
  refs = dict(ext)
  for j, n in enumerate(nodes): refs[id(n)] = ~j
  entries = tuple((n.op, n.dtype, tuple(refs[id(x)] for x in n.src), n.arg, n.shape, n.device) for n in nodes)
  return entries, tuple(refs[id(r)] for r in roots)


def made_since(start: int):
  """record's copy_old for code run after node seq `start`: its own nodes, and a constant or iota made before (a
  leaf hash-consing found); an input's own graph is reached only through ext."""
  return lambda n: n.seq >= start or (not n.src and n.op in ("CONST", "IOTA"))


def instantiate(entries: tuple, ext: list, shared: bool) -> list:
  """The entries' nodes over the external nodes ext. shared: through the hash-consing cache (node.make), so that
  building the same graph later by the frontend finds these nodes (a forward template's, which a gradient rule may
  rebuild); otherwise new nodes directly (a backward's: nothing rebuilds it)."""
  made: list = []
  add = made.append
  new = make if shared else Node
  for op, dtype, srcs, arg, shape, device in entries:
    add(new(op, dtype, tuple(made[~r] if r < 0 else ext[r] for r in srcs), arg, shape, device))
  return made


def node_of(ref: int, made: list, ext: list):
  return made[~ref] if ref < 0 else ext[ref]
