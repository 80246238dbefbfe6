"""Forward templates: library functions whose graph is recorded once per input structure and made again directly.

`@templated` marks a function of tensors (layer_norm, softmax, scaled_dot_product_attention, ...) that builds a
graph of many frontend ops: its first call over inputs of one structure runs it and records the nodes it made
(graph/template.py); a later call with inputs of the same structure makes those nodes again (through the
hash-consing cache) and gives the output one recipe for autograd, "FN", instead of one per frontend op. FN's
gradient rule (autograd._fn_rule) runs the function again, with gradients, over the same nodes (hash-consing finds
the template's nodes, so nothing is computed twice) and differentiates through it; a backward template
(autograd.py) then records the whole backward, so in a training loop neither runs again. A function may return a
tuple of tensors (batch_norm's core: y and the new running statistics, which its caller writes): each output that
had a gradient when recorded gets its own FN recipe, naming its place in the tuple.

The key of a call: each input tensor's node (its op, dtype, shape, device and argument, a constant's exact value;
a realized one as an input slot), which inputs are the same tensor, which need a gradient, every other argument
by value (numbers exactly), the grad mode and the default float dtype. A call is not templated (it runs the
function) when an argument is something else than tensors and plain values, or where runtime sizes exist; a
function whose call read a value on the host, ran host code (random numbers draw their keys there), wrote an input,
returned one of its inputs, or reached a node the template cannot express (a realized one or a buffer outside its
inputs; an unrealized node made before the call, which hash-consing handed back, is a function of the inputs and
recorded like the call's own) is not recorded (after a few such calls of one key, never again).
FUSEGRAD_TEMPLATES=0 turns templates off.
"""
from __future__ import annotations
import collections
import functools
import threading
from fusegrad import autograd, config, dtype as dt
from fusegrad.engine import jit as _jit
from fusegrad.graph import dims, template

FORWARD = True                # False: backward templates only (tests compare the paths)
_MAX = 256                    # keys kept per function (least recently used out)
_TRIES = 3                    # failed recordings of one key before it is left alone
_lock = threading.Lock()
stats = {"hits": 0, "records": 0}   # calls made from a template, and templates recorded (tests read them)


def templated(fn):
  """The decorator; fn(*args, **kwargs) -> one Tensor, or a tuple of Tensors (each output that needs a gradient
  gets its own FN recipe, naming its place in the tuple)."""
  cache: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if not (config.TEMPLATES and FORWARD) or dims.bound_any[0]: return fn(*args, **kwargs)
    tensors: list = []
    try:
      spec = (_spec(args, tensors), _spec(kwargs, tensors))
    except template.Untemplatable:
      return fn(*args, **kwargs)
    if not tensors: return fn(*args, **kwargs)
    needs = autograd.grad_enabled() and any(t.requires_grad for t in tensors)
    ins, ext = _inputs_key(tensors)
    key = (spec, ins, needs, dt.default_float)
    tpl = cache.get(key)
    if tpl is _NEVER: return fn(*args, **kwargs)
    if tpl is None or type(tpl) is int: return _record(fn, args, kwargs, tensors, ext, cache, key, tpl or 0)
    stats["hits"] += 1
    entries, refs, grads, many = tpl
    from fusegrad.tensor import Tensor
    # through the hash-consing cache where a gradient will run the function again (its rule finds these nodes)
    made = template.instantiate(entries, ext, shared=needs)
    outs = tuple(Tensor(_node=template.node_of(r, made, ext)) for r in refs)
    if needs:
      ins = tuple(tensors)
      for k, o in enumerate(outs):   # each output that had a gradient its own recipe: the function, which output
        if grads[k]: autograd.record(o, "FN", (fn, spec, k if many else None), ins)
    return outs if many else outs[0]

  return wrapper


