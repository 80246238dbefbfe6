"""Aliasing on a lazy graph: views that share storage, in-place writes through them, version counters.

Values are immutable graph nodes, so PyTorch's shared storage is emulated by functionalization. A
`Storage` holds the current value (node) of a base tensor, a version count and weak references to the
views taken of it; a view tensor carries `_alias = (storage, chain, hist)`, the chain being the view
ops ((op, arg) pairs: RESHAPE, PERMUTE, EXPAND, SHRINK, FLIP, STRIDE, DETACH) that take the base's value
to the view's. An in-place op on any member (`write`) computes the base's new value by running the
writer's new value back through the inverse of its chain (a shrink or a strided slice becomes pad +
where over the old value), then gives every live member its chain applied to that new value and bumps
the version. Members are updated when the write happens (push), so reading a tensor stays a plain
attribute read: a tensor that is never viewed and written costs nothing.

Autograd (autograd.py) reads two things from here: the write sequence numbers of a storage (a value a
gradient rule needs must not have been written after the rule's recipe was recorded, as PyTorch's
version counters check), and `hist`, a tensor's earlier autograd states (stand-ins), so that recipes
recorded before an in-place op still see the value and the graph they saw.
"""
from __future__ import annotations
import contextlib
import weakref
from fusegrad import autograd
from fusegrad.engine import jit as _jit, trace as _trace, realize as _realize

_KEEP_WRITES = 32   # write sequence numbers kept per storage (enough to name the version a recipe saw)


class Storage:
  __slots__ = ("node", "ref", "members", "version", "writes", "limit")

  def __init__(self, base):
    self.node = base.node           # the base's current value, used when the base tensor itself is gone
    self.ref = weakref.ref(base)
    self.members: list = []         # weak references to views (the base is `ref`)
    self.version = 0
    self.writes: list = []          # sequence numbers (autograd._seq) of the latest writes
    self.limit = 8

  def written_after(self, seq: int) -> bool: return bool(self.writes) and self.writes[-1] > seq

  def version_at(self, seq: int) -> int:
    return self.version - sum(1 for w in self.writes if w > seq)


def storage_of(t) -> Storage:
  """t's storage, making t the base of a new one if it has none."""
  a = t._alias
  if a is None:
    st = Storage(t)
    t._alias = (st, (), None)
    return st
  return a[0]


def view(src, r, ops: tuple):
  """Register r as a view of src (r's value is src's with ops applied); returns r."""
  if r is src: return r
  a = src._alias
  if a is None:
    st, chain = Storage(src), ()
    src._alias = (st, (), None)
  elif type(a[1]) is tuple: st, chain = a[0], a[1]
  else: return r          # a stand-in or internal snapshot: its views need no aliasing
  r._alias = (st, chain + ops, None)
  m = st.members
  m.append(weakref.ref(r))
  if len(m) > st.limit:
    st.members = m = [w for w in m if w() is not None]
    st.limit = max(8, 2 * len(m))
  return r


def leave(t) -> None:
  """t leaves its storage (its value becomes its own, as when torch gives a tensor new storage): later
  writes to t and to the views taken before do not reach each other."""
  a = t._alias
  if a is None or type(a[1]) is not tuple: return
  st = a[0]
  if st.ref() is t: st.node, st.ref = t.node, _dead
  t._alias = None if a[2] is None else (Storage(t), (), a[2])


def _dead(): return None


def apply_chain(x, chain):
  """The tensor chain of view ops takes x to (recorded for autograd like any movement)."""
  from fusegrad.tensor import Tensor
  for op, arg in chain:
    x = Tensor(_node=x.node) if op == "DETACH" else x._mv(op, arg)
  return x


def _apply_nodes(node, chain):
  from fusegrad.graph import node as gn
  for op, arg in chain:
    if op != "DETACH": node = gn.movement(node, op, arg)
  return node


