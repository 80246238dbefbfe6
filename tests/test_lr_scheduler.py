"""Learning-rate schedulers against PyTorch's: the lr sequences (and momentum / beta1 for OneCycleLR) over many
steps, with two param groups of different lrs and several settings each; sequential and chained schedules,
ReduceLROnPlateau, the closed forms of step(epoch), state_dict round trips and errors."""
from __future__ import annotations
import warnings
import numpy as np
import pytest
import torch
import fusegrad as fg

RTOL = 1e-13   # the same float operations as torch's, so the same values up to the last bits


def _opts(cls: str = "SGD", lrs=(0.1, 0.03), **kw):
  """A fusegrad and a torch optimizer, each with two param groups of different learning rates."""
  out = []
  for lib in (fg, torch):
    a, b = lib.zeros(3, requires_grad=True), lib.zeros(2, requires_grad=True)
    out.append(getattr(lib.optim, cls)([{"params": [a]}, {"params": [b], "lr": lrs[1]}], lr=lrs[0], **kw))
  return out


def _hyper(opt) -> list:
  """Every group's lr, momentum and beta1 (those it has)."""
  return [(g["lr"], g.get("momentum"), g["betas"][0] if "betas" in g else None) for g in opt.param_groups]


def _assert_same(ours, theirs, what=""):
  for a, b in zip(ours, theirs):
    for x, y in zip(a, b):
      if y is None: assert x is None, what
      else: np.testing.assert_allclose(x, y, rtol=RTOL, atol=0, err_msg=what)


def _run(sched, opt, steps: int) -> list:
  """The hyperparameters after construction and after each of `steps` optimizer + scheduler steps."""
  seq = [(_hyper(opt), list(sched.get_last_lr()))]
  for _ in range(steps):
    opt.step()       # no gradients: nothing to update, but the scheduler sees the optimizer stepped first
    sched.step()
    seq.append((_hyper(opt), list(sched.get_last_lr())))
  return seq


def _compare(seq, tseq):
  assert len(seq) == len(tseq)
  for i, ((h, last), (th, tlast)) in enumerate(zip(seq, tseq)):
    _assert_same(h, th, f"step {i}")
    np.testing.assert_allclose(last, tlast, rtol=RTOL, atol=0, err_msg=f"get_last_lr at step {i}")


