"""Higher-order gradients (create_graph) against torch.autograd.grad, on fresh random inputs: second and third
derivatives through the scans (cumsum, cumprod, logcumsumexp: the window rule's gradient must itself be
differentiable), grad w.r.t. a list holding an intermediate and the leaf below it (propagation goes on through a
requested non-leaf), and derivatives that are identically zero (they are zeros of the input's shape, not None or
"does not require grad")."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import fusegrad as fg
import fusegrad.nn.functional as FF

RTOL, ATOL = 1e-7, 1e-9


def _np(t):
  return t.detach().numpy() if isinstance(t, torch.Tensor) else t.numpy()


def _derivatives(lib, f, arrays, weights, order: int, wrt: int = 0):
  """The first `order` derivatives of sum(f(*xs) * weights[0]) w.r.t. xs[wrt], each contracted with the next weight
  before the next derivative (a Hessian-vector product and so on); the last one is taken without create_graph."""
  grad = torch.autograd.grad if lib is torch else fg.grad
  xs = [lib.tensor(a, dtype=lib.float64, requires_grad=True) for a in arrays]
  s = (f(lib, *xs) * lib.tensor(weights[0], dtype=lib.float64)).sum()
  out = []
  for k in range(order):
    last = k == order - 1
    (g,) = grad(s, xs[wrt], create_graph=not last)
    if not last: assert g.requires_grad, f"{lib.__name__}: derivative {k + 1} does not require grad"
    else: assert not g.requires_grad
    out.append(_np(g))
    if not last: s = (g * lib.tensor(weights[k + 1], dtype=lib.float64)).sum()
  return out


def _check(f, shapes, order, rng, wrt=0, lo=-1.5, hi=1.5):
  arrays = [rng.uniform(lo, hi, size=s) for s in shapes]
  with torch.no_grad(): out_shape = tuple(f(torch, *[torch.tensor(a) for a in arrays]).shape)
  weights = [rng.standard_normal(out_shape)] + [rng.standard_normal(shapes[wrt]) for _ in range(order - 1)]
  want = _derivatives(torch, f, arrays, weights, order, wrt)
  got = _derivatives(fg, f, arrays, weights, order, wrt)
  for k, (a, b) in enumerate(zip(got, want)):
    assert a.shape == b.shape, f"derivative {k + 1}: shape {a.shape}, torch {b.shape}"
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"derivative {k + 1}")


# ---- scans: the window rule under create_graph ----------------------------------------------------------------

def _lcse(L, x, d):
  # torch's own logcumsumexp has NaN in its third derivative (its backward takes logs of signed parts): the
  # reference is the composition, exact for these small values
  return x.logcumsumexp(d) if L is fg else x.exp().cumsum(d).log()


SCANS = {
  "cumsum_sq": (lambda L, x: x.cumsum(-1) ** 2, [(3, 6)]),
  "cumsum_dim0_cube": (lambda L, x: x.cumsum(0) ** 3, [(5, 4)]),
  "cumsum_sin": (lambda L, x: (x.cumsum(1) * x).sin(), [(2, 5, 3)]),
  "cumprod": (lambda L, x: x.cumprod(-1), [(3, 6)]),
  "cumprod_dim1_sq": (lambda L, x: x.cumprod(1) ** 2, [(2, 5, 3)]),
  "logcumsumexp": (lambda L, x: _lcse(L, x, -1) * x, [(3, 7)]),
  "logcumsumexp_dim0": (lambda L, x: _lcse(L, x, 0).exp() + _lcse(L, x, 0) ** 2, [(6, 2)]),
  "cumsum_long": (lambda L, x: x.cumsum(-1) ** 3, [(2, 70)]),       # blocked scan (longer than SCAN_BLOCK_MIN)
  "cumprod_long": (lambda L, x: x.cumprod(-1) * x, [(1, 66)], 2),
  "cumsum_then_cumprod": (lambda L, x: (x.cumsum(-1) * 0.5).cumprod(-1), [(2, 5)]),
}


@pytest.mark.parametrize("name", SCANS)
def test_scan_higher_derivatives(name, rng):
  f, shapes, order = (SCANS[name] + (3,))[:3]
  _check(f, shapes, order, rng, lo=0.5 if "long" in name else -1.5, hi=1.1 if "long" in name else 1.5)


def test_scan_first_gradient_requires_grad(rng):
  """The scan's own gradient depends on x only through the window rule: it must require grad (torch: True)."""
  a = rng.uniform(-1, 1, size=(1, 4))
  for f in (lambda x: (x.cumsum(-1) ** 2).sum(), lambda x: x.cumprod(-1).sum(), lambda x: x.logcumsumexp(-1).sum()):
    x, tx = fg.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    (g,) = fg.grad(f(x), x, create_graph=True)
    (tg,) = torch.autograd.grad(f(tx), tx, create_graph=True)
    assert g.requires_grad and tg.requires_grad
    (h,) = fg.grad(g.sum(), x)
    (th,) = torch.autograd.grad(tg.sum(), tx)
    np.testing.assert_allclose(h.numpy(), th.numpy(), rtol=RTOL, atol=ATOL)


