"""fusegrad.nn.Module's API against torch.nn.Module's, and the initialisers of fusegrad.nn.init.

Architectures are written once for both libraries (`L` is `fusegrad.nn` or `torch.nn`) and their names,
orders, state-dict keys and shapes compared with torch's. The initialisers are checked statistically on
large tensors (fresh random draws every run; the bounds are several standard errors wide).
"""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn as fnn
from fusegrad.nn import init


def _libs():
  return ((fnn, fg), (torch.nn, torch))


# ---- architectures written for both libraries ----------------------------------------------------------------

def small_cnn(L):
  return L.Sequential(L.Conv2d(3, 8, 3, padding=1), L.BatchNorm2d(8), L.ReLU(), L.MaxPool2d(2),
                      L.Conv2d(8, 4, 3, bias=False), L.GroupNorm(2, 4), L.Flatten(), L.Linear(4 * 2 * 2, 10))


def make_net(L):
  """assignment order mixes parameters, buffers and modules; one module and one parameter are shared"""
  class Net(L.Module):
    def __init__(self):
      super().__init__()
      self.embed = L.Embedding(11, 8, padding_idx=0)
      self.scale = L.Parameter(L.init.ones_(torch.empty(8)) if L is torch.nn else fg.ones(8))
      self.register_buffer("steps", torch.zeros(3) if L is torch.nn else fg.zeros(3))
      self.register_buffer("scratch", torch.zeros(2) if L is torch.nn else fg.zeros(2), persistent=False)
      self.attn = L.MultiheadAttention(8, 2, batch_first=True)
      self.cross = L.MultiheadAttention(8, 2, kdim=6, vdim=5)
      self.blocks = L.ModuleList([L.Sequential(L.LayerNorm(8), L.Linear(8, 8)) for _ in range(2)])
      self.heads = L.ModuleDict({"cls": L.Linear(8, 3), "reg": L.Linear(8, 1, bias=False)})
      self.tied = self.heads["cls"]                      # the same module under two names
      self.norm = L.RMSNorm(8)
      self.bn = L.BatchNorm1d(8, momentum=None)
      self.up = L.ConvTranspose1d(8, 4, 3, stride=2)
    def forward(self, x):
      return x
  return Net()


def named(it) -> list: return [(k, tuple(v.shape)) for k, v in it]


@pytest.mark.parametrize("build", [small_cnn, make_net])
def test_names_orders_and_state_dict_keys(build):
  ours, theirs = build(fnn), build(torch.nn)
  assert named(ours.named_parameters()) == named(theirs.named_parameters())
  assert named(ours.named_buffers()) == named(theirs.named_buffers())
  assert [k for k, _ in ours.named_modules()] == [k for k, _ in theirs.named_modules()]
  assert [k for k, _ in ours.named_children()] == [k for k, _ in theirs.named_children()]
  assert named(ours.state_dict().items()) == named(theirs.state_dict().items())
  assert len(list(ours.parameters())) == len(list(theirs.parameters()))
  assert len(list(ours.modules())) == len(list(theirs.modules()))
  for (k, v), (_, tv) in zip(ours.state_dict().items(), theirs.state_dict().items()):
    assert v.dtype.name == str(tv.dtype).removeprefix("torch."), k
  # our weights load into torch's module, and back
  theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
  sd = {k: fg.tensor(v.numpy() + 1) if v.is_floating_point() else fg.tensor(v.numpy())
        for k, v in theirs.state_dict().items()}
  ours.load_state_dict(sd)
  for k, v in ours.state_dict().items(): np.testing.assert_array_equal(v.numpy(), sd[k].numpy(), err_msg=k)