SCHEDULES = {
  "step": ("StepLR", dict(step_size=7, gamma=0.5)),
  "step_default_gamma": ("StepLR", dict(step_size=3)),
  "multistep": ("MultiStepLR", dict(milestones=[5, 12, 12, 30], gamma=0.3)),
  "exponential": ("ExponentialLR", dict(gamma=0.93)),
  "cosine_periodic": ("CosineAnnealingLR", dict(T_max=20)),     # 80 steps: down, up, down, up
  "cosine_eta_min": ("CosineAnnealingLR", dict(T_max=17, eta_min=1e-4)),
  "cosine_long": ("CosineAnnealingLR", dict(T_max=100, eta_min=1e-3)),
  "linear_default": ("LinearLR", dict()),
  "linear_decay": ("LinearLR", dict(start_factor=1.0, end_factor=0.05, total_iters=40)),
  "linear_warmup": ("LinearLR", dict(start_factor=0.01, total_iters=10)),
  "constant": ("ConstantLR", dict(factor=0.25, total_iters=8)),
  "polynomial": ("PolynomialLR", dict(total_iters=30, power=2.0)),
  "lambda": ("LambdaLR", dict(lr_lambda=lambda e: 0.97 ** e)),
  "lambda_per_group": ("LambdaLR", dict(lr_lambda=[lambda e: e // 10 + 1, lambda e: 1 / (1 + e)])),
  "multiplicative": ("MultiplicativeLR", dict(lr_lambda=lambda e: 0.95 if e % 2 else 0.99)),
  "onecycle": ("OneCycleLR", dict(max_lr=0.5, total_steps=80)),
  "onecycle_linear_three_phase": ("OneCycleLR", dict(max_lr=[0.4, 0.2], total_steps=80, anneal_strategy="linear",
                                                      three_phase=True, div_factor=10.0, final_div_factor=100.0,
                                                      pct_start=0.25)),
  "onecycle_three_phase_cos": ("OneCycleLR", dict(max_lr=[0.4, 0.2], total_steps=81, three_phase=True)),
  "onecycle_epochs": ("OneCycleLR", dict(max_lr=0.3, epochs=8, steps_per_epoch=10, base_momentum=0.8,
                                         max_momentum=0.9, pct_start=0.45)),
  "onecycle_momentum_per_group": ("OneCycleLR", dict(max_lr=0.3, total_steps=80, base_momentum=[0.8, 0.7],
                                                      max_momentum=[0.95, 0.9])),
  "onecycle_no_momentum": ("OneCycleLR", dict(max_lr=0.3, total_steps=80, cycle_momentum=False)),
}


@pytest.mark.parametrize("opt_cls,opt_kw", [("SGD", dict(momentum=0.9)), ("Adam", dict())], ids=["sgd", "adam"])
@pytest.mark.parametrize("case", sorted(SCHEDULES))
def test_schedule_matches_torch(case, opt_cls, opt_kw):
  name, kw = SCHEDULES[case]
  opt, topt = _opts(opt_cls, **opt_kw)
  sched = getattr(fg.optim.lr_scheduler, name)(opt, **kw)
  tsched = getattr(torch.optim.lr_scheduler, name)(topt, **kw)
  assert opt.param_groups[0]["initial_lr"] == topt.param_groups[0]["initial_lr"]
  assert sched.base_lrs == tsched.base_lrs and sched.last_epoch == tsched.last_epoch == 0
  _compare(_run(sched, opt, 80), _run(tsched, topt, 80))
  assert sched.last_epoch == tsched.last_epoch == 80


def test_one_cycle_raises_past_total_steps():
  opt, topt = _opts(momentum=0.9)
  sched = fg.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
  tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.1, total_steps=10)
  _compare(_run(sched, opt, 10), _run(tsched, topt, 10))
  msg = "Tried to step 11 times. The specified number of total steps is 10"
  with pytest.raises(ValueError, match=msg): tsched.step()
  with pytest.raises(ValueError, match=msg): sched.step()


SEQUENCES = {   # (scheduler name, kwargs) each, milestones
  "warmup_cosine": ([("LinearLR", dict(start_factor=0.1, total_iters=5)),
                     ("CosineAnnealingLR", dict(T_max=45, eta_min=1e-5))], [5]),
  "constant_exponential": ([("ConstantLR", dict(factor=0.1, total_iters=20)), ("ExponentialLR", dict(gamma=0.9))],
                           [20]),
  "three": ([("LinearLR", dict(start_factor=0.5, total_iters=4)), ("StepLR", dict(step_size=5, gamma=0.5)),
             ("ExponentialLR", dict(gamma=0.95))], [4, 20]),
  "warmup_lambda": ([("LambdaLR", dict(lr_lambda=lambda e: (e + 1) / 8)), ("MultiStepLR", dict(milestones=[10, 20]))],
                    [7]),
}


@pytest.mark.parametrize("case", sorted(SEQUENCES))
def test_sequential_matches_torch(case):
  specs, milestones = SEQUENCES[case]
  opt, topt = _opts(momentum=0.9)
  scheds = [getattr(fg.optim.lr_scheduler, n)(opt, **kw) for n, kw in specs]
  tscheds = [getattr(torch.optim.lr_scheduler, n)(topt, **kw) for n, kw in specs]
  sched = fg.optim.lr_scheduler.SequentialLR(opt, scheds, milestones)
  tsched = torch.optim.lr_scheduler.SequentialLR(topt, tscheds, milestones)
  _compare(_run(sched, opt, 60), _run(tsched, topt, 60))


CHAINS = {   # the chainable (recursive) forms compose: each scheduler scales the lr the previous one set
  "constant_exponential_step": [("ConstantLR", dict(factor=0.1, total_iters=5)), ("ExponentialLR", dict(gamma=0.9)),
                                ("StepLR", dict(step_size=7, gamma=0.5))],
  "cosine_exponential": [("CosineAnnealingLR", dict(T_max=10, eta_min=1e-3)), ("ExponentialLR", dict(gamma=0.9))],
  "linear_cosine_multistep": [("LinearLR", dict(start_factor=0.2, total_iters=6)),
                              ("CosineAnnealingLR", dict(T_max=25)), ("MultiStepLR", dict(milestones=[9, 17]))],
}


@pytest.mark.parametrize("case", sorted(CHAINS))
def test_chained_matches_torch(case):
  opt, topt = _opts()
  specs = CHAINS[case]
  sched = fg.optim.lr_scheduler.ChainedScheduler([getattr(fg.optim.lr_scheduler, n)(opt, **kw) for n, kw in specs])
  tsched = torch.optim.lr_scheduler.ChainedScheduler([getattr(torch.optim.lr_scheduler, n)(topt, **kw)
                                                      for n, kw in specs])
  _compare(_run(sched, opt, 40), _run(tsched, topt, 40))


@pytest.mark.parametrize("kw", [dict(), dict(mode="max", factor=0.5, patience=2, threshold=0.05, cooldown=2),
                                dict(threshold_mode="abs", threshold=0.01, patience=1, min_lr=[0.01, 0.001]),
                                dict(mode="max", threshold_mode="abs", patience=0, factor=0.3, min_lr=0.005, eps=1e-3)])
def test_reduce_on_plateau_matches_torch(rng, kw):
  opt, topt = _opts()
  sched = fg.optim.lr_scheduler.ReduceLROnPlateau(opt, **kw)
  tsched = torch.optim.lr_scheduler.ReduceLROnPlateau(topt, **kw)
  metrics = np.repeat(rng.standard_normal(20), rng.integers(1, 6, size=20))   # plateaus of random lengths
  for m in metrics:
    sched.step(fg.tensor(m))        # a (lazy) tensor metric is read on the host, like torch's
    tsched.step(torch.tensor(m))
    _assert_same(_hyper(opt), _hyper(topt))
    assert sched.get_last_lr() == tsched.get_last_lr() and sched.num_bad_epochs == tsched.num_bad_epochs


@pytest.mark.parametrize("name,kw", [("StepLR", dict(step_size=4, gamma=0.5)),
                                     ("MultiStepLR", dict(milestones=[3, 9, 9], gamma=0.5)),
                                     ("ExponentialLR", dict(gamma=0.9)), ("CosineAnnealingLR", dict(T_max=10)),
                                     ("LinearLR", dict(start_factor=0.2, total_iters=8)),
                                     ("ConstantLR", dict(factor=0.5, total_iters=4)),
                                     ("PolynomialLR", dict(total_iters=12, power=0.5))])
def test_step_with_epoch_uses_closed_form(name, kw):
  opt, topt = _opts()
  sched, tsched = getattr(fg.optim.lr_scheduler, name)(opt, **kw), getattr(torch.optim.lr_scheduler, name)(topt, **kw)
  for epoch in (3, 7, 1, 15, 9, 0, 22):
    opt.step(); topt.step()
    with pytest.warns(UserWarning, match="epoch parameter"): sched.step(epoch)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      tsched.step(epoch)
    _assert_same(_hyper(opt), _hyper(topt), f"epoch {epoch}")


@pytest.mark.parametrize("kind", ["cosine", "onecycle", "sequential", "lambda"])
def test_state_dict_round_trip(kind):
  def build(lib, last_epoch=-1):
    o = _opts(momentum=0.9)[0 if lib is fg else 1]
    ls = lib.optim.lr_scheduler
    if kind == "cosine": s = ls.CosineAnnealingLR(o, T_max=15, eta_min=1e-3)
    elif kind == "onecycle": s = ls.OneCycleLR(o, max_lr=0.2, total_steps=40)
    elif kind == "lambda": s = ls.LambdaLR(o, lambda e: 1 / (e + 1))
    else: s = ls.SequentialLR(o, [ls.LinearLR(o, 0.1, total_iters=6), ls.CosineAnnealingLR(o, 30)], [6])
    return o, s
  (opt, sched), (topt, tsched) = build(fg), build(torch)
  first, tfirst = _run(sched, opt, 13), _run(tsched, topt, 13)
  sd, osd = sched.state_dict(), opt.state_dict()
  assert "optimizer" not in sd and sd["last_epoch"] == 13
  opt2, sched2 = build(fg)          # the scheduler first, then the optimizer's state (its lrs and momenta)
  opt2.load_state_dict(osd)
  sched2.load_state_dict(sd)
  assert sched2.get_last_lr() == sched.get_last_lr() and _hyper(opt2) == _hyper(opt)
  rest, rest2, trest = _run(sched, opt, 25), _run(sched2, opt2, 25), _run(tsched, topt, 25)
  _compare(first + rest[1:], tfirst + trest[1:])
  _compare(rest2, trest)


def test_resume_with_last_epoch():
  opt, topt = _opts()
  with pytest.raises(KeyError, match="initial_lr"): fg.optim.lr_scheduler.StepLR(opt, 3, last_epoch=5)
  with pytest.raises(KeyError, match="initial_lr"): torch.optim.lr_scheduler.StepLR(topt, 3, last_epoch=5)
  for o in (opt, topt):
    for g in o.param_groups: g["initial_lr"] = g["lr"] * 2
  sched = fg.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20, last_epoch=5)
  tsched = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=20, last_epoch=5)
  _compare(_run(sched, opt, 30), _run(tsched, topt, 30))


