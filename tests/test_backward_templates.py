"""A backward of a structure seen before is made from a template (autograd.py, "backward templates").

The template path must give the graph the rules would build: these tests compare it bitwise with the rules' run
(`autograd.TEMPLATES = False`) over several training steps, check gradients against torch where constants change
from step to step (a rule may fold a constant into a new one: its value is in the key), and check that PyTorch's
errors (a second backward through a freed graph, a saved value modified in place) are raised on the template path
too. Every test counts the backward passes the templates made, so none passes by running the rules only.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad import autograd as A


@pytest.fixture(autouse=True)
def _templates_on():
  old = A.TEMPLATES
  A.TEMPLATES = True
  A._templates.clear()
  yield
  A.TEMPLATES = old


def _hits() -> int: return A._templates_hits[0]


def _mlp_steps(rng, templates: bool, steps: int, device: str):
  A.TEMPLATES = templates
  fg.manual_seed(0)
  model = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 5)).to(device)
  opt = fg.optim.AdamW(model.parameters(), lr=1e-2)
  data = [(rng.standard_normal((8, 12), dtype=np.float32), rng.integers(0, 5, 8)) for _ in range(steps)]
  losses = []
  for x, y in data:
    loss = F.cross_entropy(model(fg.tensor(x, device=device)), fg.tensor(y, device=device))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
  return losses, [p.numpy() for p in model.parameters()]


def test_training_steps_equal_the_rules_run(device):
  seed = np.random.SeedSequence().entropy
  want = _mlp_steps(np.random.default_rng(seed), False, 5, device)
  before = _hits()
  got = _mlp_steps(np.random.default_rng(seed), True, 5, device)
  assert _hits() - before >= 3          # the first step (lazy initial weights) and the second record
  assert got[0] == want[0]
  for a, b in zip(got[1], want[1]): np.testing.assert_array_equal(a, b)


def test_gpt_backward_from_template_is_bitwise_the_rules():
  import sys, os
  sys.path.insert(0, os.path.dirname(__file__))
  from nanogpt_model import GPTConfig, build
  cfg = GPTConfig(block_size=16, vocab_size=33, n_layer=1, n_head=2, n_embd=16, dropout=0.0, bias=True)
  rng = np.random.default_rng()
  batches = [(rng.integers(0, 33, (4, 16)), rng.integers(0, 33, (4, 16))) for _ in range(4)]
  def run(templates):
    A.TEMPLATES = templates
    fg.manual_seed(0)
    m = build(fg)(cfg)
    opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    for x, y in batches:
      _, loss = m(fg.tensor(x), fg.tensor(y))
      opt.zero_grad()
      loss.backward()
      opt.step()
    return [p.numpy() for p in m.parameters()]
  want = run(False)
  before = _hits()
  got = run(True)
  assert _hits() - before >= 2
  for a, b in zip(got, want): np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op", ["mul", "pow", "div", "scale_then_pow"])
def test_changing_constants_reach_the_gradient(op, device):
  # x * c, x ** c, c / x: a new Python number each step is a kernel argument (same structure) but the rules may
  # fold it (pow's c - 1): a template serves the values it was made with only, so the gradient follows the value
  rng = np.random.default_rng()
  x0 = rng.uniform(0.5, 2.0, (6, 7)).astype(np.float32)
  fns = {"mul": lambda x, c: x * c, "pow": lambda x, c: x ** c, "div": lambda x, c: c / x,
         "scale_then_pow": lambda x, c: (x * (c + 1)) ** (c / 2)}
  f = fns[op]
  before = _hits()
  for c in (1.7, 2.3, 1.7, 2.3, 0.6):
    x = fg.tensor(x0, device=device, requires_grad=True)
    f(x, c).sum().backward()
    xt = torch.tensor(x0, requires_grad=True)
    f(xt, c).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
  assert _hits() - before >= 2


def test_second_backward_through_a_freed_graph_raises_on_the_template_path():
  rng = np.random.default_rng()
  w = fg.tensor(rng.standard_normal((5, 5), dtype=np.float32), requires_grad=True)
  before = _hits()
  for i in range(4):
    x = fg.tensor(rng.standard_normal((4, 5), dtype=np.float32))
    y = (x @ w).exp().sum()
    y.backward()
  assert _hits() - before >= 2
  with pytest.raises(RuntimeError, match="backward through the graph a second time"):
    y.backward()


def test_retain_graph_on_the_template_path():
  rng = np.random.default_rng()
  a = rng.standard_normal((4, 5), dtype=np.float32)
  for i in range(3):
    w = fg.tensor(a, requires_grad=True)
    y = (w.tanh() * w).sum()
    y.backward(retain_graph=True)
    y.backward()
    wt = torch.tensor(a, requires_grad=True)
    (wt.tanh() * wt).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * wt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_inplace_modification_of_a_saved_value_raises_on_the_template_path():
  rng = np.random.default_rng()
  a = rng.standard_normal((4, 5), dtype=np.float32)
  before = _hits()
  for i in range(4):    # the same structure recorded, then hit; the last time exp's saved output is written first
    w = fg.tensor(a, requires_grad=True)
    y = w.exp()
    z = y.sum()
    if i < 3:
      z.backward()
      np.testing.assert_allclose(w.grad.numpy(), np.exp(a), rtol=1e-6)
      continue
    y.add_(1)     # exp's rule reads its output
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
      z.backward()
  assert _hits() - before == 3   # the failing backward's key is a hit too: the check runs on the template path


def test_gradients_accumulate_and_are_fresh_tensors():
  rng = np.random.default_rng()
  a = rng.standard_normal((3, 4), dtype=np.float32)
  w = fg.tensor(a, requires_grad=True)
  before = _hits()
  for i in range(3): (w * w).sum().backward()
  assert _hits() - before == 2
  np.testing.assert_allclose(w.grad.numpy(), 6 * a, rtol=1e-6)
  g = w.grad
  g.mul_(0)             # a gradient is its own tensor: writing it changes nothing else
  np.testing.assert_array_equal(w.numpy(), a)


def test_a_different_structure_records_its_own_template():
  rng = np.random.default_rng()
  a = rng.standard_normal((3, 4), dtype=np.float32)
  outs = []
  for shape_op in ("sum", "mean", "sum", "mean"):
    w = fg.tensor(a, requires_grad=True)
    getattr(w.sin(), shape_op)().backward()
    outs.append(w.grad.numpy())
  np.testing.assert_allclose(outs[0], np.cos(a), rtol=1e-6)
  np.testing.assert_allclose(outs[1], np.cos(a) / a.size, rtol=1e-6)
  np.testing.assert_array_equal(outs[2], outs[0])
  np.testing.assert_array_equal(outs[3], outs[1])