def _unapply(op, arg, new, old):
  """The value before `op` given the new value after it and the old value before it."""
  from fusegrad.tensor import Tensor, where
  from fusegrad.graph import node as gn
  from fusegrad import dtype as dt
  if op == "RESHAPE": return new._mv("RESHAPE", old.shape)
  if op == "PERMUTE":
    inv = [0] * len(arg)
    for i, p in enumerate(arg): inv[p] = i
    return new._mv("PERMUTE", tuple(inv))
  if op == "FLIP": return new._mv("FLIP", arg)
  if op == "DETACH": return Tensor(_node=new.node)
  mask = Tensor(_node=gn.const(True, dt.bool_, new.shape, new.device))
  if op == "STRIDE":
    for d, k in enumerate(arg):
      if k == 1: continue
      new, mask = _spread(new, d, k, old.shape[d]), _spread(mask, d, k, old.shape[d])
  elif op == "SHRINK":
    pads = tuple((lo, s - hi) for (lo, hi), s in zip(arg, old.shape))
    new, mask = new._mv("PAD", pads), mask._mv("PAD", pads)
  else: raise AssertionError(op)
  return where(mask, new, old)


def _spread(t, d: int, k: int, n: int):
  """Put k - 1 zeros after each element along dim d and cut to n: a strided slice's values in place."""
  s = t.shape
  t = t._mv("RESHAPE", s[:d + 1] + (1,) + s[d + 1:])
  t = t._mv("PAD", tuple((0, k - 1) if i == d + 1 else (0, 0) for i in range(t.ndim)))
  t = t._mv("RESHAPE", s[:d] + (s[d] * k,) + s[d + 1:])
  return t._mv("SHRINK", tuple((0, n) if i == d else (0, x) for i, x in enumerate(t.shape)))


def _members(st: Storage, skip) -> list:
  out = []
  for w in st.members:
    m = w()
    if m is None or m is skip: continue
    a = m._alias
    if a is not None and a[0] is st and type(a[1]) is tuple: out.append(m)
  return out


def write(t, r) -> None:
  """t takes r's value in place (same shape and dtype): the base and every other view of t's storage
  see the write; autograd is told (rebinding with history) where it records."""
  if _trace._seg[0] is not None and _trace.on_write(t, r): return   # held pending by a replayed step
  from fusegrad.tensor import Tensor
  a = t._alias
  if a is None or type(a[1]) is not tuple:     # the common case: a tensor nobody viewed
    t._alias = None     # (an internal snapshot that gets written becomes a tensor of its own)
    st = storage_of(t)
    chain = ()
  else:
    st, chain = a[0], a[1]
  if any(op == "EXPAND" for op, _ in chain):
    raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a single "
                       "memory location. Please clone() the tensor before performing the operation.")
  detached = any(op == "DETACH" for op, _ in chain)
  base = st.ref() if chain else t
  base_node = base.node if base is not None else st.node
  rec = autograd.grad_enabled() and r.dtype.is_float and (r.requires_grad or t.requires_grad or
                                                           (not detached and base is not None and base.requires_grad))
  if rec and chain and not detached and base is not None and base._ctx is None and base.requires_grad:
    raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place operation.")
  _jit.note_rebind(base if base is not None else t)
  if not chain:
    base_new = r
  else:
    full = rec and not detached     # the write reaches the base through autograd too
    with (contextlib.nullcontext() if full else autograd.no_grad()):
      x = base if (base is not None and full) else Tensor(_node=base_node)
      olds = [x]
      for op, arg in chain[:-1]: olds.append(apply_chain(olds[-1], ((op, arg),)))
      v = r
      for (op, arg), old in zip(reversed(chain), reversed(olds)): v = _unapply(op, arg, v, old)
      base_new = v
  s = next(autograd._seq)
  st.version += 1
  st.writes.append(s)
  if len(st.writes) > _KEEP_WRITES: del st.writes[:-_KEEP_WRITES]
  st.node = base_new.node
  full = rec and not detached
  # the writer
  if rec: autograd.rebind(t, r, s)
  else: t.node = r.node
  if chain:
    if base is not None:
      if full: autograd.rebind(base, base_new, s)
      else: base.node = base_new.node
    else:       # the base tensor is gone: its new value stands for it
      base_new._alias = (st, (), None)
      st.ref = weakref.ref(base_new)
      base = base_new
  # a parameter written through `.data` is computed with the next realize, whatever it realizes, as PyTorch's write
  # happens at once: updated by hand (`p.data.add_(p.grad, alpha=-lr)`, then the loss read) it would otherwise stay
  # a lazy graph growing by a step's backward every step (an optimizer's own writes are realized by its step)
  if detached and base is not None and base.requires_grad and base._ctx is None: _realize.later(base)
  members = _members(st, t)
  if not members: return
  if full:
    with autograd.enable_grad():
      for m in members: autograd.rebind(m, apply_chain(base, m._alias[1]), s)
  else:
    for m in members: m.node = _apply_nodes(base_new.node, m._alias[1])


