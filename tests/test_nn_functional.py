"""fusegrad.nn.functional against torch.nn.functional: attention and the losses, values and gradients.

Each case is one function written for both libraries (`F` is either functional namespace, `c` makes a
constant such as a target or a class weight), the inputs it differentiates and the constants it takes.
Torch runs in float64 on the same values; fresh random inputs every run. Every loss runs with every
reduction on CPU; a representative subset also runs on PYTHON and OPENCL.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import fusegrad as fg
import fusegrad.nn as fnn
import fusegrad.nn.functional as FF
from conftest import DEVICES

RTOL, ATOL = 1e-5, 1e-5
OTHER = [d for d in DEVICES if d != "CPU"]


def close(got, want, label: str, tol: float = 1.0) -> None:
  assert got is not None, f"{label}: is None, torch has a value"
  g = got.numpy() if isinstance(got, fg.Tensor) else np.asarray(got)
  w = want.detach().double().numpy()
  assert g.shape == w.shape, f"{label}: shape {g.shape}, torch {w.shape}"
  scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
  np.testing.assert_allclose(g, w, rtol=RTOL * tol, atol=ATOL * tol * scale, err_msg=label)


class FGc:
  def __init__(self, device): self.device = device
  def __call__(self, a): return fg.tensor(np.asarray(a), device=self.device)


def c_torch(a):
  a = np.asarray(a)
  return torch.tensor(a, dtype=torch.float64) if a.dtype == np.float32 else torch.tensor(a)


def run(fn, diff: list, consts: list, device: str, rng, tol: float = 1.0) -> None:
  """fn(F, c, *diff_inputs, *consts): compare its value and the gradients of every diff input with torch's"""
  fx = [fg.tensor(a, device=device, requires_grad=True) for a in diff]
  tx = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in diff]
  c = FGc(device)
  fy = fn(FF, c, *fx, *[c(a) for a in consts])
  ty = fn(TF, c_torch, *tx, *[c_torch(a) for a in consts])
  assert fy.dtype == fg.float32, fy.dtype
  close(fy, ty, "value", tol)
  g = rng.standard_normal(ty.shape).astype(np.float32)
  fy.backward(fg.tensor(g, device=device))
  ty.backward(torch.tensor(g, dtype=torch.float64))
  for i, (a, b) in enumerate(zip(fx, tx)):
    assert a.grad is not None and a.grad.shape == a.shape and a.grad.device == device, f"input {i} grad"
    close(a.grad, b.grad, f"input {i} grad", tol)


def randn(rng, *shape) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)


# ---- scaled_dot_product_attention ------------------------------------------------------------------------------

def _mask(rng, shape, kind):
  if kind == "bool":
    m = rng.random(shape) < 0.6          # True: takes part (sdpa's convention)
    m[..., 0] = True                     # no row without a key
    return m
  return randn(rng, *shape)


SDPA = [
  # (name, q shape, k shape, v shape, mask kind, mask shape, kwargs)
  ("3d", (2, 4, 8), (2, 6, 8), (2, 6, 5), None, None, {}),
  ("4d", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), None, None, {}),
  ("causal_square", (2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4), None, None, {"is_causal": True}),
  ("causal_rect", (2, 2, 4, 4), (2, 2, 6, 4), (2, 2, 6, 3), None, None, {"is_causal": True}),
  ("causal_3d", (3, 5, 4), (3, 5, 4), (3, 5, 4), None, None, {"is_causal": True}),
  ("bool_mask_bcast", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), "bool", (4, 6), {}),
  ("bool_mask_full", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), "bool", (2, 3, 4, 6), {}),
  ("float_mask", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), "float", (2, 1, 4, 6), {}),
  ("float_mask_3d", (2, 4, 8), (2, 6, 8), (2, 6, 8), "float", (4, 6), {}),
  ("scale", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), None, None, {"scale": 0.3}),
  ("scale_bool_mask", (2, 4, 8), (2, 6, 8), (2, 6, 8), "bool", (2, 4, 6), {"scale": 1.7}),
  ("gqa", (2, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 8), None, None, {"enable_gqa": True}),
  ("gqa_causal", (1, 6, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4), None, None, {"enable_gqa": True, "is_causal": True}),
]
SDPA_PARAMS = ([pytest.param(*s, "CPU", id=f"{s[0]}-CPU") for s in SDPA]
               + [pytest.param(*SDPA[i], d, id=f"{SDPA[i][0]}-{d}") for d in OTHER for i in (3, 7, 11)])


