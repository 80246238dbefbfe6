"""Eager steps reuse their schedules: a graph of the same structure is scheduled once and its plan replayed.

The cache key is the graph's structure (ops, shapes, dtypes, constants, views, which nodes are realized), never
the buffers: these tests count schedule misses, lowerings and replays (schedule.stats), and check that every
replayed or re-scheduled result equals numpy or the step-by-step path.
"""
from __future__ import annotations
import sys
import threading
import traceback
import numpy as np
import pytest
import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad.engine import realize as R, trace
from fusegrad.schedule import schedule as S


def _counts() -> dict:
  return dict(S.stats)


def _delta(before: dict) -> dict:
  return {k: S.stats[k] - before[k] for k in ("schedule_hits", "schedule_misses", "lower_calls", "replays")}


def _f(x, y, c=2.0):
  return ((x * c + 1) @ y).relu().sum(0)


def _f_np(x, y, c=2.0):
  return np.maximum((x * np.float32(c) + 1) @ y, 0).sum(0)


def test_second_identical_step_replays(device, rng):
  S._schedule_cache.clear()
  a, b = rng.standard_normal((2, 6, 5), dtype=np.float32), rng.standard_normal((2, 5, 7), dtype=np.float32)
  out = _f(fg.tensor(a[0], device=device), fg.tensor(b[0], device=device)).numpy()
  np.testing.assert_allclose(out, _f_np(a[0], b[0]), rtol=1e-5, atol=1e-5)
  before = _counts()
  out = _f(fg.tensor(a[1], device=device), fg.tensor(b[1], device=device)).numpy()   # new buffers, same structure
  np.testing.assert_allclose(out, _f_np(a[1], b[1]), rtol=1e-5, atol=1e-5)
  d = _delta(before)
  assert d == {"schedule_hits": 1, "schedule_misses": 0, "lower_calls": 0, "replays": 1}


