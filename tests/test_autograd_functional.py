"""torch.autograd.functional (vjp, jvp, jacobian, hessian, vhp, hvp) against torch on fresh random inputs."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import fusegrad as fg

FUNCS = {   # name: (function of lib's tensors, the number of inputs)
  "exp": (lambda x: x.exp() * 2, 1),
  "sum": (lambda x: (x ** 3).sum(), 1),
  "mixed": (lambda x, y: (x * y).sum(0), 2),
  "two_out": (lambda x, y: (x.sin() * y, (x @ y.T).sum()), 2),
  "tanh_mm": (lambda x, y: (x @ y.T).tanh(), 2),
}
SHAPES = {1: [(2, 3)], 2: [(2, 3), (2, 3)]}


def _pairs(rng, n):
  arrs = [rng.standard_normal(s) for s in SHAPES[n]]
  return tuple(fg.tensor(a) for a in arrs), tuple(torch.tensor(a) for a in arrs)


def _same(a, b, tol=1e-9):
  if isinstance(b, torch.Tensor):
    assert isinstance(a, fg.Tensor) and tuple(a.shape) == tuple(b.shape), (a, b.shape)
    np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=tol, atol=tol)
    return
  assert isinstance(a, tuple) and len(a) == len(b)
  for x, y in zip(a, b): _same(x, y, tol)


def _arg(ts): return ts[0] if len(ts) == 1 else ts


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_jacobian_vjp_jvp(rng, name):
  f, n = FUNCS[name]
  ins, tins = _pairs(rng, n)
  _same(fg.autograd.functional.jacobian(f, _arg(ins)), torch.autograd.functional.jacobian(f, _arg(tins)))
  out = f(*tins)
  outs = out if isinstance(out, tuple) else (out,)
  vs = [rng.standard_normal(tuple(o.shape)) for o in outs]
  v, tv = _arg(tuple(fg.tensor(a) for a in vs)), _arg(tuple(torch.tensor(a) for a in vs))
  _same(fg.autograd.functional.vjp(f, _arg(ins), v), torch.autograd.functional.vjp(f, _arg(tins), tv))
  us = [rng.standard_normal(s) for s in SHAPES[n]]
  u, tu = _arg(tuple(fg.tensor(a) for a in us)), _arg(tuple(torch.tensor(a) for a in us))
  _same(fg.autograd.functional.jvp(f, _arg(ins), u), torch.autograd.functional.jvp(f, _arg(tins), tu))


@pytest.mark.parametrize("name", ["sum", "logsumexp"])
def test_hessian_and_products(rng, name):
  f = FUNCS["sum"][0] if name == "sum" else (lambda x, y: (x * y.exp()).logsumexp(1).sum())
  n = 1 if name == "sum" else 2
  ins, tins = _pairs(rng, n)
  _same(fg.autograd.functional.hessian(f, _arg(ins)), torch.autograd.functional.hessian(f, _arg(tins)))
  vs = [rng.standard_normal(s) for s in SHAPES[n]]
  v, tv = _arg(tuple(fg.tensor(a) for a in vs)), _arg(tuple(torch.tensor(a) for a in vs))
  for op in ("vhp", "hvp"):
    _same(getattr(fg.autograd.functional, op)(f, _arg(ins), v), getattr(torch.autograd.functional, op)(f, _arg(tins), tv))


def test_errors(rng):
  x = fg.tensor(rng.standard_normal((2, 3)))
  tx = torch.tensor(x.numpy())
  for lib, t in ((fg, x), (torch, tx)):
    with pytest.raises(RuntimeError, match="The vector v can only be None"): lib.autograd.functional.vjp(lambda a: a * 2, t)
    with pytest.raises(RuntimeError, match="v has invalid size"):
      lib.autograd.functional.vjp(lambda a: a * 2, t, lib.ones(3))
  with pytest.raises(TypeError): fg.autograd.functional.jacobian(lambda a: a, [x, 3])
  # the inputs are not changed and get no gradient
  fg.autograd.functional.jacobian(lambda a: a.exp(), x)
  assert not x.requires_grad and x.grad is None