def write_node(t, node) -> None:
  """write(t, a tensor of node) without autograd, as an optimizer's write is made (a replayed step's,
  engine/trace.py): the common case (nobody views t) without write's general path."""
  a = t._alias
  if a is not None and (type(a[1]) is not tuple or a[1] or _members(a[0], t)):
    from fusegrad.tensor import Tensor
    with autograd.no_grad(): write(t, Tensor(_node=node))
    return
  if a is None: st = storage_of(t)
  else: st = a[0]
  _jit.note_rebind(t)
  s = next(autograd._seq)
  st.version += 1
  st.writes.append(s)
  if len(st.writes) > _KEEP_WRITES: del st.writes[:-_KEEP_WRITES]
  st.node = t.node = node


def set_node(t, node) -> None:
  """Give t a new value without autograd (a captured step's replay, loading a state dict): its views follow."""
  a = t._alias
  if a is None or not a[1] and not a[0].members:
    t.node = node
    if a is not None: a[0].node = node
    return
  from fusegrad.tensor import Tensor
  with autograd.no_grad():
    write(t, Tensor(_node=node))


# ---- strides: the layout PyTorch would give a view (fusegrad's buffers are contiguous; a view's layout is its chain
# run over its storage's contiguous base)

def contiguous_strides(shape) -> tuple:
  out, acc = [], 1
  for s in reversed(shape):
    out.append(acc)
    acc *= max(int(s), 1)
  return tuple(reversed(out))


def layout(t) -> tuple:
  """(strides, storage offset) of t in elements, as PyTorch's would be: a view's from its chain over the base's
  contiguous layout (a negative step gives a negative stride, as numpy's views); any other tensor is contiguous."""
  a = t._alias
  if a is None or type(a[1]) is not tuple or not a[1]: return contiguous_strides(t.shape), 0
  st = a[0]
  base = st.ref()
  shape = tuple(base.shape) if base is not None else tuple(st.node.shape)
  strides, off = contiguous_strides(shape), 0
  for op, arg in a[1]:
    if op == "RESHAPE":
      new = reshape_strides(shape, strides, arg)
      strides = new if new is not None else contiguous_strides(arg)   # (internal chains reshape only where it views)
      shape = tuple(arg)
    elif op == "PERMUTE":
      shape, strides = tuple(shape[p] for p in arg), tuple(strides[p] for p in arg)
    elif op == "EXPAND":
      strides = tuple(0 if o != n else s for s, o, n in zip(strides, shape, arg))
      shape = tuple(arg)
    elif op == "SHRINK":
      off += sum(lo * s for (lo, _), s in zip(arg, strides))
      shape = tuple(hi - lo for lo, hi in arg)
    elif op == "FLIP":
      off += sum((shape[d] - 1) * strides[d] for d in arg if shape[d])
      strides = tuple(-s if d in arg else s for d, s in enumerate(strides))
    elif op == "STRIDE":
      shape = tuple(-(-n // k) for n, k in zip(shape, arg))
      strides = tuple(s * k for s, k in zip(strides, arg))
  return strides, off


def reshape_strides(shape, strides, new) -> tuple | None:
  """The strides that view a tensor of (shape, strides) as shape `new` without a copy, or None where none do (one
  of new's dims would span two non-adjacent chunks): PyTorch's rule for view() and for reshape() returning a view."""
  if not shape or any(int(s) == 0 for s in shape):
    return contiguous_strides(new)
  newst = [0] * len(new)
  vd = len(new) - 1
  base = strides[-1] if strides else 1
  tn = vn = 1
  for td in range(len(shape) - 1, -1, -1):
    tn *= shape[td]
    if td == 0 or (shape[td - 1] != 1 and strides[td - 1] != tn * base):
      while vd >= 0 and (vn < tn or new[vd] == 1):
        newst[vd] = vn * base
        vn *= new[vd]
        vd -= 1
      if vn != tn: return None
      if td > 0:
        base, tn, vn = strides[td - 1], 1, 1
  if vd != -1: return None
  return tuple(newst)
