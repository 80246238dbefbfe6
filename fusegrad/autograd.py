"""Reverse-mode autograd over the lazy graph.

Every differentiable primitive the frontend applies (an ALU op, a cast, a movement, a reduction, a
gather, a window view, a copy) is recorded on its output as (kind, arg, inputs, output node). The
gradient rules are one table keyed by the same names (`RULES` and `ALU_RULES` below), written with
Tensor ops, so the backward pass is itself a lazy graph that fuses like the forward one.
"""
from __future__ import annotations
import collections
import contextlib
import itertools
import math
import threading
import weakref
from fusegrad import config, dtype as dt
from fusegrad.engine import jit as _jit
from fusegrad.graph import template

_state = threading.local()
_seq = itertools.count()   # recipes are numbered in creation order (see rebind)


def grad_enabled() -> bool: return getattr(_state, "enabled", True)


class _GradMode(contextlib.ContextDecorator):
  """no_grad / enable_grad: a context manager, and a decorator with or without parentheses (`@no_grad()`,
  `@no_grad`), as torch's. Each entry saves the mode it replaces (a decorated function that recurses enters the same
  object again), and a decorated generator function runs each of its resumptions in the mode."""
  mode = True

  def __new__(cls, orig_func=None):
    self = super().__new__(cls)
    self._prev = []
    if orig_func is None: return self
    if not callable(orig_func): raise TypeError(f"{cls.__name__}() takes no arguments, got {orig_func!r}")
    return self(orig_func)

  def __init__(self, orig_func=None): pass

  def __enter__(self):
    self._prev.append(grad_enabled())
    _state.enabled = self.mode

  def __exit__(self, *exc):
    _state.enabled = self._prev.pop()
    return False

  def __call__(self, fn):
    import functools
    import inspect
    if inspect.isgeneratorfunction(fn):
      mode = self.mode
      @functools.wraps(fn)
      def gen(*args, **kwargs):
        g = fn(*args, **kwargs)
        sent = None
        while True:
          prev = grad_enabled()
          _state.enabled = mode
          try:
            item = g.send(sent)
          except StopIteration as e:
            return e.value
          finally:
            _state.enabled = prev
          sent = yield item
      return gen
    return super().__call__(fn)


class no_grad(_GradMode):
  """with fusegrad.no_grad(): ops record nothing for autograd (also usable as a decorator)."""
  mode = False


class enable_grad(_GradMode):
  mode = True


def record(out, kind: str, arg, inputs: tuple) -> None:
  """Attach the recipe of `out` if any input needs a gradient."""
  if not grad_enabled() or not out.dtype.is_float: return
  if any(t.requires_grad for t in inputs):
    out._ctx = (kind, arg, inputs, out.node, next(_seq))
    out.requires_grad = True


def rebind(t, new, s: int) -> None:
  """t takes new's value and recipe in place (fusegrad/alias.py calls this for each tensor a write reaches; s is
  the write's sequence number). t's previous state moves to a stand-in kept in t's history: recipes recorded
  before the write resolve t to it (`_resolve`), so they keep the value and the graph they saw. new's own recipes
  that read t (the in-place op itself, `b.mul_(3)`) are pointed at the stand-in directly: like PyTorch, which
  saves what an in-place op needs of its input before overwriting it, they are exempt from the version check."""
  if t._ctx is None and t.requires_grad:    # a leaf keeps its identity: its gradient goes to it, whatever its value
    t.node = new.node
    return
  from fusegrad.tensor import Tensor
  a = t._alias
  old = Tensor(_node=t.node)
  old._ctx, old.requires_grad = t._ctx, t.requires_grad
  old._alias = (a[0], False, a[2])        # False: a stand-in, no view; its value never changes
  if new._ctx is not None:
    since = _installed(t._ctx) if t._ctx is not None else -1
    stack, seen = [new], set()
    while stack:
      x = stack.pop()
      if id(x) in seen or x._ctx is None or x._ctx[4] <= since: continue
      seen.add(id(x))
      ins = x._ctx[2]
      if any(i is t for i in ins):
        x._ctx = x._ctx[:2] + (tuple(old if i is t else i for i in ins),) + x._ctx[3:]
      stack.extend(i for i in ins if i is not t)
    t._ctx = new._ctx[:5] + (s,)
  elif t.requires_grad:    # overwritten by a value that needs no gradient: no leaf, and nothing flows back
    t._ctx = ("CONTIGUOUS", None, (Tensor(_node=new.node),), new.node, s, s)
  else:
    t._ctx = None
  t._alias = (a[0], a[1], (s, old))
  t.node = new.node
  t.requires_grad = t.requires_grad or new.requires_grad


def _installed(ctx) -> int:
  """The sequence number from which a recipe is its tensor's state (its recording, or the write that installed it)."""
  return ctx[5] if len(ctx) > 5 else ctx[4]


def _resolve(i, seq: int):
  """The state that tensor i had when the recipe numbered seq was recorded (i as it is, unless written since)."""
  a = i._alias
  while a is not None and a[2] is not None and seq < a[2][0]:
    i = a[2][1]
    a = i._alias
  return i


# ---- the rules: (arg, inputs, out_tensor, grad) -> one gradient (or None) per input ------------------

def _where(c, a, b):
  from fusegrad.tensor import where
  return where(c, a, b)


def _T(node):
  from fusegrad.tensor import Tensor
  return Tensor(_node=node)


def _sum_to(g, shape):
  return g if g.shape == tuple(shape) else g.reshape(shape)


def _alu_rule(op, inputs, out, g):
  a = inputs[0]
  b = inputs[1] if len(inputs) > 1 else None
  from fusegrad.tensor import where
  if op == "ADD": return g, g
  if op == "SUB": return g, -g
  if op == "MUL": return g * b, g * a
  if op == "DIV": return g / b, -g * a / (b * b)
  if op == "NEG": return (-g,)
  if op == "EXP": return (g * out,)
  if op == "LOG": return (g / a,)
  if op == "SQRT": return (g / (2 * out),)
  if op == "SIN": return (g * a.cos(),)
  if op == "COS": return (-g * a.sin(),)
  if op == "TAN": return (g * (1 + out * out),)
  if op == "TANH":   # sech^2 from exp(-2|x|): 1 - out^2 cancels to 0 past |x| = 9 (float32) and loses digits before
    e = (a.abs() * -2).exp()
    return (g * (4 * e / ((1 + e) * (1 + e))),)
  if op == "ERF": return (g * (2 / math.sqrt(math.pi)) * (-(a * a)).exp(),)
  if op == "ATAN": return (g / (1 + a * a),)
  if op == "ATAN2":   # atan2(a, b): d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2); 0 where a^2 + b^2 is 0 (torch's)
    d = a * a + b * b
    r = where(d == 0, 0.0, g / d)
    return r * b, -r * a
  if op == "RECIP": return (-g * out * out,)
  if op == "ABS": return (g * a.sign(),)
  if op in ("FLOOR", "CEIL", "RINT", "TRUNC"): return (g * 0,)
  if op == "POW":
    da = where(b == 0, 0.0, g * b * a.pow(b - 1))   # d/da a^0 is 0, also at a = 0
    # d/db a^b = a^b log(a): PyTorch's 0 where a = 0 and b >= 0, else the product as it comes (0^-1 log 0 is -inf)
    return da, where((a == 0) & (b >= 0), 0.0, g * (out * a.log()))
  if op == "MOD": return g, -g * (a / b).trunc()
  if op in ("MAX", "MIN"):
    # ties split the gradient equally, as torch.maximum/minimum do
    win = (a > b) if op == "MAX" else (a < b)
    tie = a == b
    ga = where(win, g, where(tie, g * 0.5, 0.0))
    gb = where(win, 0.0, where(tie, g * 0.5, g))
    return ga, gb
  if op == "WHERE": return None, where(a, g, 0.0), where(a, 0.0, g)
  return tuple(None for _ in inputs)   # comparisons, logic, bits: not differentiable