@pytest.mark.parametrize("name,qs,ks,vs,mask,ms,kw,device", SDPA_PARAMS)
def test_sdpa(name, qs, ks, vs, mask, ms, kw, device, rng):
  diff = [randn(rng, *qs), randn(rng, *ks), randn(rng, *vs)]
  if mask == "float": diff.append(_mask(rng, ms, mask))          # a float mask gets a gradient too
  consts = [_mask(rng, ms, mask)] if mask == "bool" else []
  fn = lambda F, c, q, k, v, m=None: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
  run(fn, diff, consts, device, rng)


def test_sdpa_errors():
  q = np.zeros((2, 4, 8), np.float32)
  for L in (TF, FF):
    T = (lambda a: torch.tensor(a)) if L is TF else fg.tensor
    with pytest.raises(RuntimeError):   # is_causal and a mask
      L.scaled_dot_product_attention(T(q), T(q), T(q), attn_mask=T(np.ones((4, 4), bool)), is_causal=True)
    with pytest.raises(RuntimeError):   # head dims differ
      L.scaled_dot_product_attention(T(q), T(q[..., :4]), T(q))


# ---- losses ------------------------------------------------------------------------------------------------------

def logits(rng, *shape): return (rng.standard_normal(shape) * 2).astype(np.float32)
def probs(rng, *shape, axis=1):
  e = np.exp(rng.standard_normal(shape) * 2)
  return (e / e.sum(axis, keepdims=True)).astype(np.float32)
def classes(rng, n, *shape, ignore=None):
  t = rng.integers(0, n, size=shape)
  if ignore is not None: t.reshape(-1)[::3] = ignore       # every third target is ignored
  return t
def weights(rng, n): return rng.uniform(0.2, 2.0, n).astype(np.float32)
def unit(rng, *shape): return rng.uniform(0.02, 0.98, shape).astype(np.float32)
def near(rng, x):
  """a target near x, equal to it in a few places (the kinks of abs, smooth_l1, huber)"""
  t = (x + rng.standard_normal(x.shape) * 1.5).astype(np.float32)
  t.reshape(-1)[::4] = x.reshape(-1)[::4]
  return t


def with_kinks(rng, x, beta):
  """targets at distance exactly 0 and exactly beta from x"""
  t = near(rng, x)
  t.reshape(-1)[1::4] = x.reshape(-1)[1::4] + np.float32(beta)
  return t


def big_logits(rng, *shape):
  x = logits(rng, *shape)
  k = (0.0, 100.0, -100.0, 1000.0, -1000.0, 30.0, -30.0, 0.0)
  x.reshape(-1)[:len(k)] = k
  return x


def binary_targets(rng, *shape):
  t = rng.uniform(0, 1, shape).astype(np.float32)
  t.reshape(-1)[::3] = rng.integers(0, 2, size=t.reshape(-1)[::3].shape)   # hard 0/1 labels among soft ones
  return t


class Loss:
  def __init__(self, name, fn, make, all_devices=False, reductions=("mean", "sum", "none"), tol=1.0):
    """fn(F, c, *diff, *consts, reduction=); make(rng) -> (diff arrays, const arrays)"""
    self.name, self.fn, self.make, self.all, self.reductions, self.tol = name, fn, make, all_devices, reductions, tol


def _ce(**kw): return lambda F, c, x, t, *w: F.cross_entropy(x, t, *[w_ for w_ in w], **kw)


