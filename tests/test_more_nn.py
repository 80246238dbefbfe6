"""More of torch.nn against torch, from the same inputs and weights: the remaining loss modules (values and gradients
for every reduction), nn.init's orthogonal_ / dirac_ / sparse_, the CosineAnnealingWarmRestarts and CyclicLR
schedulers (every step's lr and momentum, step(epoch), state_dict round trips, inside fusegrad.jit),
nn.utils.parameters_to_vector / vector_to_parameters, the containers' list and dict operations and
Module.get_submodule / get_parameter / get_buffer."""
from __future__ import annotations
import math
import warnings
import zlib
from collections import OrderedDict
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn as fnn
from fusegrad.nn import init, losses


def _nn(name: str):
  """fusegrad's class by torch's name (nn's export, else where it is defined)."""
  return getattr(fnn, name, None) or getattr(losses, name)


def _pair(a: np.ndarray, grad: bool = False):
  return fg.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad)


# ---- loss modules ------------------------------------------------------------------------------------------------

def _pm1(rng, *shape):
  return np.where(rng.random(shape) < 0.5, -1.0, 1.0).astype(np.float32)


def _loss_cases(rng):
  f32 = lambda *s: rng.standard_normal(s).astype(np.float32)   # noqa: E731
  pos = lambda *s: (rng.random(s) + 0.2).astype(np.float32)     # noqa: E731
  mlm_target = np.array([[3, 0, -1, 1, 2], [1, -1, 0, 0, 0], [0, 1, 2, 3, 4], [4, 4, -1, 2, 0]], np.int64)
  w5a, w5b = pos(5), pos(5)
  cos = lambda lib: (lambda a, b: 1 - lib.nn.functional.cosine_similarity(a, b))   # noqa: E731
  # name: (constructor kwargs per library, [(array, differentiable)], weight arrays (constructor kwarg -> array))
  return {
    "margin_ranking": ("MarginRankingLoss", lambda lib: dict(margin=0.3), [(f32(9), True), (f32(9), True), (_pm1(rng, 9), False)]),
    "triplet": ("TripletMarginLoss", lambda lib: dict(margin=0.7), [(f32(6, 5), True), (f32(6, 5), True), (f32(6, 5), True)]),
    "triplet_p1_swap": ("TripletMarginLoss", lambda lib: dict(margin=2.0, p=1, swap=True), [(f32(6, 5), True), (f32(6, 5), True), (f32(6, 5), True)]),
    "triplet_dist_default": ("TripletMarginWithDistanceLoss", lambda lib: dict(), [(f32(6, 5), True), (f32(6, 5), True), (f32(6, 5), True)]),
    "triplet_dist_cos_swap": ("TripletMarginWithDistanceLoss", lambda lib: dict(distance_function=cos(lib), margin=0.5, swap=True),
                              [(f32(6, 5), True), (f32(6, 5), True), (f32(6, 5), True)]),
    "cosine_embedding": ("CosineEmbeddingLoss", lambda lib: dict(margin=0.2), [(f32(7, 4), True), (f32(7, 4), True), (_pm1(rng, 7), False)]),
    "multilabel_soft_margin": ("MultiLabelSoftMarginLoss", lambda lib: dict(weight=lib.tensor(w5a)),
                               [(f32(4, 5), True), ((rng.random((4, 5)) < 0.4).astype(np.float32), False)]),
    "multilabel_soft_margin_noweight": ("MultiLabelSoftMarginLoss", lambda lib: dict(), [(f32(4, 5), True), ((rng.random((4, 5)) < 0.4).astype(np.float32), False)]),
    "multilabel_margin": ("MultiLabelMarginLoss", lambda lib: dict(), [(f32(4, 5), True), (mlm_target, False)]),
    "multilabel_margin_1d": ("MultiLabelMarginLoss", lambda lib: dict(), [(f32(5), True), (mlm_target[0], False)]),
    "multi_margin": ("MultiMarginLoss", lambda lib: dict(), [(f32(6, 5), True), (rng.integers(0, 5, 6), False)]),
    "multi_margin_p2_weight": ("MultiMarginLoss", lambda lib: dict(p=2, margin=0.6, weight=lib.tensor(w5b)),
                               [(f32(6, 5), True), (rng.integers(0, 5, 6), False)]),
    "poisson_log": ("PoissonNLLLoss", lambda lib: dict(), [(f32(5, 3), True), (rng.poisson(2.0, (5, 3)).astype(np.float32), False)]),
    "poisson_full": ("PoissonNLLLoss", lambda lib: dict(log_input=False, full=True), [(pos(5, 3), True), (rng.poisson(2.0, (5, 3)).astype(np.float32), False)]),
    "gaussian": ("GaussianNLLLoss", lambda lib: dict(), [(f32(5, 3), True), (f32(5, 3), False), (pos(5, 3), True)]),
    "gaussian_full_var_per_row": ("GaussianNLLLoss", lambda lib: dict(full=True, eps=1e-3), [(f32(5, 3), True), (f32(5, 3), True), (pos(5), True)]),
    "hinge_embedding": ("HingeEmbeddingLoss", lambda lib: dict(margin=0.5), [(f32(8), True), (_pm1(rng, 8), False)]),
    "soft_margin": ("SoftMarginLoss", lambda lib: dict(), [(f32(7, 3), True), (_pm1(rng, 7, 3), False)]),
  }