def test_shared_parameters_are_deduplicated():
  for L, lib in _libs():
    m = L.Module()
    m.a = L.Linear(3, 3)
    m.b = m.a
    m.c = L.Linear(3, 3)
    m.c.weight = m.a.weight
    names = [k for k, _ in m.named_parameters()]
    assert names == ["a.weight", "a.bias", "c.bias"], (L, names)
    assert [k for k, _ in m.named_modules()] == ["", "a", "c"]
    assert list(m.state_dict()) == ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"]
    assert len(list(m.named_parameters(remove_duplicate=False))) == 6


def test_registration_rules():
  m = fnn.Module()
  m.w = fnn.Parameter(fg.ones(2))
  m.lin = fnn.Linear(2, 2)
  m.register_buffer("b", fg.zeros(2))
  m.plain = fg.zeros(3)                    # a plain tensor attribute is not registered
  assert [k for k, _ in m.named_parameters()] == ["w", "lin.weight", "lin.bias"]
  assert list(m.state_dict()) == ["w", "b", "lin.weight", "lin.bias"]
  assert "plain" not in m.state_dict() and isinstance(m.plain, fg.Tensor)
  m.w = None                               # a parameter slot can be emptied
  assert [k for k, _ in m.named_parameters()] == ["lin.weight", "lin.bias"]
  m.lin = fnn.ReLU()                       # reassigning a module keeps its slot
  del m.b
  assert list(m.state_dict()) == [] and "b" not in dict(m.named_buffers())
  assert "lin" in dir(m)
  with pytest.raises(AttributeError): m.missing
  for L, lib in _libs():
    m = L.Module()
    m.w = L.Parameter(lib.ones(2))
    with pytest.raises(TypeError): m.w = lib.zeros(2)           # a tensor over a parameter
    with pytest.raises(KeyError): m.register_parameter("a.b", None)
    with pytest.raises(KeyError): m.register_buffer("a.b", None)
    with pytest.raises(TypeError): m.register_buffer("x", 3)
    with pytest.raises(TypeError): m.add_module("x", 3)
    with pytest.raises(NotImplementedError): m(lib.zeros(2))   # no forward

    class Early(L.Module):
      def __init__(self):
        self.w = L.Parameter(lib.ones(2))
        super().__init__()
    with pytest.raises(AttributeError): Early()


def test_parameter():
  p = fnn.Parameter(fg.ones(2, 3))
  assert isinstance(p, fg.Tensor) and p.requires_grad and p.is_leaf and p.shape == (2, 3)
  assert not fnn.Parameter(fg.ones(2), requires_grad=False).requires_grad
  assert repr(p).startswith("Parameter containing:")
  # a parameter made from a non-leaf is a leaf
  x = fg.ones(2, requires_grad=True)
  q = fnn.Parameter(x * 2)
  assert q.is_leaf and q.requires_grad
  np.testing.assert_array_equal(q.numpy(), [2, 2])


# ---- load_state_dict ------------------------------------------------------------------------------------------

def _snapshot(m) -> dict: return {k: v.numpy().copy() for k, v in m.state_dict().items()}


def _same(m, snap) -> None:
  now = _snapshot(m)
  assert list(now) == list(snap)
  for k in snap: np.testing.assert_array_equal(now[k], snap[k], err_msg=k)


def _fresh_sd(m, rng) -> dict:
  return {k: fg.tensor(rng.standard_normal(v.shape).astype(np.float32)) if v.dtype.is_float
          else fg.tensor(v.numpy() + 3) for k, v in m.state_dict().items()}