LOSSES = [
  # cross_entropy, class indices
  Loss("ce_2d", lambda F, c, x, t, reduction: F.cross_entropy(x, t, reduction=reduction),
       lambda r: ([logits(r, 6, 5)], [classes(r, 5, 6)]), all_devices=True),
  Loss("ce_1d", lambda F, c, x, t, reduction: F.cross_entropy(x, t, reduction=reduction),
       lambda r: ([logits(r, 5)], [np.array(r.integers(0, 5))])),
  Loss("ce_4d", lambda F, c, x, t, reduction: F.cross_entropy(x, t, reduction=reduction),
       lambda r: ([logits(r, 2, 4, 3, 5)], [classes(r, 4, 2, 3, 5)]), all_devices=True),
  Loss("ce_weight", lambda F, c, x, t, w, reduction: F.cross_entropy(x, t, weight=w, reduction=reduction),
       lambda r: ([logits(r, 7, 5)], [classes(r, 5, 7), weights(r, 5)])),
  Loss("ce_ignore", lambda F, c, x, t, reduction: F.cross_entropy(x, t, reduction=reduction),
       lambda r: ([logits(r, 7, 5)], [classes(r, 5, 7, ignore=-100)])),
  Loss("ce_ignore_custom_4d", lambda F, c, x, t, reduction: F.cross_entropy(x, t, ignore_index=2, reduction=reduction),
       lambda r: ([logits(r, 2, 4, 3, 3)], [classes(r, 4, 2, 3, 3, ignore=2)])),
  Loss("ce_weight_ignore", lambda F, c, x, t, w, reduction: F.cross_entropy(x, t, w, ignore_index=1,
                                                                             reduction=reduction),
       lambda r: ([logits(r, 7, 5)], [classes(r, 5, 7, ignore=1), weights(r, 5)])),
  Loss("ce_smoothing", lambda F, c, x, t, reduction: F.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1),
       lambda r: ([logits(r, 6, 5)], [classes(r, 5, 6)]), all_devices=True),
  Loss("ce_smoothing_weight_ignore",
       lambda F, c, x, t, w, reduction: F.cross_entropy(x, t, w, ignore_index=-100, reduction=reduction,
                                                        label_smoothing=0.25),
       lambda r: ([logits(r, 8, 5)], [classes(r, 5, 8, ignore=-100), weights(r, 5)])),
  Loss("ce_smoothing_weight_4d",
       lambda F, c, x, t, w, reduction: F.cross_entropy(x, t, w, ignore_index=0, reduction=reduction,
                                                        label_smoothing=0.3),
       lambda r: ([logits(r, 2, 4, 3, 2)], [classes(r, 4, 2, 3, 2, ignore=0), weights(r, 4)])),
  Loss("ce_smoothing_1d", lambda F, c, x, t, reduction: F.cross_entropy(x, t, reduction=reduction, label_smoothing=0.2),
       lambda r: ([logits(r, 5)], [np.array(r.integers(0, 5))])),
  # cross_entropy, class probabilities
  Loss("ce_probs", lambda F, c, x, t, reduction: F.cross_entropy(x, t, reduction=reduction),
       lambda r: ([logits(r, 6, 5), probs(r, 6, 5)], []), all_devices=True),
  Loss("ce_probs_smoothing", lambda F, c, x, t, reduction: F.cross_entropy(x, t, reduction=reduction,
                                                                           label_smoothing=0.2),
       lambda r: ([logits(r, 6, 5)], [probs(r, 6, 5)])),
  Loss("ce_probs_weight_smoothing_4d",
       lambda F, c, x, t, w, reduction: F.cross_entropy(x, t, w, reduction=reduction, label_smoothing=0.1),
       lambda r: ([logits(r, 2, 4, 3, 3)], [probs(r, 2, 4, 3, 3), weights(r, 4)])),
  Loss("ce_probs_1d", lambda F, c, x, t, reduction: F.cross_entropy(x, t, reduction=reduction),
       lambda r: ([logits(r, 5)], [probs(r, 5, axis=0)])),
  # nll_loss
  Loss("nll", lambda F, c, x, t, reduction: F.nll_loss(x, t, reduction=reduction),
       lambda r: ([logits(r, 6, 5)], [classes(r, 5, 6)]), all_devices=True),
  Loss("nll_weight_ignore", lambda F, c, x, t, w, reduction: F.nll_loss(x, t, w, ignore_index=3, reduction=reduction),
       lambda r: ([logits(r, 7, 5)], [classes(r, 5, 7, ignore=3), weights(r, 5)])),
  Loss("nll_4d_weight", lambda F, c, x, t, w, reduction: F.nll_loss(x, t, w, reduction=reduction),
       lambda r: ([logits(r, 2, 3, 4, 2)], [classes(r, 3, 2, 4, 2), weights(r, 3)])),
  Loss("nll_1d", lambda F, c, x, t, reduction: F.nll_loss(x, t, reduction=reduction),
       lambda r: ([logits(r, 5)], [np.array(r.integers(0, 5))])),
  # regression losses: the target is differentiated too
  Loss("mse", lambda F, c, x, t, reduction: F.mse_loss(x, t, reduction=reduction),
       lambda r: ([randn(r, 4, 5), randn(r, 4, 5)], []), all_devices=True),
  Loss("l1", lambda F, c, x, t, reduction: F.l1_loss(x, t, reduction=reduction),
       lambda r: (lambda x: ([x, near(r, x)], []))(randn(r, 4, 5)), all_devices=True),
  *[Loss(f"smooth_l1_beta{b}", (lambda b: lambda F, c, x, t, reduction: F.smooth_l1_loss(x, t, reduction=reduction,
                                                                                           beta=b))(b),
         (lambda b: lambda r: (lambda x: ([x, with_kinks(r, x, b)], []))(randn(r, 4, 5)))(b), all_devices=b == 0.5)
    for b in (1.0, 0.5, 0.0)],
  *[Loss(f"huber_delta{d}", (lambda d: lambda F, c, x, t, reduction: F.huber_loss(x, t, reduction=reduction,
                                                                                   delta=d))(d),
         (lambda d: lambda r: (lambda x: ([x, with_kinks(r, x, d)], []))(randn(r, 4, 5)))(d))
    for d in (1.0, 2.0, 0.3)],
  # binary cross entropy
  Loss("bce", lambda F, c, x, t, reduction: F.binary_cross_entropy(x, t, reduction=reduction),
       lambda r: ([unit(r, 4, 5)], [binary_targets(r, 4, 5)]), all_devices=True),
  Loss("bce_weight", lambda F, c, x, t, w, reduction: F.binary_cross_entropy(x, t, w, reduction=reduction),
       lambda r: ([unit(r, 4, 5)], [binary_targets(r, 4, 5), weights(r, 5)])),
  Loss("bce_target_grad", lambda F, c, x, t, reduction: F.binary_cross_entropy(x, t, reduction=reduction),
       lambda r: ([unit(r, 3, 4), unit(r, 3, 4)], [])),
  Loss("bce_logits", lambda F, c, x, t, reduction: F.binary_cross_entropy_with_logits(x, t, reduction=reduction),
       lambda r: ([logits(r, 4, 5)], [binary_targets(r, 4, 5)]), all_devices=True),
  Loss("bce_logits_big", lambda F, c, x, t, reduction: F.binary_cross_entropy_with_logits(x, t, reduction=reduction),
       lambda r: ([big_logits(r, 4, 5)], [binary_targets(r, 4, 5)])),
  Loss("bce_logits_weight_pos", lambda F, c, x, t, w, pw, reduction: F.binary_cross_entropy_with_logits(
       x, t, w, reduction=reduction, pos_weight=pw),
       lambda r: ([big_logits(r, 4, 5)], [binary_targets(r, 4, 5), weights(r, 5), weights(r, 5)]), all_devices=True),
  Loss("bce_logits_pos_bcast", lambda F, c, x, t, pw, reduction: F.binary_cross_entropy_with_logits(
       x, t, reduction=reduction, pos_weight=pw),
       lambda r: ([logits(r, 2, 3, 4)], [binary_targets(r, 2, 3, 4), weights(r, 4)])),
  Loss("bce_logits_target_grad", lambda F, c, x, t, reduction: F.binary_cross_entropy_with_logits(
       x, t, reduction=reduction), lambda r: ([logits(r, 3, 4), unit(r, 3, 4)], [])),
  # kl_div: targets with exact zeros are constants (torch's target gradient is nan there)
  Loss("kl_div", lambda F, c, x, t, reduction: F.kl_div(x, t, reduction=reduction),
       lambda r: ([np.log(probs(r, 4, 5))], [np.where(r.random((4, 5)) < 0.3, 0, probs(r, 4, 5)).astype(np.float32)]),
       reductions=("mean", "sum", "none", "batchmean"), all_devices=True),
  Loss("kl_div_target_grad", lambda F, c, x, t, reduction: F.kl_div(x, t, reduction=reduction),
       lambda r: ([np.log(probs(r, 3, 2, 4)), probs(r, 3, 2, 4)], []), reductions=("mean", "sum", "none", "batchmean")),
  Loss("kl_div_log_target", lambda F, c, x, t, reduction: F.kl_div(x, t, reduction=reduction, log_target=True),
       lambda r: ([np.log(probs(r, 4, 5)), np.log(probs(r, 4, 5))], []),
       reductions=("mean", "sum", "none", "batchmean")),
]
LOSS_PARAMS = ([pytest.param(l, red, "CPU", id=f"{l.name}-{red}-CPU") for l in LOSSES for red in l.reductions]
               + [pytest.param(l, l.reductions[0], d, id=f"{l.name}-{l.reductions[0]}-{d}")
                  for d in OTHER for l in LOSSES if l.all])


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")   # torch's notice for kl_div
@pytest.mark.parametrize("loss,reduction,device", LOSS_PARAMS)
def test_loss(loss, reduction, device, rng):
  diff, consts = loss.make(rng)
  run(lambda F, c, *a: loss.fn(F, c, *a, reduction=reduction), diff, consts, device, rng, loss.tol)


