"""Python scalars that change between steps do not recompile (schedule/schedule.py: _lift_varying_scalars): after
a graph differs from an earlier one of the same structure only in some constants, those constants become
one-element input buffers, so one compiled kernel and one cached schedule serve every value."""
from __future__ import annotations
import numpy as np
import pytest
import fusegrad as fg
from fusegrad.runtime import device as rd
from fusegrad.schedule import schedule as S


def test_ten_thousand_steps_with_a_changing_scalar_compile_once(rng):
  x = fg.tensor(rng.standard_normal(1000).astype(np.float32))
  xs = x.numpy()
  dev = rd.get("CPU")
  for i in range(10_000):
    s = 3.0 + (i * 7919 % 10007) * 1e-4   # (x * 1.0 would fold to x: a different graph)
    y = (x * s + 1.5).sum()
    if i == 3: programs, misses = len(dev.programs), S.stats["schedule_misses"]
    if i % 997 == 0: np.testing.assert_allclose(y.item(), (xs * np.float32(s) + np.float32(1.5)).sum(), rtol=1e-4)
    else: y.realize()
  assert len(dev.programs) == programs and S.stats["schedule_misses"] == misses


def test_only_the_constants_that_change_are_lifted(device, rng):
  x = fg.tensor(rng.standard_normal((4, 8)).astype(np.float32), device=device)
  lifted = S.stats["scalars_lifted"]
  for i in range(4):
    got = ((x - 0.25) * (1.5 + i)).numpy()
    np.testing.assert_allclose(got, (x.numpy() - np.float32(0.25)) * np.float32(1.5 + i), rtol=1e-6)
  # the first step sees one value; each later step lifts the one constant that changes, never 0.25
  assert S.stats["scalars_lifted"] - lifted == 3
  c = rd.get(device).compiled(_kernel((x - 0.25) * 9.0))
  assert "0.25" in c.source


def test_integer_scalars_and_shapes(device, rng):
  n = fg.tensor(rng.integers(-5, 5, (3, 5)).astype(np.int64), device=device)
  for k in range(5):
    np.testing.assert_array_equal((n * k + (k - 2)).numpy(), n.numpy() * k + (k - 2))
  # a constant of a shape (fg.full) that changes, broadcast into a kernel
  for v in (1.5, -2.0, 3.25):
    np.testing.assert_allclose((fg.full((3, 5), v, device=device) + n.float()).numpy(), v + n.numpy())


def test_lifted_constants_differentiate(rng):
  w = fg.tensor(rng.standard_normal(6).astype(np.float32), requires_grad=True)
  for s in (2.0, 3.0, 4.0):
    w.grad = None
    (w * s).square().sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * s * s * w.detach().numpy(), rtol=1e-5)


def _kernel(out):
  items = [it for it in S.create_schedule([out.node]) if it.kind == "KERNEL"]
  return items[-1].kernel
