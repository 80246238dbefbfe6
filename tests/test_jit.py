"""fusegrad.jit: a captured step replays the same kernels and gives what the eager step gives — parameters,
optimizer state, returned values, random numbers, running statistics — against eager fusegrad and PyTorch."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from test_optim import CASES, assert_on_torch_trajectory
from conftest import DEVICES


def _mlp(seed: int, device: str = "CPU", dropout: float = 0.0, bn: bool = False):
  fg.manual_seed(seed)
  layers = [nn.Linear(12, 16), nn.BatchNorm1d(16) if bn else nn.Identity(), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(16, 5)]
  return nn.Sequential(*layers).to(device)


def _batches(rng, n: int, rows: int = 8, device: str = "CPU"):
  return [(fg.tensor(rng.standard_normal((rows, 12)).astype(np.float32), device=device),
           fg.tensor(rng.integers(0, 5, rows), device=device)) for _ in range(n)]


def _train_step(model, opt):
  def step(x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss
  return step


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_optimizer_replays_torchs_trajectory(device, rng, case):
  """The replays give, bit for bit, what the same optimizer gives eagerly, and both follow torch's trajectory: in
  float64 torch's, within float32 torch's own distance from it (adaptive steps divide a gradient's rounding by
  sqrt(v), so two float32 trajectories part by more than an ulp: see test_optim.test_trajectory_matches_torch)."""
  W, b = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
  spec = CASES[case]
  params = [[fg.tensor(a, device=device, requires_grad=True) for a in (W, b)] for _ in range(2)]
  (w, bb), (ew, eb) = params
  opt, eopt = (getattr(fg.optim, spec["cls"])(p, **spec["kw"]) for p in params)
  tparams = [[torch.tensor(a.astype(T), requires_grad=True) for a in (W, b)] for T in (np.float32, np.float64)]
  topts = [getattr(torch.optim, spec["cls"])(p, **spec["kw"]) for p in tparams]

  def step_of(o, pw, pb):
    def step(x, y):
      o.zero_grad()
      loss = ((x @ pw + pb - y) ** 2).mean()
      loss.backward()
      o.step()
      return loss
    return step
  step, eager = fg.jit(step_of(opt, w, bb)), step_of(eopt, ew, eb)

  for i in range(12):   # fresh data each step: the replays must read this call's arguments
    X, Y = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    loss = step(fg.tensor(X, device=device), fg.tensor(Y, device=device))
    assert loss.item() == eager(fg.tensor(X, device=device), fg.tensor(Y, device=device)).item(), f"step {i}"
    tloss = [step_of(o, *p)(torch.tensor(X, dtype=p[0].dtype), torch.tensor(Y, dtype=p[0].dtype))
             for o, p in zip(topts, tparams)]
    np.testing.assert_allclose(loss.item(), tloss[1].item(), rtol=1e-5, err_msg=f"step {i}")
  np.testing.assert_array_equal(w.numpy(), ew.numpy())
  np.testing.assert_array_equal(bb.numpy(), eb.numpy())
  for ours, theirs, exact in zip((w, bb), *tparams): assert_on_torch_trajectory(ours, theirs, exact, spec.get("atol"))
  for k, v in topts[0].state_dict()["state"].get(0, {}).items():
    if v is None: continue
    ours, theirs = opt.state_dict()["state"][0][k], eopt.state_dict()["state"][0][k]
    if isinstance(ours, fg.Tensor): ours, theirs = ours.numpy(), theirs.numpy()
    np.testing.assert_array_equal(ours, theirs, err_msg=k)
    assert_on_torch_trajectory(ours, v, topts[1].state_dict()["state"][0][k], spec.get("atol"), err_msg=k)


def test_replay_is_bit_identical_to_eager_and_launches_the_same_kernels(rng):
  data = _batches(rng, 6)
  m1, m2 = _mlp(1), _mlp(1)
  o1, o2 = fg.optim.Adam(m1.parameters(), lr=0.01), fg.optim.Adam(m2.parameters(), lr=0.01)
  eager, jitted = _train_step(m1, o1), fg.jit(_train_step(m2, o2))
  kept = []
  for i, (x, y) in enumerate(data):
    with fg.track() as te: le = eager(x, y).item()
    with fg.track() as tj: lj = jitted(x, y)
    kept.append(lj)
    assert lj.item() == le, f"step {i}"
    if i >= 2:   # replays: the eager step's kernels, nothing compiled
      assert [k.name for k in tj.kernels] == [k.name for k in te.kernels]
  # every returned loss is a value of its own (a later replay does not overwrite an earlier result)
  assert len({t.item() for t in kept}) == len(kept)
  for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
    np.testing.assert_array_equal(p1.numpy(), p2.numpy(), err_msg=n)


def test_a_value_read_before_a_replay_keeps_its_value(rng):
  model = _mlp(2)
  opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  step = fg.jit(_train_step(model, opt))
  data = _batches(rng, 6)
  for x, y in data[:3]: step(x, y)
  w = model[0].weight
  held = w.detach()                    # shares the parameter's storage: it follows the updates, as in torch
  lazy = w * 2                         # an unrealized graph that reads the current value
  before = w.numpy().copy()
  for x, y in data[3:]: step(x, y)     # two replays: the parameter alternates between two buffers
  assert not np.array_equal(w.numpy(), before)
  np.testing.assert_array_equal(held.numpy(), w.numpy())
  np.testing.assert_array_equal(lazy.numpy(), before * 2)


def test_dropout_draws_new_masks_like_eager():
  rng = np.random.default_rng(0)
  data = _batches(rng, 6, rows=32)
  results = []
  for use_jit in (False, True):
    model = _mlp(3, dropout=0.5)
    opt = fg.optim.SGD(model.parameters(), lr=0.05)
    step = _train_step(model, opt)
    step = fg.jit(step) if use_jit else step
    fg.manual_seed(123)
    results.append([step(x, y).item() for x, y in data])
  assert results[0] == results[1]
  assert len(set(results[1])) == len(results[1])


def test_batchnorm_running_statistics_follow_eager(rng):
  data = _batches(rng, 7)
  models = [_mlp(4, bn=True), _mlp(4, bn=True)]
  opts = [fg.optim.AdamW(m.parameters(), lr=0.01) for m in models]
  eager, jitted = _train_step(models[0], opts[0]), fg.jit(_train_step(models[1], opts[1]))
  for x, y in data: assert eager(x, y).item() == jitted(x, y).item()
  for (k, a), b in zip(models[0].state_dict().items(), models[1].state_dict().values()):
    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
  assert models[1][1].num_batches_tracked.item() == len(data)


def test_learning_rate_schedules_and_structure_changes_are_followed(rng):
  data = _batches(rng, 12)
  models = [_mlp(5), _mlp(5)]
  opts = [fg.optim.SGD(m.parameters(), lr=0.1) for m in models]
  scheds = [fg.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in opts]
  steps = [_train_step(models[0], opts[0]), fg.jit(_train_step(models[1], opts[1]))]
  for i, (x, y) in enumerate(data):
    if i == 6:   # momentum on: a different update graph, so the capture is dropped and taken again
      for o in opts: o.param_groups[0]["momentum"] = 0.9
    losses = [s(x, y).item() for s in steps]
    assert losses[0] == losses[1], f"step {i}"
    for s in scheds: s.step()
  for a, b in zip(models[0].parameters(), models[1].parameters()): np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_loading_state_between_replays(rng, tmp_path):
  data = _batches(rng, 10)
  models = [_mlp(6), _mlp(6)]
  opts = [fg.optim.Adam(m.parameters(), lr=0.01) for m in models]
  steps = [_train_step(models[0], opts[0]), fg.jit(_train_step(models[1], opts[1]))]
  for x, y in data[:4]:
    for s in steps: s(x, y)
  saved_model = {k: v.numpy().copy() for k, v in models[0].state_dict().items()}
  saved_opt = opts[0].state_dict()
  saved_opt = {"state": {k: {n: (fg.tensor(v.numpy()) if isinstance(v, fg.Tensor) else v) for n, v in st.items()}
                         for k, st in saved_opt["state"].items()}, "param_groups": saved_opt["param_groups"]}
  for x, y in data[4:7]:
    for s in steps: s(x, y)
  for m, o in zip(models, opts):   # rewind both to step 4
    m.load_state_dict({k: fg.tensor(v) for k, v in saved_model.items()})
    o.load_state_dict(saved_opt)
  for i, (x, y) in enumerate(data[4:]):
    assert steps[0](x, y).item() == steps[1](x, y).item(), f"step {i}"


def test_a_new_argument_shape_gets_its_own_capture(rng):
  full, short = _batches(rng, 4, rows=8), _batches(rng, 4, rows=3)
  models = [_mlp(7), _mlp(7)]
  opts = [fg.optim.Adam(m.parameters(), lr=0.01) for m in models]
  steps = [_train_step(models[0], opts[0]), fg.jit(_train_step(models[1], opts[1]))]
  for epoch in range(4):   # an epoch of full batches and a short last one, as a data loader without drop_last gives
    for x, y in full[:2] + [short[epoch]]:
      out = [s(x, y) for s in steps]
      assert out[1].shape == () and out[0].item() == out[1].item()
  assert len(steps[1]._captures) == 2


def test_returned_structures_and_values(rng):
  w = fg.tensor(rng.standard_normal((4, 4)).astype(np.float32))

  @fg.jit
  def f(x, scale):
    y = x @ w
    return {"y": y * scale, "parts": (y.sum(), x)}

  for i in range(4):
    X = rng.standard_normal((3, 4)).astype(np.float32)
    out = f(X, 2.0)   # numpy arguments become tensors
    np.testing.assert_allclose(out["y"].numpy(), X @ w.numpy() * 2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["parts"][0].item(), (X @ w.numpy()).sum(), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out["parts"][1].numpy(), X)
  np.testing.assert_allclose(f(X, 3.0)["y"].numpy(), X @ w.numpy() * 3, rtol=1e-5, atol=1e-5)


def test_errors_name_the_problem():
  step = fg.jit(lambda x, opts: x * 2)
  with pytest.raises(TypeError, match="hashable"):
    step(fg.ones(3), {1, 2})

  @fg.jit
  def bump(x):
    x += 1
    return x
  bump(fg.ones(3))
  with pytest.raises(NotImplementedError, match="arguments in place"):
    bump(fg.ones(3))

  inner = fg.jit(lambda x: x + 1)
  outer = fg.jit(lambda x: inner(x))
  with pytest.raises(RuntimeError, match="captured"):
    outer(fg.ones(2))


def test_state_set_to_an_argument_is_refused(rng):
  state = fg.tensor(rng.standard_normal(3).astype(np.float32))

  @fg.jit
  def keep(x):
    state.copy_(x)     # the new value is the argument's own buffer: nothing the step computed
    return x * 2

  keep(fg.tensor(rng.standard_normal(3).astype(np.float32)))
  with pytest.raises(NotImplementedError, match="did not compute"):
    keep(fg.tensor(rng.standard_normal(3).astype(np.float32)))


# ---- Python state a step changes: schedulers stepped inside, train/eval, seeds; what cannot be followed is refused

def _sched_cases(lib):
  S = lib.optim.lr_scheduler
  lam = lambda e: 0.9 ** e   # noqa: E731
  return {
    "StepLR": lambda o: S.StepLR(o, step_size=1, gamma=0.7),
    "MultiStepLR": lambda o: S.MultiStepLR(o, milestones=[2, 3, 5], gamma=0.5),
    "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.8),
    "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=3, eta_min=0.01),
    "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=0.2, total_steps=9),
    "LinearLR": lambda o: S.LinearLR(o, start_factor=0.2, total_iters=4),
    "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=3),
    "PolynomialLR": lambda o: S.PolynomialLR(o, total_iters=6, power=2.0),
    "LambdaLR": lambda o: S.LambdaLR(o, lr_lambda=lam),
    "MultiplicativeLR": lambda o: S.MultiplicativeLR(o, lr_lambda=lambda e: 0.85),
    "SequentialLR": lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.5, total_iters=2),
                                                 S.ExponentialLR(o, gamma=0.7)], milestones=[3]),
    "ChainedScheduler": lambda o: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=2),
                                                      S.ExponentialLR(o, gamma=0.9)]),
    "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=0, threshold=0.5),
  }


_SCHED_RUNS = [(d, n) for d in ("CPU", "PYTHON") for n in sorted(_sched_cases(fg))] + \
  [("OPENCL", n) for n in ("StepLR", "OneCycleLR", "SequentialLR", "ReduceLROnPlateau") if "OPENCL" in DEVICES]


@pytest.mark.parametrize("device,name", _SCHED_RUNS)
def test_scheduler_stepped_inside_the_jitted_step_follows_torch(device, rng, name):
  W, b = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
  w, bb = fg.tensor(W, device=device, requires_grad=True), fg.tensor(b, device=device, requires_grad=True)
  tw, tb = torch.tensor(W, requires_grad=True), torch.tensor(b, requires_grad=True)
  opt = fg.optim.SGD([w, bb], lr=0.1, momentum=0.9)
  topt = torch.optim.SGD([tw, tb], lr=0.1, momentum=0.9)
  sched, tsched = _sched_cases(fg)[name](opt), _sched_cases(torch)[name](topt)
  plateau = name == "ReduceLROnPlateau"

  @fg.jit
  def step(x, y):
    opt.zero_grad()
    loss = ((x @ w + bb - y) ** 2).mean()
    loss.backward()
    opt.step()
    if plateau: sched.step(loss)
    else: sched.step()
    return loss

  lrs = []
  for i in range(9):
    X, Y = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    if plateau and i % 3: Y = Y * 4   # losses that go up and down: the plateau decisions differ from step to step
    loss = step(fg.tensor(X, device=device), fg.tensor(Y, device=device))
    topt.zero_grad()
    tloss = ((torch.tensor(X) @ tw + tb - torch.tensor(Y)) ** 2).mean()
    tloss.backward()
    topt.step()
    tsched.step(tloss.item()) if plateau else tsched.step()
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5, err_msg=f"step {i}")
    np.testing.assert_allclose(sched.get_last_lr(), tsched.get_last_lr(), rtol=1e-6, err_msg=f"step {i}")
    lrs.append(tuple(sched.get_last_lr()))
    if hasattr(tsched, "last_epoch"): assert sched.last_epoch == tsched.last_epoch
  assert len(set(lrs)) > 1   # the schedule did move while replaying
  assert len(step._captures) == 1   # one capture, replayed from the third step on
  np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(bb.numpy(), tb.detach().numpy(), rtol=1e-5, atol=2e-6)


def test_one_cycle_momentum_and_adam_betas_inside_the_step_follow_eager(rng):
  data = _batches(rng, 10)
  models = [_mlp(8), _mlp(8)]
  opts = [fg.optim.Adam(m.parameters(), lr=0.01) for m in models]
  scheds = [fg.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=10) for o in opts]
  def make(model, opt, sched):
    def step(x, y):
      loss = F.cross_entropy(model(x), y)
      opt.zero_grad()
      loss.backward()
      opt.step()
      sched.step()
      return loss
    return step
  steps = [make(models[0], opts[0], scheds[0]), fg.jit(make(models[1], opts[1], scheds[1]))]
  for i, (x, y) in enumerate(data):
    assert steps[0](x, y).item() == steps[1](x, y).item(), f"step {i}"
    assert opts[0].param_groups[0]["betas"] == opts[1].param_groups[0]["betas"]
  for a, b in zip(models[0].parameters(), models[1].parameters()): np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_train_eval_and_seed_inside_the_step_are_repeated_and_mode_is_guarded(rng):
  data = _batches(rng, 8, rows=16)
  models = [_mlp(9, dropout=0.5, bn=True), _mlp(9, dropout=0.5, bn=True)]
  opts = [fg.optim.SGD(m.parameters(), lr=0.05) for m in models]
  def make(model, opt):
    def step(x, y):
      fg.manual_seed(7)   # the same dropout masks every step: replays seed again
      model.train()
      loss = F.cross_entropy(model(x), y)
      opt.zero_grad()
      loss.backward()
      opt.step()
      model.eval()        # the step leaves the model in eval mode: so must a replay
      return loss, model(x).sum()
    return step
  steps = [make(models[0], opts[0]), fg.jit(make(models[1], opts[1]))]
  for i, (x, y) in enumerate(data):
    for m in models: m.train(i % 2 == 0)   # the mode before the step does not matter: the step sets it
    outs = [s(x, y) for s in steps]
    assert outs[0][0].item() == outs[1][0].item() and outs[0][1].item() == outs[1][1].item(), f"step {i}"
    assert not models[1].training and not models[1][3].training
  assert len(steps[1]._captures) == 1

  # a step that does not set the mode: replayed only in the mode it was captured in; another mode warms up again
  ms = [_mlp(10, dropout=0.5), _mlp(10, dropout=0.5)]
  os_ = [fg.optim.SGD(m.parameters(), lr=0.05) for m in ms]
  steps = [_train_step(ms[0], os_[0]), fg.jit(_train_step(ms[1], os_[1]))]
  for i, (x, y) in enumerate(data):
    for m in ms: m.train(i < 3 or i > 5)
    fg.manual_seed(i)
    a = steps[0](x, y).item()
    fg.manual_seed(i)
    assert a == steps[1](x, y).item(), f"step {i}"
  for a, b in zip(ms[0].parameters(), ms[1].parameters()): np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_what_a_replay_cannot_follow_is_refused_at_capture(rng):
  w = fg.tensor(rng.standard_normal((8, 4)).astype(np.float32), requires_grad=True)
  opt = fg.optim.SGD([w], lr=0.1)
  x, y = fg.tensor(rng.standard_normal((16, 8)).astype(np.float32)), fg.tensor(rng.standard_normal((16, 4)).astype(np.float32))
  def loss_of(x, y): return ((x @ w - y) ** 2).mean()

  @fg.jit
  def set_lr(x, y):   # an lr computed in Python from a count the step keeps: a replay would keep the capture's value
    opt.zero_grad(); loss_of(x, y).backward(); opt.step()
    calls.append(1)
    opt.param_groups[0]["lr"] = 0.1 * 0.5 ** len(calls)
    return x.sum()
  calls: list = []
  set_lr(x, y)
  with pytest.raises(RuntimeError, match=r"changed SGD\.param_groups\[0\]\['lr'\] from 0\.05 to 0\.025"):
    set_lr(x, y)

  @fg.jit
  def set_constant_lr(x, y):   # the same value every step: a replay may keep it
    opt.param_groups[0]["lr"] = 0.01
    opt.zero_grad(); loss_of(x, y).backward(); opt.step()
    return x.sum()
  for _ in range(3): set_constant_lr(x, y)

  n = 0
  @fg.jit
  def count(x, y):
    nonlocal n
    n += 1
    return loss_of(x, y)
  count(x, y)
  with pytest.raises(RuntimeError, match=r"changed the variable 'n' from 1 to 2"):
    count(x, y)

  class Trainer:
    def __init__(self): self.n = 0
    @fg.jit
    def step(self, x, y):
      self.n += 1
      opt.zero_grad(); loss_of(x, y).backward(); opt.step()
      return loss_of(x, y)
  t = Trainer()
  t.step(x, y)
  with pytest.raises(RuntimeError, match=r"changed self\.n from 1 to 2"):
    t.step(x, y)

  @fg.jit
  def reads(x, y):
    loss = loss_of(x, y)
    return loss * 2 if loss.item() > 0 else loss   # a branch on a computed value
  reads(x, y)
  with pytest.raises(RuntimeError, match=r"reads the value of a tensor of shape \(\) on the host"):
    reads(x, y)

  @fg.jit
  def returns_float(x, y): return float(loss_of(x, y).detach().numpy())
  returns_float(x, y)
  with pytest.raises(RuntimeError, match="on the host"):
    returns_float(x, y)

  sched = fg.optim.lr_scheduler.StepLR(opt, step_size=1)
  @fg.jit
  def epoch_step(x, y, e):
    sched.step(e)
    return loss_of(x, y)
  with pytest.raises(RuntimeError, match=r"StepLR\.step\(epoch\) inside a jitted function"):
    epoch_step(x, y, 3)

  plateau = fg.optim.lr_scheduler.ReduceLROnPlateau(opt)
  @fg.jit
  def plateau_number(x, y):
    plateau.step(0.5)
    return loss_of(x, y)
  with pytest.raises(RuntimeError, match="needs the metric as a tensor"):
    plateau_number(x, y)

  @fg.jit
  def returns_number(x, y): return loss_of(x, y), 0.5
  returns_number(x, y)
  with pytest.raises(RuntimeError, match="returns a Python value"):
    returns_number(x, y)


TEMPERATURE = 1.0


def test_a_python_number_changed_between_calls_is_followed(rng):
  """A replay runs none of the step's Python: a global it names that the caller changes between calls drops the
  capture (the call runs eagerly and captures again) instead of being replayed with the capture's value."""
  global TEMPERATURE
  step = fg.jit(lambda x: (x / TEMPERATURE).sum())
  for t in (1.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 0.5):
    TEMPERATURE = t
    x = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(step(fg.tensor(x)).item(), (x / t).sum(), rtol=1e-5, atol=1e-5)