def test_load_state_dict_strict_errors(rng):
  m = small_cnn(fnn)
  t = small_cnn(torch.nn)
  snap = _snapshot(m)
  good = _fresh_sd(m, rng)
  tgood = {k: torch.tensor(v.numpy()) for k, v in good.items()}

  def both_fail(mutate, *needles):
    sd, tsd = mutate(dict(good)), mutate(dict(tgood))
    with pytest.raises(RuntimeError) as want:
      t.load_state_dict(tsd)
    with pytest.raises(RuntimeError) as got:
      m.load_state_dict(sd)
    for n in needles:
      assert n in str(got.value), (n, str(got.value))
      assert n in str(want.value), (n, str(want.value))
    _same(m, snap)                       # nothing changed: not even the keys that were fine

  def missing(sd):
    del sd["1.running_var"]
    return sd
  both_fail(missing, "Missing key(s)", '"1.running_var"')

  def unexpected(sd):
    sd["1.extra"] = sd["1.weight"]
    return sd
  both_fail(unexpected, "Unexpected key(s)", '"1.extra"')

  def shape(sd):
    sd["7.weight"] = sd["7.weight"][:, :8]
    return sd
  both_fail(shape, "size mismatch for 7.weight", "[10, 8]", "[10, 16]")

  def several(sd):
    sd = missing(unexpected(sd))
    sd["0.bias"] = sd["0.bias"][:4]
    return sd
  both_fail(several, '"1.running_var"', '"1.extra"', "size mismatch for 0.bias")

  # strict=False: the same lists as torch, the rest loaded
  sd = unexpected(missing(dict(good)))
  res = m.load_state_dict(sd, strict=False)
  tres = t.load_state_dict(unexpected(missing(dict(tgood))), strict=False)
  assert list(res.missing_keys) == list(tres.missing_keys) == ["1.running_var"]
  assert list(res.unexpected_keys) == list(tres.unexpected_keys) == ["1.extra"]
  np.testing.assert_array_equal(m.state_dict()["0.weight"].numpy(), good["0.weight"].numpy())
  np.testing.assert_array_equal(m.state_dict()["1.running_var"].numpy(), snap["1.running_var"])
  # a shape mismatch is an error even when not strict
  with pytest.raises(RuntimeError, match="size mismatch"):
    m.load_state_dict(shape(dict(good)), strict=False)
  res = m.load_state_dict(good)
  assert list(res.missing_keys) == [] and list(res.unexpected_keys) == []


def test_load_state_dict_keeps_identity_and_device(rng):
  """optimizers hold the parameter objects: loading changes their values, not the objects"""
  m = small_cnn(fnn).to("PYTHON")
  before = {k: id(v) for k, v in m.named_parameters()}
  m.load_state_dict(_fresh_sd(m, rng))             # CPU tensors into PYTHON parameters
  assert {k: id(v) for k, v in m.named_parameters()} == before
  assert all(p.device == "PYTHON" and p.requires_grad for p in m.parameters())
  assert all(b.device == "PYTHON" for b in m.buffers())
  assert m.state_dict()["1.num_batches_tracked"].dtype == fg.int64


