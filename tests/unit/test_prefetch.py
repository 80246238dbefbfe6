"""A staged reduction's tiles prefetched through registers (OptOp.PREFETCH, ir.Stage.prefetch): the listing's order
(the first tile before the loop over the tiles, the next tile's loads before the step's local reads, their stores
after them), the interpreter's and OpenCL's values against the plain staged kernel and numpy, and the refusals."""
from __future__ import annotations
from dataclasses import replace
import numpy as np
import pytest
import fusegrad as fg
from fusegrad.codegen import pipeline
from fusegrad.codegen.ir import AxisKind, Stage, LocalLoad
from fusegrad.codegen.linearize import Loop, End, Let, Fetch, Refill
from fusegrad.codegen.opt import Opt, OptOp, OptError, apply_opt, apply_opts
from fusegrad.runtime import device as rd
from tests.unit.kernels import one_kernel, run, make
from tests.unit.test_actions import GPU, _has_opencl

K = AxisKind
needs_opencl = pytest.mark.skipif(not _has_opencl(), reason="no OpenCL device (pyopencl) on this machine")


def _staged(k, opts):
  """The index of k's STAGE axis after opts."""
  ko = apply_opts(k, opts, GPU)
  return ko.axis_index(ko.of_kind(K.STAGE)[0].var)


def _matmul_opts(k, stage: int, buffers: int) -> tuple:
  """A 16 x 16 work-group of 2 x 2 outputs per item, the reduction staged `stage` deep and prefetched."""
  opts = (Opt(OptOp.UPCAST, 1, 2), Opt(OptOp.UPCAST, 0, 2), Opt(OptOp.LOCAL, 0, 16), Opt(OptOp.LOCAL, 3, 16))
  red = apply_opts(k, opts, GPU).axis_index(k.axes[-1].var)
  opts += (Opt(OptOp.STAGE, red, stage),)
  return opts + (Opt(OptOp.PREFETCH, _staged(k, opts), buffers),)


def _scopes(listing) -> list:
  """(statement, the loop variables around it) for each statement."""
  out, stack = [], []
  for st in listing:
    if isinstance(st, End): stack.pop()
    out.append((st, tuple(stack)))
    if isinstance(st, Loop): stack.append(st.var)
  return out


@pytest.mark.parametrize("buffers", [1, 2])
def test_listing_fetches_before_the_reads_and_refills_after(buffers, rng):
  """In the listing: each tile's Let (the first tile) before the loop over the tiles; in that loop a Fetch per tile,
  the inner loop of local reads, then one Refill for both tiles; two buffers: the reads at the step's buffer."""
  a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 64)).astype(np.float32)
  item = one_kernel(fg.Tensor(a) @ fg.Tensor(b))
  opts = _matmul_opts(item.kernel, 16, buffers)
  p = pipeline.prepare(item.kernel, GPU, opts)
  step, s = p.kernel.axes[-2].var, p.kernel.axes[-1].var
  assert (p.kernel.axes[-2].kind, p.kernel.axes[-1].kind, step.hi + 1) == (K.REDUCE, K.STAGE, 6)
  sc = _scopes(p.listing)
  kinds = [(type(st).__name__, scope) for st, scope in sc if isinstance(st, (Fetch, Refill)) or
           (isinstance(st, Let) and isinstance(st.val, Stage)) or (isinstance(st, Loop) and st.var in (step, s))]
  assert kinds == [("Let", ()), ("Let", ()), ("Loop", ()), ("Fetch", (step,)), ("Fetch", (step,)),
                   ("Loop", (step,)), ("Refill", (step,))], kinds
  tiles = [st.val for st, _ in sc if isinstance(st, Let) and isinstance(st.val, Stage)]
  assert all(t.prefetch == step and t.buffers == buffers for t in tiles), tiles
  refill = next(st for st, _ in sc if isinstance(st, Refill))
  assert refill.stages == tuple(tiles) and refill.valid == fg.graph.symbolic.Cond.range(step, 0, step.hi)
  reads = [st.val for st, scope in sc if isinstance(st, Let) and isinstance(st.val, LocalLoad)]
  assert reads and all(scope[-2:] == (step, s) for st, scope in sc if isinstance(st, Let) and
                       isinstance(st.val, LocalLoad))
  assert all((step in fg.graph.symbolic.variables(r.idx)) == (buffers == 2) for r in reads)
  want = run(item, opts[:-1])                                  # the plain staged kernel: the same sums, in order
  np.testing.assert_array_equal(run(item, opts), want)
  np.testing.assert_allclose(want, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["PYTHON"] + (["OPENCL"] if _has_opencl() else []))