def test_scan_plain_backward_unchanged(rng):
  """Without create_graph the gradient is the same and needs no gradient itself."""
  a = rng.uniform(-1, 1, size=(3, 9))
  x, tx = fg.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  (g,) = fg.grad((x.cumsum(-1) ** 2).sum() + x.cumprod(-1).sum(), x)
  (tg,) = torch.autograd.grad((tx.cumsum(-1) ** 2).sum() + tx.cumprod(-1).sum(), tx)
  assert not g.requires_grad
  np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=RTOL, atol=ATOL)


# ---- grad w.r.t. an intermediate and the leaf below it --------------------------------------------------------

def _both(fn, rng, shape=(3, 4)):
  a = rng.uniform(-1, 1, size=shape)
  got = fn(fg, fg.grad, fg.tensor(a, requires_grad=True))
  want = fn(torch, torch.autograd.grad, torch.tensor(a, requires_grad=True))
  assert len(got) == len(want)
  for k, (g, w) in enumerate(zip(got, want)):
    assert (g is None) == (w is None), f"result {k}: {g is None=}, torch {w is None=}"
    if g is not None:
      assert g.shape == tuple(w.shape)
      np.testing.assert_allclose(_np(g), _np(w), rtol=RTOL, atol=ATOL, err_msg=f"result {k}")
  return got, want


def test_grad_wrt_intermediate_and_leaf(rng):
  def f(L, G, x):
    y = x * 2
    z = (y * y).sum() + (x * x.sin()).sum()        # x reaches z through y and directly
    return G(z, [y, x])
  _both(f, rng)

  def f(L, G, x):                                  # the leaf first, then the intermediate; a chain of two
    y = x.exp()
    w = y.tanh() * 3
    return G((w * y).sum(), [x, w, y])
  _both(f, rng)

  def f(L, G, x):                                  # an intermediate below another requested intermediate only
    y = x * x
    w = y.sin()
    return G(w.sum(), [w, y])
  _both(f, rng)


def test_grad_wrt_intermediate_and_leaf_create_graph(rng):
  def f(L, G, x):
    y = x.sin()
    z = (y * y * x).sum()
    gy, gx = G(z, [y, x], create_graph=True)
    return (gy, gx) + G((gx * gx).sum() + gy.sum(), x)
  _both(f, rng)


def test_grad_wrt_intermediate_allow_unused(rng):
  def f(L, G, x):
    u = L.tensor(np.ones((3, 4)), dtype=L.float64, requires_grad=True)   # not in z's graph at all
    y = x * 3
    return G((y * y).sum(), [y, u, x], allow_unused=True)
  got, _ = _both(f, rng)
  assert got[1] is None
  for lib, G in ((fg, fg.grad), (torch, torch.autograd.grad)):
    x = lib.tensor(np.ones((2,)), dtype=lib.float64, requires_grad=True)
    u = lib.tensor(np.ones((2,)), dtype=lib.float64, requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match="allow_unused"):
      G((y * y).sum(), [y, x, u])


def test_backward_inputs_intermediate_and_leaf(rng):
  a = rng.uniform(-1, 1, size=(2, 3))
  x, tx = fg.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  y, ty = x.exp(), tx.exp()
  (y * y * x).sum().backward(inputs=[y, x])
  (ty * ty * tx).sum().backward(inputs=[ty, tx])
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), rtol=RTOL, atol=ATOL)


# ---- derivatives that are identically zero ----------------------------------------------------------------------