def _move_rule(arg, inputs, out, g):
  op, a = arg
  x = inputs[0]
  if op == "RESHAPE": return (g.reshape(x.shape),)
  if op == "PERMUTE":
    inv = [0] * len(a)
    for i, p in enumerate(a): inv[p] = i
    return (g.permute(*inv),)
  if op == "EXPAND":   # a broadcast may add leading dims too (Tensor._broadcast_to)
    lead = g.ndim - x.ndim
    axes = tuple(range(lead)) + tuple(lead + i for i, (s, n) in enumerate(zip(x.shape, g.shape[lead:])) if s != n)
    g = g.sum(axes, keepdim=True) if axes else g
    return (g.reshape(x.shape) if lead else g,)
  if op == "PAD":
    return (g._shrink([(b, b + s) for (b, _), s in zip(a, x.shape)]),)
  if op == "SHRINK":
    pads = []
    for (lo, hi), s in zip(reversed(a), reversed(x.shape)): pads += [lo, s - hi]
    return (g.pad(tuple(pads)),)
  if op == "FLIP": return (g.flip(*a),)
  if op == "STRIDE":
    for d, k in enumerate(a):
      if k == 1: continue
      g = g.unsqueeze(d + 1).pad(tuple([0, 0] * (g.ndim - d - 1) + [0, k - 1])).flatten(d, d + 1)
      g = g.narrow(d, 0, x.shape[d])
    return (g,)
  raise AssertionError(op)


def _reduce_rule(arg, inputs, out, g):
  op, axes = arg[:2]
  x = inputs[0]
  if op == "SUM": return (g.expand(*x.shape),)
  if op in ("MAX", "MIN"):
    hit = (x == out.expand(*x.shape)).float() if x.dtype != dt.float64 else (x == out.expand(*x.shape)).double()
    if len(arg) > 2:   # (Tensor._reduce's `selected`: an inf or NaN gradient reaches the maxima only)
      return (_where(hit != 0, g.expand(*x.shape) / hit.sum(axes, keepdim=True), 0.0),)
    return (g.expand(*x.shape) * hit / hit.sum(axes, keepdim=True),)
  if op == "PROD":
    if len(axes) == 1 and x.shape[axes[0]] <= 1024:
      # exact with zeros: the product of the others, over an n x n mask of the reduced axis
      from fusegrad.tensor import arange, where
      ax, n = axes[0], x.shape[axes[0]]
      xt = x.transpose(ax, -1).unsqueeze(-2)                         # [..., 1, n]
      eye = arange(n, device=x.device).reshape(n, 1) == arange(n, device=x.device).reshape(1, n)
      others = where(eye, 1.0, xt).prod(-1)                          # [..., n]: prod over j != i
      return (g.expand(*x.shape) * others.transpose(ax, -1).reshape(x.shape),)
    # exact with zeros over any axes: the product of the nonzero elements, given to the only zero if there is one
    from fusegrad.tensor import where
    z = x == 0
    nz = z.sum(axes, keepdim=True)
    p = where(z, 1.0, x).prod(axes, keepdim=True)
    return (g.expand(*x.shape) * where(nz == 0, p / x, where((nz == 1) & z, p, 0.0)),)
  raise AssertionError(op)


def _gather_rule(arg, inputs, out, g):
  data, pos = inputs
  from fusegrad.tensor import arange
  if arg is not None:   # Tensor.gather(d, index): a one-hot along d, index's size there x d's (cross_entropy's pick)
    d, index = arg
    n = data.shape[d]
    cls = arange(n, device=data.device).reshape(*[n if k == d + 1 else 1 for k in range(data.ndim + 1)])
    hit = index.unsqueeze(d + 1) == cls                                   # [.., J, n, ..]
    return _where(hit, g.unsqueeze(d + 1), 0).sum(d), None
  n = data.numel()
  hit = pos.reshape(-1, 1) == arange(n, device=data.device).reshape(1, n)   # one-hot scatter-add
  # (a select, not a product with the one-hot mask: an inf or NaN of g reaches its own position only, as PyTorch's
  # scatter-add gives it; 0 * inf would be NaN in every other position)
  flat = _where(hit, g.reshape(-1, 1), 0).sum(0)
  return flat.reshape(data.shape), None


def _unbroadcast(g, shape):
  """Sum g over the dims that broadcasting added or stretched, back to shape."""
  shape = tuple(shape)
  if g.shape == shape: return g
  lead = g.ndim - len(shape)
  axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1)
  return (g.sum(axes, keepdim=True) if axes else g).reshape(shape)


def _matmul_rule(arg, inputs, out, g):
  # out = a @ b (batch dims broadcast): da = g @ b^T, db = a^T @ g, summed over what was broadcast
  a, b = inputs
  ga = _unbroadcast(g @ b.mT, a.shape) if a.requires_grad else None
  if not b.requires_grad: return ga, None
  if b.ndim == 2 and a.ndim > 2:    # a batch against one matrix: one matmul over all rows
    a, g = a.reshape(-1, a.shape[-1]), g.reshape(-1, g.shape[-1])
  if b.ndim == 2 and a.ndim == 2:
    from fusegrad.tensor import _transposed_view
    # b is w.T (a Linear layer's weight): compute w's gradient g^T a in w's own layout, so that its consumer
    # (the optimizer's update, elementwise over w) reads it contiguously
    gb = (g.T @ a).T if _transposed_view(b) else a.T @ g
  else:
    gb = _unbroadcast(a.mT @ g, b.shape)
  return ga, gb


# an embedding's gradient is summed by sorting its indices (_rows_summed_by_sort) where the one-hot reduction's work
# (rows x indices x row size) is at least this. A call's backward on a 2-core Xeon, one-hot -> sorted: 5000 x 256 x 64
# 0.92 -> 2.37 ms (one-hot kept: ~30 small kernels cost more); a word LM's 2000 x 700 x 200 3.75 -> 1.47 ms;
# 1000 x 2048 x 256 8.2 -> 3.4 ms; GPT-2's vocabulary 50257 x 512 x 768 372 -> 19 ms, x 2048 tokens 1853 -> 26 ms
# (torch 46)...
SORTED_SCATTER_MIN = 1 << 27
# ...and this many times the sort's (indices^2 comparisons, twice)
SORTED_SCATTER_SHARE = 8


