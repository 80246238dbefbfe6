"""Frontend ops that build their graph as nodes directly (no intermediate Tensors, for their Python cost) make the
very graph their Tensor-op definition makes: the same node objects (nodes are hash-consed), so values, fusion
and kernels are those of the composite."""
import numpy as np
import pytest
import fusegrad as fg
from fusegrad import autograd
from fusegrad.tensor import where

DTYPES = [fg.float32, fg.float64, fg.float16, fg.bfloat16]


def _x(shape, dtype):
  return fg.tensor(np.random.default_rng().standard_normal(shape).astype(np.float32)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (5,), (3, 4)])
def test_relu_nodes(dtype, shape):
  x = _x(shape, dtype)
  with autograd.no_grad():
    ref = where(x <= 0, 0, x)
  assert x.relu().node is ref.node


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64])
@pytest.mark.parametrize("shape", [(), (5,), (3, 4)])
def test_sigmoid_nodes(dtype, shape):
  x = _x(shape, dtype)
  with autograd.no_grad():
    e = (-x.abs()).exp()
    ref = where(x >= 0, (1 + e).reciprocal(), e / (1 + e))
  assert x.sigmoid().node is ref.node


@pytest.mark.parametrize("dtype", [fg.float16, fg.bfloat16, fg.int32])
def test_sigmoid_other_dtypes(dtype):
  a = np.random.default_rng().standard_normal(7).astype(np.float32) * 4
  x = fg.tensor(a).to(dtype)
  want = 1 / (1 + np.exp(-x.float().numpy().astype(np.float64)))
  got = x.sigmoid()
  assert got.dtype == (dtype if dtype.is_float else fg.float32)
  np.testing.assert_allclose(got.float().numpy(), want, rtol=1e-2 if dtype.is_float else 1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bounds", [(-0.5, 0.5), (None, 1), (0, None), (0.5, -0.5)])
def test_clamp_nodes(dtype, bounds):
  x = _x((3, 4), dtype)
  lo, hi = bounds
  out = x
  with autograd.no_grad():
    if lo is not None: out = where(out < lo, lo, out)
    if hi is not None: out = where(out > hi, hi, out)
  assert x.clamp(lo, hi).node is out.node


def test_clamp_where_gradients():
  """clamp's and where's node-built paths keep their gradients: 1 on [min, max] inclusive (and at a tie of where's
  branches, the condition's side), against PyTorch's."""
  torch = pytest.importorskip("torch")
  a = np.random.default_rng().standard_normal((4, 5)).astype(np.float32)
  a[0, :3] = [-0.5, 0.5, 0.0]
  b = np.random.default_rng().standard_normal((4, 5)).astype(np.float32)
  x, y = fg.tensor(a, requires_grad=True), fg.tensor(b, requires_grad=True)
  tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  (x.clamp(-0.5, 0.5) * 3 + fg.where(x > y, x, y) * 2).sum().backward()
  (tx.clamp(-0.5, 0.5) * 3 + torch.where(tx > ty, tx, ty) * 2).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=0, atol=0)
  np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), rtol=0, atol=0)


def test_where_nodes():
  x, y = _x((3, 4), fg.float32), _x((3, 4), fg.float32)
  c = x > y
  with autograd.no_grad():
    ref = where(c, x._broadcast_to((3, 4)), y.float())
  assert where(c, x, y).node is ref.node


@pytest.mark.parametrize("bounds", [(-1.25, float("nan")), (float("nan"), 1.0), (float("nan"), None), (2.0, 1.0)])
def test_clamp_nan_bounds(bounds):
  """A NaN bound gives NaN everywhere, as PyTorch's clamp (a comparison with NaN alone would leave x as is); min > max
  gives max. Scalar bounds and tensor bounds (a NaN in some elements) alike, with PyTorch's gradients."""
  torch = pytest.importorskip("torch")
  a = np.random.default_rng().standard_normal(6).astype(np.float32)
  a[-1] = np.nan
  lo, hi = bounds
  x, tx = fg.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  got, want = x.clamp(lo, hi), torch.clamp(tx, lo, hi)
  np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())
  got.sum().backward(); want.sum().backward()
  # (at a NaN input PyTorch's gradient is 0 and fusegrad's 1 where no bound is selected; its value is NaN either way)
  np.testing.assert_array_equal(x.grad.numpy()[:-1], tx.grad.numpy()[:-1])
  tlo = np.random.default_rng().standard_normal(6).astype(np.float32) - 1
  tlo[1] = np.nan
  got = x.detach().clamp(min=fg.tensor(tlo))
  want = torch.clamp(tx.detach(), min=torch.tensor(tlo))
  np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v", [0, 1.5, -2])
def test_compare_scalar_nodes(dtype, v):
  x = _x((3, 4), dtype)
  c = x._operand(v, x.dtype)._broadcast_to(x.shape)
  assert (x > v).node is c._alu("CMPLT", x).node
  assert (x >= v).node is c._alu("CMPLE", x).node
  assert (x > v).dtype == fg.bool
