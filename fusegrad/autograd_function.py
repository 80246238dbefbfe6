"""torch.autograd.Function: an op whose forward and backward are the user's Python, on the lazy graph.

`MyFn.apply(*args)` runs `forward` under no_grad (its tensor ops build lazy graph as any op's) and gives each tensor
output a recipe ("PYFN", autograd.RULES) whose rule calls `backward(ctx, *grads)` with that output's gradient and
zeros for the others (materialized, as torch's default): torch calls backward once with every output's gradient,
fusegrad once per output that gets one, whose contributions add up at the inputs (a backward is linear in its
gradients). Both styles: `forward(ctx, *args)`, and `forward(*args)` with `setup_context(ctx, inputs, output)`.
What backward returns is checked as torch checks it (count, shape: broadcast gradients summed down, dtype cast).
The backward template (autograd.py) and the eager trace do not key Python functions: a backward through one runs
its rules each time; fusegrad.jit captures its kernels (a replay runs no Python, so a side effect in it would not
repeat).
"""
from __future__ import annotations
import functools
from fusegrad import autograd


class FunctionCtx:
  """ctx of a custom Function: save_for_backward / saved_tensors (checked against in-place writes since, as torch's
  version counters), needs_input_grad, mark_dirty, mark_non_differentiable, set_materialize_grads, and any attribute
  the forward sets."""

  def __init__(self):
    self._saved, self._seq, self._freed = (), -1, False
    self._dirty, self._nondiff, self.materialize_grads = (), (), True
    self.needs_input_grad: tuple = ()

  def save_for_backward(self, *tensors) -> None:
    from fusegrad.tensor import Tensor
    for t in tensors:
      if t is not None and not isinstance(t, Tensor):
        raise TypeError(f"save_for_backward can only save variables, but argument {tensors.index(t)} is of type "
                        f"{type(t).__name__}")
    self._saved, self._seq = tensors, next(autograd._seq)

  def save_for_forward(self, *tensors) -> None: self.save_for_backward(*tensors)

  @property
  def saved_tensors(self) -> tuple:
    if self._freed: raise RuntimeError(autograd._SECOND)
    for t in self._saved:
      a = None if t is None else t._alias
      if a is not None and a[1] is not False and a[0].written_after(self._seq):
        raise autograd._modified(t, a[0], self._seq, t._ctx)
    return self._saved

  def mark_dirty(self, *tensors) -> None: self._dirty = tensors
  def mark_non_differentiable(self, *tensors) -> None: self._nondiff = tensors
  def set_materialize_grads(self, value: bool) -> None: self.materialize_grads = bool(value)


class _FunctionMeta(type):
  def __call__(cls, *args, **kwargs):
    if args or kwargs or cls.forward is not Function.forward:
      raise RuntimeError("Legacy autograd function with non-static forward method is deprecated. Please use "
                         "new-style autograd function with static forward method. (Example: "
                         "https://pytorch.org/docs/stable/autograd.html#torch.autograd.Function)")
    return super().__call__()


class Function(metaclass=_FunctionMeta):
  """Subclass with static `forward` and `backward` (and optionally `setup_context`); call `apply`."""

  @staticmethod
  def forward(*args, **kwargs):
    raise NotImplementedError("You must implement the forward function for custom autograd.Function.")

  @staticmethod
  def setup_context(ctx, inputs, output):
    raise NotImplementedError("setup_context is not implemented.")

  @staticmethod
  def backward(ctx, *grad_outputs):
    raise NotImplementedError("You must implement either the backward or vjp method for your custom "
                              "autograd.Function to use it with backward mode AD.")

  vjp = backward

  @classmethod
  def apply(cls, *args, **kwargs):
    from fusegrad.tensor import Tensor
    ctx = FunctionCtx()
    ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
    # each tensor argument as it is now: a recipe's input keeps its value and graph if the forward writes it in
    # place (mark_dirty)
    before = {}
    for a in args:
      if isinstance(a, Tensor) and id(a) not in before:
        s = Tensor(_node=a.node)
        s._ctx, s.requires_grad = a._ctx, a.requires_grad
        before[id(a)] = s
    split = cls.setup_context is not Function.setup_context
    with autograd.no_grad():
      if split:
        out = cls.forward(*args, **kwargs)
        cls.setup_context(ctx, args, out)
      else:
        out = cls.forward(ctx, *args, **kwargs)
    single = not isinstance(out, tuple)
    outs = list((out,) if single else out)
    dirty = {id(t) for t in ctx._dirty}
    for t in ctx._dirty:
      if t._ctx is None and t.requires_grad and autograd.grad_enabled():
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    tensor_args = [a for a in args if isinstance(a, Tensor)]
    record = autograd.grad_enabled() and any(a.requires_grad for a in tensor_args)
    metas = tuple((o.shape, o.dtype, o.device) if isinstance(o, Tensor) else None for o in outs)
    nondiff = {id(t) for t in ctx._nondiff}
    ins = tuple(before[id(a)] if id(a) in dirty else a for a in tensor_args)
    for k, o in enumerate(outs):
      if not isinstance(o, Tensor): continue
      if id(o) in before and id(o) not in dirty:   # an input returned as is: a new tensor of its value, as torch's
        o = outs[k] = Tensor(_node=o.node)
      if record and o.dtype.is_float and id(o) not in nondiff:
        o._ctx = ("PYFN", (cls, ctx, k, metas, tuple(isinstance(a, Tensor) for a in args)), ins, o.node,
                  next(autograd._seq))
        o.requires_grad = True
      elif id(o) in dirty: o._ctx, o.requires_grad = None, False
    return outs[0] if single else tuple(outs)