def _take_rows_rule(idx, inputs, out, g):
  # out[i, ...] = w[idx[i], ...]: dw[v] = the sum of g[i] where idx[i] == v (rows x indices x row size, tiled as a
  # matmul); a select, not one_hot(idx)^T @ g: an inf or NaN of g[i] reaches row idx[i] only, as PyTorch's
  from fusegrad.tensor import arange
  w = inputs[0]
  V = w.shape[0]
  M = idx.numel()
  C = w.numel() // max(V, 1)
  if not grad_enabled() and V * M * C >= SORTED_SCATTER_MIN and SORTED_SCATTER_SHARE * 2 * M * M <= V * M * C:
    return (_rows_summed_by_sort(idx.reshape(M), g.reshape(M, C), V).reshape(w.shape),)
  hit = idx.reshape(M, 1, 1) == arange(V, device=w.device).reshape(1, V, 1)     # [M, V, 1]
  return (_where(hit, g.reshape(M, 1, -1), 0).sum(0).reshape(w.shape),)


def _rows_summed_by_sort(idx, g, V: int):
  """[V, C]: row v the sum of the rows g[i] (g: [M, C]) whose idx[i] == v, 0 where none, in work indices^2 + indices
  x row size x log(indices) + rows x log(indices) instead of the one-hot reduction's rows x indices x row size (a
  word LM's 2000-word embedding over 700 tokens: 280 million multiply-adds for 140 thousand additions; a GPT-2
  vocabulary's, 50257 x 8192 x 768). The kernel IR has no stores at computed positions (a scatter), so: the indices
  sorted stably (each one's rank among (idx, position) pairs), g's rows gathered in that order, summed within each
  run of one index by a segmented scan (log2(M) steps, each stored: x_r += x_(r - s) where both rows hold the same
  index), and each row v reads the end of its run, found by a binary search of the sorted indices. Rows without an
  index select 0 (no product: an inf or NaN of g reaches its own row only). A half-precision g is summed in
  float32. Not differentiable (the caller keeps the one-hot form under create_graph)."""
  from fusegrad.tensor import Tensor, arange, where
  from fusegrad.graph import node as gn
  M, C = g.shape
  dev = g.device
  gd = g.dtype
  half = gd in (dt.float16, dt.bfloat16)
  if half: g = g._cast(dt.float32)

  def at(t, pos):   # t[pos] for t [N] or [N, C] and int64 positions [P] known to be in range: a gather, no checks
    if t.ndim == 1: return Tensor(_node=gn.gather(t.contiguous().node, pos.node))
    cols = t.shape[1]
    flat = pos.reshape(-1, 1) * cols + arange(cols, device=dev).reshape(1, cols)
    return Tensor(_node=gn.gather(t.contiguous().node, flat.node))

  with no_grad():
    i = arange(M, dtype=dt.int32, device=dev)
    k = idx._cast(dt.int32)
    before = (k.reshape(1, M) < k.reshape(M, 1)) | ((k.reshape(1, M) == k.reshape(M, 1)) & (i.reshape(1, M) < i.reshape(M, 1)))
    rank = before._cast(dt.int32).sum(1, dtype=dt.int32)                            # [M]: each pair's sorted place
    order = where(rank.reshape(1, M) == i.reshape(M, 1), i.reshape(1, M), 0).sum(1, dtype=dt.int32)
    order = order._cast(dt.int64).contiguous()                                      # order[r]: the i ranked r
    sk = at(k, order).contiguous()                                                  # the sorted indices
    x = at(g, order).contiguous()                                                   # g's rows in that order
    s = 1
    while s < M:
      same = (sk[s:] == sk[:-s]).pad((s, 0)).reshape(M, 1)
      x = (x + where(same, x[:-s].pad((0, 0, s, 0)), 0)).contiguous()
      s *= 2
    v = arange(V, device=dev)
    lo, hi = v * 0, v * 0 + M                                                       # the number of sorted indices <= v
    for _ in range(max(1, (M).bit_length())):
      mid = (lo + hi) // 2
      ok = (at(sk, mid.clamp(max=M - 1)) <= v) & (mid < hi)
      lo, hi = where(ok, mid + 1, lo), where(ok, hi, mid)
    last = (lo - 1).clamp(min=0)
    has = (lo > 0) & (at(sk, last) == v)
    out = where(has.reshape(V, 1), at(x, last), 0)
  return out._cast(gd) if half else out


def _sigmoid_grad(x, out, g):
  # out * sigmoid(-x): 1 - out would cancel to 0 for x past 17 (float32) and lose digits well before
  e = (-x.abs()).exp()
  return g * out * _where(x >= 0, e / (1 + e), (1 + e).reciprocal())


def _softplus_grad(arg, x, g):
  beta, threshold = arg
  bx = x * beta
  return _where(bx > threshold, g, g * bx.sigmoid())


def _window_rule(arg, inputs, out, g):
  # w[..., i, k] = x[..., i + k]: dx[..., j] = sum over k of g[..., j - k, k]
  from fusegrad.graph import node as gn
  from fusegrad.graph.view import View
  x = inputs[0]
  lead, (L, n) = g.shape[:-2], g.shape[-2:]
  if grad_enabled():
    # create_graph: Tensor ops only, so the gradient is itself differentiable (the view below is not recorded).
    # Row i of g shifted right by i (the skew of a [L, n + L] pad read with rows one shorter), summed over rows:
    # s[j] = sum over i of g[i, j - i]
    gg = g.reshape(-1, L, n).pad((0, L))                                  # [B, L, n + L]
    B, W = gg.shape[0], n + L
    s = gg.reshape(B, L * W).narrow(1, 0, L * (W - 1)).reshape(B, L, W - 1).sum(1)
    return (s.reshape(x.shape),)
  gp = g.reshape(-1, L, n).pad((0, 0, n - 1, n - 1)).contiguous()      # [B, L + 2n - 2, n]
  B, rows = gp.shape[0], L + 2 * n - 2
  v = View((B, L + n - 1, n), (rows * n, n, -(n - 1)), (n - 1) * n, None)
  flat = gp.reshape(B * rows * n)
  h = _T(gn.make("VIEW", flat.dtype, (flat.node,), v, v.shape, flat.device))
  return (h.sum(-1).reshape(*lead, L + n - 1).reshape(x.shape),)


# the gradient of a window view (_unfold_rule) is stored from this many elements on
UNFOLD_GRAD_STORE = 1 << 15


