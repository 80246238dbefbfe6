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


# ---- inputs PyTorch refuses ------------------------------------------------------------------------------------

def test_embedding_refuses_negative_and_out_of_range_indices(device):
  w = fg.arange(6., device=device).reshape(3, 2)
  for bad in ([-1], [3], [0, 5]):
    with pytest.raises(IndexError, match="index out of range in self"):
      F.embedding(fg.tensor(bad, device=device), w)
    with pytest.raises(IndexError, match="index out of range in self"):
      torch.nn.functional.embedding(torch.tensor(bad), torch.zeros(3, 2))
  # a lazy index cannot be checked without running it: out of range reads a zero row, never another row
  lazy = (fg.tensor([0, 1, 5, 2, -2], device=device) + 1) - 1
  np.testing.assert_array_equal(F.embedding(lazy, w).numpy(), [[0, 1], [2, 3], [0, 0], [4, 5], [0, 0]])


def test_gather_index_select_refuse_negative_indices(device):
  x = fg.arange(6., device=device).reshape(3, 2)
  with pytest.raises(RuntimeError, match="index -1 is out of bounds for dimension 1 with size 2"):
    x.gather(1, fg.tensor([[0], [-1], [1]], device=device))
  with pytest.raises(IndexError, match="index out of range in self"):
    x.index_select(0, fg.tensor([0, -1], device=device))
  with pytest.raises(IndexError, match="index out of range in self"):
    x.index_select(0, fg.tensor([3], device=device))
  # lazy indices out of range (either side) read 0, not the neighbouring row's elements
  lazy = lambda v: (fg.tensor(v, device=device) + 1) - 1
  np.testing.assert_array_equal(x.gather(1, lazy([[0, 1], [2, 0], [1, -1]])).numpy(), [[0, 1], [0, 2], [5, 0]])
  np.testing.assert_array_equal(x.index_select(0, lazy([2, 3, -1])).numpy(), [[4, 5], [0, 0], [0, 0]])
  np.testing.assert_array_equal(x[lazy([0, 3, -1, -4])].numpy(), [[0, 1], [0, 0], [4, 5], [0, 0]])   # x[i] wraps -1
  np.testing.assert_array_equal(x[lazy([0, 1, 2]), lazy([1, 2, -1])].numpy(), [1, 0, 5])


def test_softmax_dim_none():
  x = fg.tensor([[1., 2.], [3., 5.]])
  with pytest.raises(TypeError, match="argument 'dim'.*must be int, not NoneType"): x.softmax(None)
  with pytest.raises(TypeError, match="argument 'dim'.*must be int, not NoneType"): x.log_softmax(None)
  a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
  for arr in (a, a[0], a[0, 0], np.arange(48, dtype=np.float32).reshape(2, 3, 2, 4) / 9):
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
      got = F.softmax(fg.tensor(arr))
    with pytest.warns(UserWarning):
      want = torch.nn.functional.softmax(torch.from_numpy(arr))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    with pytest.warns(UserWarning, match="log_softmax"):
      got = F.log_softmax(fg.tensor(arr))
    with pytest.warns(UserWarning):
      want = torch.nn.functional.log_softmax(torch.from_numpy(arr))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("data,dtype", [([300], "uint8"), ([-256], "uint8"), ([-129], "int8"), ([128], "int8"),
                                        ([2 ** 31], "int32"), ([2.5e9], "int32"), ([-0.5], "uint8"),
                                        ([float("nan")], "int32"), ([float("inf")], "int64"), (200, "int8")])
def test_tensor_refuses_values_out_of_integer_range(data, dtype):
  with pytest.raises(RuntimeError, match=f"value cannot be converted to type {dtype} without overflow"):
    torch.tensor(data, dtype=getattr(torch, dtype))
  with pytest.raises(RuntimeError, match=f"value cannot be converted to type {dtype} without overflow"):
    fg.tensor(data, dtype=getattr(fg, dtype))


