"""Python numbers in a graph are kernel arguments (codegen/ir.Param), not literals of the source: a value that
changes every step (a learning rate, a loss scale, an offset) reuses one compiled program and one schedule, and
binds its value at each launch. Values a compiler simplifies on (zero, powers of two, small integers) stay
literals."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import fusegrad as fg
from fusegrad.runtime import device as rd
from fusegrad.schedule import schedule as sched
from fusegrad.schedule.schedule import create_schedule


def _kernel(t: fg.Tensor):
  items = [it for it in create_schedule([t.node]) if it.kind == "KERNEL"]
  assert len(items) == 1
  return items[0]


def test_changing_scalar_compiles_once(rng):
  """10^4 steps of an update with a new Python float each step: after the first, no program is compiled, rendered
  or scheduled again, and every step's value is right."""
  dev = rd.get("CPU")
  w0 = rng.standard_normal(64).astype(np.float32)
  g = fg.Tensor(rng.standard_normal(64).astype(np.float32))
  w = fg.Tensor(w0)
  ref = w0.copy()
  gn = g.numpy()
  lrs = rng.uniform(1e-4, 1e-2, 10_000)
  w = (w - float(lrs[0]) * g * 0.999).realize()
  ref = ref - np.float32(lrs[0]) * gn * np.float32(0.999)
  compiles, programs, prepared = dev.compiles, len(dev.programs), len(dev.by_kernel)
  misses = sched.stats["schedule_misses"]
  for i, lr in enumerate(lrs[1:]):
    w = (w - float(lr) * g * 0.999).realize()
    ref = ref - np.float32(lr) * gn * np.float32(0.999)
    if i % 2500 == 0: np.testing.assert_allclose(w.numpy(), ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(w.numpy(), ref, rtol=1e-4, atol=1e-5)
  # (counts in locals: a failing assert would otherwise print the whole device, thousands of programs)
  now = (dev.compiles, len(dev.programs), len(dev.by_kernel), sched.stats["schedule_misses"])
  assert now == (compiles, programs, prepared, misses), now


@pytest.mark.parametrize("value,literal", [(0.3, False), (1e-5, False), (-7.25, False), (2.0, True), (0.5, True),
                                           (0.0, True), (float("inf"), True)])
def test_which_constants_are_arguments(value, literal, rng):
  x = fg.Tensor(rng.standard_normal(16).astype(np.float32))
  item = _kernel(x * value + 1.0)
  assert item.kernel.params == (() if literal else (fg.float32,))
  assert item.param_values() == ([] if literal else [float(np.float32(value))])
  src = rd.get("CPU").kernel_program(item.kernel)[1]
  assert ("p0" in src) != literal


@pytest.mark.parametrize("dtype,values", [
  ("float32", (0.3, -1.7)), ("float64", (0.1, 1e-300)), ("float16", (0.3, 3.7)), ("bfloat16", (0.3, 1.9)),
  ("int32", (37, -1000003)), ("int64", (3_000_000_007, -(2 ** 40) - 3)), ("uint8", (37, 200)),
  ("uint32", (4_000_000_007, 99))])
def test_argument_values_of_every_dtype(device, dtype, values, rng):
  """Two values of one dtype through one program, each as numpy computes it in that dtype."""
  d = getattr(fg, dtype)
  npd = np.float32 if dtype == "bfloat16" else np.dtype(dtype)
  base = rng.integers(0, 50, 32) if d.is_int else rng.standard_normal(32)
  x = fg.Tensor(base.astype(npd if dtype != "bfloat16" else np.float32), device=device)
  if dtype == "bfloat16": x = x.to(fg.bfloat16)
  kernels = set()
  for v in values:
    out = x + v
    kernels.add(id(_kernel(out).kernel))
    assert out.dtype == d
    got = out.float().numpy() if dtype == "bfloat16" else out.numpy()
    if dtype == "bfloat16":
      from fusegrad.runtime.python import bf16_round_trip
      want = bf16_round_trip(bf16_round_trip(x.float().numpy()) + bf16_round_trip(np.float32(v)))
      np.testing.assert_array_equal(got, want)
    elif d.is_int:
      want = base.astype(npd) + np.array(v).astype(npd)
      np.testing.assert_array_equal(got, want)
    else:
      want = (base.astype(npd) + npd.type(v)).astype(npd)
      np.testing.assert_allclose(got, want, rtol=1e-3 if dtype == "float16" else 1e-6)
  assert len(kernels) == 1


def test_replayed_schedule_binds_this_graphs_values(device, rng):
  """A cached schedule's plan (the fast path of a repeated step) reads each run's constants."""
  a = rng.standard_normal((8, 16)).astype(np.float32)
  x = fg.Tensor(a, device=device)
  for s in (0.3, 1.7, -2.9, 0.3):
    y = ((x * s).exp().sum(1) + s / 3).numpy()
    np.testing.assert_allclose(y, np.exp(a * np.float32(s)).sum(1) + np.float32(s / 3), rtol=1e-5)


def test_padding_value_is_an_argument(device, rng):
  a = rng.standard_normal((3, 5)).astype(np.float32)
  x = fg.Tensor(a, device=device)
  for v in (3.7, -0.3):
    y = fg.nn.functional.pad(x, (1, 2), value=v) * 1.3
    np.testing.assert_allclose(y.numpy(), np.pad(a, ((0, 0), (1, 2)), constant_values=np.float32(v)) * np.float32(1.3),
                               rtol=1e-6)


def test_jit_replays_its_captured_arguments(rng):
  a = rng.standard_normal(32).astype(np.float32)

  @fg.jit
  def step(x): return (x * 0.37 + 1.1).exp()
  for _ in range(4):
    np.testing.assert_allclose(step(fg.Tensor(a)).numpy(), np.exp(a * np.float32(0.37) + np.float32(1.1)), rtol=1e-6)


def test_beam_search_on_a_kernel_with_arguments(rng, tmp_path, monkeypatch):
  monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
  a = rng.standard_normal((16, 64)).astype(np.float32)
  with fg.beam(1):
    y = (fg.Tensor(a) * 0.3 + 0.7).sum(1).numpy()
  np.testing.assert_allclose(y, (a * np.float32(0.3) + np.float32(0.7)).sum(1), rtol=1e-5)


def test_selects_of_an_argument_on_one_condition(device, rng):
  """gcc 12.2 with AVX-512 vectorized this wrong once jump threading had split the selects' paths (runtime/cpu.py
  compiles with -fno-thread-jumps): the shape of binary_cross_entropy_with_logits' gradient."""
  a = (rng.standard_normal(40) * 3).astype(np.float32)
  x = fg.Tensor(a, device=device)
  m = x <= 0
  for s in (0.05, 0.3):
    y = (fg.where(m, 0.0, s) + fg.where(m, s, 0.0)) * fg.where(m, x, -x)
    np.testing.assert_allclose(y.numpy(), np.float32(s) * -np.abs(a), rtol=1e-6)


def _programs(dev) -> int:
  return len(dev.programs) if dev.renderer is not None else len(dev.by_kernel)


def test_reads_at_another_offset_share_a_program(device, rng):
  """A view's offset into its buffer is an index argument (sym.ArgVar): an RNN's step t reading xp[t], a slice
  at another start, a padded window at another shift compile once."""
  dev = rd.get(device)
  a = rng.standard_normal((24, 40)).astype(np.float32)
  xp = fg.Tensor(a, device=device).realize()
  before = _programs(dev)
  for t in range(24):
    np.testing.assert_allclose((xp[t] * 1.5 + 0.25).numpy(), a[t] * np.float32(1.5) + np.float32(0.25), rtol=1e-5, atol=1e-6)
  for s in range(5):
    np.testing.assert_allclose((xp[:, s:s + 30] * 2).sum(1).numpy(), (a[:, s:s + 30] * 2).sum(1), rtol=1e-5, atol=1e-5)
  assert _programs(dev) - before <= 2
  # padding (a negative offset, a masked view) and flips (negative strides) at several shifts
  for s in range(3):
    got = fg.nn.functional.pad(xp, (3, 1))[s:s + 5, s:s + 20].numpy()
    np.testing.assert_array_equal(got, np.pad(a, ((0, 0), (3, 1)))[s:s + 5, s:s + 20])
    np.testing.assert_array_equal(xp.flip(1)[s:s + 4, s + 1:s + 9].numpy(), a[:, ::-1][s:s + 4, s + 1:s + 9])


def test_rnn_steps_share_programs(rng):
  """A recurrent layer's per-step kernels differ only by where they read the input projection (xp[t]: an offset
  folded through the bias add): a sequence twice as long compiles only what depends on its length."""
  dev = rd.get("CPU")
  rnn = fg.nn.RNN(8, 16)
  def run(T):
    x = rng.standard_normal((T, 2, 8)).astype(np.float32)
    with fg.track() as t:
      out, h = rnn(fg.Tensor(x))
      got = out.numpy()
    ref = torch.nn.RNN(8, 16)
    ref.load_state_dict({k: torch.tensor(v.numpy()) for k, v in rnn.state_dict().items()})
    np.testing.assert_allclose(got, ref(torch.tensor(x))[0].detach().numpy(), rtol=1e-4, atol=1e-5)
    return len(t.kernels)
  run(6)
  before = _programs(dev)
  kernels = run(12)
  assert kernels >= 12 and _programs(dev) - before <= 4   # the projection, the output, the first and last steps


def test_search_runs_kernels_with_index_arguments(rng, tmp_path, monkeypatch):
  monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
  a = rng.standard_normal((20, 64)).astype(np.float32)
  x = fg.Tensor(a).realize()
  with fg.beam(1):
    y = (x[3:19] * 0.3).sum(1).numpy()
  np.testing.assert_allclose(y, (a[3:19] * np.float32(0.3)).sum(1), rtol=1e-5, atol=1e-5)


def test_a_split_reduction_stays_in_the_schedule_cache(device, rng):
  """The partial results of a big sum are read through views the scheduler's rewrite makes (no node of the walked
  graph): their offsets are kept by the cached schedule itself, so the repeated sum is a cache hit."""
  a = rng.standard_normal(1 << 17).astype(np.float32)
  x = fg.Tensor(a, device=device).realize()
  x.sum().realize()
  misses = sched.stats["schedule_misses"]
  for _ in range(3):
    np.testing.assert_allclose(x.sum().item(), a.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)
  assert sched.stats["schedule_misses"] == misses