def _spec(a, tensors: list):
  """An argument as a hashable value, tensors as ("tensor", place in `tensors`) (appended there)."""
  t = type(a)
  if a is None or t is str or t is bool or t is int: return (t, a)
  if t is float: return (float, a.hex())
  if t is dt.DType: return a
  if t is tuple or t is list: return (t.__name__,) + tuple(_spec(x, tensors) for x in a)
  if t is dict: return ("dict",) + tuple((k, _spec(v, tensors)) for k, v in a.items())
  if t is slice: return ("slice", _spec(a.start, tensors), _spec(a.stop, tensors), _spec(a.step, tensors))
  if a is Ellipsis: return ("...",)
  if hasattr(t, "_ctx") and hasattr(t, "node"):   # a Tensor (its class: a traced placeholder's slots stay unread)
    tensors.append(a)
    return ("tensor", len(tensors) - 1)
  raise template.Untemplatable(f"an argument of type {t.__name__}")


def rebuild(spec, tensors: list):
  """The arguments `_spec` described, with `tensors` in the tensors' places."""
  if isinstance(spec, dt.DType): return spec
  t = spec[0]
  if t == "tensor": return tensors[spec[1]]
  if t == "tuple" or t == "list":
    out = [rebuild(x, tensors) for x in spec[1:]]
    return tuple(out) if t == "tuple" else out
  if t == "dict": return {k: rebuild(v, tensors) for k, v in spec[1:]}
  if t == "slice": return slice(*(rebuild(x, tensors) for x in spec[1:]))
  if t == "...": return Ellipsis
  if t is float: return float.fromhex(spec[1])
  return spec[1]


def _node_key(n) -> tuple:
  # a realized node is an input slot, but a constant stays its value even realized (node.alu folds it: x * ones)
  if n.buffer is not None and n.op != "CONST" and n.op != "IOTA": return ("IN", n.dtype, n.shape, n.device)
  a = n.arg
  a = (float, a.hex()) if type(a) is float else (type(a), a) if type(a) in (int, bool) else a
  return (n.op, n.dtype, n.shape, n.device, a, len(n.src))


def _inputs_key(tensors: list) -> tuple[tuple, list]:
  """(the key of the inputs, the external nodes a template refers to): each input's node, and an unrealized
  view's source too, the one node below an input that building on it reaches (movements compose into one view
  over that source: graph/node.movement)."""
  first: dict = {}
  out, ext, below = [], [], []
  for i, t in enumerate(tensors):
    n = t.node
    ext.append(n)
    out.append((_node_key(n), first.setdefault(id(t), i), first.setdefault(("node", id(n)), i), t.requires_grad))
    if n.op == "VIEW" and n.buffer is None and n.src: below.append(n.src[0])
  for b in below:
    out.append(_node_key(b))
    ext.append(b)
  return tuple(out), ext


def _record(fn, args, kwargs, tensors, ext_nodes: list, cache, key, tries: int):
  reads = _jit.host_reads[0]
  before = [t.node for t in tensors]
  out = fn(*args, **kwargs)
  try:
    from fusegrad.tensor import Tensor
    many = type(out) is tuple
    outs = out if many else (out,)
    if not outs or any(type(o) is not Tensor for o in outs):
      raise template.Untemplatable("the result is no tensor or tuple of tensors")
    if _jit.host_reads[0] != reads: raise template.Untemplatable("the function read or wrote values on the host")
    if any(t.node is not b for t, b in zip(tensors, before)): raise template.Untemplatable("an input was written")
    if any(o is t for o in outs for t in tensors): raise template.Untemplatable("the result is an input")
    # a node made before the call is an entry too: the function reached it only by building on its inputs (hash-
    # consing handed back an equal node that a live graph still holds: the same layer called again on the same
    # input while the last result's graph lives), so it is a function of them; a realized one still refuses
    entries, refs = template.record([o.node for o in outs], ext_nodes, lambda n: True)
    # which outputs carry a gradient is a function of the key (the inputs that need one, the grad mode)
    value = (entries, refs, tuple(o.requires_grad for o in outs), many)
    stats["records"] += 1
  except template.Untemplatable:
    value = tries + 1 if tries + 1 < _TRIES else _NEVER
  with _lock:
    cache[key] = value
    if len(cache) > _MAX: cache.popitem(last=False)
  return out


class _Never:
  """A key whose calls are not recorded any more."""


_NEVER = _Never()