def test_training_steps_match_torch(rng):
  """a small CNN trained a few steps with SGD (momentum, weight decay) in both libraries: same weights"""
  ours, theirs = small_cnn(fnn), small_cnn(torch.nn)
  theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
  theirs.double()
  opt = fg.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
  topt = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
  for _ in range(3):
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=4)
    opt.zero_grad(); topt.zero_grad()
    fnn.functional.cross_entropy(ours(fg.tensor(x)), fg.tensor(y)).backward()
    torch.nn.functional.cross_entropy(theirs(torch.tensor(x, dtype=torch.float64)), torch.tensor(y)).backward()
    opt.step(); topt.step()
  tsd = theirs.state_dict()
  for k, v in ours.state_dict().items():
    np.testing.assert_allclose(v.numpy(), tsd[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


# ---- modes, dtypes, gradients, printing ------------------------------------------------------------------------------

def test_train_eval_propagate():
  m = make_net(fnn)
  assert all(s.training for s in m.modules())
  assert m.eval() is m and not any(s.training for s in m.modules())
  m.blocks[1].train()
  assert m.blocks[1][0].training and not m.blocks[0][0].training and not m.training
  assert m.train() is m and all(s.training for s in m.modules())
  for L in (fnn, torch.nn):
    with pytest.raises(ValueError): L.Linear(2, 2).train("yes")


def test_to_dtype_casts_floating_state(rng):
  m = small_cnn(fnn)
  ids = {k: id(v) for k, v in m.named_parameters()}
  x = fg.tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
  m(x).sum().backward()
  assert m.to(fg.float64) is m
  assert {k: id(v) for k, v in m.named_parameters()} == ids
  for k, v in m.state_dict().items():
    assert v.dtype == (fg.int64 if k.endswith("num_batches_tracked") else fg.float64), k
  assert all(p.grad.dtype == fg.float64 for p in m.parameters())
  assert m(x.double()).dtype == fg.float64
  m.float()
  assert all(p.dtype == fg.float32 for p in m.parameters()) and m[1].num_batches_tracked.dtype == fg.int64
  m.half()
  assert all(p.dtype == fg.float16 for p in m.parameters())
  for L, lib in _libs():
    with pytest.raises(TypeError): L.Linear(2, 2).to(lib.int32)


def test_zero_grad_and_requires_grad(rng):
  m = small_cnn(fnn)
  x = fg.tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
  m(x).sum().backward()
  assert all(p.grad is not None for p in m.parameters())
  m.zero_grad(set_to_none=False)
  assert all(p.grad is not None and not np.any(p.grad.numpy()) for p in m.parameters())
  m.zero_grad()
  assert all(p.grad is None for p in m.parameters())
  # gradients accumulate across backward calls, like torch
  m(x).sum().backward()
  g1 = m[7].bias.grad.numpy().copy()
  m(x).sum().backward()
  np.testing.assert_allclose(m[7].bias.grad.numpy(), 2 * g1, rtol=1e-6)
  m.zero_grad()
  assert m.requires_grad_(False) is m
  assert not any(p.requires_grad for p in m.parameters())
  xg = fg.tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32), requires_grad=True)
  m(xg).sum().backward()
  assert xg.grad is not None and all(p.grad is None for p in m.parameters())
  m[0].requires_grad_()
  assert m[0].weight.requires_grad and not m[7].weight.requires_grad


def test_repr_matches_torch():
  build = lambda L: L.Sequential(
    L.Conv2d(3, 4, 3, stride=2, padding=1, bias=False), L.BatchNorm2d(4), L.ReLU(), L.MaxPool2d(2), L.AvgPool2d(3),
    L.AdaptiveAvgPool2d((1, 1)), L.Flatten(), L.Linear(4, 2), L.Dropout(0.1), L.LeakyReLU(0.2), L.GELU("tanh"),
    L.LayerNorm(2, bias=False), L.Embedding(10, 3, padding_idx=0), L.GroupNorm(2, 4), L.Softmax(dim=1), L.ELU(),
    L.ConvTranspose2d(4, 2, 3, stride=2, output_padding=1), L.Unflatten(1, (2, 2)), L.RMSNorm(4),
    L.Conv1d(2, 2, 3, padding="same", padding_mode="reflect"), L.ModuleList([L.Tanh(), L.Identity()]),
    L.ModuleDict({"a": L.Hardtanh(-2.0, 2.0), "b": L.Softplus(beta=2.0)}), L.BatchNorm1d(3, affine=False))
  assert repr(build(fnn)) == repr(build(torch.nn))
  m = fnn.MultiheadAttention(8, 2)
  assert repr(m).startswith("MultiheadAttention(") and "(out_proj): Linear(in_features=8, out_features=8" in repr(m)


# ---- containers -------------------------------------------------------------------------------------------------

def test_sequential_api():
  for L in (fnn, torch.nn):
    a, b, c = L.ReLU(), L.Tanh(), L.Sigmoid()
    s = L.Sequential(a, b)
    assert len(s) == 2 and s[0] is a and s[-1] is b and list(s) == [a, b]
    assert s.append(c) is s and len(s) == 3 and s[2] is c
    sl = s[1:]
    assert isinstance(sl, L.Sequential) and list(sl) == [b, c]
    with pytest.raises(IndexError): s[3]
    with pytest.raises(IndexError): s[-4]
    from collections import OrderedDict
    named = L.Sequential(OrderedDict([("first", a), ("second", b)]))
    assert [k for k, _ in named.named_children()] == ["first", "second"] and named.first is a