_LOSS_NAMES = sorted(_loss_cases(np.random.default_rng(0)))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", _LOSS_NAMES)
def test_loss_module_matches_torch(case, reduction):
  rng = np.random.default_rng(zlib.crc32(case.encode()))
  name, kw, args = _loss_cases(rng)[case]
  ours, theirs = _nn(name)(**kw(fg), reduction=reduction), getattr(torch.nn, name)(**kw(torch), reduction=reduction)
  assert list(ours.state_dict()) == list(theirs.state_dict())
  assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
  fa, ta = zip(*[_pair(a, g) for a, g in args])
  out, tout = ours(*fa), theirs(*ta)
  assert tuple(out.shape) == tuple(tout.shape)
  np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=2e-5, atol=1e-6)
  w = rng.standard_normal(tuple(tout.shape)).astype(np.float32)   # a gradient from above for 'none'
  (out * fg.tensor(w)).sum().backward()
  (tout * torch.tensor(w)).sum().backward()
  for i, (f, t) in enumerate(zip(fa, ta)):
    if t.requires_grad:
      np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=2e-4, atol=2e-6, err_msg=f"gradient {i}")


def test_loss_legacy_flags_and_errors():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for kw in (dict(size_average=False), dict(reduce=False), dict(size_average=True, reduce=True)):
      assert _nn("MarginRankingLoss")(**kw).reduction == torch.nn.MarginRankingLoss(**kw).reduction
      assert _nn("MultiMarginLoss")(**kw).reduction == torch.nn.MultiMarginLoss(**kw).reduction
  for cls, kw in (("TripletMarginLoss", dict(margin=0)), ("TripletMarginWithDistanceLoss", dict(margin=-1.0)),
                  ("MultiMarginLoss", dict(p=3)), ("MultiMarginLoss", dict(weight=fg.ones(2, 2)))):
    tkw = {k: torch.ones(2, 2) if k == "weight" else v for k, v in kw.items()}
    with pytest.raises(ValueError) as e: _nn(cls)(**kw)
    with pytest.raises(ValueError) as te: getattr(torch.nn, cls)(**tkw)
    assert str(e.value) == str(te.value)
  x, t = fg.randn(2, 4), fg.tensor([[1, 2, -1], [3, -1, 0]])
  with pytest.raises(RuntimeError, match=r"inconsistent target size: \[2, 3\] for input of size: \[2, 4\]"):
    _nn("MultiLabelMarginLoss")()(x, t)
  with pytest.raises(RuntimeError, match="out of range"):
    _nn("MultiLabelMarginLoss")()(x, fg.tensor([[1, 2, -1, 4], [3, -1, 0, 0]]))
  with pytest.raises(RuntimeError, match="expected scalar type Long but found Float"):
    _nn("MultiLabelMarginLoss")()(x, fg.zeros(2, 4))
  with pytest.raises(RuntimeError, match="Expected non-empty vector or matrix"):
    _nn("MultiLabelMarginLoss")()(fg.randn(2, 3, 4), fg.zeros(2, 3, 4, dtype=fg.int64))
  with pytest.raises(ValueError, match="not a valid value for reduction"):
    _nn("SoftMarginLoss")(reduction="bad")(x, x)
  assert repr(_nn("TripletMarginWithDistanceLoss")()) == repr(torch.nn.TripletMarginWithDistanceLoss())