def test_tensor_integer_range_edges_like_torch():
  for data, dtype in (([-1], "uint8"), ([-255, 255], "uint8"), ([-128, 127], "int8"), ([2 ** 63 - 1], "int64"),
                      ([255.0, 0.0], "uint8"), ([300, 2], "bool")):
    np.testing.assert_array_equal(fg.tensor(data, dtype=getattr(fg, dtype)).numpy(),
                                  torch.tensor(data, dtype=getattr(torch, dtype)).numpy())
  # numpy arrays convert as numpy does (torch does not check them either)
  np.testing.assert_array_equal(fg.tensor(np.array([300]), dtype=fg.uint8).numpy(), [44])
  with pytest.raises(RuntimeError, match="int8 without overflow"): fg.full((2,), 200, dtype=fg.int8)


@pytest.mark.parametrize("data", [[2 ** 63], 2 ** 63, [-2 ** 63 - 1], [[1, 2 ** 64]]])
def test_tensor_refuses_ints_past_int64(data):
  with pytest.raises(ValueError, match="Overflow when unpacking long"): torch.tensor(data)
  with pytest.raises(ValueError, match="Overflow when unpacking long"): fg.tensor(data)
  with pytest.raises(ValueError, match="Overflow when unpacking long"): fg.tensor(data, dtype=fg.int64)


def test_tensor_big_ints_as_float():
  for data in ([2 ** 70, 1.5], [2 ** 63]):
    kw = {} if any(isinstance(v, float) for v in data) else {"dtype": "float32"}
    got = fg.tensor(data, **({"dtype": fg.float32} if kw else {}))
    want = torch.tensor(data, **({"dtype": torch.float32} if kw else {}))
    assert got.dtype == fg.float32
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  with pytest.raises(ValueError, match="could not build a tensor"): fg.tensor([[1], [1, 2]])


@pytest.mark.parametrize("make", [lambda: fg.zeros(2 ** 40, 2 ** 40), lambda: fg.ones(2 ** 62, 4),
                                  lambda: fg.randn(2 ** 32, 2 ** 32), lambda: fg.zeros(1, 1).expand(2 ** 40, 2 ** 40),
                                  lambda: fg.zeros(2 ** 40, 1) + fg.zeros(1, 2 ** 40)])
def test_element_count_past_int64_refused(make):
  with pytest.raises(RuntimeError, match="Storage size calculation overflowed with sizes="): make()


# ---- clear errors for wrong types, 0-d reductions ------------------------------------------------------------

def test_cat_stack_refuse_non_tensors():
  with pytest.raises(TypeError, match="expected Tensor as element 1 in argument 0, but got list"):
    torch.cat([torch.ones(2), [1, 2]])
  with pytest.raises(TypeError, match="expected Tensor as element 1 in argument 0, but got list"):
    fg.cat([fg.ones(2), [1, 2]])
  with pytest.raises(TypeError, match="expected Tensor as element 0 in argument 0, but got int"):
    fg.stack([3, fg.ones(2)])


def test_layers_name_a_non_tensor_input():
  with pytest.raises(TypeError, match="linear.*'input'.*must be Tensor, not str"): fg.nn.Linear(2, 3)("abc")
  with pytest.raises(TypeError, match="conv2d.*must be Tensor, not list"): fg.nn.Conv2d(1, 1, 3)([[1.0]])
  with pytest.raises(TypeError, match="layer_norm.*must be Tensor, not str"): fg.nn.LayerNorm(3)("abc")
  with pytest.raises(TypeError, match="mse_loss.*must be Tensor, not float"): F.mse_loss(1.0, fg.ones(2))


@pytest.mark.parametrize("name", ["sum", "prod", "mean", "amax", "amin", "argmax", "argmin", "any", "all",
                                  "logsumexp", "softmax", "log_softmax", "cumsum", "cumprod", "argsort", "std"])
def test_zero_dim_reductions_take_dim_0_and_minus_1(name):
  x, tx = fg.tensor(3.), torch.tensor(3.)
  for d in (0, -1):
    got, want = getattr(x, name)(d), getattr(tx, name)(d)
    assert got.shape == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  with pytest.raises(IndexError, match="Dimension out of range"): getattr(x, name)(1)
  with pytest.raises(IndexError): getattr(tx, name)(1)