def _unfold_rule(arg, inputs, out, g):
  # w[:, o, k] = x[:, o * stride + k * dilation]: dx is the sum over kernel offsets k of g[:, :, k] spread
  # back to those positions (stride gaps by pad+reshape, offsets by pad) — prod(kernel) terms, one kernel
  import itertools
  kernel, stride, dilation = arg
  x = inputs[0]
  k = len(kernel)
  n = x.ndim - k                         # the leading dims the windows keep
  sp, osz = x.shape[n:], g.shape[n:n + k]
  total = None
  for off in itertools.product(*[range(m) for m in kernel]):
    t = g[(slice(None),) * (n + k) + off]
    for i, s in enumerate(stride):
      if s > 1: t = t.unsqueeze(n + i + 1).pad((0, 0) * (k - 1 - i) + (0, s - 1)).flatten(n + i, n + i + 1) \
                     .narrow(n + i, 0, (osz[i] - 1) * s + 1)
    pads = []
    for i in reversed(range(k)):
      lo = off[i] * dilation[i]
      pads += [lo, sp[i] - lo - ((osz[i] - 1) * stride[i] + 1)]
    t = t.pad(tuple(pads))
    total = t if total is None else total + t
  # stored when big: each element sums prod(kernel) guarded, spread reads, and recomputed, every kernel reading it (a
  # batch norm's two gradient sums and its input gradient, behind a max-pool or an im2col convolution) paid them
  # again (ResNet-18's step: its batch norms' backward reductions 20 -> 5 ms); a small one stays fused (one kernel)
  store = total is not None and math.prod(kernel) > 1 and total.numel() >= UNFOLD_GRAD_STORE
  return (total.contiguous() if store else total,)


def _conv_rows_rule(arg, inputs, out, g):
  from fusegrad.nn.functional import rows_matmul_grad
  return rows_matmul_grad(arg, inputs, out, g)


def _unfold_flat_rule(arg, inputs, out, g):
  # w[b, p, k(, c)] = x[b, (p + off(k)) * inner (+ c)]: dx is the sum over kernel offsets of g[:, :, k] shifted to its
  # offset
  import itertools
  from fusegrad.tensor import embed_positions
  kernel, steps, length, inner = arg
  B, M = inputs[0].shape
  if not isinstance(length, int):   # positions as dims: g back over the flat positions they read (0 between)
    pos = length
    length = sum((n - 1) * s for n, s in pos) + 1
    g = embed_positions(g, 1, pos, length)
  total = None
  for k in itertools.product(*[range(n) for n in kernel]):
    off = sum(i * s for i, s in zip(k, steps)) * inner
    t = g[(slice(None), slice(None)) + k].reshape(B, length * inner).pad((off, M - off - length * inner))
    total = t if total is None else total + t
  return (total,)


def _fn_rule(arg, ins, out, g):
  """A call that fusegrad/templates.py made from a template: the function runs again over its inputs' nodes (the
  hash-consing cache hands back the template's nodes) and the gradients come from its own recipes. A function of
  several outputs gives each its own recipe (arg's last item: the output's place): the gradient of each runs the
  function and differentiates through that output (two outputs that both get gradients: two runs, whose
  contributions add up at the inputs)."""
  from fusegrad.tensor import Tensor
  from fusegrad.templates import rebuild
  fn, (args, kwargs), k = arg
  if grad_enabled():   # create_graph: differentiable gradients, through the inputs themselves
    leaves = list(ins)
  else:                # new leaves over the same nodes: the walk below stops at them
    leaves = []
    for i in ins:
      t = Tensor(_node=i.node)
      if i.requires_grad: t.requires_grad = True
      leaves.append(t)
  with enable_grad(): y = fn(*rebuild(args, leaves), **rebuild(kwargs, leaves))
  if k is not None: y = y[k]
  want, seen = [], set()
  for t in leaves:
    if t.requires_grad and id(t) not in seen:
      seen.add(id(t))
      want.append(t)
  gs = dict(zip(map(id, want), grad([y], want, [g], create_graph=grad_enabled(), allow_unused=True)))
  out, given = [], set()
  for t in leaves:   # an input named twice gets its whole gradient once
    out.append(gs.get(id(t)) if id(t) not in given else None)
    given.add(id(t))
  return tuple(out)


RULES = {
  "ALU": lambda arg, ins, out, g: _alu_rule(arg, ins, out, g),
  "CAST": lambda arg, ins, out, g: (g.to(ins[0].dtype) if ins[0].dtype.is_float else None,),
  "MOVE": _move_rule,
  "REDUCE": _reduce_rule,
  "GATHER": _gather_rule,
  "TAKE_ROWS": _take_rows_rule,
  "MATMUL": _matmul_rule,
  "WINDOW": _window_rule,
  "UNFOLD": _unfold_rule,
  "UNFOLD_FLAT": _unfold_flat_rule,
  "CONV_ROWS": _conv_rows_rule,
  "CONTIGUOUS": lambda arg, ins, out, g: (g,),
  "FN": _fn_rule,
  "SIGMOID": lambda arg, ins, out, g: (_sigmoid_grad(ins[0], out, g),),
  "EXPM1": lambda arg, ins, out, g: (g * ins[0].exp(),),   # not out + 1, which is 0 where expm1 rounds to -1
  "LOG1P": lambda arg, ins, out, g: (g / (ins[0] + 1),),
  "SOFTPLUS": lambda arg, ins, out, g: (_softplus_grad(arg, ins[0], g),),
  "RELU": lambda arg, ins, out, g: (_where(out <= 0, 0, g),),
  "COPY": lambda arg, ins, out, g: (g.to(ins[0].device),),
  "ZERO_GRAD": lambda arg, ins, out, g: (_zeros(ins[0]),),
  "LINK": lambda arg, ins, out, g: (g, _ZERO),   # see _linked
  # the inverse trig/hyperbolic functions of ops_math.py (their compositions are not differentiated)
  "ASIN": lambda arg, ins, out, g: (g / ((1 - ins[0]) * (1 + ins[0])).sqrt(),),
  "ACOS": lambda arg, ins, out, g: (-g / ((1 - ins[0]) * (1 + ins[0])).sqrt(),),
  "SINH": lambda arg, ins, out, g: (g * ins[0].cosh(),),
  "COSH": lambda arg, ins, out, g: (g * ins[0].sinh(),),
  "ASINH": lambda arg, ins, out, g: (g / (ins[0] * ins[0] + 1).sqrt(),),
  "ACOSH": lambda arg, ins, out, g: (g / ((ins[0] - 1) * (ins[0] + 1)).sqrt(),),
  "ATANH": lambda arg, ins, out, g: (g / ((1 - ins[0]) * (1 + ins[0])),),
  # PyTorch's: grad / (1 + exp(other - self)) and grad / (1 + exp(self - other))
  "LOGADDEXP": lambda arg, ins, out, g: (g / (1 + (ins[1] - ins[0]).exp()), g / (1 + (ins[0] - ins[1]).exp())),
  "HYPOT": lambda arg, ins, out, g: (g * ins[0] / out, g * ins[1] / out),
  # PyTorch's: d/dx is log(y), 0 where x = 0 and y <= 0; d/dy is x / y
  "XLOGY": lambda arg, ins, out, g: (_where((ins[0] == 0) & (ins[1] <= 0), 0.0, g * ins[1].log()), g * ins[0] / ins[1]),
}


def _zeros(x):
  from fusegrad.tensor import zeros_like
  return zeros_like(x)


class _Zero:
  """A LINK rule's gradient for the input it links: zeros where nothing else reaches that input (_run)."""


_ZERO = _Zero()


