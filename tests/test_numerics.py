"""Numerical accuracy and edge-value semantics, against torch (CPU) and float64 references."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn.functional as F

NAN, INF = float("nan"), float("inf")


# ---- sorting: NaN, ties, signed zeros, infinities -----------------------------------------------------------

SORT_DATA = [1., NAN, 2., -INF, INF, 0., -0., NAN, 1., -3.5, 2.]


@pytest.mark.parametrize("descending", [False, True])
def test_sort_nan_inf_ties_like_torch(device, descending):
  x, tx = fg.tensor(SORT_DATA, device=device), torch.tensor(SORT_DATA)
  tv, ti = torch.sort(tx, descending=descending, stable=True)
  v, i = x.sort(descending=descending)
  np.testing.assert_array_equal(i.numpy(), ti.numpy())
  np.testing.assert_array_equal(v.numpy(), tv.numpy())
  np.testing.assert_array_equal(np.signbit(v.numpy()), np.signbit(tv.numpy()))   # -0.0 keeps its place
  np.testing.assert_array_equal(x.argsort(descending=descending, stable=True).numpy(), ti.numpy())
  assert i.dtype == fg.int64


def test_argsort_nan_is_a_permutation(device):
  # it was [1, 2, 0]: NaN compared unequal to itself and ranked as nothing
  i = fg.tensor([1., NAN, 2.], device=device).argsort().numpy()
  np.testing.assert_array_equal(i, [0, 2, 1])


def test_sort_2d_dims_and_ints(device, rng):
  a = rng.integers(-3, 4, size=(5, 7)).astype(np.int64)   # many ties
  for dim in (0, 1, -1):
    for desc in (False, True):
      tv, ti = torch.sort(torch.from_numpy(a), dim=dim, descending=desc, stable=True)
      v, i = fg.tensor(a, device=device).sort(dim, descending=desc)
      np.testing.assert_array_equal(i.numpy(), ti.numpy())
      np.testing.assert_array_equal(v.numpy(), tv.numpy())
  np.testing.assert_array_equal(fg.tensor(a, device=device).msort().numpy(), torch.msort(torch.from_numpy(a)).numpy())
  b = fg.tensor([True, False, True], device=device).sort()
  np.testing.assert_array_equal(b.indices.numpy(), [1, 0, 2])


def test_sort_0d():
  v, i = fg.tensor(3.).sort()
  assert v.item() == 3.0 and i.item() == 0 and i.shape == ()
  assert fg.tensor(3.).argsort().item() == 0


def test_sort_gradient_follows_permutation(rng):
  a = rng.standard_normal((3, 6)).astype(np.float32)
  x, tx = fg.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  w = rng.standard_normal((3, 6)).astype(np.float32)
  (x.sort(1).values * fg.tensor(w)).sum().backward()
  (torch.sort(tx, 1).values * torch.tensor(w)).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)


@pytest.mark.parametrize("largest", [True, False])
def test_topk_like_torch(device, largest, rng):
  a = rng.permutation(40).astype(np.float32).reshape(5, 8)   # distinct: torch's tie order is unspecified
  a[1, 3] = NAN
  for dim in (0, 1):
    tv, ti = torch.topk(torch.from_numpy(a), 3, dim=dim, largest=largest)
    v, i = fg.topk(fg.tensor(a, device=device), 3, dim=dim, largest=largest)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
  v, i = fg.tensor(SORT_DATA).topk(3)
  np.testing.assert_array_equal(v.numpy(), [NAN, NAN, INF])   # NaN is the largest value, as in torch
  np.testing.assert_array_equal(i.numpy(), [1, 7, 4])
  assert fg.tensor([1, 2, 3]).topk(0).values.shape == (0,)


def test_kthvalue_like_torch(device, rng):
  a = rng.permutation(30).astype(np.float32).reshape(5, 6)
  for dim, keep in ((0, False), (1, True), (-1, False)):
    tv, ti = torch.kthvalue(torch.from_numpy(a), 2, dim=dim, keepdim=keep)
    v, i = fg.tensor(a, device=device).kthvalue(2, dim, keep)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
  v, i = fg.kthvalue(fg.tensor([1., NAN, 2.]), 3)
  assert np.isnan(v.item()) and i.item() == 1


def test_topk_kthvalue_refuse_bad_k():
  x = fg.tensor([1., 2., 3.])
  with pytest.raises(RuntimeError, match="selected index k out of range"): x.topk(4)
  with pytest.raises(RuntimeError, match="selected index k out of range"): x.topk(-1)
  with pytest.raises(RuntimeError, match="kthvalue.*k out of range"): x.kthvalue(0)
  with pytest.raises(RuntimeError, match="kthvalue.*k out of range"): x.kthvalue(4)


# ---- expm1, log1p, softplus and friends: small and far inputs -----------------------------------------------

WIDE = [1e-8, -1e-8, 1e-30, -1e-30, 1e-3, -1e-3, 0.3, -0.7, 1., -1., 5., -5., 15., -15., 20., -20., 30., -30.,
        80., -80., 100., -100., 1e4, -1e4, 0., -0.99, 0.99, INF, -INF, NAN]


def _ref64(tf, vals, dtype, dtf=None):
  """torch in float64 (its float32 kernels round expm1'(-20) to 0 and sigmoid(-100) to 0), rounded to dtype;
  dtf, where given, is the exact derivative (torch's expm1 gradient is result + 1, 0 wherever expm1 is -1)."""
  x = torch.tensor(vals, dtype=torch.float64, requires_grad=True)
  y = tf(x)
  y.sum().backward()
  g = dtf(x.detach()) if dtf is not None else x.grad
  return y.detach().to(dtype).numpy(), g.to(dtype).numpy()


def _close(got, want, rtol, tiny):
  """Relative error per element, except below `tiny` (subnormals), where the absolute error counts."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  same = (got == want) | (np.isnan(got) & np.isnan(want))
  with np.errstate(all="ignore"):
    err = np.where(np.abs(want) < tiny, np.abs(got - want) / tiny, np.abs(got - want) / np.abs(want))
  bad = ~same & ~(err <= rtol)
  assert not bad.any(), f"got {got[bad]}, want {want[bad]} at inputs {np.asarray(WIDE)[bad]}"


ACCURATE = [
  ("expm1", lambda x: x.expm1(), torch.expm1, torch.exp),
  ("log1p", lambda x: x.log1p(), torch.log1p),
  ("softplus", lambda x: F.softplus(x), torch.nn.functional.softplus),
  ("softplus_beta", lambda x: F.softplus(x, 2.0, 10.0), lambda x: torch.nn.functional.softplus(x, 2.0, 10.0)),
  ("softplus_beta_half", lambda x: x.softplus(0.5, 3.0), lambda x: torch.nn.functional.softplus(x, 0.5, 3.0)),
  ("logsigmoid", F.logsigmoid, torch.nn.functional.logsigmoid),
  ("sigmoid", lambda x: x.sigmoid(), torch.sigmoid, lambda x: torch.sigmoid(x) * torch.sigmoid(-x)),
  ("tanh", lambda x: x.tanh(), torch.tanh, lambda x: torch.cosh(x) ** -2),
  ("elu", lambda x: F.elu(x, 1.5), lambda x: torch.nn.functional.elu(x, 1.5)),
  ("mish", F.mish, torch.nn.functional.mish),
  ("silu", F.silu, torch.nn.functional.silu),
]


@pytest.mark.parametrize("case", ACCURATE, ids=[a[0] for a in ACCURATE])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_accurate_unary_and_gradient(device, case, dtype):
  name, f, tf = case[:3]
  # the old formulas gave expm1(1e-8) = log1p(1e-8) = 0, softplus(-100) = 0, sigmoid(-100) = 0 and
  # an expm1 gradient of 0 at -20: relative errors of 1
  if dtype == "float64" and device == "OPENCL" and fg.float64 not in __import__("fusegrad.runtime.device",
                                                                                fromlist=["get"]).get("OPENCL").supported:
    pytest.skip("this OpenCL device has no float64")
  want, gwant = _ref64(tf, WIDE, getattr(torch, dtype), case[3] if len(case) > 3 else None)
  x = fg.tensor(WIDE, dtype=getattr(fg, dtype), device=device, requires_grad=True)
  y = f(x)
  y.sum().backward()
  assert y.dtype == getattr(fg, dtype)
  tiny = 1e-37 if dtype == "float32" else 1e-300
  # (torch's own sigmoid and tanh gradients, out (1 - out) and 1 - out^2, are 0 at x = 20 in float32)
  rtol = 4e-6 if dtype == "float32" else 1e-13
  _close(y.numpy(), want, rtol, tiny)
  _close(x.grad.numpy(), gwant, rtol, tiny)


def test_expm1_log1p_tiny_inputs_exact():
  for v in (1e-8, -1e-8, 1e-30, -1e-30, 2e-7):
    assert fg.tensor([v]).expm1().item() == pytest.approx(np.expm1(np.float32(v)), rel=1e-6)
    assert fg.tensor([v]).log1p().item() == pytest.approx(np.log1p(np.float32(v)), rel=1e-6)
  assert fg.tensor([-100.0]).softplus().item() == pytest.approx(3.720076e-44, rel=0.05)   # a subnormal, not 0
  assert fg.tensor([-0.0]).expm1().numpy()[0] == 0 and np.signbit(fg.tensor([-0.0]).expm1().numpy()[0])


def test_bce_with_logits_far_logits(device):
  x = [-100., -30., -1e-6, 0., 1e-6, 30., 100.]
  t = [0., 1., 0.5, 1., 0., 0., 1.]
  want = torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(x, dtype=torch.float64),
                                                               torch.tensor(t, dtype=torch.float64), reduction="none")
  got = F.binary_cross_entropy_with_logits(fg.tensor(x, device=device), fg.tensor(t, device=device), reduction="none")
  _close(got.numpy(), want.numpy(), 1e-6, 1e-37)


# ---- statistics of shifted data: var/std, batch/layer/group norm -------------------------------------------

def _shifted(rng, shape, mu):
  return (rng.standard_normal(shape) + mu).astype(np.float32)


def _err(got, want): return float(np.abs(np.asarray(got, np.float64) - want).max())


@pytest.mark.parametrize("mu", [10.0, 1000.0])
def test_var_std_shifted_data(device, rng, mu):
  # a float32 sum of 16384 values near 1000 is off by ~1e-3: the mean and the variance inherited it
  a = _shifted(rng, (16384, 3), mu)
  a64 = a.astype(np.float64)
  x, tx = fg.tensor(a, device=device), torch.from_numpy(a)
  want_v, want_m = a64.var(0, ddof=1), a64.mean(0)
  tv, tm = torch.var_mean(tx, 0)
  v, m = x.var_mean(0)
  assert _err(v.numpy(), want_v) <= 2 * _err(tv.numpy(), want_v) + 1e-7 and _err(v.numpy(), want_v) < 5e-6
  assert _err(m.numpy(), want_m) <= 2 * _err(tm.numpy(), want_m) + 1e-7
  s, m2 = fg.std_mean(x, 0, correction=0)
  assert _err(s.numpy(), a64.std(0)) < 5e-6 and _err(m2.numpy(), want_m) < 2e-4
  assert _err(x.std(0).numpy(), a64.std(0, ddof=1)) < 5e-6
  np.testing.assert_allclose(x.var(0, keepdim=True).numpy(), want_v[None], rtol=5e-6)


@pytest.mark.parametrize("mu", [10.0, 1000.0])
@pytest.mark.parametrize("shape", [(64, 8, 16, 16), (256, 4), (8, 3, 100)])
def test_batch_norm_training_shifted_data(device, rng, mu, shape):
  a = _shifted(rng, shape, mu)
  C = shape[1]
  want = torch.nn.functional.batch_norm(torch.from_numpy(a.astype(np.float64)), None, None, training=True).numpy()
  rm64, rv64 = torch.zeros(C, dtype=torch.float64), torch.ones(C, dtype=torch.float64)
  torch.nn.functional.batch_norm(torch.from_numpy(a.astype(np.float64)), rm64, rv64, training=True)
  e_torch = _err(torch.nn.functional.batch_norm(torch.from_numpy(a), None, None, training=True).numpy(), want)
  rm, rv = fg.zeros(C, device=device), fg.ones(C, device=device)
  got = F.batch_norm(fg.tensor(a, device=device), rm, rv, training=True).numpy()
  e = _err(got, want)
  assert e <= 2 * e_torch + 1e-6, (e, e_torch)
  assert e < 2e-6
  np.testing.assert_allclose(rm.numpy(), rm64.numpy(), rtol=1e-6)
  np.testing.assert_allclose(rv.numpy(), rv64.numpy(), rtol=1e-5)


@pytest.mark.parametrize("mu", [10.0, 1000.0])
def test_layer_and_group_norm_shifted_data(device, rng, mu):
  a = _shifted(rng, (16, 6, 300), mu)
  t, t64 = torch.from_numpy(a), torch.from_numpy(a.astype(np.float64))
  x = fg.tensor(a, device=device)
  for f, tf in ((lambda x: F.layer_norm(x, (300,)), lambda x: torch.nn.functional.layer_norm(x, (300,))),
                (lambda x: F.layer_norm(x, (6, 300)), lambda x: torch.nn.functional.layer_norm(x, (6, 300))),
                (lambda x: F.group_norm(x, 3), lambda x: torch.nn.functional.group_norm(x, 3))):
    want = tf(t64).numpy()
    e, e_torch = _err(f(x).numpy(), want), _err(tf(t).numpy(), want)
    assert e <= 2 * e_torch + 1e-6 and e < 2e-6, (e, e_torch)


def test_norm_gradients_shifted_data(rng):
  a = _shifted(rng, (32, 4, 50), 1000.0)
  w = rng.standard_normal((32, 4, 50))
  x, t64 = fg.tensor(a, requires_grad=True), torch.tensor(a.astype(np.float64), requires_grad=True)
  (F.batch_norm(x, None, None, training=True) * fg.tensor(w.astype(np.float32))).sum().backward()
  (torch.nn.functional.batch_norm(t64, None, None, training=True) * torch.from_numpy(w)).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), t64.grad.numpy(), rtol=1e-3, atol=2e-5)