def test_scheduler_stepped_before_optimizer_warns_like_torch():
  opt, topt = _opts()
  sched, tsched = fg.optim.lr_scheduler.StepLR(opt, 2), torch.optim.lr_scheduler.StepLR(topt, 2)
  with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"): tsched.step()
  with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"): sched.step()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    sched.step()                    # only the first step is checked
  with pytest.warns(UserWarning, match="get_last_lr"): sched.get_lr()


def test_bad_arguments():
  ls = fg.optim.lr_scheduler
  opt, _ = _opts()
  with pytest.raises(TypeError, match="is not an Optimizer"): ls.StepLR(object(), 3)
  with pytest.raises(TypeError, match="is not an Optimizer"): ls.OneCycleLR(object(), 0.1, total_steps=3)
  with pytest.raises(ValueError, match="Starting multiplicative factor"): ls.LinearLR(opt, start_factor=0)
  with pytest.raises(ValueError, match="Ending multiplicative factor"): ls.LinearLR(opt, end_factor=1.5)
  with pytest.raises(ValueError, match="between 0 and 1"): ls.ConstantLR(opt, factor=1.5)
  with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 3"): ls.LambdaLR(opt, [abs] * 3)
  with pytest.raises(TypeError, match="lr_lambda should be a function"): ls.MultiplicativeLR(opt, 0.9)
  with pytest.raises(ValueError, match="total_steps OR"): ls.OneCycleLR(opt, 0.1)
  with pytest.raises(ValueError, match="positive integer total_steps"): ls.OneCycleLR(opt, 0.1, total_steps=0)
  with pytest.raises(ValueError, match="positive integer epochs"): ls.OneCycleLR(opt, 0.1, epochs=0, steps_per_epoch=3)
  with pytest.raises(ValueError, match="pct_start"): ls.OneCycleLR(opt, 0.1, total_steps=10, pct_start=1)
  with pytest.raises(ValueError, match="anneal_strategy"): ls.OneCycleLR(opt, 0.1, total_steps=10, anneal_strategy="x")
  with pytest.raises(ValueError, match="max_lr must have the same length"): ls.OneCycleLR(opt, [0.1] * 3, total_steps=9)
  ada = fg.optim.Adagrad([fg.zeros(2, requires_grad=True)])
  with pytest.raises(ValueError, match="momentum or beta1"): ls.OneCycleLR(ada, 0.1, total_steps=10)
  ls.OneCycleLR(ada, 0.1, total_steps=10, cycle_momentum=False)
  other, _ = _opts()
  a, b = ls.LinearLR(opt), ls.ExponentialLR(other, 0.9)
  with pytest.raises(ValueError, match="same optimizer"): ls.SequentialLR(opt, [a, b], [3])
  with pytest.raises(ValueError, match="number of milestones"): ls.SequentialLR(opt, [a, ls.StepLR(opt, 2)], [3, 4])
  with pytest.raises(ValueError, match="at least one"): ls.SequentialLR(opt, [], [])
  with pytest.raises(ValueError, match="Factor should be < 1.0"): ls.ReduceLROnPlateau(opt, factor=1.0)
  with pytest.raises(ValueError, match="mode median is unknown"): ls.ReduceLROnPlateau(opt, mode="median")
  with pytest.raises(ValueError, match="expected 2 min_lrs, got 3"): ls.ReduceLROnPlateau(opt, min_lr=[0.1] * 3)
