"""OptOp.READAHEAD (software prefetch along a reduction loop): which loads it asks for and how far ahead, where the
hints go in the listing, how each renderer spells them, that values are unchanged on the interpreter and compiled,
and the heuristic's choice (a long matmul's panels, nothing for a short one or a convolution's windows)."""
from __future__ import annotations
import numpy as np
import pytest
import fusegrad as fg
from fusegrad.codegen import pipeline, passes
from fusegrad.codegen.ir import AxisKind
from fusegrad.codegen.linearize import Loop, PrefetchSt
from fusegrad.codegen.opt import Opt, OptOp, OptError, apply_opt, heuristic
from fusegrad.codegen.renderer.cstyle import CRenderer, OpenCLRenderer
from fusegrad.graph import symbolic as sym
from fusegrad.runtime import device as rd
from tests.unit.kernels import one_kernel, run

K = AxisKind


def _close(a, b): np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-4)


def _reduce_axis(k) -> int:
  return next(i for i, a in enumerate(k.axes) if a.kind is K.REDUCE)


def _matmul(rng, n=24, k=512, m=64):
  a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
  return one_kernel(fg.Tensor(a) @ fg.Tensor(b)), a @ b


def test_streamed_loads_ask_ahead_by_whole_steps(rng):
  """b[k, j] steps a row of 64 floats (256 bytes) per step of k: 1024 bytes ahead is 4 steps; a[i, k] steps 4 bytes a
  step and is left to the hardware. The hints sit first in the reduction's loop, and values are unchanged."""
  item, want = _matmul(rng)
  caps = rd.get("PYTHON").caps
  r = _reduce_axis(item.kernel)
  k = apply_opt(item.kernel, Opt(OptOp.READAHEAD, r, 1024), caps)
  assert k.read_ahead == ((item.kernel.axes[r].var, 1024),)
  p = pipeline.prepare(item.kernel, caps, (Opt(OptOp.READAHEAD, r, 1024),))
  hints = p.kernel.prefetches
  loads = passes.streamed_loads([st.value for st in p.kernel.stores], item.kernel.axes[r].var)
  assert len(hints) == len(loads) == 1
  (x, step), = loads
  assert step == 64 and hints[0].buf == x.buf and hints[0].idx == sym.lin(x.idx) + 64 * 4
  # first statement of the loop over k, nothing outside it
  at = [i for i, st in enumerate(p.listing) if isinstance(st, PrefetchSt)]
  assert len(at) == 1 and isinstance(p.listing[at[0] - 1], Loop) and p.listing[at[0] - 1].var == item.kernel.axes[r].var
  _close(run(item, (Opt(OptOp.READAHEAD, r, 1024),)), want)
  _close(run(item, (Opt(OptOp.READAHEAD, r, 1024),), "CPU"), want)


def test_renderers_spell_the_hint(rng):
  item, _ = _matmul(rng)
  caps = rd.get("PYTHON").caps
  p = pipeline.prepare(item.kernel, caps, (Opt(OptOp.READAHEAD, _reduce_axis(item.kernel), 512),))
  c = CRenderer().render(p.kernel, p.listing)
  assert c.count("__builtin_prefetch(b") == 1, c
  cl = OpenCLRenderer().render(p.kernel, p.listing)
  assert "__builtin_prefetch" not in cl and "/* read ahead: b" in cl, cl


def test_heuristic_reads_a_long_matmuls_panels_ahead(rng):
  """With a register tile (the CPU's caps), a long reduction's panels of columns are read ahead (heuristic.READ_AHEAD)
  and the row operand is not; values match numpy compiled and on the interpreter."""
  item, want = _matmul(rng, n=36, k=512, m=128)
  caps = rd.get("CPU").caps
  opts = heuristic.hand_coded(item.kernel, caps)
  assert opts[-1] == Opt(OptOp.READAHEAD, opts[-1].axis, heuristic.READ_AHEAD), opts
  p = pipeline.prepare(item.kernel, caps, tuple(opts))
  assert p.kernel.prefetches and all(h.buf == p.kernel.prefetches[0].buf for h in p.kernel.prefetches)
  _close(run(item, tuple(opts), "CPU"), want)
  _close(run(item, tuple(opts)), want)