# the loss modules: constructor arguments in torch's order, buffers for the weights
LOSS_MODULES = [
  ("CrossEntropyLoss", lambda L, w: L.CrossEntropyLoss(w, ignore_index=1, label_smoothing=0.1), "ce"),
  ("CrossEntropyLoss", lambda L, w: L.CrossEntropyLoss(reduction="sum"), "ce"),
  ("NLLLoss", lambda L, w: L.NLLLoss(w, reduction="none"), "ce"),
  ("MSELoss", lambda L, w: L.MSELoss(), "reg"),
  ("L1Loss", lambda L, w: L.L1Loss(reduction="sum"), "reg"),
  ("SmoothL1Loss", lambda L, w: L.SmoothL1Loss(beta=0.5), "reg"),
  ("HuberLoss", lambda L, w: L.HuberLoss(delta=0.7), "reg"),
  ("BCELoss", lambda L, w: L.BCELoss(w), "bce"),
  ("BCEWithLogitsLoss", lambda L, w: L.BCEWithLogitsLoss(w, pos_weight=w * 2), "bcel"),
  ("KLDivLoss", lambda L, w: L.KLDivLoss(reduction="batchmean", log_target=True), "kl"),
]


@pytest.mark.parametrize("i", range(len(LOSS_MODULES)))
def test_loss_modules(i, rng):
  name, build, kind = LOSS_MODULES[i]
  w = weights(rng, 5)
  ours, theirs = build(fnn, fg.tensor(w)), build(torch.nn, torch.tensor(w, dtype=torch.float64))
  assert type(ours).__name__ == name
  assert dict(ours.state_dict()).keys() == theirs.state_dict().keys()
  x = {"ce": logits(rng, 6, 5), "reg": randn(rng, 6, 5), "bce": unit(rng, 6, 5), "bcel": logits(rng, 6, 5),
       "kl": np.log(probs(rng, 6, 5))}[kind]
  t = {"ce": classes(rng, 5, 6, ignore=1), "reg": randn(rng, 6, 5), "bce": binary_targets(rng, 6, 5),
       "bcel": binary_targets(rng, 6, 5), "kl": np.log(probs(rng, 6, 5))}[kind]
  run(lambda F, c, x, t: ours(x, t) if F is FF else theirs(x, t), [x], [t], "CPU", rng)