ZERO = {
  # (function, input shapes, the input differentiated, order): torch's last derivative is zeros
  "matmul_sq_d3": (lambda L, x, y: (x @ y) ** 2, [(3, 4), (4, 5)], 0, 3),
  "matmul_sq_d3_y": (lambda L, x, y: (x @ y) ** 2, [(3, 4), (4, 5)], 1, 3),
  "conv2d_w_sq_d3": (lambda L, w, x: (TF if L is torch else FF).conv2d(x, w, stride=2) ** 2,
                     [(3, 2, 3, 3), (1, 2, 7, 7)], 0, 3),
  "conv2d_sq_d3": (lambda L, x, w: (TF if L is torch else FF).conv2d(x, w, padding=1) ** 2,
                   [(1, 2, 4, 4), (3, 2, 3, 3)], 0, 3),
  "max_sq_d3": (lambda L, x: x.max(-1).values ** 2, [(4, 5)], 0, 3),
  "amax_sq_d3": (lambda L, x: x.amax(-1) ** 2, [(4, 5)], 0, 3),
  "max_pool2d_sq_d3": (lambda L, x: (TF if L is torch else FF).max_pool2d(x, 2) ** 2, [(2, 3, 6, 6)], 0, 3),
  "max_pool2d_s1_sq_d3": (lambda L, x: (TF if L is torch else FF).max_pool2d(x, 3, 1, 1) ** 2, [(1, 2, 5, 5)], 0, 3),
  "avg_pool2d_sq_d3": (lambda L, x: (TF if L is torch else FF).avg_pool2d(x, 2) ** 2, [(2, 3, 6, 6)], 0, 3),
}


@pytest.mark.parametrize("name", ZERO)
def test_zero_higher_derivatives(name, rng):
  f, shapes, wrt, order = ZERO[name]
  arrays = [rng.uniform(-1.5, 1.5, size=s) for s in shapes]
  with torch.no_grad(): out_shape = tuple(f(torch, *[torch.tensor(a) for a in arrays]).shape)
  weights = [rng.standard_normal(out_shape)] + [rng.standard_normal(shapes[wrt]) for _ in range(order - 1)]
  want = _derivatives(torch, f, arrays, weights, order, wrt)
  got = _derivatives(fg, f, arrays, weights, order, wrt)
  assert not np.any(want[-1]), "the case's last derivative is meant to be zeros in torch"
  for k, (a, b) in enumerate(zip(got, want)):
    assert a.shape == b.shape == tuple(shapes[wrt]), f"derivative {k + 1}: shape {a.shape}, torch {b.shape}"
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"derivative {k + 1}")


def test_zero_derivative_does_not_displace_real_gradient(rng):
  """A linked gradient gives its input zeros only where nothing else reaches it: with another path the value is
  that path's alone (the third derivative of x^3 plus a matmul term that is zero in x)."""
  a, b = rng.uniform(-1, 1, size=(3, 4)), rng.uniform(-1, 1, size=(4, 2))
  res = []
  for lib, G in ((fg, fg.grad), (torch, torch.autograd.grad)):
    x, y = lib.tensor(a, requires_grad=True), lib.tensor(b, requires_grad=True)
    s = ((x @ y) ** 2).sum() + (x ** 3).sum()
    (g1,) = G(s, x, create_graph=True)
    (g2,) = G(g1.sum(), x, create_graph=True)
    (g3,) = G(g2.sum(), x)
    res.append((_np(g1), _np(g2), _np(g3)))
  for u, v in zip(*res): np.testing.assert_allclose(u, v, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(res[0][2], np.full((3, 4), 6.0))


def test_backward_create_graph_grad_is_differentiable(rng):
  """backward(create_graph=True) leaves a .grad that a further grad differentiates (zeros where it is constant)."""
  a, b = rng.uniform(-1, 1, size=(3, 4)), rng.uniform(-1, 1, size=(4, 2))
  x, y = fg.tensor(a, requires_grad=True), fg.tensor(b, requires_grad=True)
  (x @ y).sum().backward(create_graph=True)     # x.grad depends on y only
  assert x.grad.requires_grad
  (h,) = fg.grad(x.grad.sum(), x)
  np.testing.assert_array_equal(h.numpy(), np.zeros((3, 4)))
  # plain backward: unchanged, gradients need no gradient
  x2 = fg.tensor(a, requires_grad=True)
  (x2 @ fg.tensor(b)).sum().backward()
  assert not x2.grad.requires_grad
  (g,) = fg.grad((x2 * x2).sum(), x2)
  assert not g.requires_grad