def test_heuristic_leaves_short_reductions_and_windows_alone(rng):
  caps = rd.get("CPU").caps
  short, _ = _matmul(rng, n=36, k=64, m=128)      # 64 steps: under heuristic.SWAP_MIN_REDUCE
  assert not any(o.op is OptOp.READAHEAD for o in heuristic.hand_coded(short.kernel, caps))
  # a row convolution's innermost loop steps its windows by one float
  x, w = rng.standard_normal((2, 16, 12, 12)).astype(np.float32), rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
  out = fg.nn.functional.conv2d(fg.Tensor(x), fg.Tensor(w), padding=1)
  from fusegrad.schedule.schedule import create_schedule
  for it in create_schedule([out.node]):
    if it.kind == "KERNEL":
      assert not any(o.op is OptOp.READAHEAD for o in heuristic.hand_coded(it.kernel, caps)), it.kernel.name


def test_illegal_read_aheads_say_why(rng):
  item, _ = _matmul(rng)
  caps = rd.get("PYTHON").caps
  k = item.kernel
  r = _reduce_axis(k)
  g = next(i for i, a in enumerate(k.axes) if a.kind is K.GLOBAL)
  for o, why in ((Opt(OptOp.READAHEAD, g, 1024), "only a reduction loop"),
                 (Opt(OptOp.READAHEAD, r, 100), "multiple of 64"),
                 (Opt(OptOp.READAHEAD, r, 8192), "multiple of 64")):
    with pytest.raises(OptError, match=why): apply_opt(k, o, caps)
  with pytest.raises(OptError, match="already"):
    apply_opt(apply_opt(k, Opt(OptOp.READAHEAD, r, 64), caps), Opt(OptOp.READAHEAD, r, 64), caps)
  # a sum along contiguous rows steps 4 bytes a step: nothing to ask for
  s = one_kernel(fg.Tensor(rng.standard_normal((8, 512)).astype(np.float32)).sum(1))
  with pytest.raises(OptError, match="no load steps a cache line"):
    apply_opt(s.kernel, Opt(OptOp.READAHEAD, _reduce_axis(s.kernel), 1024), caps)


def test_a_later_split_of_the_loop_drops_its_hint(rng):
  """UNROLL after READAHEAD splits the loop (its variable is gone): no hint is made, and values are unchanged."""
  item, want = _matmul(rng)
  caps = rd.get("PYTHON").caps
  r = _reduce_axis(item.kernel)
  opts = (Opt(OptOp.READAHEAD, r, 1024), Opt(OptOp.UNROLL, r, 4))
  p = pipeline.prepare(item.kernel, caps, opts)
  assert p.kernel.prefetches == () and not any(isinstance(st, PrefetchSt) for st in p.listing)
  _close(run(item, opts), want)
  _close(run(item, opts, "CPU"), want)


def test_tile_chunks_are_whole_runs_of_a_panel(rng):
  """runtime/cpu._parts: a register tile's chunks hold whole runs of its innermost work-item axis (a panel's row
  blocks) where the usual count would cut them; other kernels keep the usual count. A tiled matmul launched so
  computes numpy's values."""
  from types import SimpleNamespace
  from fusegrad.runtime import cpu
  mm = lambda n, d, cost, tiled=True: SimpleNamespace(tiled=tiled, global_dims=(n // d, d), cost=cost)
  cost = 2 * 2048 ** 3
  parts = cpu._parts(mm(10944, 342, cost), 10944, 2)      # 2048^2: 32 panels of 342 row blocks
  assert 32 % parts == 0 and parts >= 2 * cpu.CHUNKS_PER_THREAD and parts < 10944 // 342 * 342
  assert cpu._parts(mm(10944, 342, cost, tiled=False), 10944, 2) == min(10944, max(8, cost // cpu.CHUNK_WORK))
  # runs already whole under the usual count (a convolution's 11 channel blocks): unchanged
  assert cpu._parts(mm(4488, 11, 2 * 10 ** 9), 4488, 2) == max(8, 2 * 10 ** 9 // cpu.CHUNK_WORK)
  a, b = rng.standard_normal((1026, 256)).astype(np.float32), rng.standard_normal((256, 512)).astype(np.float32)
  _close((fg.Tensor(a) @ fg.Tensor(b)).numpy(), a @ b)