@pytest.mark.parametrize("classes_", [5, 1100])
def test_class_loss_with_every_target_ignored(classes_, rng):
  """Every target ignore_index: the mean's loss is 0 / 0 = NaN and its gradient 0, as PyTorch's (a plain division gave
  NaN gradients: the ignored terms' zero weights times the division's infinite derivative), with and without class
  weights and label smoothing, and through the gathered targets of a vocabulary (1100 classes)."""
  x = rng.standard_normal((6, classes_)).astype(np.float32)
  t = np.full(6, 3)
  w = rng.uniform(0.2, 2.0, classes_).astype(np.float32)
  for kw in ({}, {"weight": w}, {"label_smoothing": 0.1}, {"weight": w, "label_smoothing": 0.2}):
    grads = []
    for L, T in ((FF, fg.tensor), (TF, torch.tensor)):
      xt = T(x, requires_grad=True)
      loss = L.cross_entropy(xt, T(t), ignore_index=3, **{k: T(v) if k == "weight" else v for k, v in kw.items()})
      loss.backward()
      assert np.isnan(float(loss.item())), kw
      grads.append(xt.grad.numpy())
    np.testing.assert_array_equal(grads[0], grads[1])
    np.testing.assert_array_equal(grads[0], np.zeros_like(x))
  # one target counted: the mean and its gradient as before
  t[2] = 1
  xs = [fg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)]
  for L, T, xt in ((FF, fg.tensor, xs[0]), (TF, torch.tensor, xs[1])): L.cross_entropy(xt, T(t), ignore_index=3).backward()
  np.testing.assert_allclose(xs[0].grad.numpy(), xs[1].grad.numpy(), rtol=1e-5, atol=1e-6)