# ---- nn.init -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,gain", [((3, 7), 1.0), ((7, 3), 2.0), ((5, 5), 1.0), ((4, 2, 3, 3), 0.5),
                                        ((16, 3, 2), math.sqrt(2))])
def test_orthogonal(shape, gain):
  fg.manual_seed(3)
  w = fnn.Parameter(fg.empty(*shape))
  assert init.orthogonal_(w, gain=gain) is w
  assert tuple(w.shape) == shape and w.requires_grad and w.grad is None
  a = w.numpy().reshape(shape[0], -1).astype(np.float64) / gain
  g = a @ a.T if a.shape[0] <= a.shape[1] else a.T @ a
  np.testing.assert_allclose(g, np.eye(g.shape[0]), atol=1e-5)
  fg.manual_seed(3)
  np.testing.assert_array_equal(init.orthogonal_(fg.empty(*shape), gain=gain).numpy(), w.numpy())   # seeded
  assert not np.array_equal(init.orthogonal_(fg.empty(*shape), gain=gain).numpy(), w.numpy())


def test_orthogonal_errors_and_empty():
  with pytest.raises(ValueError, match="Only tensors with 2 or more dimensions are supported"): init.orthogonal_(fg.empty(4))
  assert init.orthogonal_(fg.empty(0, 3)).shape == (0, 3)


@pytest.mark.parametrize("shape,groups", [((4, 4, 3), 1), ((5, 3, 4), 1), ((6, 3, 3, 3), 2), ((4, 2, 3, 3, 3), 1),
                                          ((6, 4, 5, 2), 3), ((2, 5, 4), 1)])
