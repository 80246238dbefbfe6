"""The scheduler's work is bounded by the graph's size: the backward of every conv / pool / einsum form, with
`y.sum()` as the loss, schedules with a number of lowering attempts and node visits linear in the graph (counted,
not timed). A 1x1 convolution's backward once sent the scheduler into an endless retry of a kernel it had
already cut; the gradients are checked against torch so a bounded but wrong schedule fails too."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.schedule import schedule as S

CASES = {
  "conv2d 1x1": (lambda F, x, w: F.conv2d(x, w), (1, 16, 32, 32), (16, 16, 1, 1)),
  "conv2d 3x3 padded": (lambda F, x, w: F.conv2d(x, w, padding=1), (1, 16, 32, 32), (16, 16, 3, 3)),
  "conv2d dilated": (lambda F, x, w: F.conv2d(x, w, padding=2, dilation=2), (1, 16, 32, 32), (16, 16, 3, 3)),
  "conv2d strided grouped": (lambda F, x, w: F.conv2d(x, w, stride=2, padding=1, groups=4), (2, 16, 32, 32), (16, 4, 3, 3)),
  "conv_transpose2d": (lambda F, x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
                       (1, 16, 32, 32), (16, 16, 3, 3)),
  "conv_transpose2d 1x1": (lambda F, x, w: F.conv_transpose2d(x, w), (1, 16, 32, 32), (16, 16, 1, 1)),
  "conv_transpose2d dilated": (lambda F, x, w: F.conv_transpose2d(x, w, padding=1, dilation=2), (1, 16, 32, 32), (16, 16, 3, 3)),
  "conv1d": (lambda F, x, w: F.conv1d(x, w, padding=2), (2, 8, 64), (8, 8, 5)),
  "conv_transpose1d": (lambda F, x, w: F.conv_transpose1d(x, w, stride=2), (2, 8, 64), (8, 8, 5)),
  "max_pool2d": (lambda F, x, w: F.max_pool2d(x * w, 3, stride=2, padding=1), (2, 8, 32, 32), (1, 8, 1, 1)),
  "avg_pool2d": (lambda F, x, w: F.avg_pool2d(x * w, 2), (2, 8, 32, 32), (1, 8, 1, 1)),
  "adaptive_avg_pool2d": (lambda F, x, w: F.adaptive_avg_pool2d(x * w, (7, 7)), (2, 8, 30, 30), (1, 8, 1, 1)),
  "max_pool1d": (lambda F, x, w: F.max_pool1d(x * w, 4), (2, 8, 64), (1, 8, 1)),
  "einsum bmm": (lambda F, x, w: (torch if F is torch.nn.functional else fg).einsum("bij,bjk->bik", x, w), (4, 16, 32), (4, 32, 8)),
  "einsum trace": (lambda F, x, w: (torch if F is torch.nn.functional else fg).einsum("ii,jk->jk", x, w), (32, 32), (4, 4)),
  "einsum outer": (lambda F, x, w: (torch if F is torch.nn.functional else fg).einsum("i,j->ij", x, w), (32,), (16,)),
  "einsum contraction": (lambda F, x, w: (torch if F is torch.nn.functional else fg).einsum("abc,cbd->ad", x, w), (4, 5, 6), (6, 5, 3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_backward_schedules_in_linear_work(name, rng):
  fn, xs, ws = CASES[name]
  x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
  fx, fw = fg.tensor(x, requires_grad=True), fg.tensor(w, requires_grad=True)
  fn(F, fx, fw).sum().backward()
  roots = [fx.grad.node, fw.grad.node]
  nodes = {id(n) for r in roots for n in r.toposort()}
  S._schedule_cache.clear(); S._lower_cache.clear()
  S.stats.update(lower_calls=0, nodes_walked=0)
  fg.realize(fx.grad, fw.grad)
  assert S.stats["lower_calls"] <= len(nodes), S.stats
  assert S.stats["nodes_walked"] <= 8 * len(nodes) + 64, S.stats
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  fn(torch.nn.functional, tx, tw).sum().backward()
  np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(fw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_transformer_step_schedules_in_linear_work():
  """A whole training step (forward, backward, AdamW) of a small transformer: each kernel is lowered about once
  (a restart-from-scratch scheduler lowered ten times as many)."""
  import sys, os
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
  from charlm import CharTransformer
  fg.manual_seed(0)
  m = CharTransformer(vocab=32, ctx=16, dim=32, heads=2, layers=2)
  opt = fg.optim.AdamW(m.parameters(), lr=1e-3)
  b = np.random.default_rng(0).integers(0, 32, (4, 17))
  loss = F.cross_entropy(m(fg.tensor(b[:, :-1])).reshape(-1, 32), fg.tensor(b[:, 1:]).reshape(-1))
  loss.backward()
  grads = [p.grad for p in m.parameters()]
  roots = [g.node for g in grads] + [loss.node]
  nodes = {id(n) for r in roots for n in r.toposort()}
  S._schedule_cache.clear(); S._lower_cache.clear()
  S.stats.update(lower_calls=0, nodes_walked=0)
  fg.realize(loss, *grads)
  assert S.stats["lower_calls"] <= len(nodes) // 2, (S.stats, len(nodes))
  assert S.stats["nodes_walked"] <= 8 * len(nodes), (S.stats, len(nodes))
  assert np.isfinite(loss.item())


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrence_schedules_in_linear_work(kind, rng):
  """A recurrent layer's forward and backward over T steps: its state's chain (c_t = f * c_{t-1} + i * g, and the
  gradient's chain backwards) is stored every few steps (rule shared_value), so the scheduler's work grows about
  linearly with T. Unbounded, every step's kernel inlined the whole chain before it: 4 times the steps took 12
  times the lowering work and 29 times the region walks (an LSTM at T = 32: 240k nodes lowered and 4M region
  visits, against 29k and 111k; its first step 18 s against 1.1). The gradients
  are checked against torch's."""
  def work(T):
    m = getattr(fg.nn, kind)(8, 16)
    tm = getattr(torch.nn, kind)(8, 16)
    m.load_state_dict({k: fg.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})
    x = rng.standard_normal((T, 2, 8)).astype(np.float32)
    fx, tx = fg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, _ = m(fx)
    (out * out).sum().backward()
    S._schedule_cache.clear(); S._lower_cache.clear()
    S.stats.update(lower_calls=0, nodes_walked=0, region_visits=0)
    fg.realize(fx.grad, *[p.grad for p in m.parameters()])
    got = dict(S.stats)
    tout, _ = tm(tx)
    (tout * tout).sum().backward()
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-3, atol=1e-4)
    for p, tp in zip(m.parameters(), tm.parameters()):
      np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-3, atol=1e-3)
    return got
  short, long = work(8), work(32)
  for k in ("lower_calls", "nodes_walked"):
    assert long[k] <= 6 * short[k], (k, short, long)
  # (the weight gradients sum over all steps: each cut lowering finds in their region walks it again, a few set
  # operations a node; 7-8x here, against 29x unbounded)
  assert long["region_visits"] <= 12 * short["region_visits"], (short, long)