def _linked(g, x):
  """g (a gradient of x computed with create_graph) as a tensor that is differentiable in x: PyTorch's gradients
  under create_graph are functions of the inputs, possibly constant (the third derivative of (x @ y) ** 2 in x, the
  second through a convolution or a max-pool), so a further grad of them gives zeros, not None or "does not require
  grad". Same node: the value is g's; the LINK recipe passes g's gradient on and gives x zeros (none where x gets
  another gradient)."""
  if not x.requires_grad or not g.dtype.is_float: return g
  from fusegrad.tensor import Tensor
  r = Tensor(_node=g.node)
  with enable_grad(): record(r, "LINK", None, (g, x))
  return r


# ---- what each rule reads: PyTorch's saved tensors -------------------------------------------------------

_READS_OUT = {"EXP", "SQRT", "TAN", "TANH", "RECIP"}
_READS_IN = {"LOG", "SIN", "COS", "ERF", "ABS", "ATAN"}


def _saved(kind: str, arg, ins) -> tuple:
  """(indices of the inputs whose values the rule reads, whether it reads the output), for the inputs that
  need a gradient: what PyTorch would save for backward. A saved value must not have been written since."""
  if kind == "ALU":
    op = arg
    if op in ("ADD", "SUB", "NEG", "FLOOR", "CEIL", "RINT", "TRUNC"): return (), False
    if op in _READS_OUT: return (), True
    if op in _READS_IN: return (0,), False
    a_rg, b_rg = ins[0].requires_grad, len(ins) > 1 and ins[1].requires_grad
    if op == "MUL": return (1,) * a_rg + (0,) * b_rg, False
    if op in ("DIV", "MOD"): return ((0, 1) if b_rg else (1,) if a_rg else ()), False
    if op == "POW": return ((0, 1) if a_rg else (0,)), b_rg
    if op in ("MAX", "MIN", "ATAN2"): return (0, 1), False
    if op == "WHERE": return (0,), False
    return (), False
  if kind == "REDUCE": return ((), False) if arg[0] == "SUM" else ((0,), True)
  if kind == "MATMUL": return (1,) * ins[0].requires_grad + (0,) * ins[1].requires_grad, False
  if kind == "GATHER": return (1,), False
  if kind in ("SIGMOID", "RELU"): return (), True
  if kind in ("ASIN", "ACOS", "SINH", "COSH", "ASINH", "ACOSH", "ATANH"): return (0,), False
  if kind in ("LOGADDEXP", "XLOGY"): return (0, 1), False
  if kind == "HYPOT": return (0, 1), True
  if kind == "TAKE_ROWS": return (), False
  return (), False


def _saves_something(kind: str, arg, ins) -> bool:
  if kind == "TAKE_ROWS": return True      # the indices, held in the recipe
  i, o = _saved(kind, arg, ins)
  return bool(i) or o


class _Freed:
  """Marks a recipe whose saved values a backward without retain_graph released."""


_FREED = _Freed()


def _op_name(ctx) -> str:
  kind, arg = ctx[0], ctx[1]
  if kind == "PYFN": return arg[0].__name__ + "Backward"
  name = arg if kind == "ALU" else arg[0] if kind in ("MOVE", "REDUCE") else kind
  return name.capitalize()


def _modified(t, st, seq: int, ctx) -> RuntimeError:
  which = f", which is output 0 of {_op_name(ctx)}," if ctx is not None else ""
  return RuntimeError(f"one of the variables needed for gradient computation has been modified by an inplace "
                      f"operation: [fusegrad.{t.dtype.name} {list(t.shape)}]{which} is at version {st.version}; "
                      f"expected version {st.version_at(seq)} instead. Hint: the value was written (an in-place op on "
                      f"it or on a tensor sharing its storage) after the operation that saved it for backward; clone() "
                      f"it before writing.")


def _check_saved(t, ctx, ins) -> None:
  """PyTorch's version-counter check: the values t's rule reads are still the ones it was recorded with."""
  kind, arg, orig, _, seq = ctx[:5]
  idx, out = _saved(kind, arg, ins)
  for k in idx:
    i = orig[k]    # as recorded: a stand-in (chain False) is a snapshot nothing can write
    a = i._alias
    if a is not None and a[1] is not False and a[0].written_after(seq):
      raise _modified(i, a[0], seq, i._ctx)
  if out:
    a = t._alias
    if a is None: return
    st, since = a[0], _installed(ctx)
    if a[1] is False or st.written_after(since): raise _modified(t, st, since, ctx)


_SECOND = ("Trying to backward through the graph a second time (or directly access saved tensors after they have "
           "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
           "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if "
           "you need to access saved tensors after calling backward.")


# ---- the backward pass ----------------------------------------------------------------------------------

def _inputs(t) -> tuple:
  """t's recipe inputs, each in the state it had when the recipe was recorded."""
  ctx = t._ctx
  return tuple(_resolve(i, ctx[4]) if i._alias is not None else i for i in ctx[2])


def _toposort(roots, inputs_of: dict | None = None) -> list:
  """The tensors roots depend on through recipes, inputs first; inputs_of (if given) gets each one's _inputs."""
  order, seen = [], set()
  for r in roots:
    stack = [(r, False)]
    while stack:
      t, done = stack.pop()
      if done: order.append(t); continue
      if id(t) in seen: continue
      seen.add(id(t))
      stack.append((t, True))
      if t._ctx is not None:
        ins = _inputs(t)
        if inputs_of is not None: inputs_of[id(t)] = ins
        for i in ins:
          if i.requires_grad: stack.append((i, False))
  return order