def test_modulelist_moduledict_api():
  for L in (fnn, torch.nn):
    a, b, c, d = L.Linear(1, 1), L.Linear(1, 2), L.Linear(1, 3), L.Linear(1, 4)
    ml = L.ModuleList([a, b])
    ml.append(c)
    ml.extend([d])
    assert len(ml) == 4 and ml[-1] is d and list(ml) == [a, b, c, d]
    ml.insert(1, L.ReLU())
    assert isinstance(ml[1], L.ReLU) and ml[2] is b and [k for k, _ in ml.named_children()] == list("01234")
    ml[0] = L.Tanh()
    assert isinstance(ml[0], L.Tanh) and [k for k, _ in ml.named_parameters()][:2] == ["2.weight", "2.bias"]
    assert isinstance(ml[1:3], L.ModuleList) and len(ml[1:3]) == 2
    with pytest.raises(IndexError): ml[5]
    md = L.ModuleDict({"x": a, "y": b})
    md["z"] = c
    assert list(md.keys()) == ["x", "y", "z"] and "y" in md and "w" not in md and md["z"] is c
    assert [k for k, _ in md.items()] == ["x", "y", "z"] and list(md) == ["x", "y", "z"] and len(md) == 3
    assert [k for k, _ in md.named_parameters()] == ["x.weight", "x.bias", "y.weight", "y.bias", "z.weight", "z.bias"]
    with pytest.raises(KeyError): md["w"]


def test_apply_and_children():
  order = []
  m = small_cnn(fnn)
  assert m.apply(lambda mod: order.append(type(mod).__name__)) is m
  torder = []
  small_cnn(torch.nn).apply(lambda mod: torder.append(type(mod).__name__))
  assert order == torder
  assert [type(c).__name__ for c in m.children()] == [type(c).__name__ for c in small_cnn(torch.nn).children()]


# ---- nn.init ------------------------------------------------------------------------------------------------------

def _stats(t: fg.Tensor):
  a = t.numpy().astype(np.float64)
  return a, a.mean(), a.std()


SHAPE = (256, 128, 3)        # fan_in 384, fan_out 768; ~98k values
FAN_IN, FAN_OUT = 128 * 3, 256 * 3


def _check_uniform(t, bound):
  a, mean, std = _stats(t)
  n = a.size
  assert a.min() >= -bound and a.max() <= bound
  assert a.max() > 0.99 * bound and a.min() < -0.99 * bound
  assert abs(mean) < 5 * bound / math.sqrt(3 * n)
  assert abs(std - bound / math.sqrt(3)) < 0.02 * bound


def _check_normal(t, mean_want, std_want):
  a, mean, std = _stats(t)
  assert abs(mean - mean_want) < 5 * std_want / math.sqrt(a.size)
  assert abs(std / std_want - 1) < 0.02
  assert abs(a.max() - mean_want) > 3.5 * std_want     # tails exist (not a uniform)


@pytest.mark.parametrize("kw", [{}, {"a": 0.1}, {"mode": "fan_out", "nonlinearity": "relu"},
                                {"a": math.sqrt(5)}, {"nonlinearity": "tanh"}])
def test_kaiming(kw):
  gain = torch.nn.init.calculate_gain(kw.get("nonlinearity", "leaky_relu"), kw.get("a", 0))
  fan = FAN_OUT if kw.get("mode") == "fan_out" else FAN_IN
  t = fg.zeros(*SHAPE)
  assert init.kaiming_uniform_(t, **kw) is t and t.shape == SHAPE and t.dtype == fg.float32
  _check_uniform(t, gain * math.sqrt(3.0 / fan))
  assert init.kaiming_normal_(t, **kw) is t
  _check_normal(t, 0.0, gain / math.sqrt(fan))