def test_zero_dim_max_min_topk_kthvalue():
  x = fg.tensor(3.)
  for f in (lambda t: t.max(0), lambda t: t.min(-1), lambda t: t.topk(1, 0), lambda t: t.kthvalue(1, 0),
            lambda t: t.sort(0)):
    (v, i), (tv, ti) = f(x), f(torch.tensor(3.))
    assert v.item() == tv.item() and i.item() == ti.item() == 0 and i.shape == () and i.dtype == fg.int64


# ---- state files and optimizer state ---------------------------------------------------------------------------

def test_optimizer_state_of_wrong_shape_refused():
  w = fg.zeros(3, 2, requires_grad=True)
  opt = fg.optim.Adam([w], lr=0.1)
  w.grad = fg.ones(3, 2)
  opt.step()
  sd = opt.state_dict()
  sd["state"][0]["exp_avg"] = fg.zeros(1)     # would broadcast in the update
  with pytest.raises(ValueError, match=r"'exp_avg' of shape \[1\] for parameter 0 of shape \[3, 2\]"):
    fg.optim.Adam([fg.zeros(3, 2, requires_grad=True)]).load_state_dict(sd)
  sd["state"][0]["exp_avg"] = np.zeros((2, 3), np.float32)
  with pytest.raises(ValueError, match=r"'exp_avg' of shape \[2, 3\]"):
    fg.optim.Adam([fg.zeros(3, 2, requires_grad=True)]).load_state_dict(sd)


def test_state_load_nesting_bound(tmp_path):
  from fusegrad.nn import state
  deep = cur = []
  for _ in range(state.MAX_DEPTH + 5):
    cur.append([]); cur = cur[0]
  with pytest.raises(ValueError, match="nested deeper than"): state.save(deep, tmp_path / "a.safetensors")
  # a file written by someone else with a deeply nested structure: a clear StateFileError, not a RecursionError
  import safetensors.numpy
  for depth in (state.MAX_DEPTH + 5, 100_000):
    text = '{"format": "fusegrad.state/1", "tree": ' + '{"l": [' * depth + '{"l": []}' + ']}' * depth + '}'
    p = tmp_path / f"deep{depth}.safetensors"
    safetensors.numpy.save_file({"x": np.zeros(1, np.float32)}, str(p), metadata={state.STATE_KEY: text})
    with pytest.raises(state.StateFileError, match="nested deeper than"): state.load(p)
  ok = [[[1, {"a": (2, 3)}]]]
  state.save(ok, tmp_path / "ok.safetensors")
  assert state.load(tmp_path / "ok.safetensors") == ok


def test_state_bool_bytes_other_than_0_1_refused(tmp_path):
  import safetensors.numpy
  from fusegrad.nn import state
  p = tmp_path / "b.safetensors"
  safetensors.numpy.save_file({"good": np.array([True, False]), "mask": np.array([0, 1, 7], np.uint8).view(np.bool_)},
                              str(p))
  with pytest.raises(state.StateFileError, match="tensor 'mask': BOOL data holds byte 7 at element 2"):
    state.load_file(p)
  safetensors.numpy.save_file({"good": np.array([True, False, True])}, str(p))
  np.testing.assert_array_equal(state.load_file(p)["good"].numpy(), [True, False, True])


@pytest.mark.parametrize("exponent", [3, 3.0, 2])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_small_integer_powers_are_multiplications_as_torchs(exponent, dtype, rng):
  """x ** 3 (and x ** 2) is spelled as PyTorch's CPU kernel spells it ((x*x)*x): bit for bit its values, zeros of
  both signs included, no powf call in the kernel (scalar, 2 ms of a minGPT step's NewGELU); gradients close."""
  a = (rng.standard_normal(777) * 3).astype(dtype)
  a[:2] = [0.0, -0.0]
  x, t = fg.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  with fg.track() as tr:
    y = (x ** exponent).realize()
  assert not any("powf(" in k.source.split("void " + k.name + "(")[-1] or "pow(" in k.source.split("void " + k.name + "(")[-1]
                 for k in tr.kernels)
  ty = t ** exponent
  assert y.dtype == getattr(fg, dtype)
  np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
  (y * y).sum().backward()
  (ty * ty).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5 if dtype == "float32" else 1e-12)