def test_loss_errors():
  x, t = np.zeros((3, 4), np.float32), np.zeros(3, np.int64)
  for L, T in ((TF, torch.tensor), (FF, fg.tensor)):
    with pytest.raises(ValueError):      # bad reduction
      L.cross_entropy(T(x), T(t), reduction="avg")
    with pytest.raises(ValueError):
      L.mse_loss(T(x), T(x), reduction="avg")
    with pytest.raises(ValueError):      # batch sizes differ
      L.cross_entropy(T(x), T(np.zeros(2, np.int64)))
    with pytest.raises(IndexError):      # class index out of range (fusegrad checks indices that exist)
      L.cross_entropy(T(x), T(np.array([0, 4, 1])))
    with pytest.raises(ValueError):
      L.binary_cross_entropy(T(x), T(np.zeros((3, 1), np.float32)))
    with pytest.raises(ValueError):
      L.binary_cross_entropy_with_logits(T(x), T(np.zeros((4, 3), np.float32)))
    with pytest.raises(RuntimeError):    # negative beta
      L.smooth_l1_loss(T(x), T(x), beta=-1.0)
  with pytest.raises(ValueError):
    torch.nn.CrossEntropyLoss(reduction="avg")(torch.tensor(x), torch.tensor(t))
  with pytest.raises(ValueError):
    fnn.CrossEntropyLoss(reduction="avg")


# ---- one_hot ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_one_hot(device, rng):
  t = rng.integers(0, 6, size=(3, 4))
  for n in (-1, 6, 9):
    got = FF.one_hot(fg.tensor(t, device=device), n)
    want = TF.one_hot(torch.tensor(t), n)
    assert got.dtype == fg.int64 and got.device == device
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  np.testing.assert_array_equal(FF.one_hot(fg.tensor(np.array(3)), 5).numpy(), TF.one_hot(torch.tensor(3), 5).numpy())


def test_one_hot_errors():
  for L, T in ((TF, torch.tensor), (FF, fg.tensor)):
    with pytest.raises(RuntimeError): L.one_hot(T(np.array([0, 5])), 5)            # out of range
    with pytest.raises(RuntimeError): L.one_hot(T(np.array([0, -1])), 5)
    with pytest.raises(RuntimeError): L.one_hot(T(np.array([0.0, 1.0], np.float32)), 3)   # not an index tensor