@pytest.mark.parametrize("gain", [1.0, 2.5])
def test_xavier(gain):
  t = fg.zeros(*SHAPE)
  assert init.xavier_uniform_(t, gain=gain) is t
  _check_uniform(t, gain * math.sqrt(6.0 / (FAN_IN + FAN_OUT)))
  assert init.xavier_normal_(t, gain=gain) is t
  _check_normal(t, 0.0, gain * math.sqrt(2.0 / (FAN_IN + FAN_OUT)))


def test_uniform_normal():
  t = fg.zeros(300, 400)
  assert init.uniform_(t, -0.5, 1.5) is t
  a, mean, std = _stats(t)
  assert a.min() >= -0.5 and a.max() <= 1.5 and abs(mean - 0.5) < 0.01 and abs(std - 2 / math.sqrt(12)) < 0.01
  assert init.normal_(t, 3.0, 0.5) is t
  _check_normal(t, 3.0, 0.5)


def _truncnorm_moments(mean, std, a, b):
  al, be = (a - mean) / std, (b - mean) / std
  pdf = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
  cdf = lambda x: (1 + math.erf(x / math.sqrt(2))) / 2
  z = cdf(be) - cdf(al)
  m = mean + std * (pdf(al) - pdf(be)) / z
  var = std ** 2 * (1 + (al * pdf(al) - be * pdf(be)) / z - ((pdf(al) - pdf(be)) / z) ** 2)
  return m, math.sqrt(var)


@pytest.mark.parametrize("mean,std,a,b", [(0.0, 1.0, -2.0, 2.0), (0.5, 2.0, -1.0, 4.0), (0.0, 0.02, -0.04, 0.04),
                                          (1.0, 1.0, 1.5, 3.0)])
def test_trunc_normal(mean, std, a, b):
  t = fg.zeros(400, 250)
  assert init.trunc_normal_(t, mean, std, a, b) is t
  v, m, s = _stats(t)
  assert v.min() >= a and v.max() <= b
  assert v.min() < a + 0.02 * (b - a) and v.max() > b - 0.02 * (b - a)
  want_m, want_s = _truncnorm_moments(mean, std, a, b)
  assert abs(m - want_m) < 5 * want_s / math.sqrt(v.size), (m, want_m)
  assert abs(s / want_s - 1) < 0.02, (s, want_s)
  # the shape of the distribution: its quartiles match torch's draw of the same law
  tt = torch.nn.init.trunc_normal_(torch.empty(400, 250, dtype=torch.float64), mean, std, a, b).numpy()
  for q in (0.1, 0.25, 0.5, 0.75, 0.9):
    assert abs(np.quantile(v, q) - np.quantile(tt, q)) < 0.02 * (b - a), q


def test_constant_inits():
  for shape in [(3, 5), (5, 3), (4, 4)]:
    t = fnn.Parameter(fg.zeros(*shape))
    assert init.eye_(t) is t and t.requires_grad and isinstance(t, fnn.Parameter)
    np.testing.assert_array_equal(t.numpy(), torch.nn.init.eye_(torch.empty(shape)).numpy())
  t = fg.zeros(2, 3, 4)
  assert init.ones_(t) is t and np.all(t.numpy() == 1)
  assert init.zeros_(t) is t and np.all(t.numpy() == 0)
  assert init.constant_(t, 2.5) is t and np.all(t.numpy() == 2.5) and t.shape == (2, 3, 4)
  for L in (init, torch.nn.init):
    with pytest.raises(ValueError): L.eye_(fg.zeros(2, 2, 2) if L is init else torch.zeros(2, 2, 2))