def test_dirac(shape, groups):
  w, tw = fg.randn(*shape), torch.randn(*shape)
  init.dirac_(w, groups), torch.nn.init.dirac_(tw, groups)
  np.testing.assert_array_equal(w.numpy(), tw.numpy())
  if shape[0] == shape[1] and shape[2] % 2:   # the identity convolution
    x = np.random.default_rng(0).standard_normal((2, shape[1]) + (6,) * (len(shape) - 2)).astype(np.float32)
    conv = getattr(fg.nn.functional, f"conv{len(shape) - 2}d")
    np.testing.assert_allclose(conv(fg.tensor(x), w, padding=shape[2] // 2).numpy(), x, atol=0)


def test_dirac_errors():
  with pytest.raises(ValueError, match="Only tensors with 3, 4, or 5 dimensions are supported"): init.dirac_(fg.empty(3, 3))
  with pytest.raises(ValueError, match="dim 0 must be divisible by groups"): init.dirac_(fg.empty(5, 3, 3), groups=2)


@pytest.mark.parametrize("shape,sparsity", [((20, 8), 0.3), ((7, 5), 0.5), ((10, 3), 0.0), ((200, 30), 0.9)])
def test_sparse(shape, sparsity):
  w = fnn.Parameter(fg.empty(*shape))
  assert init.sparse_(w, sparsity, std=0.05) is w
  a, ta = w.numpy(), torch.nn.init.sparse_(torch.empty(*shape), sparsity, std=0.05).numpy()
  zeros = (a == 0).sum(0)
  np.testing.assert_array_equal(zeros, (ta == 0).sum(0))
  assert (zeros == math.ceil(sparsity * shape[0])).all()
  nz = a[a != 0]
  if nz.size > 100: assert 0.04 < nz.std() < 0.06
  assert len({tuple(np.flatnonzero(a[:, j] == 0)) for j in range(shape[1])}) > 1 or sparsity == 0   # random rows
  with pytest.raises(ValueError, match="Only tensors with 2 dimensions are supported"): init.sparse_(fg.empty(2, 2, 2), 0.1)


# ---- lr schedulers -------------------------------------------------------------------------------------------------

def _opts(cls: str = "SGD", **kw):
  out = []
  for lib in (fg, torch):
    a, b = lib.zeros(3, requires_grad=True), lib.zeros(2, requires_grad=True)
    out.append(getattr(lib.optim, cls)([{"params": [a]}, {"params": [b], "lr": 0.03}], lr=0.1, **kw))
  return out


def _hyper(opt):
  return [(g["lr"], g.get("momentum"), g["betas"][0] if "betas" in g else None) for g in opt.param_groups]


class _Scale:   # a callable object: its __dict__ is part of CyclicLR's state_dict
  def __init__(self): self.k = 0.9
  def __call__(self, x): return self.k ** x


SCHEDULES = {
  "warm_restarts": ("SGD", dict(momentum=0.9), "CosineAnnealingWarmRestarts", lambda: dict(T_0=7)),
  "warm_restarts_mult": ("SGD", dict(), "CosineAnnealingWarmRestarts", lambda: dict(T_0=3, T_mult=2, eta_min=1e-3)),
  "cyclic": ("SGD", dict(momentum=0.9), "CyclicLR", lambda: dict(base_lr=0.01, max_lr=0.1, step_size_up=5)),
  "cyclic_triangular2": ("SGD", dict(momentum=0.5), "CyclicLR",
                         lambda: dict(base_lr=[0.01, 0.02], max_lr=[0.1, 0.3], step_size_up=4, step_size_down=9,
                                      mode="triangular2", base_momentum=[0.8, 0.7], max_momentum=0.95)),
  "cyclic_exp_range_adam": ("Adam", dict(), "CyclicLR",
                            lambda: dict(base_lr=0.001, max_lr=0.01, step_size_up=6, mode="exp_range", gamma=0.97)),
  "cyclic_scale_fn_iterations": ("AdamW", dict(), "CyclicLR",
                                 lambda: dict(base_lr=0.001, max_lr=0.01, step_size_up=3, scale_fn=_Scale(),
                                              scale_mode="iterations")),
  "cyclic_lambda_no_momentum": ("SGD", dict(), "CyclicLR",
                                lambda: dict(base_lr=0.001, max_lr=0.01, step_size_up=5,
                                             scale_fn=lambda x: 1 / x, cycle_momentum=False)),
}


def _make(case):
  cls, okw, sname, skw = SCHEDULES[case]
  opt, topt = _opts(cls, **okw)
  return (opt, getattr(fg.optim.lr_scheduler, sname)(opt, **skw()),
          topt, getattr(torch.optim.lr_scheduler, sname)(topt, **skw()))


def _same(opt, sched, topt, tsched, what):
  for a, b in zip(_hyper(opt), _hyper(topt)):
    for x, y in zip(a, b):
      if y is None: assert x is None, what
      else: np.testing.assert_allclose(x, y, rtol=1e-13, atol=0, err_msg=what)
  np.testing.assert_allclose(sched.get_last_lr(), tsched.get_last_lr(), rtol=1e-13, atol=0, err_msg=what)
  assert sched.last_epoch == tsched.last_epoch, what


@pytest.mark.parametrize("case", sorted(SCHEDULES))
def test_scheduler_matches_torch(case):
  opt, sched, topt, tsched = _make(case)
  _same(opt, sched, topt, tsched, "constructed")
  for i in range(60):
    opt.step(), topt.step()
    sched.step(), tsched.step()
    _same(opt, sched, topt, tsched, f"step {i}")


@pytest.mark.parametrize("case", sorted(SCHEDULES))
def test_scheduler_state_dict_round_trip(case):
  opt, sched, topt, tsched = _make(case)
  for _ in range(13): opt.step(), topt.step(), sched.step(), tsched.step()
  sd, tsd = sched.state_dict(), tsched.state_dict()
  assert sorted(sd) == sorted(tsd)
  for k, v in tsd.items():
    if isinstance(v, (int, float, str, list, type(None))) and k != "_last_lr": assert sd[k] == v, k
  opt2, sched2, topt2, tsched2 = _make(case)   # fresh ones, loaded from the saved states
  sched2.load_state_dict(sd), tsched2.load_state_dict(tsd)
  for g, g1 in zip(opt2.param_groups, opt.param_groups): g.update({k: g1[k] for k in ("lr", "momentum", "betas") if k in g1})
  for g, g1 in zip(topt2.param_groups, topt.param_groups): g.update({k: g1[k] for k in ("lr", "momentum", "betas") if k in g1})
  if isinstance(sched.__dict__.get("_scale_fn_custom"), _Scale): sched.__dict__["_scale_fn_custom"].k = 0.9
  for i in range(20):
    for o, s in ((opt, sched), (opt2, sched2), (topt2, tsched2)): o.step(), s.step()
    _same(opt2, sched2, topt2, tsched2, f"resumed step {i}")
    _same(opt, sched, topt2, tsched2, f"original step {i}")


@pytest.mark.parametrize("T_mult", [1, 2, 3])
def test_warm_restarts_fractional_epochs(T_mult):
  opt, topt = _opts()
  s = fg.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=4, T_mult=T_mult, eta_min=0.005)
  ts = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(topt, T_0=4, T_mult=T_mult, eta_min=0.005)
  iters = 7
  for epoch in range(12):
    for b in range(iters):
      opt.step(), topt.step()
      s.step(epoch + b / iters), ts.step(epoch + b / iters)
      _same(opt, s, topt, ts, f"epoch {epoch} batch {b}")
      assert s.T_cur == pytest.approx(ts.T_cur, rel=1e-12) and s.T_i == ts.T_i
  s.step(), ts.step()   # back to counting
  _same(opt, s, topt, ts, "counted step")
  with pytest.raises(ValueError, match="Expected non-negative epoch, but got -1"): s.step(-1)


def test_scheduler_bad_arguments_like_torch():
  for lib in (fg, torch):
    S = lib.optim.lr_scheduler
    o = lib.optim.SGD([lib.zeros(2, requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match="Expected positive integer T_0, but got 0"): S.CosineAnnealingWarmRestarts(o, T_0=0)
    with pytest.raises(ValueError, match="Expected integer T_mult >= 1, but got 0"): S.CosineAnnealingWarmRestarts(o, 2, T_mult=0)
    with pytest.raises(ValueError, match="Expected float or int eta_min"): S.CosineAnnealingWarmRestarts(o, 2, eta_min="x")
    with pytest.raises(ValueError, match="mode is invalid and scale_fn is None"): S.CyclicLR(o, 0.1, 1.0, mode="sine")
    with pytest.raises(ValueError, match="max_lr must have the same length"): S.CyclicLR(o, 0.1, [1.0, 2.0])
    o2 = lib.optim.Adagrad([lib.zeros(2, requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match="optimizer must support momentum or beta1"): S.CyclicLR(o2, 0.1, 1.0)
    S.CyclicLR(o2, 0.1, 1.0, cycle_momentum=False)


@pytest.mark.parametrize("name", ["CyclicLR", "CosineAnnealingWarmRestarts"])
def test_scheduler_stepped_inside_the_jitted_step_follows_torch(rng, name):
  W = rng.standard_normal((8, 4)).astype(np.float32)
  w, tw = fg.tensor(W, requires_grad=True), torch.tensor(W, requires_grad=True)
  opt, topt = fg.optim.SGD([w], lr=0.1, momentum=0.9), torch.optim.SGD([tw], lr=0.1, momentum=0.9)
  make = {"CyclicLR": lambda S, o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=3, mode="triangular2"),
          "CosineAnnealingWarmRestarts": lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2, eta_min=0.01)}
  sched, tsched = make[name](fg.optim.lr_scheduler, opt), make[name](torch.optim.lr_scheduler, topt)

  @fg.jit
  def step(x, y):
    opt.zero_grad()
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    opt.step()
    sched.step()
    return loss

  for i in range(9):
    X, Y = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    loss = step(fg.tensor(X), fg.tensor(Y))
    topt.zero_grad()
    tloss = ((torch.tensor(X) @ tw - torch.tensor(Y)) ** 2).mean()
    tloss.backward()
    topt.step()
    tsched.step()
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5, err_msg=f"step {i}")
    np.testing.assert_allclose(sched.get_last_lr(), tsched.get_last_lr(), rtol=1e-12, err_msg=f"step {i}")
    assert opt.param_groups[0]["momentum"] == pytest.approx(topt.param_groups[0]["momentum"], rel=1e-12)
  assert len(step._captures) == 1
  np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=2e-6)


def test_warm_restarts_epoch_inside_jit_is_refused():
  w = fg.zeros(2, requires_grad=True)
  opt = fg.optim.SGD([w], lr=0.1)
  sched = fg.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2)

  @fg.jit
  def step(x):
    opt.zero_grad()
    (w * x).sum().backward()
    opt.step()
    sched.step(1.5)

  with pytest.raises(RuntimeError, match="step\\(epoch\\) inside a jitted function"):
    for _ in range(3): step(fg.ones(2))


