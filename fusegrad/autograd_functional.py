"""torch.autograd.functional: vjp, jvp, jacobian, hessian, vhp and hvp, composed from autograd.grad.

jacobian takes one backward per output element (reverse mode; the rows are built lazily and realized together):
fine for the small functions these are used on, as torch's default (non-vectorized) strategy. jvp uses the double
backward trick (the gradient of a vjp with respect to its cotangent), so the function must be twice differentiable
where torch's forward mode would not need it.
"""
from __future__ import annotations
from fusegrad import autograd


def _tuple(x, name: str, fn: str) -> tuple:
  from fusegrad.tensor import Tensor
  if isinstance(x, Tensor): return (x,), True
  if isinstance(x, (tuple, list)) and all(isinstance(t, Tensor) for t in x): return tuple(x), False
  raise TypeError(f"The {name} given to {fn} must be either a Tensor or a tuple of Tensors but the value at index 0 "
                  f"has type {type(x if not isinstance(x, (tuple, list)) else next(t for t in x if not isinstance(t, Tensor))).__name__}.")


def _prep(inputs: tuple, create_graph: bool) -> tuple:
  """The inputs as fresh leaves that require grad (with create_graph, a tensor that requires grad keeps its graph
  through a view, as torch's)."""
  out = []
  for t in inputs:
    if create_graph and t.requires_grad: out.append(t.view_as(t))
    else: out.append(t.detach().requires_grad_())
  return tuple(out)


def _grads(outs, ins, vs, create_graph: bool, retain: bool = True) -> tuple:
  from fusegrad.tensor import zeros_like
  want = [o for o in outs if o.requires_grad]
  if not want: return tuple(zeros_like(i) for i in ins)
  gvs = [v for o, v in zip(outs, vs) if o.requires_grad]
  gs = autograd.grad(want, list(ins), gvs, retain_graph=retain or create_graph, create_graph=create_graph,
                     allow_unused=True)
  return tuple(zeros_like(i) if g is None else g for i, g in zip(ins, gs))


def _out(ts: tuple, single: bool, create_graph: bool):
  ts = tuple(t if create_graph else t.detach() for t in ts)
  return ts[0] if single else ts


def _call(func, ins: tuple, fn: str) -> tuple:
  with autograd.enable_grad(): out = func(*ins)
  return _tuple(out, "outputs of the user-provided function", fn)


def vjp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
  """(func(inputs), v^T J): the vector-Jacobian product at inputs."""
  ins, single = _tuple(inputs, "inputs", "vjp")
  ins = _prep(ins, create_graph)
  outs, out_single = _call(func, ins, "vjp")
  vs = _vectors(v, outs, "vjp")
  return _out(outs, out_single, create_graph), _out(_grads(outs, ins, vs, create_graph), single, create_graph)


def jvp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
  """(func(inputs), J v): the Jacobian-vector product at inputs (by differentiating a vjp in its cotangent)."""
  from fusegrad.tensor import zeros_like
  ins, single = _tuple(inputs, "inputs", "jvp")
  ins = _prep(ins, True)
  vs = _vectors(v, ins, "jvp")
  outs, out_single = _call(func, ins, "jvp")
  us = tuple(zeros_like(o).requires_grad_() for o in outs)
  with autograd.enable_grad(): gs = _grads(outs, ins, us, True)
  keep = [(g, v) for g, v in zip(gs, vs) if g.requires_grad]
  if keep:
    jv = autograd.grad([g for g, _ in keep], list(us), [v for _, v in keep], create_graph=create_graph,
                       allow_unused=True)
  else: jv = [None] * len(us)
  jv = tuple(zeros_like(o) if j is None else j for o, j in zip(outs, jv))
  return _out(outs, out_single, create_graph), _out(jv, out_single, create_graph)