def _run(outputs, grad_outputs, inputs=None, retain_graph: bool = False, create_graph: bool = False) -> tuple:
  """Propagate from outputs; returns (id(tensor) -> gradient, the tensors in order) for leaves (or for `inputs`)."""
  grads: dict = {}
  for o, g in zip(outputs, grad_outputs): grads[id(o)] = g if id(o) not in grads else grads[id(o)] + g
  wanted = {id(t) for t in inputs} if inputs is not None else None
  ins_of: dict = {}
  order = _toposort(outputs, ins_of)
  key = None
  # hooks are Python a template, a replayed trace or a fusegrad.jit replay would not call: such a backward runs
  # its rules, and neither is made from it
  hooked = bool(_tensor_hooks or _post_hooks or _groups) and _hooked(order)
  if hooked:
    _unfollowable("a backward that calls hooks (register_hook, a module's full backward hook)", forget=False)
    _refuse_capture("fusegrad.jit: the step's backward calls hooks (Tensor.register_hook, "
                    "register_post_accumulate_grad_hook or a module's register_full_backward_hook); a replay does not "
                    "run the step's Python, so they would not be called. Remove the hooks or call the step without "
                    "fusegrad.jit")
  elif inputs is None and not create_graph and config.TEMPLATES:
    key = _template_key(order, ins_of, outputs, grad_outputs)
  if key is not None:
    tpl = _templates.get(key[0])
    if tpl is _UNTEMPLATABLE: key = None
    elif tpl is not None:
      _templates_hits[0] += 1
      return tpl.run(order, ins_of, key[1], retain_graph), order
  # with `inputs`, a rule runs where one of its inputs leads to a wanted tensor (a wanted non-leaf's gradient is
  # complete when its turn comes, and propagation goes on through it to wanted tensors below, as PyTorch's)
  needed = None
  if wanted is not None:
    needed = set()
    for t in order:
      if id(t) in wanted or (t._ctx is not None and any(id(i) in needed for i in ins_of[id(t)])): needed.add(id(t))
  reads = _jit.host_reads[0]
  done = []
  fired: set = set()
  zeroed: set = set()    # ids whose gradient so far is only a LINK's zeros (replaced, not added to, by a real one)
  with (enable_grad() if create_graph else no_grad()):
    for t in (_grouped(order, ins_of) if hooked and _groups else reversed(order)):
      if hooked: _call_hooks(t, grads, fired)
      g = grads.get(id(t))
      if g is None or t._ctx is None: continue
      ins = ins_of[id(t)]
      if needed is not None and not any(id(i) in needed for i in ins): continue
      ctx = t._ctx
      kind, arg, _, out_node = ctx[:4]
      if out_node is _FREED: raise RuntimeError(_SECOND)
      _check_saved(t, ctx, ins)
      out = t if t.node is out_node else _T(out_node)
      gs = RULES[kind](arg, ins, out, g)
      done.append((t, ins))
      for i, gi in zip(ins, gs):
        if gi is None or not i.requires_grad: continue
        k = id(i)
        if gi is _ZERO:    # a LINK's input: zeros, where no other gradient reaches it
          if k not in grads:
            grads[k] = _zeros(i)
            zeroed.add(k)
          continue
        if gi.dtype != i.dtype and i.dtype.is_float: gi = gi.to(i.dtype)
        if gi.shape != i.shape: gi = gi.expand(*i.shape) if gi.numel() == 1 else gi.reshape(i.shape)
        if k in zeroed:
          zeroed.discard(k)
          grads[k] = gi
        else: grads[k] = gi if k not in grads else grads[k] + gi
  if key is not None: _record(key, order, grads, done, reads)
  if not retain_graph:    # release what the rules saved, as PyTorch frees a graph's saved tensors
    for t, ins in done: _free(t, ins)
  return grads, order


# ---- hooks ------------------------------------------------------------------------------------------------
# Tensor.register_hook, register_post_accumulate_grad_hook and the groups a module's full backward hook watches
# (nn/module.py), kept here by the tensor's id with a weak reference (a tensor has no room of its own for them, and
# a dict keyed by tensors would compare them with the elementwise ==): the entry goes when the tensor does.

class RemovableHandle:
  """torch.utils.hooks.RemovableHandle: `remove()` takes the hook out of the dict(s) it was registered in (held
  weakly: a handle does not keep a module or tensor's hooks alive); also a context manager that removes on exit."""
  _ids = itertools.count()

  def __init__(self, hooks_dict, *, extra_dict=None):
    self.hooks_dict_ref = weakref.ref(hooks_dict)
    self.id = next(RemovableHandle._ids)
    extra = () if extra_dict is None else (extra_dict,) if isinstance(extra_dict, dict) else tuple(extra_dict)
    self.extra_dict_ref = tuple(weakref.ref(d) for d in extra)

  def remove(self) -> None:
    for r in (self.hooks_dict_ref,) + self.extra_dict_ref:
      d = r()
      if d is not None: d.pop(self.id, None)

  def __enter__(self) -> "RemovableHandle": return self
  def __exit__(self, *exc) -> None: self.remove()


_tensor_hooks: dict = {}   # id(tensor) -> (weakref to it, OrderedDict handle id -> hook(grad) -> grad or None)
_post_hooks: dict = {}     # id(leaf) -> (weakref to it, OrderedDict handle id -> hook(leaf))
_groups: dict = {}         # id(tensor) -> (weakref to it, the _Group it belongs to)


class _Group:
  """Tensors whose gradients one function sees together (a module's inputs, or its outputs: its full backward
  hook's grad_input and grad_output): fn(grads, one per member, None where none came) -> new grads or None, called
  once per backward when every member's gradient is complete and before any of them flows on (`_grouped`)."""
  __slots__ = ("members", "fn")

  def __init__(self, members, fn):
    self.members, self.fn = tuple(weakref.ref(t) for t in members), fn


def _entry(table: dict, t, make: bool):
  """t's value in table (None if it has none and not make); a dead tensor's entry is dropped by its weakref."""
  e = table.get(id(t))
  if e is not None and e[0]() is t: return e[1]
  if not make: return None
  k = id(t)
  def gone(r, k=k, table=table):
    e = table.get(k)
    if e is not None and e[0] is r: del table[k]
  table[k] = e = (weakref.ref(t, gone), collections.OrderedDict())
  return e[1]


def _unfollowable(msg: str, forget: bool = True) -> None:
  """Hooks exist: the eager trace's segment in progress goes on eagerly (a segment left so is not stored: no
  recorded step holds a backward with hooks) and, where a hook was just registered (forget), the steps recorded
  before are forgotten: a replayed backward sets .grad without running the rules, so it would not call it."""
  from fusegrad.engine import trace
  trace.off(msg)
  if forget: trace._traces.clear()


def _refuse_capture(msg: str) -> None:
  """A step being captured by fusegrad.jit runs Python a replay would not run again: the capture raises msg."""
  rec = _jit.recorder()
  if rec is not None and rec.recording and rec.error is None: rec.error = msg


def register_hook(t, hook) -> RemovableHandle:
  """Tensor.register_hook: hook(grad) -> a new gradient or None, called when t's gradient is computed."""
  return _register(_tensor_hooks, t, hook, "a tensor hook was registered")


_retained: dict = {}   # id(t) -> weakref: non-leaf tensors that keep their .grad (retain_grad)


def retain_grad(t) -> None:
  """Tensor.retain_grad: a non-leaf's gradient is kept in its .grad by every backward through it (accumulated, as
  torch's); a hook that stores it (so such a backward runs its rules, as any hooked one)."""
  if not t.requires_grad: raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
  if t._ctx is None or retains_grad(t): return
  w = weakref.ref(t, lambda _r, k=id(t): _retained.pop(k, None))

  def retain(g):
    x = w()
    if x is not None: x.grad = g if x.grad is None else x.grad + g
  register_hook(t, retain)
  _retained[id(t)] = w


def retains_grad(t) -> bool:
  e = _retained.get(id(t))
  return e is not None and e() is t


def register_post_accumulate_grad_hook(t, hook) -> RemovableHandle:
  """Tensor.register_post_accumulate_grad_hook: hook(t) after backward accumulated into t.grad (leaves only)."""
  if t.requires_grad and not t.is_leaf:
    raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
  return _register(_post_hooks, t, hook, "a post-accumulate-grad hook was registered")


def _register(table: dict, t, hook, why: str) -> RemovableHandle:
  if not t.requires_grad: raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
  hooks = _entry(table, t, True)
  h = RemovableHandle(hooks)
  hooks[h.id] = hook
  _unfollowable(why)
  return h


def _group_hook(tensors, fn) -> None:
  """fn sees the gradients of tensors together (see _Group); nn.Module's full backward hooks use it."""
  g = _Group(tensors, fn)
  for t in tensors:
    _entry(_groups, t, True)
    e = _groups[id(t)]
    _groups[id(t)] = (e[0], g)


