"""The in-memory program cache is bounded (LRU, FUSEGRAD_MAX_PROGRAMS): an evicted CPU program's shared
library is unloaded once nothing can run it any more, and a program still held (by a jit capture) is not."""
from __future__ import annotations
import gc
import os
import subprocess
import sys
import textwrap
import numpy as np
import pytest
import fusegrad as fg
from fusegrad.runtime import device as rd
from fusegrad.schedule.schedule import create_schedule


def _mapped(prefix: str) -> set:
  """Paths under prefix that this process has mapped (a kernel library's file is deleted once loaded)."""
  out = set()
  with open("/proc/self/maps") as f:
    for line in f:
      parts = line.split(maxsplit=5)
      if len(parts) == 6 and parts[5].startswith(prefix): out.add(parts[5].strip().removesuffix(" (deleted)"))
  return out


@pytest.fixture
def small_bound(device):
  dev = rd.get(device)
  old = dev.max_programs
  dev.max_programs = 3
  yield dev
  dev.max_programs = old


def _distinct(device, i: int, rng) -> tuple:
  """A kernel no other test compiles (its size and a literal constant, a power of two, are in the source; other
  numbers are kernel arguments) and its expected value."""
  x = rng.standard_normal(1000 + i).astype(np.float32)
  c = 2.0 ** -(i + 5)
  return fg.Tensor(x, device=device) * 3.25 + c, x * np.float32(3.25) + np.float32(c)


def test_program_cache_is_lru_bounded(device, small_bound, rng):
  dev = small_bound
  srcs = []
  for i in range(6):
    t, ref = _distinct(device, i, rng)
    k = create_schedule([t.node])[-1].kernel
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-6, atol=1e-5)   # an FMA may round once
    srcs.append(dev.kernel_program(k)[1])
    assert len(dev.programs) <= 3 and len(dev.by_kernel) <= 6
  assert len(set(srcs)) == 6
  if dev.renderer is not None:
    assert list(dev.programs) == srcs[3:]        # least recently used first
  # an evicted program is compiled again when needed, and becomes the most recent entry
  t, ref = _distinct(device, 0, rng)
  np.testing.assert_allclose(t.numpy(), ref, rtol=1e-6, atol=1e-5)   # an FMA may round once
  if dev.renderer is not None:
    assert list(dev.programs) == srcs[4:] + [srcs[0]]
    # a hit moves its program to the recent end
    t, ref = _distinct(device, 4, rng)
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-6, atol=1e-5)   # an FMA may round once
    assert list(dev.programs) == [srcs[5], srcs[0], srcs[4]]


def test_evicted_cpu_library_is_unloaded_when_unreferenced(rng):
  dev = rd.get("CPU")
  old = dev.max_programs
  dev.max_programs = 2
  try:
    step = fg.jit(lambda a: (a * 1.75 + 0.125).sqrt().sum())
    x = np.abs(rng.standard_normal(777)).astype(np.float32)
    ref = np.sqrt(x * np.float32(1.75) + np.float32(0.125)).sum()
    for _ in range(3): np.testing.assert_allclose(step(fg.Tensor(x)).numpy(), ref, rtol=1e-5)   # captured
    captured = [it[2] for c in step._captures.values() if not isinstance(c, str) for it in c.items
                if it[0] == "kernel"]
    assert captured
    paths = {p.lib.dll._name for p in captured}
    assert paths <= _mapped(dev._tmp)
    for i in range(4): _distinct("CPU", 50 + i, rng)[0].realize()     # evicts the captured programs
    assert not any(p in dev.programs.values() for p in captured)
    gc.collect()
    assert paths <= _mapped(dev._tmp), "a program a capture still runs was unloaded"
    np.testing.assert_allclose(step(fg.Tensor(x)).numpy(), ref, rtol=1e-5)   # the replay still runs them
    del captured
    step.reset()
    gc.collect()
    assert not paths & _mapped(dev._tmp), "evicted libraries stay loaded after their last user went"
  finally:
    dev.max_programs = old


def test_failed_load_reports_its_cause(monkeypatch):
  # the compiler accepted the kernel; loading it failed (no mappings left, a noexec temp dir): say so
  from fusegrad.runtime import cpu
  dev = rd.get("CPU")
  def refuse(binary): raise OSError("failed to map segment from shared object")
  monkeypatch.setattr(dev, "_load", refuse)
  with pytest.raises(cpu.LoadError, match="could not load the compiled kernel .*failed to map segment"):
    dev.compile("k", "void k(void) {}\nvoid k_entry(void **b, long long s, long long e) {}\n")


CHILD = textwrap.dedent("""
  import numpy as np, fusegrad as fg
  from fusegrad.runtime import device as rd
  dev = rd.get("CPU")
  def maps():
    with open("/proc/self/maps") as f: lines = f.read().splitlines()
    return len(lines), len({l.split(maxsplit=5)[5] for l in lines if l.split(maxsplit=5)[5:] and dev._tmp in l})
  base = None
  for i in range(150):
    x = np.arange(300 + i, dtype=np.float32)
    np.testing.assert_allclose((fg.Tensor(x) * 2 + i).numpy(), x * 2 + i)
    if i == 20: base = maps()
  print(base[0], base[1], *maps(), len(dev.programs))
""")


@pytest.mark.slow
def test_many_distinct_kernels_keep_mappings_bounded(tmp_path):
  env = {**os.environ, "FUSEGRAD_MAX_PROGRAMS": "16", "FUSEGRAD_CACHE_DIR": str(tmp_path / "cache"),
         "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
  r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=900)
  assert r.returncode == 0, r.stderr
  maps_then, libs_then, maps_now, libs_now, programs = map(int, r.stdout.split())
  assert programs == 16
  assert libs_now <= 16 + 1, libs_now          # the cached programs and the launcher
  assert libs_now <= libs_then                 # steady after the cache filled (it held 16 at kernel 20 too)
  assert maps_now <= maps_then + 20, (maps_then, maps_now)   # 130 more kernels, no more mappings


RSS_CHILD = r"""
import numpy as np, fusegrad as fg
def rss():
  for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"): return int(line.split()[1]) // 1024
w = fg.tensor(np.random.rand(256).astype(np.float32))
def steps(n, base):
  for i in range(n):
    (w * base + 0.5).relu().sum().realize()
def shapes(lo, hi):
  for n in range(lo, hi):
    (fg.ones(n, 3) * 2 + fg.arange(3)).sum(0).realize()
steps(300, 1.5); shapes(8, 40)
mid = rss()
steps(3000, 2.5); shapes(40, 72)
print(mid, rss())
"""


@pytest.mark.slow
def test_long_run_memory_stays_flat(tmp_path):
  """Thousands of steps and dozens of new shapes, past a small program bound: RSS after the warm-up stays flat
  (programs are evicted and unloaded, replayed steps allocate nothing that stays)."""
  env = {**os.environ, "FUSEGRAD_MAX_PROGRAMS": "16", "FUSEGRAD_CACHE_DIR": str(tmp_path / "cache"),
         "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
  r = subprocess.run([sys.executable, "-c", RSS_CHILD], capture_output=True, text=True, env=env, timeout=900)
  assert r.returncode == 0, r.stderr
  mid, end = map(int, r.stdout.split())
  assert end - mid <= 24, (mid, end)
