"""Optimizers against PyTorch: 20-step parameter trajectories on a small least-squares problem."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import fusegrad as fg
from fusegrad.runtime import device as rd

CASES = {
  "sgd": dict(cls="SGD", kw=dict(lr=0.05)),
  "sgd_momentum_dampening": dict(cls="SGD", kw=dict(lr=0.05, momentum=0.9, dampening=0.1)),
  "sgd_nesterov_wd": dict(cls="SGD", kw=dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
  "sgd_maximize": dict(cls="SGD", kw=dict(lr=0.01, momentum=0.5, maximize=True)),
  "adam": dict(cls="Adam", kw=dict(lr=0.01)),
  "adam_wd_betas": dict(cls="Adam", kw=dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
  "adam_amsgrad": dict(cls="Adam", kw=dict(lr=0.01, amsgrad=True)),
  "adamw": dict(cls="AdamW", kw=dict(lr=0.01)),
  "adamw_amsgrad_wd": dict(cls="AdamW", kw=dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
}


def _problem(rng):
  return (rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32),
          rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32))


@pytest.mark.parametrize("case", sorted(CASES))
def test_trajectory_matches_torch(device, rng, case):
  W, b, X, Y = _problem(rng)
  spec = CASES[case]
  w, bb = fg.tensor(W, device=device, requires_grad=True), fg.tensor(b, device=device, requires_grad=True)
  tw, tb = torch.tensor(W, requires_grad=True), torch.tensor(b, requires_grad=True)
  opt = getattr(fg.optim, spec["cls"])([w, bb], **spec["kw"])
  topt = getattr(torch.optim, spec["cls"])([tw, tb], **spec["kw"])
  x, y = fg.tensor(X, device=device), fg.tensor(Y, device=device)
  for _ in range(20):
    opt.zero_grad()
    ((x @ w + bb - y) ** 2).mean().backward()
    opt.step()
    topt.zero_grad()
    ((torch.tensor(X) @ tw + tb - torch.tensor(Y)) ** 2).mean().backward()
    topt.step()
  np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(bb.numpy(), tb.detach().numpy(), rtol=1e-5, atol=2e-6)


def test_param_groups_have_their_own_lr(rng):
  W, b, X, Y = _problem(rng)
  w, bb = fg.tensor(W, requires_grad=True), fg.tensor(b, requires_grad=True)
  tw, tb = torch.tensor(W, requires_grad=True), torch.tensor(b, requires_grad=True)
  opt = fg.optim.SGD([{"params": [w]}, {"params": [bb], "lr": 0.5}], lr=0.01, momentum=0.9)
  topt = torch.optim.SGD([{"params": [tw]}, {"params": [tb], "lr": 0.5}], lr=0.01, momentum=0.9)
  for step in range(10):
    for o in (opt, topt): o.param_groups[0]["lr"] = 0.01 * (step + 1)   # a schedule changes lr each step
    opt.zero_grad(); ((fg.tensor(X) @ w + bb - fg.tensor(Y)) ** 2).mean().backward(); opt.step()
    topt.zero_grad(); ((torch.tensor(X) @ tw + tb - torch.tensor(Y)) ** 2).mean().backward(); topt.step()
  np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(bb.numpy(), tb.detach().numpy(), rtol=1e-5, atol=2e-6)


def test_changing_lr_compiles_nothing_new(rng):
  W, b, X, Y = _problem(rng)
  w = fg.tensor(W, requires_grad=True)
  opt = fg.optim.Adam([w], lr=0.01)
  x, y = fg.tensor(X), fg.tensor(Y)
  def step(lr):
    opt.param_groups[0]["lr"] = lr
    opt.zero_grad(); ((x @ w - y) ** 2).mean().backward(); opt.step()
  step(0.01); step(0.02)
  cpu = rd.get("CPU")
  before = len(cpu.programs)
  for i in range(5): step(0.001 * (i + 3))     # new lr and new bias corrections every step
  assert len(cpu.programs) == before


def test_adam_step_of_one_parameter_is_one_kernel(rng):
  w = fg.tensor(rng.standard_normal((32, 16)).astype(np.float32), requires_grad=True)
  opt = fg.optim.Adam([w], lr=1e-3)
  for _ in range(2):
    w.grad = fg.tensor(rng.standard_normal((32, 16)).astype(np.float32))
    with fg.track() as t:
      opt.step()
    assert len(t.kernels) == 1    # parameter, exp_avg and exp_avg_sq in one kernel


def test_bad_arguments():
  w = fg.zeros(3, requires_grad=True)
  with pytest.raises(ValueError): fg.optim.SGD([w], lr=-1)
  with pytest.raises(ValueError): fg.optim.SGD([w], lr=0.1, nesterov=True)
  with pytest.raises(ValueError): fg.optim.Adam([w], betas=(1.0, 0.9))
  with pytest.raises(ValueError): fg.optim.Adam([fg.zeros(3)])
  with pytest.raises(ValueError): fg.optim.SGD([], lr=0.1)