def once_differentiable(fn):
  """torch's decorator for a backward that is not itself differentiable: it runs under no_grad."""
  @functools.wraps(fn)
  def wrapper(ctx, *grads):
    with autograd.no_grad(): return fn(ctx, *grads)
  return wrapper


def _rule(arg, ins, out, g):
  """A custom Function's output's gradient: its backward with this output's gradient (the others zeros, or None
  where the forward called set_materialize_grads(False)), checked and mapped onto the tensor inputs."""
  from fusegrad.tensor import zeros
  cls, ctx, k, metas, is_tensor = arg
  if ctx._freed: raise RuntimeError(autograd._SECOND)
  grads = [None if m is None or not ctx.materialize_grads else zeros(m[0], dtype=m[1], device=m[2]) for m in metas]
  grads[k] = g
  res = cls.backward(ctx, *grads)
  res = res if isinstance(res, tuple) else (res,)
  name = f"{cls.__name__}Backward"
  if len(res) < len(is_tensor) or any(r is not None for r in res[len(is_tensor):]):
    raise RuntimeError(f"function {name} returned an incorrect number of gradients (expected {len(is_tensor)}, got "
                       f"{len(res)})")
  out_grads = []
  for i, (r, tens) in enumerate(zip(res, is_tensor)):
    if not tens: continue
    x = ins[len(out_grads)]
    if r is not None and tuple(r.shape) != tuple(x.shape):
      lead = len(r.shape) - len(x.shape)
      if lead < 0 or any(s != 1 and s != rs for s, rs in zip(x.shape, r.shape[lead:])):
        raise RuntimeError(f"Function {name} returned an invalid gradient at index {i} - got {list(r.shape)} but "
                           f"expected shape compatible with {list(x.shape)}")
      r = autograd._unbroadcast(r, x.shape)
    out_grads.append(r)
  return tuple(out_grads)


def free(ctx) -> None:
  """A backward without retain_graph released what the forward saved."""
  ctx._freed, ctx._saved = True, ()


# ---- grad_fn: a recipe as torch's graph node object (its name and the nodes of its inputs) ----------------------

_MOVE_NAMES = {"RESHAPE": "View", "PERMUTE": "Permute", "EXPAND": "Expand", "SHRINK": "Slice", "PAD": "ConstantPadNd",
               "FLIP": "Flip", "STRIDE": "Slice"}
_KIND_NAMES = {"MATMUL": "Mm", "CAST": "ToCopy", "CONTIGUOUS": "Clone", "GATHER": "Gather", "TAKE_ROWS": "Embedding",
               "COPY": "ToCopy", "RELU": "Relu", "SIGMOID": "Sigmoid", "SOFTPLUS": "Softplus", "EXPM1": "Expm1",
               "LOG1P": "Log1P", "CONV_ROWS": "Convolution", "UNFOLD": "Im2Col", "UNFOLD_FLAT": "Im2Col",
               "WINDOW": "Unfold"}


class GradFn:
  """Tensor.grad_fn: the recipe that made a tensor, as torch's Node: `name()` (torch's names where fusegrad's recipe
  is the same op, e.g. MulBackward0, ViewBackward0, SumBackward0; a custom Function's `<cls>Backward`) and
  `next_functions` ((node, 0) per input: its grad_fn, an AccumulateGrad for a leaf that requires grad, else None)."""
  __slots__ = ("_ctx",)

  def __init__(self, ctx): self._ctx = ctx

  def name(self) -> str:
    kind, arg = self._ctx[0], self._ctx[1]
    if kind == "PYFN": return f"{arg[0].__name__}Backward"
    if kind == "FN": return f"{getattr(arg[0], '__name__', 'Function').strip('_').title().replace('_', '')}Backward0"
    if kind == "ALU": base = arg.capitalize()
    elif kind == "MOVE" and arg[0] == "RESHAPE" and self._ctx[2][0]._ctx is not None and \
        self._ctx[2][0]._ctx[0] == "REDUCE":   # (a reduction's dims dropped: torch's one node)
      return GradFn(self._ctx[2][0]._ctx).name()
    elif kind == "MOVE": base = _MOVE_NAMES.get(arg[0], arg[0].capitalize())
    elif kind == "REDUCE":   # (torch numbers its overloads: sum() is SumBackward0, sum(dim) SumBackward1)
      return f"{arg[0].capitalize()}Backward{int(arg[0] == 'SUM' and len(arg[1]) < self._ctx[2][0].ndim)}"
    else: base = _KIND_NAMES.get(kind, kind.capitalize())
    return f"{base}Backward0"

  @property
  def next_functions(self) -> tuple:
    out = []
    for i in self._ctx[2]:
      if i._ctx is not None: out.append((GradFn(i._ctx), 0))
      elif i.requires_grad: out.append((AccumulateGrad(i), 0))
      else: out.append((None, 0))
    return tuple(out)

  def __eq__(self, other): return isinstance(other, GradFn) and other._ctx is self._ctx
  def __hash__(self): return id(self._ctx)
  def __repr__(self) -> str: return f"<{self.name()} object at {hex(id(self._ctx))}>"


class AccumulateGrad:
  """The node of a leaf that requires grad (next_functions' entry for it); `variable` is the leaf."""
  __slots__ = ("variable",)

  def __init__(self, t): self.variable = t
  def name(self) -> str: return "torch::autograd::AccumulateGrad"
  next_functions = ()
  def __repr__(self) -> str: return f"<AccumulateGrad object at {hex(id(self.variable))}>"