# ---- nn.utils ------------------------------------------------------------------------------------------------------

def _mlp(L):
  return L.Sequential(L.Linear(3, 4), L.Tanh(), L.Linear(4, 2, bias=False), L.Linear(2, 1))


def _same_weights(m, tm):
  for p, tp in zip(m.parameters(), tm.parameters()): p.data = fg.tensor(tp.detach().numpy())


def test_parameters_to_vector_and_back(rng):
  m, tm = _mlp(fnn), _mlp(torch.nn)
  _same_weights(m, tm)
  vec, tvec = fnn.utils.parameters_to_vector(m.parameters()), torch.nn.utils.parameters_to_vector(tm.parameters())
  np.testing.assert_array_equal(vec.numpy(), tvec.detach().numpy())
  c = rng.standard_normal(tvec.shape[0]).astype(np.float32)
  (vec * fg.tensor(c)).sum().backward(), (tvec * torch.tensor(c)).sum().backward()   # the gradient reaches each p
  for p, tp in zip(m.parameters(), tm.parameters()): np.testing.assert_array_equal(p.grad.numpy(), tp.grad.numpy())
  new = rng.standard_normal(tvec.shape[0]).astype(np.float32)
  params = list(m.parameters())
  fnn.utils.vector_to_parameters(fg.tensor(new), m.parameters())
  torch.nn.utils.vector_to_parameters(torch.tensor(new), tm.parameters())
  assert [id(p) for p in m.parameters()] == [id(p) for p in params]   # the same Parameters, new values
  for p, tp in zip(m.parameters(), tm.parameters()):
    assert tuple(p.shape) == tuple(tp.shape) and p.requires_grad
    np.testing.assert_array_equal(p.numpy(), tp.detach().numpy())
  x = rng.standard_normal((5, 3)).astype(np.float32)
  np.testing.assert_allclose(m(fg.tensor(x)).numpy(), tm(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
  with pytest.raises(TypeError, match="expected torch.Tensor, but got: list"):
    fnn.utils.vector_to_parameters([1.0], m.parameters())


# ---- containers ----------------------------------------------------------------------------------------------------

def _structure(m):
  return ([(k, type(v).__name__) for k, v in m._modules.items()], list(m.state_dict()),
          [tuple(v.shape) for v in m.state_dict().values()])


def _both(fn):
  """fn(L) for both libraries: the same structure (keys, module types, state-dict keys and shapes)."""
  a, b = fn(fnn), fn(torch.nn)
  if isinstance(b, torch.nn.Module):
    assert _structure(a) == _structure(b)
  else:
    assert a == b
  return a, b


def _seq(L):
  return L.Sequential(L.Linear(2, 3), L.ReLU(), L.Linear(3, 4), L.Tanh(), L.Linear(4, 5))


def test_sequential_operations_match_torch():
  def insert(L):
    s = _seq(L)
    assert s.insert(1, L.Linear(3, 3)) is s
    s.insert(-1, L.Sigmoid())
    return s.insert(len(s), L.Linear(5, 6))
  _both(insert)
  _both(lambda L: _seq(L).extend([L.Linear(5, 2), L.ReLU()]).append(L.Linear(2, 7)))

  def setitem(L):
    s = _seq(L)
    s[0] = L.Linear(2, 9)
    s[-1] = L.Linear(4, 8)
    return s
  _both(setitem)

  def delitem(L):
    s = _seq(L)
    del s[1]
    del s[-1]
    return s
  _both(delitem)

  def delslice(L):
    s = _seq(L)
    del s[1:4:2]
    return s
  _both(delslice)

  def pop(L):
    s = _seq(L)
    a, b = s.pop(0), s.pop(-1)
    assert isinstance(a, L.Linear) and a.out_features == 3 and b.out_features == 5
    return s
  _both(pop)
  _both(lambda L: _seq(L) + L.Sequential(L.Linear(5, 1)))

  def iadd(L):
    s = _seq(L)
    s += L.Sequential(L.Linear(5, 1), L.ReLU())
    return s
  _both(iadd)
  _both(lambda L: _seq(L) * 2)
  _both(lambda L: 2 * L.Sequential(L.Linear(2, 2)))

  def imul(L):
    s = L.Sequential(L.Linear(2, 2), L.ReLU())
    s *= 3
    return s
  _both(imul)
  _both(lambda L: _seq(L)[1:4])

  def named(L):
    s = L.Sequential(OrderedDict([("fc", L.Linear(2, 3)), ("act", L.ReLU()), ("out", L.Linear(3, 1))]))
    del s[1]   # renumbered, as torch's
    return s
  _both(named)
  s = _seq(fnn)
  shared = s[0]
  s2 = s + s
  assert s2[0] is shared and s2[5] is shared and len(s2) == 10 and len(list(s2.parameters())) == 6
  assert "0" not in dir(s)


def test_sequential_errors_match_torch():
  for L in (fnn, torch.nn):
    s = _seq(L)
    with pytest.raises(IndexError, match="index 5 is out of range"): s[5]
    with pytest.raises(IndexError, match="index -6 is out of range"): s[-6] = L.ReLU()
    with pytest.raises(IndexError, match="Index out of range: 7"): s.insert(7, L.ReLU())
    with pytest.raises(AssertionError, match="module should be of type"): s.insert(0, 3)
    with pytest.raises(ValueError, match="add operator supports only objects of Sequential class"): s + L.ReLU()
    with pytest.raises(ValueError, match="add operator supports only objects of Sequential class"): s += [L.ReLU()]
    with pytest.raises(TypeError, match="unsupported operand type"): s * 1.5
    with pytest.raises(ValueError, match="Non-positive multiplication factor 0"): s * 0
    with pytest.raises(IndexError): s.pop(9)


def _ml(L):
  return L.ModuleList([L.Linear(1, 2), L.Linear(2, 3), L.ReLU(), L.Linear(3, 4)])


def test_module_list_operations_match_torch():
  def pop(L):
    ml = _ml(L)
    assert ml.pop(1).out_features == 3
    assert ml.pop(-1).out_features == 4
    return ml
  _both(pop)

  def delete(L):
    ml = _ml(L)
    del ml[0]
    del ml[::2]
    return ml
  _both(delete)
  _both(lambda L: _ml(L) + L.ModuleList([L.Linear(4, 5)]))
  _both(lambda L: _ml(L) + [L.Linear(4, 6), L.Tanh()])

  def iadd(L):
    ml = _ml(L)
    ml += [L.Linear(4, 5)]
    return ml
  _both(iadd)

  def insert(L):
    ml = _ml(L)
    ml.insert(1, L.Linear(7, 7))
    ml.insert(len(ml), L.Linear(8, 8))
    ml.insert(0, L.Tanh())
    return ml
  _both(insert)
  _both(lambda L: _ml(L).extend((L.Linear(4, 9), L.Linear(9, 9))))

  def setitem(L):
    ml = _ml(L)
    ml[-2] = L.Linear(5, 5)
    return ml
  _both(setitem)
  _both(lambda L: _ml(L)[1:])
  for L in (fnn, torch.nn):
    with pytest.raises(IndexError, match="index 4 is out of range"): _ml(L)[4]
    with pytest.raises(TypeError, match="ModuleList.extend should be called with an iterable, but got int"): _ml(L).extend(3)


def _md(L):
  return L.ModuleDict({"conv": L.Conv2d(1, 2, 3), "fc": L.Linear(3, 4), "act": L.ReLU()})


def test_module_dict_operations_match_torch():
  def update(L):
    md = _md(L)
    md.update({"fc": L.Linear(3, 8), "new": L.Linear(1, 1)})
    md.update([("pair", L.Linear(2, 2)), ["list", L.Tanh()]])
    md.update(L.ModuleDict({"from_md": L.Linear(6, 6)}))
    md.update(OrderedDict([("z", L.Linear(1, 3)), ("a", L.Linear(3, 1))]))
    return md
  _both(update)

  def pop(L):
    md = _md(L)
    assert md.pop("fc").out_features == 4
    del md["act"]
    return md
  _both(pop)

  def clear(L):
    md = _md(L)
    md.clear()
    md["x"] = L.Linear(1, 1)
    return md
  _both(clear)
  _both(lambda L: (list(_md(L).keys()), [type(v).__name__ for v in _md(L).values()],
                   [(k, type(v).__name__) for k, v in _md(L).items()], "fc" in _md(L), len(_md(L)), list(_md(L))))
  for L in (fnn, torch.nn):
    with pytest.raises(TypeError, match="ModuleDict.update should be called with an iterable of key/value pairs, but got int"):
      _md(L).update(3)
    with pytest.raises(ValueError, match="ModuleDict update sequence element #0 has length 3; 2 is required"):
      _md(L).update([("a", L.ReLU(), 1)])
    with pytest.raises(TypeError, match="ModuleDict update sequence element #1 should be Iterable"):
      _md(L).update([("a", L.ReLU()), 3])
    with pytest.raises(KeyError): _md(L).pop("missing")


def _net(L):
  class Block(L.Module):
    def __init__(self):
      super().__init__()
      self.lin = L.Linear(3, 3)
      self.bn = L.BatchNorm1d(3)
      self.register_buffer("scale", L.Parameter(lib_ones(L, 3), requires_grad=False).data * 2)
      self.plain = 5
  class Net(L.Module):
    def __init__(self):
      super().__init__()
      self.blocks = L.ModuleList([Block(), Block()])
      self.head = L.Sequential(OrderedDict([("fc", L.Linear(3, 1))]))
      self.gain = L.Parameter(lib_ones(L, 1))
  return Net()


def lib_ones(L, n):
  return fg.ones(n) if L is fnn else torch.ones(n)


def test_get_submodule_parameter_buffer_match_torch():
  net, tnet = _net(fnn), _net(torch.nn)
  for target in ("", "blocks", "blocks.1", "blocks.0.bn", "head.fc"):
    assert type(net.get_submodule(target)).__name__ == type(tnet.get_submodule(target)).__name__
  assert net.get_submodule("blocks.1.lin") is net.blocks[1].lin
  for target in ("gain", "blocks.0.lin.weight", "head.fc.bias"):
    p, tp = net.get_parameter(target), tnet.get_parameter(target)
    assert isinstance(p, fnn.Parameter) and tuple(p.shape) == tuple(tp.shape)
  assert net.get_parameter("head.fc.weight") is net.head.fc.weight
  for target in ("blocks.0.scale", "blocks.1.bn.running_mean", "blocks.0.bn.num_batches_tracked"):
    assert tuple(net.get_buffer(target).shape) == tuple(tnet.get_buffer(target).shape)
  assert net.get_buffer("blocks.1.bn.running_var") is net.blocks[1].bn.running_var
  bad = [("get_submodule", "blocks.2"), ("get_submodule", "blocks.0.nope"), ("get_submodule", "gain"),
         ("get_submodule", "blocks.0.plain"), ("get_parameter", "blocks.0.scale"), ("get_parameter", "blocks.0.nope"),
         ("get_parameter", "blocks.0.lin"), ("get_buffer", "gain"), ("get_buffer", "blocks.0.plain"),
         ("get_buffer", "head.fc.missing"), ("get_buffer", "nothere.x")]
  for fn, target in bad:
    with pytest.raises(AttributeError) as e: getattr(net, fn)(target)
    with pytest.raises(AttributeError) as te: getattr(tnet, fn)(target)
    assert str(e.value) == str(te.value), (fn, target)
