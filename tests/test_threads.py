"""Realizing from several threads at once: every result must be the one numpy computes.

The CPU launcher once kept one global job slot, so two threads' kernels ran on each other's buffers and
returned each other's sums (a silent wrong answer); these tests run the graphs that showed it.
"""
from __future__ import annotations
import threading
import numpy as np
import pytest
import fusegrad as fg

THREADS = 4


def _run_threads(n: int, work) -> list:
  """work(i) on n threads started together; returns the exceptions raised (none expected)."""
  barrier = threading.Barrier(n)
  errors: list = []
  def body(i):
    try:
      barrier.wait()
      work(i)
    except BaseException as e:   # collected: an assertion on a worker thread would otherwise vanish
      errors.append(e)
  ts = [threading.Thread(target=body, args=(i,)) for i in range(n)]
  for t in ts: t.start()
  for t in ts: t.join()
  return errors


def _sizes(device: str) -> tuple[int, int, int]:
  # (elements of the elementwise/reduction inputs, matmul size, repetitions): the interpreter is slow
  return {"CPU": (1 << 21, 192, 5), "OPENCL": (1 << 16, 64, 3)}.get(device, (1 << 12, 16, 2))


def test_concurrent_realize_matches_numpy(device, rng):
  n, m, reps = _sizes(device)
  data = [(rng.standard_normal(n).astype(np.float32), rng.standard_normal((m, m)).astype(np.float32),
           rng.standard_normal((m, m)).astype(np.float32)) for _ in range(THREADS)]

  def work(i):
    x_np, a_np, b_np = data[i]
    x, a, b = (fg.Tensor(v, device=device) for v in (x_np, a_np, b_np))
    for _ in range(reps):
      # the reported reproducer: a long elementwise chain into a full sum, and a max
      s = ((x * 2 + 1).exp().log() - 1).sum().item()
      np.testing.assert_allclose(s, np.float64(x_np * 2).sum(), rtol=1e-3, atol=0.5)
      assert x.amax().item() == x_np.max()
      mm = (a @ b).relu().numpy()
      np.testing.assert_allclose(mm, np.maximum(a_np @ b_np, 0), rtol=1e-4, atol=1e-3)
      sm = a.softmax(1).numpy()
      e = np.exp(a_np - a_np.max(1, keepdims=True))
      np.testing.assert_allclose(sm, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
      col = (a * 3).sum(0).numpy()
      np.testing.assert_allclose(col, (a_np * 3).sum(0), rtol=1e-4, atol=1e-3)

  errors = _run_threads(THREADS, work)
  assert not errors, errors[0]


def test_threads_realize_the_same_lazy_nodes(device, rng):
  # several threads ask for one lazy graph at once: each gets the value (computed once or several times)
  n, m, reps = _sizes(device)
  for _ in range(reps):
    a_np = rng.standard_normal((m, m)).astype(np.float32)
    x_np = rng.standard_normal(n).astype(np.float32)
    a, x = fg.Tensor(a_np, device=device), fg.Tensor(x_np, device=device)
    h = (a @ a.T).tanh()         # shared intermediate: every result below reads it
    outs = [h.sum(1), h.amax(0), (h * 2).sum(), (x.sin() * 2).sum()]
    ref = np.tanh(a_np.astype(np.float64) @ a_np.T)
    refs = [ref.sum(1), ref.max(0), (ref * 2).sum(), (np.sin(x_np.astype(np.float64)) * 2).sum()]
    got: dict = {}
    def work(i):
      got[i] = [outs[(i + j) % len(outs)].numpy() for j in range(len(outs))]
    errors = _run_threads(THREADS, work)
    assert not errors, errors[0]
    for i in range(THREADS):
      for j in range(len(outs)):
        k = (i + j) % len(outs)
        np.testing.assert_allclose(got[i][j], refs[k], rtol=1e-3, atol=1e-2 if k != 3 else 0.5)


def test_jitted_function_from_threads(rng):
  # one capture, replayed by several threads: its internal buffers must not be shared by two replays at once
  step = fg.jit(lambda p, q: ((p * q).exp() + 1).log().sum(1))
  ins = [(rng.standard_normal((64, 256)).astype(np.float32), rng.standard_normal((64, 256)).astype(np.float32))
         for _ in range(THREADS)]
  for p, q in ins[:2]: step(fg.Tensor(p), fg.Tensor(q))   # warm-up and capture
  def work(i):
    p, q = ins[i]
    for _ in range(20):
      np.testing.assert_allclose(step(fg.Tensor(p), fg.Tensor(q)).numpy(), np.log(np.exp(p * q) + 1).sum(1),
                                 rtol=1e-4, atol=1e-4)
  errors = _run_threads(THREADS, work)
  assert not errors, errors[0]


def test_tracker_sees_its_own_thread(rng):
  x_np = rng.standard_normal(1000).astype(np.float32)
  seen: dict = {}
  def work(i):
    x = fg.Tensor(x_np)
    with fg.track() as t:
      for _ in range(i + 1): (x + i).exp().sum().realize()
    seen[i] = len(t.kernels)
  errors = _run_threads(3, work)
  assert not errors, errors[0]
  assert seen == {0: 1, 1: 2, 2: 3}