# ---- kernel counts (CPU) ----------------------------------------------------------------------------------------

def _leaf(rng, *shape):
  return fg.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True).realize()


@pytest.mark.parametrize("reduction,bwd", [("mean", 1), ("sum", 1)])
def test_cross_entropy_kernel_counts(reduction, bwd, rng):
  x = _leaf(rng, 64, 10)
  t = fg.tensor(rng.integers(0, 10, size=64)).realize()
  with fg.track() as fk:
    loss = FF.cross_entropy(x, t, reduction=reduction).realize()
  with fg.track() as bk:
    loss.backward()
    x.grad.realize()
  want = TF.cross_entropy(torch.tensor(x.numpy(), requires_grad=True), torch.tensor(t.numpy()), reduction=reduction)
  np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-5)
  assert len(fk.kernels) == 1       # log_softmax, the one-hot pick and the reduction: one kernel
  assert len(bk.kernels) == bwd     # softmax - onehot per row (mean: over the count of valid targets, summed beside)


@pytest.mark.parametrize("extra", [(), (3,)])
def test_cross_entropy_over_many_classes_gathers_its_targets(extra, rng):
  """From FF.PICK_GATHER_MIN classes the targets' logits are gathered, not selected by a one-hot over every logit: the
  forward reads the logits in its reductions and N of them besides, and the backward's gradient of the gather is a
  one-hot along the classes only (it had been one over every logit for every target: seconds on [1024, 50257]).
  Values and gradients against float64 torch, as close as float32 torch, with ignore_index, label smoothing, every
  reduction and a class dim with a trailing dim beside it; kernel counts."""
  C = FF.PICK_GATHER_MIN + 37
  a = (rng.standard_normal((24, C) + extra) * 3).astype(np.float32)
  y = rng.integers(0, C, (24,) + extra)
  y.reshape(-1)[::5] = -100
  for reduction in ("mean", "sum", "none"):
    for ls in (0.0, 0.1):
      x, t64, t32 = (fg.tensor(a, requires_grad=True), torch.tensor(a.astype(np.float64), requires_grad=True),
                     torch.tensor(a, requires_grad=True))
      got = FF.cross_entropy(x, fg.tensor(y), reduction=reduction, label_smoothing=ls)
      want, w32 = (TF.cross_entropy(t, torch.from_numpy(y), reduction=reduction, label_smoothing=ls) for t in (t64, t32))
      got.sum().backward(), want.sum().backward(), w32.sum().backward()
      np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
      e, e32 = (np.abs(g - t64.grad.numpy()).max() for g in (x.grad.numpy(), t32.grad.numpy()))
      assert e <= 2 * e32 + 1e-7, (reduction, ls, e, e32)
  x, t = _leaf(rng, 64, C), fg.tensor(rng.integers(0, C, size=64)).realize()
  with fg.track() as fk:
    loss = FF.cross_entropy(x, t).realize()
  with fg.track() as bk:
    loss.backward()
    x.grad.realize()
  assert len(fk.kernels) <= 3 and len(bk.kernels) <= 2, ([k.name for k in fk.kernels], [k.name for k in bk.kernels])
  assert all(k.flops < 64 * C * 30 for k in fk.kernels + bk.kernels)   # no work of rows x classes x targets


@pytest.mark.parametrize("mask", [None, "bool", "float", "causal"])
def test_sdpa_kernel_count(mask, rng):
  q, k, v = (_leaf(rng, 2, 2, 8, 4) for _ in range(3))
  kw = {"is_causal": True} if mask == "causal" else {}
  if mask is not None and mask != "causal":
    kw["attn_mask"] = fg.tensor(_mask(rng, (8, 8), mask)).realize()
  if mask == "causal": FF.scaled_dot_product_attention(q, k, v, **kw)   # the causal mask is made once per shape
  with fg.track() as t:
    FF.scaled_dot_product_attention(q, k, v, **kw).realize()
  assert len(t.kernels) == 2        # q @ k^T, then softmax and @ v