def _vectors(v, ts: tuple, fn: str) -> tuple:
  """v as a tuple matching ts (the function's outputs for vjp, its inputs for jvp/vhp), checked as torch checks it;
  None only where ts is one tensor of one element (then ones)."""
  if v is None:
    if len(ts) != 1 or ts[0].numel() != 1:
      what = "user-provided function returns" if fn == "vjp" else "input to the user-provided function is"
      raise RuntimeError(f"The vector v can only be None if the {what} a single Tensor with a single element.")
    from fusegrad.tensor import ones_like
    return (ones_like(ts[0]),)
  vs, _ = _tuple(v, "v", fn)
  if len(vs) != len(ts):
    raise RuntimeError(f"v is a tuple of invalid length: should be {len(ts)} but got {len(vs)}.")
  for i, (v, t) in enumerate(zip(vs, ts)):
    if tuple(v.shape) != tuple(t.shape):
      where = f" at index {i}" if len(ts) > 1 else ""
      raise RuntimeError(f"v has invalid size{where}: should be {list(t.shape)} but got {list(v.shape)}.")
  return vs


def jacobian(func, inputs, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
             strategy: str = "reverse-mode"):
  """d func(inputs) / d inputs: for each output a tensor of shape output.shape + input.shape (nested as torch's:
  a tensor for one input and one output, tuples over whichever is a tuple)."""
  from fusegrad.tensor import stack, zeros
  if strategy not in ("reverse-mode", "forward-mode"):
    raise ValueError('Expected strategy to be either "forward-mode" or "reverse-mode". Hint: If your function has '
                     'more outputs than inputs, "forward-mode" tends to be more performant. Otherwise, prefer to use '
                     '"reverse-mode".')
  ins, single = _tuple(inputs, "inputs", "jacobian")
  ins = _prep(ins, create_graph)
  outs, out_single = _call(func, ins, "jacobian")
  per_out = []
  for o in outs:
    flat = o.reshape(-1)
    rows = [[] for _ in ins]
    for k in range(flat.numel()):
      gs = _grads((flat[k],), ins, (None,), create_graph) if o.requires_grad else \
        tuple(zeros(i.shape, dtype=i.dtype, device=i.device) for i in ins)
      for r, g in zip(rows, gs): r.append(g)
    jac = []
    for i, r in zip(ins, rows):
      j = stack(r).reshape(tuple(o.shape) + tuple(i.shape)) if r else zeros(tuple(o.shape) + tuple(i.shape),
                                                                                dtype=i.dtype, device=i.device)
      jac.append(j if create_graph else j.detach())
    per_out.append(jac[0] if single else tuple(jac))
  return per_out[0] if out_single else tuple(per_out)


def hessian(func, inputs, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
            outer_jacobian_strategy: str = "reverse-mode"):
  """The second derivatives of a function with one scalar output: shape input.shape + input.shape (tuples of tuples
  for several inputs)."""
  ins, single = _tuple(inputs, "inputs", "hessian")

  def grad_fn(*xs):
    outs, _ = _call(func, xs, "hessian")
    if len(outs) != 1 or outs[0].numel() != 1:
      raise RuntimeError("The function given to hessian should return a single Tensor with a single element.")
    gs = _grads(outs, xs, (None,), True)
    return gs[0] if single else gs
  return jacobian(grad_fn, ins[0] if single else ins, create_graph=create_graph)


def vhp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
  """(func(inputs), v^T H) for a function with one scalar output."""
  ins, single = _tuple(inputs, "inputs", "vhp")
  ins = _prep(ins, True)
  outs, _ = _call(func, ins, "vhp")
  if len(outs) != 1 or outs[0].numel() != 1:
    raise RuntimeError("The function given to vhp should return a single Tensor with a single element.")
  vs = _vectors(v, ins, "vhp")
  with autograd.enable_grad(): gs = _grads(outs, ins, (None,), True)
  keep = [(g, v) for g, v in zip(gs, vs) if g.requires_grad]
  res = _grads([g for g, _ in keep], ins, [v for _, v in keep], create_graph)   # (none kept: zeros)
  return _out(outs, True, create_graph), _out(res, single, create_graph)


def hvp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
  """(func(inputs), H v): equal to vhp's for the twice-differentiable functions (their Hessian is symmetric)."""
  return vhp(func, inputs, v, create_graph, strict)
