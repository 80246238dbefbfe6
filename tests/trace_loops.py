"""Helpers of the checked-trace tests (test_trace.py, test_trace_fuzz.py): a loop run with traces off, then on."""
from __future__ import annotations
import numpy as np
import fusegrad as fg
from fusegrad.engine import trace


def run_both(traced, make, steps: int, body):
  """body(model, opt, i) -> list of numpy arrays, for traces off then on (the `traced` fixture switches them), from
  the same seed, the parameters appended: (off results, on results, trace.stats delta of the traced run)."""
  out = []
  for flag in (False, True):
    traced(flag)
    fg.manual_seed(0)
    model, opt = make()
    before = dict(trace.stats)
    res = [body(model, opt, i) for i in range(steps)]
    res.append([p.detach().numpy().copy() for p in model.parameters()])
    out.append(res)
  return out[0], out[1], {k: trace.stats[k] - before[k] for k in before}


def assert_same(a, b):
  for x, y in zip(a, b):
    for u, v in zip(x, y): np.testing.assert_array_equal(u, v)
