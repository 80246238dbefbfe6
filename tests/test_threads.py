"""Realizing from several threads at once: every result must be the one numpy computes.

The CPU launcher once kept one global job slot, so two threads' kernels ran on each other's buffers and
returned each other's sums (a silent wrong answer); these tests run the graphs that showed it.
"""
from __future__ import annotations
import sys
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
  old = sys.getswitchinterval()
  sys.setswitchinterval(1e-5)   # switch threads often: a race in Python code shows up within a few runs
  try:
    for t in ts: t.start()
    for t in ts: t.join()
  finally:
    sys.setswitchinterval(old)
  return errors


def _sizes(device: str) -> tuple[int, int, int]:
  # (elements of the elementwise/reduction inputs, matmul size, repetitions): the interpreter is slow
  return {"CPU": (1 << 21, 192, 3), "OPENCL": (1 << 16, 64, 3)}.get(device, (1 << 10, 12, 2))


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
  # several threads ask for one lazy graph at once, each for its parts in another order: every one gets the
  # value (a node is computed once or several times), while others realize the nodes its schedule reads
  m, reps = {"CPU": (64, 12), "OPENCL": (64, 4)}.get(device, (8, 2))
  for _ in range(reps):
    a_np = rng.standard_normal((m, m)).astype(np.float32)
    a = fg.Tensor(a_np, device=device)
    h = (a @ a.T).tanh()
    g = h.softmax(1)
    z = (g * 2 + h).sum(0)
    outs = [h.sum(1), g.amax(0), z, (z * h[0]).sum(), (h + 1).exp().mean()]
    rh = np.tanh(a_np.astype(np.float64) @ a_np.T)
    e = np.exp(rh - rh.max(1, keepdims=True))
    rg = e / e.sum(1, keepdims=True)
    rz = (rg * 2 + rh).sum(0)
    refs = [rh.sum(1), rg.max(0), rz, (rz * rh[0]).sum(), np.exp(rh + 1).mean()]
    def work(i):
      for j in range(len(outs)):
        k = (i + j) % len(outs)
        np.testing.assert_allclose(outs[k].numpy(), refs[k], rtol=1e-4, atol=1e-4)
    errors = _run_threads(8, work)
    assert not errors, errors[0]


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


_MARK_SRC = r"""
#define _GNU_SOURCE
#include <unistd.h>
#include <sys/syscall.h>
/* out[i] = the id of the thread that ran item i; each chunk takes ~1 ms, so every thread of the pool claims some */
void mark_entry(void **b, long long start, long long end) {
  long long *out = (long long *)b[0], tid = (long long)syscall(SYS_gettid);
  usleep(1000);
  for (long long i = start; i < end; i++) out[i] = tid;
}
"""


def test_pool_threads_run_contiguous_ranges():
  """The CPU launcher cuts a kernel's chunks into one contiguous range per thread, and each thread claims its own
  range first (runtime/cpu_pool.c): the items each thread runs are a few runs, not every other chunk (a sum streams
  its part of memory as one stream: on a quiet Zen 4 0.65 ms against 0.96 ms for chunks taken in turn). A kernel of
  8 equal chunks on the pool: at most two runs of one thread's items per thread (its own range, and what it took
  from another's), where chunks taken in turn give up to 8."""
  import ctypes
  from types import SimpleNamespace
  from fusegrad.runtime import device as rd
  from fusegrad.runtime import cpu
  dev = rd.get("CPU")
  if dev.threads < 2: pytest.skip("the CPU device runs one thread here (FUSEGRAD_THREADS=1 or one core)")
  lib = dev.compile_library("mark_pool", _MARK_SRC)
  n, parts = 64, 8
  program = SimpleNamespace(_entry=ctypes.cast(lib.mark_entry, ctypes.c_void_p).value)
  kernel = SimpleNamespace(global_size=n, cost=cpu.PARALLEL_MIN_WORK * 4 * dev.threads, tiled=False, global_dims=())
  for _ in range(5):
    out = np.zeros(n, dtype=np.int64)
    batch = dev.prepare_batch([(program, kernel, [out])], ())
    assert batch.tmpl[2] == parts   # the count prepare_batch cut it into (cpu._parts): this test's premise
    dev.run_prepared(batch, ())
    assert (out != 0).all(), out
    chunk_tids = out[::n // parts]
    runs = 1 + int((chunk_tids[1:] != chunk_tids[:-1]).sum())
    assert runs <= 2 * len(set(chunk_tids.tolist())), chunk_tids