def test_init_in_place_keeps_parameters():
  """an initialiser runs under no_grad on a leaf that requires grad, and keeps it a leaf Parameter"""
  m = fnn.Linear(4, 3)
  w = m.weight
  for fn in (init.kaiming_uniform_, init.xavier_normal_, init.trunc_normal_, init.zeros_, init.eye_):
    assert fn(m.weight) is w
    assert m.weight is w and w.is_leaf and w.requires_grad and isinstance(w, fnn.Parameter)
  m(fg.ones(2, 4)).sum().backward()
  assert w.grad is not None and w.grad.shape == (3, 4)


def test_init_seeded():
  t1, t2 = fg.zeros(50, 20), fg.zeros(50, 20)
  fg.manual_seed(7); init.kaiming_uniform_(t1)
  fg.manual_seed(7); init.kaiming_uniform_(t2)
  np.testing.assert_array_equal(t1.numpy(), t2.numpy())
  fg.manual_seed(8); init.kaiming_uniform_(t2)
  assert not np.array_equal(t1.numpy(), t2.numpy())


def test_calculate_gain():
  for nl in ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
             "sigmoid", "tanh", "relu", "leaky_relu", "selu"):
    assert init.calculate_gain(nl) == pytest.approx(torch.nn.init.calculate_gain(nl), rel=1e-12), nl
  for p in (0.2, 1, 0.0):
    assert init.calculate_gain("leaky_relu", p) == pytest.approx(torch.nn.init.calculate_gain("leaky_relu", p))
  for L in (init, torch.nn.init):
    with pytest.raises(ValueError): L.calculate_gain("swish")
    with pytest.raises(ValueError): L.calculate_gain("leaky_relu", "x")


def test_fan_errors():
  for L, lib in ((init, fg), (torch.nn.init, torch)):
    with pytest.raises(ValueError): L.xavier_uniform_(lib.zeros(5))
    with pytest.raises(ValueError): L.kaiming_normal_(lib.zeros(5))
    with pytest.raises(ValueError): L.kaiming_uniform_(lib.zeros(3, 4), mode="fan_avg")


@pytest.mark.parametrize("build,fan_in", [
  (lambda L: L.Linear(300, 200), 300),
  (lambda L: L.Conv2d(16, 32, 3), 16 * 9),
  (lambda L: L.Conv1d(12, 60, 5, groups=3), 4 * 5),
  (lambda L: L.ConvTranspose2d(20, 40, 3, groups=2), 20 * 9),     # torch's fan_in of the [in, out/g, k, k] weight
])
def test_default_init_ranges(build, fan_in):
  m = build(fnn)
  bound = 1 / math.sqrt(fan_in)
  _check_uniform(m.weight, bound)     # kaiming_uniform(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  b = m.bias.numpy()
  assert b.min() >= -bound and b.max() <= bound and b.std() > 0.3 * bound
  # torch's layer: the same law (its weights' bound)
  tw = build(torch.nn).weight.detach().numpy()
  assert abs(np.abs(tw).max() - np.abs(m.weight.numpy()).max()) < 0.01 * bound


def test_default_init_other_layers():
  mha = fnn.MultiheadAttention(64, 4)
  _check_uniform(mha.in_proj_weight, math.sqrt(6.0 / (64 + 192)))
  assert not np.any(mha.in_proj_bias.numpy()) and not np.any(mha.out_proj.bias.numpy())
  emb = fnn.Embedding(400, 250)
  _check_normal(emb.weight, 0.0, 1.0)
  bn = fnn.BatchNorm2d(5)
  for k, want in (("weight", 1), ("bias", 0), ("running_mean", 0), ("running_var", 1), ("num_batches_tracked", 0)):
    assert np.all(bn.state_dict()[k].numpy() == want), k
  for m in (fnn.LayerNorm(6), fnn.GroupNorm(2, 6), fnn.RMSNorm(6)):
    assert np.all(m.weight.numpy() == 1)
  # two layers get different weights
  assert not np.array_equal(fnn.Linear(8, 8).weight.numpy(), fnn.Linear(8, 8).weight.numpy())