def test_replay_equals_step_by_step(device, rng):
  x, y = rng.standard_normal((2, 8, 8), dtype=np.float32)
  def run():
    t = (fg.tensor(x, device=device).exp() * fg.tensor(y, device=device)).softmax(-1)
    return (t @ t.T).sum(1).numpy()
  run()
  with R.no_replay(): want = run()
  before = _counts()
  got = run()
  assert _delta(before)["replays"] == 1
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("change", ["shape", "dtype", "constant", "structure"])
def test_a_changed_graph_misses_and_computes(device, rng, change):
  S._schedule_cache.clear()
  a, b = rng.standard_normal((6, 5), dtype=np.float32), rng.standard_normal((5, 7), dtype=np.float32)
  _f(fg.tensor(a, device=device), fg.tensor(b, device=device)).numpy()
  before = _counts()
  if change == "shape":
    a2 = rng.standard_normal((4, 5), dtype=np.float32)
    got, want = _f(fg.tensor(a2, device=device), fg.tensor(b, device=device)).numpy(), _f_np(a2, b)
  elif change == "dtype":
    got = _f(fg.tensor(a, device=device).double(), fg.tensor(b, device=device).double()).numpy()
    want = np.maximum((a.astype(np.float64) * 2 + 1) @ b.astype(np.float64), 0).sum(0)
    assert got.dtype == np.float64
  elif change == "constant":
    got, want = _f(fg.tensor(a, device=device), fg.tensor(b, device=device), 3.0).numpy(), _f_np(a, b, 3.0)
  else:
    got = ((fg.tensor(a, device=device) * 2 - 1) @ fg.tensor(b, device=device)).relu().sum(0).numpy()
    want = np.maximum((a * 2 - 1) @ b, 0).sum(0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  d = _delta(before)
  assert d["schedule_misses"] == 1 and d["replays"] == 0


def test_signed_zero_constants_are_different_kernels(device):
  x = fg.tensor([1.0, 2.0], device=device)
  assert (1 / (x * 0.0)).numpy().tolist() == [np.inf, np.inf]
  assert (1 / (x * -0.0)).numpy().tolist() == [-np.inf, -np.inf]
  assert (1 / (x * 0.0)).numpy().tolist() == [np.inf, np.inf]


def test_shared_input_is_not_two_inputs(device, rng):
  """x * y and x * x have different structures (one input slot or two), whatever the shapes."""
  a, b = rng.standard_normal((2, 16), dtype=np.float32)
  x, y = fg.tensor(a, device=device), fg.tensor(b, device=device)
  for _ in range(2):
    np.testing.assert_allclose((x * y + 1).numpy(), a * b + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose((x * x + 1).numpy(), a * a + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose((y * x + 1).numpy(), b * a + 1, rtol=1e-6, atol=1e-6)


def test_a_node_realized_before_is_an_input(device, rng):
  """The same expression over a node realized beforehand is another structure (an input slot, not a subgraph)."""
  S._schedule_cache.clear()
  a = rng.standard_normal(32, dtype=np.float32)
  misses = []
  for realize_first in (False, True, False, True):
    x = fg.tensor(a, device=device)
    z = x * 3
    if realize_first: z.realize()
    before = _counts()
    np.testing.assert_allclose(((z + 1) * z).sum().numpy(), ((a * 3 + 1) * (a * 3)).sum(), rtol=1e-4)
    misses.append(_delta(before)["schedule_misses"])
  assert misses == [1, 1, 0, 0]


def test_in_place_through_views_keeps_replaying(device, rng):
  a = rng.standard_normal((4, 6), dtype=np.float32)
  x = fg.tensor(a, device=device)
  want = a.copy()
  before = _counts()
  for i in range(4):
    v = x[1:3]
    v.add_(i + 1.0)
    x.mul_(0.5)
    want[1:3] += i + 1.0
    want *= 0.5
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(v.numpy(), want[1:3], rtol=1e-6)
  assert S.stats["replays"] > before["replays"]


def _train(device, data, replay: bool, steps: int = 5):
  fg.manual_seed(0)
  model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
  opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  sched = fg.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
  losses = []
  ctx = R.no_replay() if not replay else _nothing()
  with ctx:
    for i in range(steps):
      x, y = data[i % len(data)]
      loss = F.cross_entropy(model(fg.tensor(x, device=device)), fg.tensor(y, device=device))
      opt.zero_grad()
      loss.backward()
      opt.step()
      sched.step()
      losses.append(loss.item())
  return losses, [p.numpy() for p in model.parameters()]


class _nothing:
  def __enter__(self): return self
  def __exit__(self, *a): return False


def test_training_steps_equal_the_step_by_step_path(device, rng, monkeypatch):
  # (the realize's replay alone: a checked trace, engine/trace.py, would replay the whole step; tests/test_trace.py)
  monkeypatch.setattr(trace, "ENABLED", False)
  data = [(rng.standard_normal((8, 6), dtype=np.float32), rng.integers(0, 3, 8)) for _ in range(2)]
  _train(device, data, True, 2)   # compiles
  want_l, want_p = _train(device, data, False)
  before = _counts()
  got_l, got_p = _train(device, data, True)
  d = _delta(before)
  assert d["replays"] >= 5 and d["lower_calls"] == 0
  assert got_l == want_l
  for g, w in zip(got_p, want_p): np.testing.assert_array_equal(g, w)


def test_tracking_sees_every_kernel_of_a_cached_schedule(rng):
  a, b = rng.standard_normal((6, 5), dtype=np.float32), rng.standard_normal((5, 7), dtype=np.float32)
  _f(fg.tensor(a), fg.tensor(b)).numpy()
  with fg.track() as t1: _f(fg.tensor(a), fg.tensor(b)).numpy()
  with fg.track() as t2: _f(fg.tensor(a), fg.tensor(b)).numpy()
  assert len(t1.kernels) == len(t2.kernels) > 0


def test_threads_replay_the_same_structure(rng):
  data = [(rng.standard_normal((6, 5), dtype=np.float32), rng.standard_normal((5, 7), dtype=np.float32))
          for _ in range(4)]
  _f(fg.tensor(data[0][0]), fg.tensor(data[0][1])).numpy()
  errors = []
  def work(i):
    try:
      a, b = data[i]
      for _ in range(20):
        np.testing.assert_allclose(_f(fg.tensor(a), fg.tensor(b)).numpy(), _f_np(a, b), rtol=1e-5, atol=1e-5)
    except BaseException:   # with its traceback: a race shows where it happened
      errors.append(traceback.format_exc())
  old = sys.getswitchinterval()
  sys.setswitchinterval(1e-5)
  try:
    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts: t.start()
    for t in ts: t.join()
  finally:
    sys.setswitchinterval(old)
  assert not errors, errors[0]


def test_nodes_are_invisible_to_the_garbage_collector_and_freed_by_reference_counts(rng):
  """A step's nodes cost Python's collector nothing (graph/node.py: untracked), and still die with their last
  reference: nothing leaks, with the collector never run."""
  import gc
  import weakref
  from fusegrad.graph import node as gn
  if gn._untrack is None: pytest.skip("not CPython: nodes stay tracked (correct, only slower)")
  gc.disable()
  try:
    x = fg.tensor(rng.standard_normal((4, 8)).astype(np.float32), requires_grad=True)
    y = ((x * 2).exp().sum(1) + x.T.mean(0)).relu()
    nodes = y.node.toposort()
    assert len(nodes) >= 4
    assert not any(gc.is_tracked(n) or (n.src and gc.is_tracked(n.src)) for n in nodes)
    refs = [weakref.ref(n) for n in nodes if n is not x.node]   # (x keeps its own)
    y.backward(fg.ones_like(y))
    np.testing.assert_allclose(x.grad.numpy().shape, (4, 8))
    del y, nodes
    x.grad = None
    assert all(r() is None for r in refs), "a node outlived its last reference"
  finally:
    gc.enable()


def test_the_loss_is_computed_with_the_optimizer_step(device, rng):
  """backward() asks for its scalar loss with the next realize (realize.later): the optimizer step's realize
  computes it, and `loss.item()` afterwards runs no kernel (a realize of its own, every step, before)."""
  import torch
  w0 = rng.standard_normal((8, 4)).astype(np.float32)
  x0 = rng.standard_normal((16, 8)).astype(np.float32)
  lin = nn.Linear(8, 4)
  lin.weight = nn.Parameter(fg.tensor(w0.T.copy(), device=device))
  lin.bias = nn.Parameter(fg.zeros(4, device=device))
  opt = fg.optim.SGD(lin.parameters(), lr=0.1)
  tl = torch.nn.Linear(8, 4)
  with torch.no_grad():
    tl.weight.copy_(torch.tensor(w0.T)); tl.bias.zero_()
  topt = torch.optim.SGD(tl.parameters(), lr=0.1)
  for _ in range(3):
    loss = F.softplus(lin(fg.tensor(x0, device=device))).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    with fg.track() as t:
      v = loss.item()
    assert t.kernels == [], [k.name for k in t.kernels]
    tloss = torch.nn.functional.softplus(tl(torch.tensor(x0))).mean()
    topt.zero_grad(); tloss.backward(); topt.step()
    np.testing.assert_allclose(v, tloss.item(), rtol=1e-5)