def test_prefetch_inside_an_outer_loop_with_partial_copies(device, rng):
  """A convolution staged along its last reduced axis (kw): the loop over the tiles is kh, inside ci, so the first
  tiles are copied at every ci. The work-group (80 items) is larger than the tiles (the input's 10 x 3 values, the
  weight's 8 x 3): each item fetches at most one value of each, the ones past a tile none (guarded copy steps)."""
  item = one_kernel(make("conv", rng, device))                # [2, 8, 10, 10] outputs, [3, 3, 3] reduced
  want = run(item, (), device)
  opts = (Opt(OptOp.LOCAL, 3, 10), Opt(OptOp.LOCAL, 1, 8), Opt(OptOp.STAGE, 6, 3))
  assert apply_opts(item.kernel, opts, GPU).axes[6].kind is K.STAGE
  for buffers in (1, 2):
    o = opts + (Opt(OptOp.PREFETCH, 6, buffers),)
    p = pipeline.prepare(item.kernel, GPU, o)
    ci, kh = (a.var for a in p.kernel.axes[-3:-1])
    sc = _scopes(p.listing)
    tiles = [(st.val, scope) for st, scope in sc if isinstance(st, Let) and isinstance(st.val, Stage)]
    assert sorted(t.size for t, _ in tiles) == [24, 30] and p.kernel.local_size == (80,), tiles
    assert all(t.prefetch == kh and at == (ci,) for t, at in tiles), tiles
    assert [scope for st, scope in sc if isinstance(st, (Fetch, Refill))] == [(ci, kh)] * 3
    if device == "OPENCL":
      src = rd.get("OPENCL").compile_with(item.kernel, o).source
      for n in (24, 30): assert f"_r0 = ((lidx<{n})) ?" in src and f"if (((lidx<{n}))) " in src, src
    got = run(item, o, device)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if device == "PYTHON": np.testing.assert_array_equal(got, run(item, opts, device))


@pytest.mark.parametrize("device", ["PYTHON"] + (["OPENCL"] if _has_opencl() else []))
def test_prefetch_over_a_runtime_reduction(device, rng):
  """The reduction's length known at run time (fusegrad.Variable): the loop over the tiles ends at ceil(n / 16) and
  the last step fetches nothing (its condition reads the loop's end); one program serves every n."""
  a, b = rng.standard_normal((64, 80)).astype(np.float32), rng.standard_normal((80, 64)).astype(np.float32)
  ta, tb = fg.Tensor(a, device=device).realize(), fg.Tensor(b, device=device).realize()
  V = fg.Variable("n", 1, 80)
  for n in (80, 33, 16, 17, 2):   # (n = 1 is lowered as a broadcast: no load along the reduction)
    item = one_kernel(ta[:, :V.bind(n)] @ tb[:V.bind(n)])
    assert item.kernel.axes[-1].end is not None
    opts = _matmul_opts(item.kernel, 16, 2)
    got = run(item, opts, device)
    np.testing.assert_allclose(got, a[:, :n] @ b[:n], rtol=1e-4, atol=1e-4)


def test_prefetch_refuses_what_it_cannot_do(rng):
  """PREFETCH needs a staged axis with a loop over its tiles that the tiles change along, room for the buffers in
  local memory and for the fetched values in registers; each refusal says why."""
  a, b = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
  k = one_kernel(fg.Tensor(a) @ fg.Tensor(b)).kernel
  opts = _matmul_opts(k, 16, 2)
  staged = apply_opts(k, opts[:-1], GPU)
  i = opts[-1].axis
  with pytest.raises(OptError, match="only the staged axis"): apply_opt(staged, Opt(OptOp.PREFETCH, i - 1, 1), GPU)
  with pytest.raises(OptError, match="only the staged axis"): apply_opt(k, Opt(OptOp.PREFETCH, 2, 1), GPU)
  with pytest.raises(OptError, match="1 or 2 local buffers"): apply_opt(staged, Opt(OptOp.PREFETCH, i, 3), GPU)
  with pytest.raises(OptError, match="prefetched already"):
    apply_opt(apply_opt(staged, opts[-1], GPU), Opt(OptOp.PREFETCH, i, 1), GPU)
  with pytest.raises(OptError, match="no work-groups"):
    apply_opt(staged, opts[-1], replace(GPU, has_local=False))
  # the whole reduction in one tile: nothing to fetch ahead
  one = apply_opts(k, opts[:-2] + (Opt(OptOp.STAGE, opts[-2].axis, 64),), GPU)
  with pytest.raises(OptError, match="no tile has a next one"):
    apply_opt(one, Opt(OptOp.PREFETCH, one.axis_index(one.of_kind(K.STAGE)[0].var), 1), GPU)
  # two buffers of two 32 x 16 tiles (rows padded by 4: 2 x 2 x 576 floats) do not fit 8 KiB; one does
  small = replace(GPU, local_bytes=8 << 10)
  with pytest.raises(OptError, match="exceed the device's 8192"): apply_opt(staged, opts[-1], small)
  apply_opt(staged, replace(opts[-1], arg=1), small)
  # 4 outputs and 2 x 2 fetched values per item: 8 registers
  with pytest.raises(OptError, match="registers .* exceed the device's 6"):
    apply_opt(staged, opts[-1], replace(GPU, max_registers=6))