def test_module_settings_and_frozen_parameters_are_followed(rng):
  """A layer frozen between calls (requires_grad_(False)) is not updated by later replays, and a dropout's p
  changed between calls takes effect, as in eager."""
  fg.manual_seed(0)
  model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.0), nn.Linear(8, 3))
  opt = fg.optim.SGD(model.parameters(), lr=0.1)
  step = fg.jit(_train_step(model, opt))
  data = [(fg.tensor(rng.standard_normal((16, 6)).astype(np.float32)), fg.tensor(rng.integers(0, 3, 16)))
          for _ in range(8)]
  for x, y in data[:4]: step(x, y)
  model[0].weight.requires_grad_(False)
  model[0].bias.requires_grad_(False)
  frozen = model[0].weight.numpy().copy()
  last = model[3].weight.numpy().copy()
  for x, y in data[4:6]: step(x, y)
  np.testing.assert_array_equal(model[0].weight.numpy(), frozen)
  assert not np.array_equal(model[3].weight.numpy(), last)
  # dropout switched on: about half of the hidden units are zeroed, so the replayed losses change
  model.eval()
  x, y = data[6]
  plain = F.cross_entropy(model(x), y).item()
  model.train()
  model[2].p = 1.0   # every unit dropped: the logits are the last layer's bias alone (before the step's update)
  want = F.cross_entropy(model[3].bias.detach().reshape(1, 3).expand(16, 3), y).item()
  got = step(x, y).item()
  assert abs(got - plain) > 1e-6
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_from_numpy_inputs_replay_and_follow_their_array(rng):
  """fusegrad.from_numpy shares the array: a replayed step (the eager trace, and fusegrad.jit) reads it, and an
  in-place change of the array between calls reaches the result."""
  w = fg.tensor(rng.standard_normal((3, 4)).astype(np.float32))
  a = rng.standard_normal((2, 4)).astype(np.float32)
  x = fg.from_numpy(a)
  step = lambda t: F.linear(t, w).relu().sum()
  jstep = fg.jit(step)
  for _ in range(6):
    a[:] = rng.standard_normal((2, 4)).astype(np.float32)
    want = np.maximum(a @ w.numpy().T, 0).sum()
    np.testing.assert_allclose(step(x).item(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jstep(x).item(), want, rtol=1e-5, atol=1e-5)
    b = rng.standard_normal((2, 4)).astype(np.float32)   # a fresh array each call too
    np.testing.assert_allclose(step(fg.from_numpy(b)).item(), np.maximum(b @ w.numpy().T, 0).sum(), rtol=1e-5,
                               atol=1e-5)