def _hooked(order) -> bool:
  for t in order:
    k = id(t)
    for table in (_tensor_hooks, _post_hooks):
      e = table.get(k)
      if e is not None and e[1] and e[0]() is t: return True
    e = _groups.get(k)
    if e is not None and e[0]() is t: return True
  return False


def _grouped(order, ins_of: dict):
  """The backward's walk (reversed order) with each group's members next to each other, after all of their
  consumers: the members met first move down to the last one, with what they reach (their inputs, those
  inputs' inputs...) between them and it, which is still after whatever consumes those."""
  walk = list(reversed(order))
  seen: set = set()
  for t in list(walk):
    e = _groups.get(id(t))
    if e is None or e[0]() is not t or id(e[1]) in seen: continue
    seen.add(id(e[1]))
    pos = {id(x): i for i, x in enumerate(walk)}
    at = sorted(pos[id(m)] for m in (w() for w in e[1].members) if m is not None and id(m) in pos)
    if len(at) < 2: continue
    first, last = at[0], at[-1]
    move, stack = set(), [walk[i] for i in at[:-1]]
    while stack:
      x = stack.pop()
      i = pos.get(id(x))
      if i is None or i >= last or i < first or id(x) in move: continue
      move.add(id(x))
      stack.extend(ins_of.get(id(x), ()))
    walk = [x for x in walk[:last] if id(x) not in move] + [x for x in walk[:last] if id(x) in move] + walk[last:]
  return walk


def _call_hooks(t, grads: dict, fired: set) -> None:
  """t's gradient is complete: its group's function (once per backward), then its own hooks, in order."""
  e = _groups.get(id(t))
  if e is not None and e[0]() is t and id(e[1]) not in fired:
    grp = e[1]
    fired.add(id(grp))
    ms = [w() for w in grp.members]
    res = grp.fn(tuple(None if m is None else grads.get(id(m)) for m in ms))
    if res is not None:
      for m, r in zip(ms, res):
        if m is None: continue
        if r is None: grads.pop(id(m), None)
        else: grads[id(m)] = _checked(m, r, "hook")
  hooks = _entry(_tensor_hooks, t, False)
  g = grads.get(id(t))
  if not hooks or g is None: return
  for hook in tuple(hooks.values()):
    r = hook(g)
    if r is not None: g = _checked(t, r, getattr(hook, "__name__", "hook"))
  grads[id(t)] = g


def _checked(t, g, name: str):
  """A gradient a hook returned: torch's checks (a tensor of t's shape and dtype)."""
  from fusegrad.tensor import Tensor
  if not isinstance(g, Tensor): raise TypeError(f"hook '{name}' returned a {type(g).__name__}, expected a Tensor or None")
  if g.shape != t.shape: raise RuntimeError(f"hook '{name}' has changed the size of value")
  if g.dtype != t.dtype:
    raise RuntimeError(f"hook '{name}' has changed the type of value (was {t.dtype.name} got {g.dtype.name})")
  return g


def _free(t, ins) -> None:
  ctx = t._ctx
  if ctx[0] == "PYFN": _function.free(ctx[1][1])   # (a custom Function's saved tensors; its outputs' recipes stay)
  elif _saves_something(ctx[0], ctx[1], ins): t._ctx = ctx[:3] + (_FREED,) + ctx[4:]


# ---- backward templates ----------------------------------------------------------------------------------
# A training loop's backward passes build the same graph every step: the same recipes over a forward graph of the
# same structure. Running the rules costs several microseconds of Python per node (Tensors, frontend checks,
# hash-consing), so the first backward of a structure records the graph its rules built as a template (each
# new node's op, dtype, argument, shape, device and sources: a node of the forward graph, by its place in the
# forward walk, or an earlier template node) and a later backward whose key is equal makes those nodes directly
# (about a microsecond each). The key is everything a rule reads: the forward graph below every recipe's inputs,
# outputs and saved nodes (its structure, as the scheduler keys graphs, plus every constant's exact value: a rule
# may fold one into a new constant), each recipe (kind, argument, input and output places, which tensors need a
# gradient) and the default float dtype. A backward that makes a graph the template cannot express (a rule that
# reads a value on the host, makes a buffer, or uses a realized node from outside the forward graph) is marked
# and always runs its rules; so do create_graph, autograd.grad(inputs=...) and runtime sizes.
_TEMPLATES_MAX = 64
_templates: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()
_templates_lock = threading.Lock()
_templates_hits = [0]    # backward passes made from a template (tests read it)
_UNTEMPLATABLE = object()


def _arg_nodes(a, out: list) -> None:
  """The nodes of the tensors inside a recipe's argument (TAKE_ROWS holds its indices)."""
  t = type(a)
  if t is str or a is None: return
  if t is tuple or t is list:
    for x in a: _arg_nodes(x, out)
  elif hasattr(a, "_ctx") and hasattr(a, "node"): out.append(a.node)


def _arg_key(a, pos: dict):
  """A recipe's argument as a key: plain values (a tuple of ints as itself), tensors by their node's place."""
  t = type(a)
  if t is str or a is None: return a
  if t is tuple:
    for x in a:
      if type(x) is not int: return ("tuple",) + tuple(_arg_key(x, pos) for x in a)
    return a
  if t is bool or t is int: return (t, a)
  if t is float: return (float, a.hex())   # -0.0 and 0.0 differ, NaN equals itself
  if t is dt.DType: return a
  if isinstance(a, (tuple, list)): return (t.__name__,) + tuple(_arg_key(x, pos) for x in a)
  if hasattr(a, "_ctx") and hasattr(a, "node"): return ("tensor", pos[id(a.node)])
  raise template.Untemplatable(t.__name__)


def _exact(v):
  return (float, v.hex()) if type(v) is float else (type(v), v)


def _template_key(order, ins_of: dict, outputs, grad_outputs):
  """(key, the forward walk's nodes) for a backward over order, or None where templates do not apply."""
  from fusegrad.graph import dims
  from fusegrad.schedule import schedule as sched
  if dims.bound_any[0]: return None
  roots, recipes = [], []
  for t in order:
    roots.append(t.node)
    ctx = t._ctx
    if ctx is None: continue
    if ctx[3] is _FREED: return None     # the rules' run raises PyTorch's error
    ins = ins_of[id(t)]
    recipes.append(ins)
    roots.append(ctx[3])
    for i in ins: roots.append(i.node)
    if ctx[0] != "FN": _arg_nodes(ctx[1], roots)
  for o, g in zip(outputs, grad_outputs): roots += (o.node, g.node)
  skey, nodes = sched._structure(roots)
  pos = {id(n): i for i, n in enumerate(nodes)}
  opos = {id(t): k for k, t in enumerate(order)}
  parts, r = [], 0
  try:
    for t in order:
      ctx = t._ctx
      if ctx is None:
        parts.append((pos[id(t.node)], t.requires_grad))
        continue
      ins = recipes[r]
      r += 1
      # (a templated call's argument, fusegrad/templates.py, is its function and plain values already)
      parts.append((ctx[0], ctx[1] if ctx[0] == "FN" else _arg_key(ctx[1], pos), pos[id(t.node)], pos[id(ctx[3])],
                    t.requires_grad,
                    tuple((pos[id(i.node)], i.requires_grad, opos.get(id(i), -1)) for i in ins)))
  except template.Untemplatable:
    return None
  # every constant's exact value, a realized one's too (its structure says "input": node.alu still folds it)
  consts = tuple((i, n.op, _exact(n.arg)) for i, n in enumerate(nodes) if n.op in ("CONST", "IOTA"))
  # and every view's offset into a realized buffer, which the structure leaves out (a kernel takes it as an
  # argument): a rule's new view of such a view (a matmul's x.T of a batch sliced from a dataset) composes into one
  # view of the buffer with that offset in it, which the template would make again for the next batch's slice
  offsets = tuple((i, n.arg.offset) for i, n in enumerate(nodes)
                  if n.op == "VIEW" and n.buffer is None and n.src[0].buffer is not None)
  outs = tuple((opos.get(id(o), -1), pos[id(g.node)]) for o, g in zip(outputs, grad_outputs))
  return (skey, consts, offsets, tuple(parts), outs, dt.default_float), nodes


class _Template:
  """entries: (op, dtype, sources, arg, shape, device) per node to make, sources as places in the forward walk
  (>= 0) or ~j for the j-th entry; leaves: (position in order, the node of its gradient as such a place); done:
  the positions in order whose rules ran, in their order (the saved-value checks and the freeing follow it)."""
  __slots__ = ("entries", "leaves", "done")

  def __init__(self, entries, leaves, done):
    self.entries, self.leaves, self.done = entries, leaves, done

  def run(self, order, ins_of: dict, nodes, retain_graph: bool) -> dict:
    from fusegrad.tensor import Tensor
    for k in self.done:   # what the rules' run checks before each rule
      t = order[k]
      _check_saved(t, t._ctx, ins_of[id(t)])
    made = template.instantiate(self.entries, nodes, shared=False)
    grads = {id(order[k]): Tensor(_node=template.node_of(r, made, nodes)) for k, r in self.leaves}
    if not retain_graph:
      for k in self.done:
        t = order[k]
        _free(t, ins_of[id(t)])
    return grads


def _record(key, order, grads, done, reads: int) -> None:
  """Store the graph the rules just built under key (or mark the key as one whose rules must always run)."""
  tkey, nodes = key
  try:
    if _jit.host_reads[0] != reads: raise template.Untemplatable("a rule read a value on the host")
    leaves = [(k, grads[id(t)].node) for k, t in enumerate(order)
              if t._ctx is None and t.requires_grad and id(t) in grads]
    # a node outside the forward walk is copied (a pure function of its sources), unless it holds a value
    entries, refs = template.record([n for _k, n in leaves], nodes, lambda n: True)
    opos = {id(t): k for k, t in enumerate(order)}
    tpl = _Template(entries, tuple((k, r) for (k, _n), r in zip(leaves, refs)), tuple(opos[id(t)] for t, _ in done))
  except template.Untemplatable:
    tpl = _UNTEMPLATABLE
  with _templates_lock:
    _templates[tkey] = tpl
    if len(_templates) > _TEMPLATES_MAX: _templates.popitem(last=False)


def _seed(t, gradient):
  from fusegrad.tensor import Tensor, ones_like
  if gradient is None:
    if t.numel() != 1: raise RuntimeError("grad can be implicitly created only for scalar outputs")
    return ones_like(t)
  g = gradient if isinstance(gradient, Tensor) else Tensor(gradient, dtype=t.dtype, device=t.device)
  if g.shape != t.shape:
    raise RuntimeError(f"Mismatch in shape: grad_output[0] has a shape of {g.shape} and output[0] has a shape of {t.shape}.")
  return g


def backward(t, gradient=None, retain_graph: bool | None = None, create_graph: bool = False, inputs=None,
             written: list | None = None) -> None:
  """Tensor.backward: accumulate d t / d leaf into each leaf's .grad (or into `inputs`' .grad only); written (a
  list): gets (leaf, its .grad before) for each leaf given a gradient (engine/trace.py records them)."""
  from fusegrad.tensor import Tensor
  if not t.requires_grad:
    raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
  if retain_graph is None: retain_graph = create_graph
  if inputs is not None:
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if not inputs: raise RuntimeError("'inputs' argument to backward() cannot be empty.")
  grads, order = _run([t], [_seed(t, gradient)], inputs, retain_graph, create_graph)
  if len(t.node.shape) == 0 and not t.node.realized:
    # a training loop reads its loss after the step (`loss.item()`): computed with the step's realize (the
    # optimizer's), from the values that realize has at hand, rather than by a realize of its own afterwards
    from fusegrad.engine import realize as _realize
    _realize.later(t)
  targets = inputs if inputs is not None else [x for x in order if x._ctx is None and x.requires_grad]
  given: set = set()
  for leaf in targets:
    if id(leaf) in grads:
      g = grads[id(leaf)]
      # each leaf its own gradient tensor, as PyTorch's: leaves whose gradients are one value (an LSTM's b_ih and
      # b_hh, w and v of w + v) or a broadcast view must not share a tensor that an in-place op on one of them
      # (clip_grad_norm_'s mul_) writes for all (it scaled an LSTM's bias gradients twice, silently)
      if not create_graph: g = Tensor(_node=g.node)
      else:
        if id(g) in given or g._alias is not None: g = g.clone()
        given.add(id(g))
        g = _linked(g, leaf)
      if written is not None: written.append((leaf, leaf.grad))
      leaf.grad = g if leaf.grad is None else leaf.grad + g
      if _post_hooks:
        hooks = _entry(_post_hooks, leaf, False)
        if hooks:
          for hook in tuple(hooks.values()): hook(leaf)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None, create_graph: bool = False,
         allow_unused: bool = False) -> tuple:
  """torch.autograd.grad: gradients of outputs w.r.t. inputs, without touching .grad."""
  from fusegrad.tensor import Tensor
  outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
  inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
  if grad_outputs is None: grad_outputs = [None] * len(outputs)
  elif isinstance(grad_outputs, Tensor): grad_outputs = [grad_outputs]
  for o in outputs:
    if not o.requires_grad:
      raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
  if retain_graph is None: retain_graph = create_graph
  grads, _ = _run(outputs, [_seed(o, g) for o, g in zip(outputs, grad_outputs)], inputs, retain_graph, create_graph)
  out = []
  for i in inputs:
    if id(i) not in grads:
      if not allow_unused:
        raise RuntimeError("One of the differentiated Tensors appears to not have been used in the graph. "
                           "Set allow_unused=True if this is the desired behavior.")
      out.append(None)
    else: out.append(_linked(grads[id(i)], i) if create_graph else grads[id(i)])
  return tuple(out)


# torch.autograd.Function (custom forward and backward in Python): its recipe's rule
from fusegrad import autograd_function as _function  # noqa: E402
from fusegrad.autograd_function import Function, FunctionCtx, once_differentiable  # noqa: E402,F401
function = _function   # (torch.autograd.function.FunctionCtx, once_differentiable)
RULES["PYFN"] = _function._rule
from fusegrad import autograd_functional as functional  # noqa: E402,F401  (torch.autograd.functional)
