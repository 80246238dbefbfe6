"""Each optimizer action against the numpy interpreter: the kernel with the action gives the unoptimized
kernel's result (up to float reassociation), and an illegal action raises OptError saying why."""
from __future__ import annotations
import random
import numpy as np
import pytest
import fusegrad as fg
from fusegrad.codegen.ir import AxisKind
from fusegrad.codegen.opt import Opt, OptOp, OptError, apply_opt, apply_opts
from fusegrad.codegen.renderer.base import Caps
from fusegrad.codegen.opt import heuristic
from fusegrad.runtime import device as rd
from fusegrad.graph import symbolic as sym
from tests.unit.kernels import one_kernel, run, make, NAMES

K = AxisKind


def _close(a, b):
  if a.dtype.kind in "iub": np.testing.assert_array_equal(a, b)
  # reassociated float32 sums: the kernels reduce up to 2048 standard normals (|sum| ~ 45, rounding ~1e-4 where it
  # cancels to near zero)
  else: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-4)


def _legal_actions(k, caps):
  """Every single action that applies to k (small amounts)."""
  out = []
  for i, a in enumerate(k.axes):
    for op in OptOp:
      args = [j for j in range(len(k.axes)) if j != i] if op is OptOp.SWAP else [2, 3, 4, 8, 16, a.size]
      for n in sorted(set(args)):
        try: apply_opt(k, Opt(op, i, n), caps)
        except OptError: continue
        out.append(Opt(op, i, n))
  return out


@pytest.mark.parametrize("name", NAMES)
def test_every_single_action_keeps_the_result(name, rng):
  item = one_kernel(make(name, rng))
  want = run(item, ())
  caps = rd.get("PYTHON").caps
  acts = _legal_actions(item.kernel, caps)
  assert acts, f"no action applies to {item.kernel.axes}"
  for o in acts: _close(run(item, (o,)), want)


@pytest.mark.parametrize("name", NAMES)
def test_random_action_sequences_keep_the_result(name, rng):
  """The fuzzer of actions: random legal sequences of up to four actions."""
  item = one_kernel(make(name, rng))
  want = run(item, ())
  caps = rd.get("PYTHON").caps
  r = random.Random(int(rng.integers(1 << 30)))
  for _ in range(6):
    k, seq = item.kernel, []
    for _ in range(r.randint(1, 4)):
      acts = _legal_actions(k, caps)
      if not acts: break
      o = r.choice(acts)
      k = apply_opt(k, o, caps)
      seq.append(o)
    _close(run(item, tuple(seq)), want)


def test_upcast_splits_an_axis_and_unroll_keeps_order(rng):
  item = one_kernel(make("sum_rows", rng))
  k, caps = item.kernel, rd.get("PYTHON").caps
  assert [a.kind for a in k.axes] == [K.GLOBAL, K.REDUCE]
  k2 = apply_opt(k, Opt(OptOp.UPCAST, 0, 8), caps)
  assert [(a.kind, a.size) for a in k2.axes] == [(K.GLOBAL, 5), (K.UPCAST, 8), (K.REDUCE, 64)]
  assert k2.opts == (Opt(OptOp.UPCAST, 0, 8),)
  # unrolling a reduction updates one accumulator in the loop's order: the same bits as the loop
  np.testing.assert_array_equal(run(item, (Opt(OptOp.UNROLL, 1, 4),)), run(item, ()))


def test_illegal_actions_say_why(rng):
  item = one_kernel(make("sum_rows", rng))
  k = item.kernel
  cpu = rd.get("CPU").caps
  with pytest.raises(OptError, match="does not divide"): apply_opt(k, Opt(OptOp.UPCAST, 0, 3), cpu)
  with pytest.raises(OptError, match="no work-groups"): apply_opt(k, Opt(OptOp.LOCAL, 0, 8), cpu)
  with pytest.raises(OptError, match="only a reduction axis unrolls"): apply_opt(k, Opt(OptOp.UNROLL, 0, 8), cpu)
  with pytest.raises(OptError, match="has 2 axes"): apply_opt(k, Opt(OptOp.UPCAST, 5, 2), cpu)
  with pytest.raises(OptError, match="one kind"): apply_opt(k, Opt(OptOp.SWAP, 0, 1), cpu)
  with pytest.raises(OptError, match="exceed the device"):
    k2 = apply_opt(k, Opt(OptOp.UPCAST, 1, 64), cpu)
    apply_opt(k2, Opt(OptOp.UPCAST, 0, 40), cpu)


def test_padto_computes_nothing_past_the_size(rng):
  item = one_kernel(make("sum_rows", rng))     # 40 rows
  want = run(item, ())
  caps = rd.get("PYTHON").caps
  opts = (Opt(OptOp.PADTO, 0, 16), Opt(OptOp.UPCAST, 0, 16), Opt(OptOp.PADTO, 2, 24), Opt(OptOp.UPCAST, 2, 3))
  k = item.kernel
  for o in opts: k = apply_opt(k, o, caps)
  assert [a.size for a in k.axes] == [3, 16, 24, 3]   # 40 -> 48 rows, 64 -> 72 columns
  _close(run(item, opts), want)


def test_padded_output_rows_read_in_bounds_without_conditions(rng):
  """A padded output axis (no reduction folds it) reads its padded indices at index % size, unguarded: their values
  reach only the stores the padding guards. A padded reduction axis still adds the identity there."""
  from fusegrad.codegen.ir import Load, toposort
  from fusegrad.graph import symbolic as sym
  item = one_kernel(make("sum_rows", rng))     # 40 rows x 64
  caps = rd.get("PYTHON").caps
  k = apply_opt(item.kernel, Opt(OptOp.PADTO, 0, 16), caps)
  rows = k.axes[0].var
  loads = [v for st in k.stores for v in toposort([st.value]) if isinstance(v, Load)]
  assert loads and all(rows not in x.valid.variables() for x in loads)
  assert all(rows in st.valid.variables() for st in k.stores)      # the padded rows store nothing
  for x in loads:   # every padded row reads a real one
    seen = {sym.evaluate(x.idx, {rows: r, k.axes[1].var: 0}) for r in range(48)}
    assert max(seen) < 40 * 64 and min(seen) >= 0
  want = run(item, ())
  _close(run(item, (Opt(OptOp.PADTO, 0, 16), Opt(OptOp.UPCAST, 0, 16))), want)
  kr = apply_opt(item.kernel, Opt(OptOp.PADTO, 1, 48), caps)   # the reduction: 64 -> 96, guarded
  red = kr.axes[1].var
  assert any(red in x.valid.variables() for st in kr.stores for x in toposort([st.value]) if isinstance(x, Load))
  _close(run(item, (Opt(OptOp.PADTO, 1, 48),)), want)


def test_heuristic_tiles_a_matmul(rng):
  item = one_kernel(make("matmul_big", rng))
  caps = _avx512(rd.get("CPU").caps)   # (an AVX2 machine's tile: test_heuristic_pads_rows_to_the_tile_that_fits)
  opts = heuristic.hand_coded(item.kernel, caps)
  # rows, a vector of columns (and where the tile fits several, more vectors of columns); a reduction of 8 steps
  # keeps the columns fastest (heuristic.SWAP_MIN_REDUCE)
  assert [o.op for o in opts] in ([OptOp.UPCAST] * 2, [OptOp.UPCAST] * 3), opts
  assert (opts[0].arg, opts[1].arg) == (heuristic.ROW_LANES, heuristic.tile_lanes(caps))
  if len(opts) == 3: assert opts[2].arg == heuristic.tile_shape(caps)[1]
  # a long reduction: the row blocks run fastest (neighbouring work items share a panel of columns in cache), and the
  # columns, a row of 64 floats (a cache line) a step, are read ahead
  a, b = rng.standard_normal((64, 512)).astype(np.float32), rng.standard_normal((512, 64)).astype(np.float32)
  long = one_kernel(fg.Tensor(a) @ fg.Tensor(b))
  lopts = heuristic.hand_coded(long.kernel, caps)
  assert [o.op for o in lopts[-2:]] == [OptOp.SWAP, OptOp.READAHEAD], lopts
  assert lopts[-1].arg == heuristic.READ_AHEAD
  _close(run(long, tuple(lopts)), a @ b)


def test_thin_tiles_take_partial_sums(rng):
  """A small product ([20, 800] @ [800, 200]: an LSTM step's gradient) keeps Caps.tile_items work items: with 64 its
  tile is 2 rows x 1 vector (2 accumulators), with 16 (a 2-thread CPU) 4 rows x 1; either way its reduction takes
  partial sums beside them, 8 vector accumulators in all (heuristic.TILE_MIN_ACCUMULATORS). Values match numpy on the
  interpreter and compiled."""
  from dataclasses import replace
  a, b = rng.standard_normal((20, 800)).astype(np.float32), rng.standard_normal((800, 200)).astype(np.float32)
  item = one_kernel(fg.Tensor(a) @ fg.Tensor(b))
  for items, rows in ((0, 2), (16, 4)):
    caps = replace(_avx512_gcc(rd.get("CPU").caps), tile_items=items)
    opts = heuristic.hand_coded(item.kernel, caps)
    ups = [o for o in opts if o.op is OptOp.UPCAST]
    assert ups[0].arg == rows and ups[1].arg == 16, opts
    k = apply_opts(item.kernel, opts, caps)
    red = [x for x in k.axes if x.kind is AxisKind.UPCAST and x.var in
           {v for r in heuristic._reduces(k) for v in r.loops}]
    assert len(red) == 1 and rows * red[0].size == heuristic.TILE_MIN_ACCUMULATORS, opts
    _close(run(item, tuple(opts)), a @ b)
    _close(run(item, tuple(opts), "CPU"), a @ b)


def test_gcc_avx512_tile_is_six_rows_of_four_vectors(rng):
  """With gcc on AVX-512 the register tile is 6 rows x 4 vectors of 16 columns (24 of the 32 registers; rows padded
  to a multiple of 6 where that wastes little); values match numpy on the interpreter and compiled."""
  for n in (96, 100):
    a, b = rng.standard_normal((n, 64)).astype(np.float32), rng.standard_normal((64, 256)).astype(np.float32)
    item = one_kernel(fg.Tensor(a) @ fg.Tensor(b))
    caps = _avx512_gcc(rd.get("PYTHON").caps)
    opts = heuristic.hand_coded(item.kernel, caps)
    ups = [o.arg for o in opts if o.op is OptOp.UPCAST]
    assert ups == [6, 16, 4], opts
    assert any(o.op is OptOp.PADTO for o in opts) == (n % 6 != 0), opts
    _close(run(item, tuple(opts), caps=caps), a @ b)
    _close(run(item, tuple(opts), "CPU", caps), a @ b)


# the actions that shape a register tile (a tile may be followed by others: a read-ahead hint)
_TILE_OPS = (OptOp.UPCAST, OptOp.PADTO, OptOp.SWAP)


def test_weight_gradient_keeps_its_columns_fastest(rng):
  """A product whose row operand is read across its long reduction (a weight gradient g^T x over a batch: each step's
  rows are one line of g) keeps the column blocks fastest (no SWAP); a matmul reading its rows along the reduction
  still runs its row blocks fastest. Values as numpy's on the interpreter and compiled."""
  caps = _avx512_gcc(rd.get("PYTHON").caps)
  g, x = rng.standard_normal((512, 192)).astype(np.float32), rng.standard_normal((512, 128)).astype(np.float32)
  item = one_kernel(fg.Tensor(g).T @ fg.Tensor(x))
  opts = heuristic.hand_coded(item.kernel, caps)
  assert [o.op for o in opts if o.op in _TILE_OPS] == [OptOp.UPCAST] * 3, opts
  _close(run(item, tuple(opts), caps=caps), g.T @ x)
  _close(run(item, tuple(opts), "CPU", caps), g.T @ x)
  a = rng.standard_normal((192, 512)).astype(np.float32)
  opts = heuristic.hand_coded(one_kernel(fg.Tensor(a) @ fg.Tensor(x)).kernel, caps)
  assert [o for o in opts if o.op in _TILE_OPS][-1].op is OptOp.SWAP, opts


def test_weight_gradient_rows_far_apart_are_read_ahead_in_time_with_the_panel(rng, monkeypatch):
  """A weight gradient's rows step 2 KB along its reduction (512 outputs): they are read ahead as many steps as its
  panel of columns (passes.read_ahead: a distance in time, the panel's READ_AHEAD bytes), one hint for the line the
  tile's rows start in and one for the last row's, not one per row; rows closer together (128 outputs) alike. Values
  as numpy's compiled. (Its operands in their own layout: the scheduler's panels kept for fewer rows.)"""
  from fusegrad.schedule import rules
  from fusegrad.codegen import pipeline, passes
  monkeypatch.setattr(rules, "PANEL_MIN_ROWS", 1 << 20)
  caps = _avx512_gcc(rd.get("PYTHON").caps)
  x = rng.standard_normal((512, 128)).astype(np.float32)
  for n in (512, 128):
    g = rng.standard_normal((512, n)).astype(np.float32)
    item = one_kernel(fg.Tensor(g).T @ fg.Tensor(x))
    opts = heuristic.hand_coded(item.kernel, caps)
    assert opts[-1].op is OptOp.READAHEAD, (n, opts)
    p = pipeline.prepare(item.kernel, caps, tuple(opts))
    (u, _), = p.kernel.read_ahead
    loads = passes.streamed_loads([st.value for st in p.kernel.stores], u)
    by_buf: dict = {}
    for ld, s in set(loads): by_buf.setdefault(ld.buf, []).append((sym.lin(ld.idx).const, s))
    # g's rows: consecutive floats, a row of g (n floats) per step; x's column vectors: 16 floats apart
    (gbuf, rows), = [(b, sorted(cs)) for b, cs in by_buf.items() if max(cs)[0] - min(cs)[0] < 16 and len(cs) > 1]
    assert rows[0][1] == n
    ahead = heuristic.READ_AHEAD // (4 * min(abs(s) for _, s in loads))   # steps ahead: the nearest stream's bytes
    hinted = sorted(h.idx.const for h in p.kernel.prefetches if h.buf == gbuf)
    assert hinted == [rows[0][0] + n * ahead, rows[-1][0] + n * ahead], (n, rows, hinted)
    others = [h for h in p.kernel.prefetches if h.buf != gbuf]
    assert len(others) == sum(len(set(cs)) for b, cs in by_buf.items() if b != gbuf), (n, others)   # a line apart each
    _close(run(item, tuple(opts), "CPU", caps), g.T @ x)


def test_tile_takes_an_odd_count_of_column_vectors(rng):
  """Columns that divide into no even count of vectors (784 = 49 vectors of 16) take 7 vectors x 3 rows (the rows
  padded to a multiple of 3) rather than one vector per row; values as numpy's on the interpreter and compiled."""
  caps = _avx512_gcc(rd.get("PYTHON").caps)
  g, x = rng.standard_normal((64, 100)).astype(np.float32), rng.standard_normal((64, 784)).astype(np.float32)
  item = one_kernel(fg.Tensor(g).T @ fg.Tensor(x))
  opts = heuristic.hand_coded(item.kernel, caps)
  assert [o for o in opts if o.op in _TILE_OPS] == [Opt(OptOp.PADTO, 0, 3), Opt(OptOp.UPCAST, 0, 3),
                                                    Opt(OptOp.UPCAST, 2, 16), Opt(OptOp.UPCAST, 2, 7)], opts
  _close(run(item, tuple(opts), caps=caps), g.T @ x)
  _close(run(item, tuple(opts), "CPU", caps), g.T @ x)
  # AVX2's tile (6 rows x 2 vectors of 8) divides 784 = 98 vectors of 8 evenly: no odd count
  opts = heuristic.hand_coded(item.kernel, _avx2(rd.get("PYTHON").caps))
  assert all(o.arg not in heuristic.ODD_COLUMN_VECTORS for o in opts if o.op is OptOp.UPCAST), opts


def test_heuristic_loops_a_transposing_copy_along_its_reads(rng):
  """A copy that writes consecutive vectors but reads them a row apart (a matmul's operand packed in panels) loops
  over the neighbouring vectors of a row in each work item; the copy is exact."""
  b = rng.standard_normal((256, 128)).astype(np.float32)
  x = fg.Tensor(b).reshape(256, 8, 16).permute(1, 0, 2).contiguous()
  item = one_kernel(x)
  opts = heuristic.hand_coded(item.kernel, _avx512(rd.get("PYTHON").caps))
  assert [o.op for o in opts] == [OptOp.UPCAST, OptOp.LOOP] and opts[1].arg == heuristic.TRANSPOSE_LOOP, opts
  want = b.reshape(256, 8, 16).transpose(1, 0, 2)
  np.testing.assert_array_equal(run(item, tuple(opts)), want)
  np.testing.assert_array_equal(run(item, tuple(opts), "CPU"), want)
  # 49 panels (784 columns: an MLP's input batch packed for its weight gradient): 7 a work item, the most that divide
  # 49 up to TRANSPOSE_LOOP (a power-of-two divisor was 1: no loop, 269 -> 200 us for [256, 784] on a 2-core Xeon)
  b = rng.standard_normal((64, 784)).astype(np.float32)
  item = one_kernel(fg.Tensor(b).reshape(64, 49, 16).permute(1, 0, 2).contiguous())
  opts = heuristic.hand_coded(item.kernel, _avx512(rd.get("PYTHON").caps))
  assert [o.op for o in opts] == [OptOp.UPCAST, OptOp.LOOP] and opts[1].arg == 7, opts
  want = b.reshape(64, 49, 16).transpose(1, 0, 2)
  np.testing.assert_array_equal(run(item, tuple(opts)), want)
  np.testing.assert_array_equal(run(item, tuple(opts), "CPU"), want)
  # a transpose (the read steps by 1 along the other axis): each work item loops over whole vectors' worth of it (up
  # to TRANSPOSE_VECTORS, while TRANSPOSE_MIN_ITEMS work items remain), so each lane's row is read cache lines at a
  # time (its neighbours had read other rows, a page apart)
  for r, c, n in ((320, 256, 16), (256, 208, 16), (1024, 512, 64), (1024, 48, 16)):
    a = rng.standard_normal((r, c)).astype(np.float32)
    item = one_kernel(fg.Tensor(a).T.contiguous())
    opts = heuristic.hand_coded(item.kernel, _avx512(rd.get("PYTHON").caps))
    loops = [o for o in opts if o.op is OptOp.LOOP]
    assert len(loops) == 1 and loops[0].arg == n, (r, c, opts)
    np.testing.assert_array_equal(run(item, tuple(opts)), a.T)
    np.testing.assert_array_equal(run(item, tuple(opts), "CPU"), a.T)


def test_a_reduction_down_columns_takes_vectors_across_them(rng):
  """A softmax over dim 0 reads each column's rows a row apart: its reductions take no lanes along the rows and its
  output loop none either (gathers, 16 x 64 scalar accumulators before: 200 ms for 2048^2); the column axis takes
  the vectors, every load a vector of neighbouring columns. Values as torch's, on the interpreter and compiled."""
  import torch
  a = rng.standard_normal((96, 1024)).astype(np.float32)
  item = one_kernel(fg.Tensor(a).softmax(0))
  caps = _avx512(rd.get("PYTHON").caps)
  opts = heuristic.hand_coded(item.kernel, caps)
  k = apply_opts(item.kernel, opts, caps)
  ups = [x for x in k.axes if x.kind is AxisKind.UPCAST]
  assert len(ups) == 1 and ups[0].size == 16 and not any(ups[0].var in r.loops for r in heuristic._reduces(k)), opts
  want = torch.tensor(a).softmax(0).numpy()
  _close(run(item, tuple(opts)), want)
  _close(run(item, tuple(opts), "CPU"), want)


def test_heuristic_splits_rows_read_by_division(rng):
  """An elementwise kernel over positions laid out as padded rows (a row convolution's [.., 56 x 58 + 16]: every index
  divides by 58) is padded to whole rows and loops over a row in each work item, so no index divides per element;
  values as numpy's on the interpreter and compiled."""
  a = rng.standard_normal((8, 56, 56)).astype(np.float32)
  y = (fg.Tensor(a).pad((0, 2)).reshape(8, 56 * 58).pad((0, 16)) * 2).exp()
  item = one_kernel(y)
  opts = heuristic.hand_coded(item.kernel, rd.get("PYTHON").caps)
  assert opts == [Opt(OptOp.PADTO, 1, 58), Opt(OptOp.LOOP, 1, 58)], opts
  want = np.pad(np.pad(a, ((0, 0), (0, 0), (0, 2))).reshape(8, -1), ((0, 0), (0, 16)))
  want = np.exp(want * 2)
  c = rd.get("CPU").compile_with(item.kernel, tuple(opts))
  body = c.source[c.source.rindex(f"void {c.kernel.name}("):]
  assert "/58" not in body and "%58" not in body, body
  np.testing.assert_allclose(run(item, tuple(opts)), want, rtol=1e-6)
  np.testing.assert_allclose(run(item, tuple(opts), "CPU"), want, rtol=1e-6)


@pytest.mark.parametrize("name", ["matmul", "softmax", "conv", "int_sum"])
def test_compiled_actions_match_the_interpreter(name, rng):
  """The C renderer spells what the interpreter runs: a few action sequences, compiled."""
  item = one_kernel(make(name, rng, "CPU"))
  want = run(item, (), "CPU")
  caps = rd.get("CPU").caps
  acts = _legal_actions(item.kernel, caps)
  r = random.Random(int(rng.integers(1 << 30)))
  for o in r.sample(acts, min(3, len(acts))): _close(run(item, (o,), "CPU"), want)


def _has_opencl() -> bool:
  try:
    rd.get("OPENCL")
    return True
  except Exception:
    return False


@pytest.mark.skipif(not _has_opencl(), reason="no OpenCL device (pyopencl) on this machine")
@pytest.mark.parametrize("name,opts", [
  ("sum_rows", (Opt(OptOp.GROUP, 1, 16),)),
  ("sum_rows", (Opt(OptOp.LOCAL, 0, 8), Opt(OptOp.GROUP, 2, 8), Opt(OptOp.UPCAST, 2, 4))),
  ("max_rows", (Opt(OptOp.GROUP, 1, 48),)),
  ("matmul", (Opt(OptOp.LOCAL, 1, 16), Opt(OptOp.LOCAL, 0, 4), Opt(OptOp.UPCAST, 0, 2))),
  ("int_sum", (Opt(OptOp.GROUP, 1, 32),)),
  ("softmax_wide", None),
  ("matmul_gpu", None),
  ("bmm", (Opt(OptOp.LOCAL, 1, 4), Opt(OptOp.LOCAL, 3, 8), Opt(OptOp.STAGE, 5, 4))),
  ("layernorm_wide", None),
])
def test_work_groups_on_opencl(name, opts, rng):
  """Work-group dims and group reductions (local memory, barriers) rendered in OpenCL C match the interpreter."""
  item = one_kernel(make(name, rng, "OPENCL"))
  want = run(item, (), "OPENCL")
  if opts is None: opts = tuple(heuristic.hand_coded(item.kernel, GPU))   # the GPU's defaults
  c = rd.get("OPENCL").compile_with(item.kernel, opts)
  assert c.kernel.local_size is not None and "barrier" in c.source if any(o.op in (OptOp.GROUP, OptOp.STAGE)
                                                                          for o in opts) else True
  _close(run(item, opts, "OPENCL"), want)


GPU = Caps(has_local=True, max_local=1024, local_bytes=48 << 10, vector_widths=(2, 4, 8), prefers_blocking=False)


@pytest.mark.parametrize("name", NAMES + ["matmul_gpu", "elementwise_big", "softmax_wide", "layernorm_wide"])
def test_gpu_heuristic_keeps_the_result(name, rng):
  """The work-group defaults of a GPU (renderer caps without blocking), run by the interpreter."""
  item = one_kernel(make(name, rng))
  opts = heuristic.hand_coded(item.kernel, GPU)
  kinds = {a.kind for a in apply_opts(item.kernel, opts, GPU).axes}
  if name == "matmul_gpu": assert {AxisKind.LOCAL, AxisKind.UPCAST, AxisKind.STAGE} <= kinds
  if name in ("sum_rows", "sum_all", "max_rows"): assert AxisKind.GROUP_REDUCE in kinds
  if name == "elementwise_big": assert AxisKind.LOCAL in kinds
  if name in ("softmax_wide", "layernorm_wide"):   # one work-group per row: its reductions, then its outputs
    k = apply_opts(item.kernel, opts, GPU)
    assert len(k.of_kind(AxisKind.GROUP_REDUCE)) >= 2 and k.of_kind(AxisKind.GROUP_LOOP), (opts, k.axes)
    assert k.local_size == ((256,) if name == "softmax_wide" else (128,)) and k.groups == item.kernel.axes[0].size
  _close(run(item, tuple(opts)), run(item, ()))


def _avx512(caps):
  from dataclasses import replace
  return replace(caps, vector_widths=(4, 8, 16), vector_registers=32, native_lanes=16, prefers_blocking=True, tile_registers=0, tile_columns=0,
                 has_local=False, max_registers=256, tile_items=0)


def _avx512_gcc(caps):
  """AVX-512 caps as the CPU device sets them with gcc (runtime/cpu.tile_caps)."""
  from dataclasses import replace
  from fusegrad.runtime.cpu import tile_caps
  return replace(_avx512(caps), **{k: v for k, v in tile_caps(32, 16, clang=False).items() if k != "tile_registers"})


def test_heuristic_tiles_a_panel_matmul_on_its_rows(rng):
  """A matmul whose b was packed in panels (schedule/rules.relayout) and whose output stays [rows, panels, lanes] (an
  epilogue keeps the axes apart): the tile's rows are a's rows (the panel axis moves b's reads, not a's), its two
  column vectors (AVX2: 2 of 8 lanes) come from the panel axis. It tiled the panels as rows once (1 x 8 vectors: 115
  vs 195 GFLOP/s in a transformer's projections)."""
  a = rng.standard_normal((252, 32)).astype(np.float32)
  bp = rng.standard_normal((4, 32, 8)).astype(np.float32)
  bias = rng.standard_normal((4, 8)).astype(np.float32)
  x = (fg.Tensor(a).reshape(252, 1, 32, 1) * fg.Tensor(bp).reshape(1, 4, 32, 8)).sum(2)
  item = one_kernel((x + fg.Tensor(bias)).relu())
  k = item.kernel
  assert [(a.kind, a.size) for a in k.axes] == [(K.GLOBAL, 252), (K.GLOBAL, 4), (K.GLOBAL, 8), (K.REDUCE, 32)]
  opts = heuristic.hand_coded(k, _avx2(rd.get("PYTHON").caps))
  assert opts[:3] == [Opt(OptOp.UPCAST, 0, 6), Opt(OptOp.UPCAST, 2, 2), Opt(OptOp.UPCAST, 4, 8)], opts
  want = np.maximum(np.einsum("nk,pkl->npl", a, bp) + bias, 0)
  _close(run(item, tuple(opts)), want)


def test_tile_without_padded_rows_where_one_has_as_many_accumulators(rng):
  """64 rows (a convolution's output channels) by 48 vectors of columns. gcc's AVX-512 tile is 6 rows x 4 vectors:
  its rows padded to 66; a tile of as many accumulators and no more registers whose rows and columns divide (8 x 3)
  is taken instead (heuristic._exact_tile). AVX2's 6 x 2 has none (4 x 3 needs one register more: gcc spills):
  its rows stay padded. Both against numpy."""
  from fusegrad.codegen.opt.heuristic import _exact_tile
  a, b = rng.standard_normal((64, 24)).astype(np.float32), rng.standard_normal((24, 768)).astype(np.float32)
  item = one_kernel(fg.Tensor(a) @ fg.Tensor(b))
  base = rd.get("PYTHON").caps
  for caps, want in ((_avx512_gcc(base), [8, 16, 3]), (_avx2(base), [6, 8, 2])):
    opts = heuristic.hand_coded(item.kernel, caps)
    assert [o.arg for o in opts if o.op is OptOp.UPCAST][:3] == want, opts
    assert any(o.op is OptOp.PADTO for o in opts) == (want[0] == 6), opts
    _close(run(item, tuple(opts), caps=caps), a @ b)
  # (accumulators, registers): a tile of fewer accumulators, or of more registers, is never taken
  assert _exact_tile(_avx512_gcc(base), 64, 48, (6, 4), 1 << 20, 1) == (8, 3)
  assert _exact_tile(_avx512_gcc(base), 64, 47, (6, 4), 1 << 20, 1) is None
  assert _exact_tile(_avx2(base), 64, 96, (6, 2), 1 << 20, 1) is None


def test_heuristic_no_scalar_tile_over_strided_columns(rng):
  """q @ k.T read in place steps k's rows along the output's columns: a register tile there holds scalars (8 x 32
  spilled accumulators, 18 GFLOP/s): no register tile; with K = 32, too short for a dot tile, a gathered tile
  (heuristic.gathered_tile: column vectors loaded lane by lane)."""
  q, kk = rng.standard_normal((128, 32)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)
  x = (fg.Tensor(q).reshape(128, 1, 32) * fg.Tensor(kk).reshape(1, 64, 32)).sum(2)
  item = one_kernel(x)
  assert heuristic.register_tile(item.kernel, _avx512(rd.get("PYTHON").caps)) == []
  _close(run(item, tuple(heuristic.hand_coded(item.kernel, _avx512(rd.get("PYTHON").caps)))), q @ kk.T)


def _upcasts(k, opts, caps) -> list:
  """(original axis size, amount) of each UPCAST in opts, applied in turn."""
  out = []
  for o in opts:
    if o.op is OptOp.UPCAST: out.append((k.axes[o.axis].size, o.arg))
    k = apply_opt(k, o, caps)
  return out


@pytest.mark.parametrize("rows, cols, kdim, want", [
  (256, 96, 32, [(256, 16), (96, 16)]),    # x @ w.T with 32 input features: 16 rows x a gathered vector of columns
  (256, 65, 32, [(65, 13), (256, 16)]),    # 65 columns (a vocabulary): the vectors along the rows, 13 columns
  (128, 64, 16, [(128, 16), (64, 16)]),    # attention's q @ k.T over a head's 16 dims
])
def test_heuristic_gathers_the_columns_of_a_short_strided_product(rows, cols, kdim, want, rng):
  """A product whose operands are both contiguous along a short reduction and strided along the outputs (`x @ w.T`
  read in place) gets a gathered tile: a block of rows x one vector of columns loaded lane by lane, instead of a
  vector of reduction lanes folded for every output (a horizontal sum per 32 multiply-adds). Values match numpy on
  the interpreter and compiled."""
  a, b = rng.standard_normal((rows, kdim)).astype(np.float32), rng.standard_normal((cols, kdim)).astype(np.float32)
  item = one_kernel((fg.Tensor(a).reshape(rows, 1, kdim) * fg.Tensor(b).reshape(1, cols, kdim)).sum(2))
  caps = _avx512(rd.get("PYTHON").caps)
  opts = heuristic.hand_coded(item.kernel, caps)
  assert _upcasts(item.kernel, opts, caps) == want and len(opts) == 2, opts
  k = apply_opts(item.kernel, opts, caps)
  assert not k.of_kind(K.REDUCE) or k.of_kind(K.REDUCE)[0].size == kdim, k.axes   # the reduction stays one loop
  _close(run(item, tuple(opts)), a @ b.T)
  _close(run(item, tuple(opts), "CPU"), a @ b.T)
  # a reduction of 4 vectors or more keeps the dot tile (vectors along the reduction, a block of dot products)
  a, b = rng.standard_normal((rows, 64)).astype(np.float32), rng.standard_normal((cols, 64)).astype(np.float32)
  item = one_kernel((fg.Tensor(a).reshape(rows, 1, 64) * fg.Tensor(b).reshape(1, cols, 64)).sum(2))
  assert heuristic.gathered_tile(item.kernel, caps) == []


def _guards_left(k, caps) -> list:
  """The conditions left on k's loads and Valid values once its register axes are expanded."""
  from fusegrad.codegen import passes
  from fusegrad.codegen.ir import toposort, Load, Valid
  ke = passes.expand(k, caps)
  vals = [x for st in ke.stores for x in toposort([st.value])]
  return [x for x in vals if (isinstance(x, Load) and x.valid.parts) or (isinstance(x, Valid) and x.cond.parts)]


def test_heuristic_cuts_a_concatenated_row_into_pieces(rng):
  """An elementwise kernel whose innermost axis is read through the bounds of a concatenation's parts (the gradient
  of q, k, v split from one [B, T, 96] tensor: each part's load and select guarded by `32 <= o < 64`) is cut into
  PIECES at those bounds, then its pieces' lanes are vectors: every copy's conditions are decided and folded, no
  guarded load is left (as a loop of 16, gcc vectorized none of them). Parts of 18 and 14: 16 pieces of 2."""
  import torch
  x0 = rng.standard_normal((8, 32, 96)).astype(np.float32)
  ws = [rng.standard_normal(s).astype(np.float32) for s in ((8, 2, 32, 16), (8, 2, 16, 32), (8, 2, 32, 16))]
  def grad(lib, x):
    q, k, v = x.split(32, -1)
    q, v = (t.reshape(8, 32, 2, 16).permute(0, 2, 1, 3) for t in (q, v))
    k = k.reshape(8, 32, 2, 16).permute(0, 2, 3, 1)
    ((q * lib.tensor(ws[0])).sum() + (k * lib.tensor(ws[1])).sum() + (v * lib.tensor(ws[2])).sum()).backward()
    return x.grad
  item = one_kernel(grad(fg, fg.Tensor(x0, requires_grad=True)))
  caps = _avx512(rd.get("PYTHON").caps)
  assert [a.size for a in item.kernel.axes][-1] == 96
  opts = heuristic.hand_coded(item.kernel, caps)
  assert opts[0] == Opt(OptOp.PIECES, len(item.kernel.axes) - 1, 3), opts
  assert _upcasts(item.kernel, opts, caps) == [(32, 16)], opts
  assert not _guards_left(apply_opts(item.kernel, opts, caps), caps)
  want = grad(torch, torch.tensor(x0, requires_grad=True)).numpy()
  np.testing.assert_array_equal(run(item, tuple(opts)), want)
  np.testing.assert_array_equal(run(item, tuple(opts), "CPU"), want)
  q, v = rng.standard_normal((8, 32, 18)).astype(np.float32), rng.standard_normal((8, 32, 14)).astype(np.float32)
  item = one_kernel(fg.cat([fg.Tensor(q), fg.Tensor(v)], -1) * 2)
  opts = heuristic.hand_coded(item.kernel, caps)
  assert opts == [Opt(OptOp.PIECES, len(item.kernel.axes) - 1, 16)], opts
  assert not _guards_left(apply_opts(item.kernel, opts, caps), caps)
  np.testing.assert_array_equal(run(item, tuple(opts)), np.concatenate([q, v], -1) * 2)


@pytest.mark.parametrize("case", ["pad", "crop", "rows"])
def test_elementwise_rows_take_several_vectors_per_work_item(case, rng):
  """An elementwise kernel whose work item would be one vector of a row (outer axes beside the vectors' axis: a padded
  copy, a crop, a row broadcast) computes several of the row's vectors per item (heuristic._row_vectors: the most up
  to ROW_VECTORS that divide them), so its flat index is divided back into the axes once per item; a flat one (a
  contiguous map) keeps one vector per item. Values against numpy on the interpreter and the CPU."""
  x = rng.standard_normal((4, 8, 40, 70)).astype(np.float32)
  if case == "pad":   # rows of 62 padded to 4 vectors of 16 (the last one masked)
    out, want = fg.nn.functional.pad(fg.Tensor(x[..., :60]), (1, 1, 2, 1)), np.pad(x[..., :60], ((0, 0), (0, 0), (2, 1), (1, 1)))
    upcasts = [(64, 16), (4, 4)]
  elif case == "crop":   # rows of 64 read from rows of 70
    out, want, upcasts = fg.Tensor(x)[:, :, 1:39, 3:67].contiguous(), x[:, :, 1:39, 3:67], [(64, 16), (4, 4)]
  else:   # [64, 144] * [144]: 9 vectors a row, 3 per item
    w = rng.standard_normal(144).astype(np.float32)
    out, want = fg.Tensor(x.reshape(-1)[:64 * 144].reshape(64, 144)) * fg.Tensor(w), x.reshape(-1)[:64 * 144].reshape(64, 144) * w
    upcasts = [(144, 16), (9, 3)]
  item = one_kernel(out)
  caps = _avx512(rd.get("PYTHON").caps)
  opts = heuristic.hand_coded(item.kernel, caps)
  assert _upcasts(item.kernel, opts, caps) == upcasts, opts
  for dev in ("PYTHON", "CPU"): np.testing.assert_array_equal(run(item, tuple(opts), dev), want)
  flat = one_kernel(fg.Tensor(x) * 2 + 1)   # one axis: no division to save
  assert [o.op for o in heuristic.hand_coded(flat.kernel, caps)].count(OptOp.UPCAST) == 1


def test_pieces_fold_a_concatenation_of_gate_gradients(rng):
  """An LSTM's four gate gradients concatenated into [20, 800] (each part its own function with an exp or tanh,
  guarded by `200 <= o < 400`): PIECES of 200 and vectors of 8 in each piece; each copy computes only its part's
  terms (one transcendental function per element instead of four), and -0.0 stays -0.0 where a part holds it (as
  PyTorch's cat keeps it: the ruled-out parts' zeros are not added). Values against torch, on the interpreter and
  the CPU."""
  import torch
  xs = [rng.standard_normal((20, 200)).astype(np.float32) for _ in range(4)]
  xs[3][0, :5] = -0.0
  def gates(lib, ts):
    i, f, g, o = ts
    return lib.cat([lib.sigmoid(i) * 2, lib.exp(-f.abs()), lib.tanh(g), o * 1.0], 1)
  item = one_kernel(gates(fg, [fg.Tensor(x) for x in xs]))
  caps = _avx512(rd.get("PYTHON").caps)
  opts = heuristic.hand_coded(item.kernel, caps)
  assert opts[:1] == [Opt(OptOp.PIECES, len(item.kernel.axes) - 1, 4)] and _upcasts(item.kernel, opts, caps) == [(200, 8)], opts
  k = apply_opts(item.kernel, opts, caps)
  assert not _guards_left(k, caps)
  from fusegrad.codegen import passes
  from fusegrad.codegen.ir import toposort, Alu
  ke = passes.expand(k, caps)
  transcendental = [x for st in ke.stores for x in toposort([st.value]) if isinstance(x, Alu) and x.op in ("EXP", "TANH")]
  assert len(transcendental) <= 3, len(transcendental)   # one per part that has one, not one per part per piece
  want = gates(torch, [torch.tensor(x) for x in xs]).numpy()
  for dev in ("PYTHON", "CPU"):
    got = run(item, tuple(opts), dev)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    assert np.signbit(got[0, 600:605]).all()


def test_padded_columns_load_and_store_masked_vectors(rng, monkeypatch):
  """A product whose 200 columns are padded to 13 vectors of 16 (a hidden size of 200) reads its column operand with
  masked vector loads (ir.Load.lanes, Caps.masked_vectors): the last vector's lanes past column 200 are not read,
  instead of 16 scalar loads a lane whose index wraps (`% 200`) per step of the reduction. Its outputs are masked
  vector stores. Values against numpy on the interpreter (which checks the masks) and the CPU."""
  from fusegrad.codegen import passes
  from fusegrad.codegen.ir import toposort, Load, Vectorize
  a, w, c = (rng.standard_normal(s).astype(np.float32) for s in ((20, 800), (800, 200), (20, 200)))
  item = one_kernel(fg.Tensor(a) @ fg.Tensor(w) + fg.Tensor(c))
  caps = _avx512(rd.get("PYTHON").caps)
  opts = heuristic.hand_coded(item.kernel, caps)
  assert Opt(OptOp.PADTO, 2, 16) in opts, opts
  ke = passes.expand(apply_opts(item.kernel, opts, caps), caps)
  vals = [x for st in ke.stores for x in toposort([st.value])]
  masked = [x for x in vals if isinstance(x, Load) and x.lanes]
  gathered = [x for x in vals if isinstance(x, Vectorize) and len({id(c) for c in x.src}) > 1]   # (not a broadcast)
  assert masked and not gathered, gathered
  assert all(st.lanes for st in ke.stores)
  want = a @ w + c
  for dev in ("PYTHON", "CPU"):
    np.testing.assert_allclose(run(item, tuple(opts), dev), want, rtol=1e-4, atol=1e-3)
  # with rows enough for the machine's tile, the 13 column vectors are padded to a multiple of the tile's (16 for gcc's
  # 4 vectors on AVX-512; COL_TILE_PAD_WASTE): the padded vectors read in bounds (wrapped), their lanes masked. (The
  # operand in its own layout: the scheduler packs it in padded panels from 16 rows on)
  from fusegrad.schedule import rules
  monkeypatch.setattr(rules, "PANEL_MIN_ROWS", 1 << 20)
  a = rng.standard_normal((384, 800)).astype(np.float32)
  item = one_kernel(fg.Tensor(a) @ fg.Tensor(w))
  caps = _avx512_gcc(rd.get("PYTHON").caps)
  opts = heuristic.hand_coded(item.kernel, caps)
  cv = heuristic.tile_shape(caps)[1]   # (the compiler's tile: clang's takes 1 vector, gcc's 4)
  want = [(208, 16), (-(-13 // cv) * cv, cv)] if cv > 1 else [(208, 16)]
  assert _upcasts(item.kernel, opts, caps)[-len(want):] == want, opts
  for dev in ("PYTHON", "CPU"):
    np.testing.assert_allclose(run(item, tuple(opts), dev, caps), a @ w, rtol=1e-4, atol=1e-3)


def test_contiguous_output_axes_merge_before_tiling(rng):
  """A matmul stored through a reshape ([8, 576] as [8, 4, 12, 12]: a Linear layer's input gradient shaped as the
  activation it flattened) has output axes that every index reads as one position: lowering merges them
  (codegen/lower.merge_axes), so the register tile finds its columns on the merged axis (with the innermost axis of
  12 it found none and ran scalar: 13 ms of the MNIST convnet's step). Axes a read divides stay apart: a permuted
  read's, a strided window's."""
  g, w = rng.standard_normal((8, 32)).astype(np.float32), rng.standard_normal((32, 576)).astype(np.float32)
  item = one_kernel((fg.Tensor(g) @ fg.Tensor(w)).reshape(8, 4, 12, 12))
  k = item.kernel
  assert k.name == "r_8_4_12_12"
  assert [(a.kind, a.size) for a in k.axes] == [(K.GLOBAL, 8), (K.GLOBAL, 576), (K.REDUCE, 32)]
  from fusegrad.codegen.ir import toposort, Load
  from fusegrad.graph import symbolic as sym
  idx = [st.idx for st in k.stores] + [x.idx for x in toposort([st.value for st in k.stores]) if isinstance(x, Load)]
  assert all(isinstance(a, sym.Var) for e in idx for a, _ in e.terms), idx   # no division left in any index
  caps = _avx512(rd.get("PYTHON").caps)
  opts = heuristic.hand_coded(k, caps)
  kk, cols = k, []
  for o in opts:
    if o.op is OptOp.UPCAST and kk.axes[o.axis].size == 576: cols.append(o.arg)
    kk = apply_opt(kk, o, caps)
  assert cols == [heuristic.tile_lanes(caps)], opts   # the tile's column vectors on the merged axis
  assert sum(a.kind is K.UPCAST for a in kk.axes) >= 2, opts   # ...and a block of rows
  _close(run(item, tuple(opts)), (g @ w).reshape(8, 4, 12, 12))
  # a store in another order than the load: only the dims both keep in order merge ([8, 12, 12, 4] -> [8, 144, 4])
  x = rng.standard_normal((8, 4, 12, 12)).astype(np.float32)
  item = one_kernel(fg.Tensor(x).permute(0, 2, 3, 1) * 2)
  assert [a.size for a in item.kernel.axes] == [8, 144, 4]
  _close(run(item, ()), x.transpose(0, 2, 3, 1) * 2)
  # every other row and column: batch, channels and rows step through memory in one stride pattern (576 = 4 * 144,
  # 144 = 6 * 24) and merge; the columns (stride 2, rows 24 apart) stay an axis of their own
  item = one_kernel(fg.Tensor(x)[:, :, ::2, ::2] * 2)
  assert [a.size for a in item.kernel.axes] == [192, 6]
  _close(run(item, ()), x[:, :, ::2, ::2] * 2)


def test_heuristic_unrolls_small_reductions_and_loops_their_outputs(rng):
  """A reduction kernel whose reductions are all small and that no register tile fits (a 2x2 max-pool: the window's
  max, its first argmax and the value picked, 4 elements each): each reduction is unrolled whole (UNROLL) and the
  innermost output axes run as loops in each work item (LOOP, nested up to INNER_LOOP_MIN indices), so no loop of 4
  steps runs around every output and no flat index is divided back into the axes (the MNIST convnet's pool kernels,
  0.75 -> 0.16 ms). Its input is read as a row convolution leaves it (nn/functional._conv_rows: rows of 26, planes
  of 640), so the pooled rows and columns stay two axes. Values match torch on the interpreter and compiled."""
  import torch
  flat = rng.standard_normal((8, 16, 640)).astype(np.float32)
  x = flat[:, :, :624].reshape(8, 16, 24, 26)[..., :24]
  item = one_kernel(fg.nn.functional.max_pool2d(fg.Tensor(flat)[:, :, :624].reshape(8, 16, 24, 26)[..., :24], 2))
  assert [(a.kind, a.size) for a in item.kernel.axes][:3] == [(K.GLOBAL, 128), (K.GLOBAL, 12), (K.GLOBAL, 12)]
  caps = _avx512(rd.get("PYTHON").caps)
  opts = heuristic.hand_coded(item.kernel, caps)
  k = apply_opts(item.kernel, opts, caps)
  assert not k.of_kind(K.REDUCE) and len(k.of_kind(K.UNROLL)) == len(item.kernel.of_kind(K.REDUCE)), opts
  assert [(a.kind, a.size) for a in k.axes if a.kind is not K.UNROLL] == [(K.GLOBAL, 128), (K.LOOP, 12), (K.LOOP, 12)]
  want = torch.nn.functional.max_pool2d(torch.tensor(np.ascontiguousarray(x)), 2).numpy()
  np.testing.assert_array_equal(run(item, tuple(opts)), want)
  np.testing.assert_array_equal(run(item, tuple(opts), "CPU"), want)


def test_heuristic_loops_an_elementwise_axis_without_vectors(rng):
  """An elementwise kernel with values the vector path does not take (sin) runs its innermost axis as a loop in
  each work item (a stride-1 loop for the C compiler, not one flat index divided back into axes)."""
  x, b = rng.standard_normal((128, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
  item = one_kernel((fg.Tensor(x) + fg.Tensor(b)).sin() * 0.5)
  opts = heuristic.hand_coded(item.kernel, _avx512(rd.get("PYTHON").caps))
  assert opts == [Opt(OptOp.LOOP, 1, 64)]
  k = apply_opts(item.kernel, opts, rd.get("PYTHON").caps)
  assert [(a.kind, a.size) for a in k.axes] == [(K.GLOBAL, 128), (K.LOOP, 64)]
  import torch
  _close(run(item, tuple(opts)), torch.sin(torch.tensor(x + b)).numpy() * 0.5)
  _close(run(item, tuple(opts), "CPU"), torch.sin(torch.tensor(x + b)).numpy() * 0.5)
  with pytest.raises(OptError, match="only a global axis becomes a loop"):
    apply_opt(k, Opt(OptOp.LOOP, 1, 64), rd.get("PYTHON").caps)


def _avx2(caps):
  from dataclasses import replace
  return replace(caps, vector_widths=(4, 8), vector_registers=16, native_lanes=8, prefers_blocking=True, tile_registers=0, tile_columns=0,
                 has_local=False, max_registers=256)


def test_heuristic_pads_rows_to_the_tile_that_fits(rng):
  """AVX2's 16 registers hold a 6 x (2 x 8) register tile, which no power-of-two row count divides: the heuristic
  pads the rows to a multiple of 6 (PADTO) when that adds at most heuristic.ROW_PAD_WASTE of them, else takes the
  most rows that divide; with AVX-512's 32 registers 8 rows divide. Values match numpy either way."""
  for n, caps, want in ((96, _avx2, 6), (64, _avx2, 6), (20, _avx2, 4), (100, _avx512, 8), (64, _avx512, 8)):
    a, b = rng.standard_normal((n, 24)).astype(np.float32), rng.standard_normal((24, 256)).astype(np.float32)
    item = one_kernel(fg.Tensor(a) @ fg.Tensor(b))
    opts = heuristic.hand_coded(item.kernel, caps(rd.get("PYTHON").caps))
    assert [o.arg for o in opts if o.op is OptOp.UPCAST][0] == want, (n, opts)
    assert [o.op for o in opts if o.op is OptOp.PADTO] == ([OptOp.PADTO] if n % want else []), (n, opts)
    _close(run(item, tuple(opts)), a @ b)
    _close(run(item, tuple(opts), "CPU"), a @ b)


def test_gpu_matmul_reads_its_local_tiles_four_at_a_time(rng):
  """A GPU matmul's 8 x 8 register tile is 2 x 2 groups of 4 neighbouring rows and columns (heuristic.MM_VECTOR), its
  local tiles laid out in memory order with the reduction's step outermost and rows padded by 4 (passes.stage):
  each item reads 4 columns, and 4 rows, at a 16-byte aligned position, which the OpenCL renderer spells as one
  aligned vector read (NVIDIA: ld.shared.v4 rather than 4 ld.shared.f32; H100 f32 4096^3 24 -> 28.5 TFLOP/s)."""
  from fusegrad.codegen import pipeline
  from fusegrad.codegen.renderer.cstyle import OpenCLRenderer
  a, b = rng.standard_normal((128, 32)).astype(np.float32), rng.standard_normal((32, 128)).astype(np.float32)
  item = one_kernel(fg.Tensor(a) @ fg.Tensor(b))
  opts = heuristic.hand_coded(item.kernel, GPU)
  assert [o.arg for o in opts if o.op is OptOp.UPCAST] == [4, 4, 2, 2], opts
  p = pipeline.prepare(item.kernel, GPU, tuple(opts))
  src = OpenCLRenderer().render(p.kernel, p.listing)
  assert src.count("(*(__local float4*)") == 2 and "aligned(16)" in src, src
  _close(run(item, tuple(opts)), a @ b)


def _gpu_opencl(monkeypatch):
  """The OPENCL device with the GPU caps' local memory where it has as much (PoCL's CPU device reports the renderer's
  16 KiB; it has 1 MiB): a GPU matmul's tiles fit as on a GPU."""
  from dataclasses import replace
  dev = rd.get("OPENCL")
  monkeypatch.setattr(dev, "_caps", replace(dev.caps, local_bytes=min(GPU.local_bytes, dev.cl_device.local_mem_size)))
  return dev


@pytest.mark.parametrize("device", ["PYTHON"] + (["OPENCL"] if _has_opencl() else []))
@pytest.mark.parametrize("kk", [16, 32, 272])        # the reduction in 1, 2 and 17 tiles
@pytest.mark.parametrize("buffers", [1, 2])
def test_gpu_matmul_prefetches_its_next_tiles(kk, buffers, device, rng, monkeypatch):
  """The GPU heuristic's matmul prefetches its staged tiles (OptOp.PREFETCH; heuristic.MM_PREFETCH buffers where the
  local memory holds them): the first tile is copied before the loop over the tiles; in each step every item loads
  its share of the next tile from global memory into registers before the step's local reads, and stores it after
  them (one buffer: between two barriers; two: into the other buffer, then one barrier). One tile has no next one:
  no PREFETCH. The interpreter gives the plain staged kernel's bits; OpenCL (PoCL here, a GPU under `make gpu-test`)
  matches numpy."""
  import re
  from dataclasses import replace
  from fusegrad.codegen import pipeline
  from fusegrad.codegen.ir import Stage
  from fusegrad.codegen.linearize import Let
  from fusegrad.codegen.renderer.cstyle import OpenCLRenderer
  a, b = rng.standard_normal((128, kk)).astype(np.float32), rng.standard_normal((kk, 128)).astype(np.float32)
  if device == "OPENCL": _gpu_opencl(monkeypatch)
  item = one_kernel(fg.Tensor(a, device=device) @ fg.Tensor(b, device=device))
  opts = heuristic.hand_coded(item.kernel, GPU)
  plain = [o for o in opts if o.op is not OptOp.PREFETCH]
  assert plain[-1].op is OptOp.STAGE, opts
  staged = apply_opts(item.kernel, plain, GPU)
  prefetch = Opt(OptOp.PREFETCH, staged.axis_index(staged.of_kind(K.STAGE)[0].var), buffers)
  if kk == 16:
    assert len(plain) == len(opts), opts
    with pytest.raises(OptError, match="no tile has a next one"): apply_opt(staged, prefetch, GPU)
  else:
    assert opts[-1] == replace(prefetch, arg=heuristic.MM_PREFETCH), opts
    opts = plain + [prefetch]
    p = pipeline.prepare(item.kernel, GPU, tuple(opts))
    step, s = (a_.var.name for a_ in p.kernel.axes[-2:])
    tiles = [st.val for st in p.listing if isinstance(st, Let) and isinstance(st.val, Stage)]
    assert [(t.prefetch.name, t.buffers) for t in tiles] == [(step, buffers)] * 2, tiles
    src = OpenCLRenderer().render(p.kernel, p.listing)
    head, loop = src.split(f"for (int {step} = 0;")
    assert head.count("_j = lidx;") == 2, src                  # the first tiles, copied before the loop
    fetch = [m.start() for m in re.finditer(r"v\d+_r\d+ = b[12]\[", loop)]
    inner = loop.index(f"for (int {s} = 0;")
    reads = [m.start() for m in re.finditer(r"v\d+_l\[|\(__local float4\*\)", loop)]
    stores = [m.start() for m in re.finditer(r"v\d+_l\[[^]]*\] = v\d+_r\d+;", loop)]
    # 128 x 16 values of each operand, 256 items: 8 loads each, all before the step's first local read
    assert len(fetch) == 16 and len(stores) == 16, src
    assert max(fetch) < inner < min(reads) and max(r for r in reads if r < min(stores)) < min(stores), src
    assert loop.count("barrier(") == (1 if buffers == 2 else 2), src
    # two buffers: the step's reads at its tile's buffer (step % 2, which 2 steps render as step)
    assert (f"{tiles[0].buffer_stride}+" in loop[inner:min(stores)]) == (buffers == 2), src
    if device == "PYTHON": np.testing.assert_array_equal(run(item, tuple(opts)), run(item, tuple(plain)))
  _close(run(item, tuple(opts), device), a @ b)


@pytest.mark.parametrize("device", ["PYTHON"] + (["OPENCL"] if _has_opencl() else []))
def test_stage_leaves_loads_along_a_grouped_loop_alone(device, rng):
  """A load along a reduction's loop that the work-group shares (GROUP of the staged reduction's outer part) differs
  between the group's items: it is no tile (its copies mixed the items' values: wrong on OpenCL). The interpreter
  assembles a group's tile from its items' own copy steps, as a device does, so it saw the same wrong values."""
  item = one_kernel(make("matmul", rng, device))                # 32 x 24 @ 24 x 48
  opts = (Opt(OptOp.LOCAL, 1, 16), Opt(OptOp.LOCAL, 0, 2), Opt(OptOp.LOOP, 0, 16), Opt(OptOp.STAGE, 4, 3),
          Opt(OptOp.GROUP, 4, 2))
  from fusegrad.codegen import passes
  assert not passes.stages(passes.stage(apply_opts(item.kernel, opts, GPU)))
  _close(run(item, opts, device), run(item, (), device))


def test_masked_matmul_keeps_vector_accumulators(rng):
  """Attention's scores: q @ k.T (k's transpose stored) with a causal mask and a scale after the sum. The sum runs
  on vector accumulators; the epilogue (a bool load, a select) runs lane by lane (a scalar 8 x 32 tile spilled:
  20 GFLOP/s)."""
  from fusegrad.codegen import passes
  from fusegrad.codegen.ir import dependencies
  q, kt = rng.standard_normal((128, 32)).astype(np.float32), rng.standard_normal((32, 64)).astype(np.float32)
  keep = np.tril(np.ones((128, 64), bool))
  s = (fg.Tensor(q).reshape(128, 32, 1) * fg.Tensor(kt).reshape(1, 32, 64)).sum(1) * 0.3
  item = one_kernel(s.masked_fill(fg.Tensor(~keep), float("-inf")))
  caps = _avx512(rd.get("PYTHON").caps)
  opts = heuristic.hand_coded(item.kernel, caps)
  k = apply_opts(item.kernel, opts, caps)
  assert passes.vector_axes(k, caps, dependencies([st.value for st in k.stores]))
  want = np.where(keep, (q @ kt) * np.float32(0.3), -np.inf)
  _close(run(item, tuple(opts)), want)
  _close(run(item, tuple(opts), "CPU"), want)


def test_work_group_actions_say_why(rng):
  """The shared axis, local tiles and loops refuse what they cannot do, naming why."""
  sm = one_kernel(make("softmax_wide", rng)).kernel          # [6 rows, 256 outputs (loop), max over 256, sum over 256]
  reds = [i for i, a in enumerate(sm.axes) if a.kind is AxisKind.REDUCE]
  loop = next(i for i, a in enumerate(sm.axes) if a.kind is AxisKind.LOOP)
  k1 = apply_opt(sm, Opt(OptOp.GROUP, reds[0], 64), GPU)
  with pytest.raises(OptError, match="shared axis has 64 items"):
    apply_opt(k1, Opt(OptOp.GROUP, k1.axis_index(sm.axes[reds[1]].var), 32), GPU)
  with pytest.raises(OptError, match="shared axis has 64 items"):
    apply_opt(k1, Opt(OptOp.LOCAL, loop, 32), GPU)
  with pytest.raises(OptError, match="only a reduction axis is staged"):
    apply_opt(sm, Opt(OptOp.STAGE, loop, 8), GPU)
  with pytest.raises(OptError, match="no work-group axes"):
    apply_opt(sm, Opt(OptOp.STAGE, reds[0], 8), GPU)
  mm = one_kernel(make("matmul_gpu", rng)).kernel
  k2 = apply_opt(mm, Opt(OptOp.LOCAL, 0, 16), GPU)
  with pytest.raises(OptError, match="one staged axis per kernel"):
    r = k2.axis_index(mm.axes[-1].var)
    k3 = apply_opt(k2, Opt(OptOp.STAGE, r, 4), GPU)
    apply_opt(k3, Opt(OptOp.STAGE, k3.axis_index(k3.of_kind(AxisKind.REDUCE)[0].var), 2), GPU)
  with pytest.raises(OptError, match="no work-groups"):
    apply_opt(k2, Opt(OptOp.STAGE, r, 4), _avx512(rd.get("PYTHON").caps))


def test_heuristic_streams_a_skinny_products_big_operand_once(rng):
  """x @ w.T with few rows (a small batch through a Linear layer; a ResNet's last convolutions as im2col matmuls),
  both operands contiguous along the reduction: all the rows and two columns in the tile, the reduction in vector
  lanes, so w streams through once (each output alone re-read w for every row: 8 x 4608 @ 4608 x 512, 1.7 -> 0.3
  ms). AVX2's 16 registers do not hold 8 rows x 2 columns: it keeps the reduction lanes. Values match numpy."""
  for m, caps, tiled in ((8, _avx512, True), (6, _avx512, True), (8, _avx2, False)):
    a, w = rng.standard_normal((m, 256)).astype(np.float32), rng.standard_normal((512, 256)).astype(np.float32)
    item = one_kernel(fg.Tensor(a) @ fg.Tensor(w).T)
    opts = heuristic.hand_coded(item.kernel, caps(rd.get("PYTHON").caps))
    ups = [(o.axis, o.arg) for o in opts if o.op is OptOp.UPCAST]
    assert ((0, m) in ups and (1, 2) in ups) == tiled, (m, opts)
    assert ups[0] == (2, heuristic.tile_lanes(caps(rd.get("PYTHON").caps))), opts   # the reduction in lanes first
    _close(run(item, tuple(opts)), a @ w.T)
    _close(run(item, tuple(opts), "CPU"), a @ w.T)


def _first_vector_axis(k, opts, caps):
  """The size of the axis whose lanes expand makes vectors first (passes.vector_axes), after opts."""
  from fusegrad.codegen import passes
  from fusegrad.codegen.ir import dependencies
  ko = apply_opts(k, opts, caps)
  va = passes.vector_axes(ko, caps, dependencies([st.value for st in ko.stores]))
  return ko.axes[ko.axis_index(va[0])].size if va else None


def test_heuristic_turns_a_tile_whose_rows_compute_an_exp(rng, monkeypatch):
  """Attention's softmax fused into its product with v ([H, T, S] probabilities exp(a - max) / sum times [H, S, 16]):
  the plain tile's rows (the queries) compute an exp per element lane by lane, each feeding one column vector's
  multiply-add. The tile is turned over (heuristic._turned_tile): the head's 16 columns whole as the block's rows, the
  queries in vector lanes, so the exp, the subtraction and the division are vector ops (passes.vector_axes takes the
  lanes that save the most work). A product whose rows are plain loads keeps its plain tile. Values match numpy on
  the interpreter and compiled."""
  from fusegrad.schedule import schedule as sched
  # scheduled as for AVX-512 on any host (with 8 lanes the scheduler cuts the exp off: rules.tile_operands)
  dev = rd.get("PYTHON")
  caps = _avx512(dev.caps)
  monkeypatch.setattr(dev, "_caps", caps)
  monkeypatch.setattr(sched, "_schedule_cache", type(sched._schedule_cache)())
  T = lambda x: fg.Tensor(x, device="PYTHON")   # noqa: E731
  h, t, s, d = 8, 32, 32, 16
  a, v = rng.standard_normal((h, t, s)).astype(np.float32), rng.standard_normal((h, s, d)).astype(np.float32)
  m, z = a.max(-1, keepdims=True), np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True)
  p = ((T(a) - T(m)).exp() / T(z)).reshape(h, t, s, 1)
  item = one_kernel((p * T(v).reshape(h, 1, s, d)).sum(2))
  opts = heuristic.hand_coded(item.kernel, caps)
  assert _upcasts(item.kernel, opts, caps) == [(d, d), (t, 16)], opts
  assert _first_vector_axis(item.kernel, opts, caps) == 16 and apply_opts(item.kernel, opts, caps).axes[-1].size == s
  want = (np.exp(a - m) / z) @ v
  _close(run(item, tuple(opts)), want)
  _close(run(item, tuple(opts), "CPU", caps), want)
  # the same product of plain loads: the columns in vectors, as before
  item = one_kernel((T(a).reshape(h, t, s, 1) * T(v).reshape(h, 1, s, d)).sum(2))
  opts = heuristic.hand_coded(item.kernel, caps)
  assert _upcasts(item.kernel, opts, caps)[-1] == (d, 16) and _first_vector_axis(item.kernel, opts, caps) == 16


def test_vector_lanes_go_where_they_save_most(rng):
  """passes.vector_axes takes first the UPCAST axis whose lanes save the most scalar work (passes.OP_WORK): of a tile
  of 16 rows x 8 columns, the columns where the rows are plain loads (stride-1 column loads and stores), the rows
  where each row value is an exp (one vector exp per step instead of 16 scalar ones)."""
  # (8 columns: a turned tile holds them on AVX2 and AVX-512, so the schedule keeps the exp fused: rules._turnable)
  x, y = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)
  caps = _avx512(rd.get("PYTHON").caps)
  for rows, want, rows_first in ((fg.Tensor(x), x, False), (fg.Tensor(x).exp(), np.exp(x), True)):
    item = one_kernel((rows.reshape(64, 32, 1) * fg.Tensor(y).reshape(1, 32, 8)).sum(1))
    opts = [Opt(OptOp.UPCAST, 0, 16), Opt(OptOp.UPCAST, 2, 8)]
    assert _first_vector_axis(item.kernel, opts, caps) == (16 if rows_first else 8)
    _close(run(item, tuple(opts)), want @ y)
    _close(run(item, tuple(opts), "CPU"), want @ y)


def test_bool_mask_read_as_a_condition_is_one_vector_load(rng):
  """A bool buffer read only as a select's condition (attention's causal mask, a masked_fill) is one vector load of
  its bytes widened to a lane mask (passes._masks, the renderer's fg_vloadb), in an elementwise kernel and in a matmul's
  epilogue; read any other way (stored, combined with another bool) it stays one load per lane. Values as numpy's on the
  interpreter and compiled."""
  from fusegrad.codegen.renderer.cstyle import CRenderer
  from fusegrad.codegen import pipeline
  caps = _avx512(rd.get("PYTHON").caps)
  x, y = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
  m, m2 = rng.random((64, 64)) < 0.5, rng.random((64, 64)) < 0.5
  cases = (
    (fg.Tensor(x).masked_fill(fg.Tensor(m), -np.inf), np.where(m, -np.inf, x), True),
    ((fg.Tensor(x) @ fg.Tensor(y)).masked_fill(fg.Tensor(m), 0.0), np.where(m, 0, x @ y), True),
    (fg.Tensor(m) & fg.Tensor(m2), m & m2, False),
  )
  for out, want, vector in cases:
    item = one_kernel(out)
    opts = tuple(heuristic.hand_coded(item.kernel, caps))
    p = pipeline.prepare(item.kernel, caps, opts)
    src = CRenderer().render(p.kernel, p.listing)
    assert ("fg_vloadb_" in src.split("void ")[-2 if "_entry" in src else -1]) == vector, (opts, src[-3000:])
    got = run(item, opts)
    (np.testing.assert_array_equal if want.dtype == bool else _close)(got, want)
    (np.testing.assert_array_equal if want.dtype == bool else _close)(run(item, opts, "CPU"), want)


def test_float64_sums_take_vectors_of_doubles(rng):
  """A float64 sum (a float32 one widened: tensor._moments' layer-norm statistics; a float64 tensor's) takes vectors
  of half the native lanes, one register each, and VECTOR_ACCUMULATORS of them (passes.VECTOR_F64_OPS): float32
  lanes widened by one conversion, float64 ones loaded whole. Before, its lanes were scalar doubles. Values as
  numpy's float64 sums on the interpreter and compiled."""
  from fusegrad.codegen.renderer.cstyle import CRenderer
  from fusegrad.codegen import pipeline
  caps = _avx512(rd.get("PYTHON").caps)
  x = rng.standard_normal((64, 512)).astype(np.float32)
  y = rng.standard_normal((64, 512))
  for out, want, spelled in ((fg.Tensor(x).double().sum(1), x.astype(np.float64).sum(1), "__builtin_convertvector("),
                             (fg.Tensor(y).sum(1), y.sum(1), "fg_vload_fg_float64x8(")):
    item = one_kernel(out)
    opts = tuple(heuristic.hand_coded(item.kernel, caps))
    assert _upcasts(item.kernel, opts, caps) == [(512, 8), (64, heuristic.VECTOR_ACCUMULATORS)], opts
    assert _first_vector_axis(item.kernel, opts, caps) == 8
    p = pipeline.prepare(item.kernel, caps, opts)
    src = CRenderer().render(p.kernel, p.listing)
    assert "fg_float64x8 acc" in src and spelled in src, src[-2000:]
    for dev in ("PYTHON", "CPU"):
      np.testing.assert_allclose(run(item, opts, dev), want, rtol=1e-12, atol=1e-12)


def test_gathered_rows_are_vector_loads(rng):
  """An embedding lookup's rows: each position the row's start (an index read from memory) plus the position along
  the row, one step a lane (passes._contiguous_base), so its lanes are one vector gather (`fg_vgather_N`: one vector
  load where every lane is inside the table, else lane by lane with 0 outside) rather than a scalar loop. Values equal
  numpy's on the interpreter, compiled, and on the OPENCL device through its own spelling; the C helper zeroes the
  lanes past the buffer's end."""
  import ctypes, subprocess, tempfile, os
  from fusegrad.codegen.renderer.cstyle import CRenderer, _C_PRELUDE
  from fusegrad.codegen import pipeline
  from fusegrad.runtime.cpu import find_compiler, compiler_flags
  import fusegrad.nn.functional as F
  from tests.conftest import DEVICES
  table, idx = rng.standard_normal((50, 64)).astype(np.float32), rng.integers(0, 50, 40)
  caps = _avx512(rd.get("PYTHON").caps)
  for dev in DEVICES:
    item = one_kernel(F.embedding(fg.Tensor(idx, device=dev), fg.Tensor(table, device=dev)))
    opts = tuple(heuristic.hand_coded(item.kernel, caps if dev != "OPENCL" else rd.get(dev).caps))
    if dev != "OPENCL":
      assert _first_vector_axis(item.kernel, opts, caps) == 16, opts
      p = pipeline.prepare(item.kernel, caps, opts)
      src = CRenderer().render(p.kernel, p.listing)
      assert "fg_vgather_fg_float32x16(" in src[src.index("void " + item.kernel.name):], src[-1500:]
    else:
      w = max(rd.get(dev).caps.vector_widths)
      opts = (Opt(OptOp.UPCAST, 1, w),)
      assert f"vload{w}(" in rd.get(dev).compile_with(item.kernel, opts).source
    np.testing.assert_array_equal(run(item, opts, dev), table[idx])
  # the helper's lanes past the end: a C probe over the prelude
  probe = _C_PRELUDE + """
void probe(float* out, const float* p, long long i, long long size) { fg_float32x16 v = fg_vgather_fg_float32x16(p, i, size);
  memcpy(out, &v, sizeof v); }"""
  with tempfile.TemporaryDirectory() as d:
    so = os.path.join(d, "probe.so")
    subprocess.run([find_compiler()[0], *compiler_flags(), "-x", "c", "-", "-o", so, "-lm"], input=probe, text=True,
                   check=True, capture_output=True)
    lib = ctypes.CDLL(so)
    buf = np.arange(20, dtype=np.float32) + 1
    for i in (0, 4, 10, -3):
      out = np.zeros(16, np.float32)
      lib.probe(out.ctypes.data_as(ctypes.c_void_p), buf.ctypes.data_as(ctypes.c_void_p), ctypes.c_longlong(i),
                ctypes.c_longlong(20))
      pos = np.arange(i, i + 16)
      np.testing.assert_array_equal(out, np.where((pos >= 0) & (pos < 20), buf[np.clip(pos, 0, 19)], 0))


def test_heuristic_sums_few_columns_in_vectors(rng):
  """A sum over 256 rows into 32 columns (a small GPT's layernorm weight gradient) takes its columns in vectors
  however few work items that leaves (1 here), rather than reduction lanes gathered a row apart."""
  a, b = rng.standard_normal((8, 32, 32)).astype(np.float32), rng.standard_normal((8, 32, 32)).astype(np.float32)
  item = one_kernel((fg.Tensor(a) * fg.Tensor(b)).sum((0, 1)))
  caps = _avx512(rd.get("PYTHON").caps)
  opts = heuristic.hand_coded(item.kernel, caps)
  assert _upcasts(item.kernel, opts, caps) == [(32, 16), (2, 2)], opts
  _close(run(item, tuple(opts)), (a * b).sum((0, 1)))
  _close(run(item, tuple(opts), "CPU"), (a * b).sum((0, 1)))


def test_heuristic_puts_chains_of_reductions_side_by_side(rng):
  """A reduction whose length takes no lanes (a max over 33, which whole vectors would pad by almost half) is one
  chain of dependent steps per output: the outputs take the vector lanes instead, one chain per lane. Where the chain
  cannot be vectors (float64) nothing is upcast. Values equal numpy's exactly."""
  x = rng.standard_normal((256, 33)).astype(np.float32)
  caps = _avx512(rd.get("PYTHON").caps)
  item = one_kernel(fg.Tensor(x).amax(1))
  opts = heuristic.hand_coded(item.kernel, caps)
  assert _upcasts(item.kernel, opts, caps) == [(256, 16)] and _first_vector_axis(item.kernel, opts, caps) == 16
  np.testing.assert_array_equal(run(item, tuple(opts)), x.max(1))
  np.testing.assert_array_equal(run(item, tuple(opts), "CPU"), x.max(1))
  item = one_kernel(fg.Tensor(x.astype(np.float64)).amax(1))
  assert heuristic.hand_coded(item.kernel, caps) == []


@pytest.mark.parametrize("n", [65, 300, 700])
def test_rows_no_multiple_of_the_vectors_are_padded_or_peeled(n, rng):
  """A float32 max, sum and softmax along rows of 65, 300 or 700 (no multiple of AVX-512's 16 lanes) read the rows
  in vectors: a short row padded to whole vectors whose last one is masked (PADTO; the padded lanes add the
  reduction's identity through a lane mask, passes._lane_valids), a long one peeled (PEEL: whole vector accumulators,
  then the tail's masked vectors). Rows of softmax's outputs are stored with a masked last vector beside the
  reductions' vectors (a masked store kept when a later axis is vectorized: it lost its mask and wrote past the
  row). Values against numpy on the interpreter and compiled."""
  x = (rng.standard_normal((256, n)) * 3).astype(np.float32)
  caps = _avx512(rd.get("PYTHON").caps)
  e = np.exp(x - x.max(1, keepdims=True))
  for y, want in ((fg.Tensor(x).amax(1), x.max(1)), (fg.Tensor(x).sum(1), x.sum(1)),
                  (fg.Tensor(x).softmax(1), e / e.sum(1, keepdims=True))):
    item = one_kernel(y)
    opts = heuristic.hand_coded(item.kernel, caps)
    assert (OptOp.PEEL in {o.op for o in opts}) == (n >= 256) and OptOp.PADTO in {o.op for o in opts}, opts
    assert _first_vector_axis(item.kernel, opts, caps) in (8, 16), opts
    for dev in ("PYTHON", "CPU"):
      np.testing.assert_allclose(run(item, tuple(opts), dev), want, rtol=1e-5, atol=1e-5 * np.sqrt(n))


@pytest.mark.parametrize("n, k, m", [(20, 800, 200), (13, 40, 200), (70, 64, 100)])
def test_tile_pads_columns_to_whole_vectors(n, k, m, rng):
  """A product whose columns are no multiple of the machine's lanes (a hidden size of 200 on AVX-512's 16) gets a
  register tile over columns padded to whole vectors (at most COL_PAD_WASTE more): without one it gathered its column
  operand a row apart along the reduction (a word LSTM's dh @ W_hh 25x slower than with 192 columns). Values against
  numpy, on the CPU (compiled) and the interpreter."""
  a = rng.standard_normal((n, k)).astype(np.float32)
  b = rng.standard_normal((k, m)).astype(np.float32)
  caps = rd.get("CPU").caps
  lanes = heuristic.tile_lanes(caps)
  with fg.track() as t:
    got = (fg.tensor(a) @ fg.tensor(b)).numpy()
  np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))
  pads = (-m) % lanes
  if pads and pads <= m * heuristic.COL_PAD_WASTE:
    opts = t.kernels[-1].opts
    assert any(o.op is OptOp.PADTO and o.arg == lanes for o in opts), opts
    assert any(o.op is OptOp.UPCAST and o.arg == lanes for o in opts), opts
  py = (fg.tensor(a, device="PYTHON") @ fg.tensor(b, device="PYTHON")).numpy()
  np.testing.assert_allclose(py, a @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_reduction_of_whole_vectors_takes_the_accumulators_that_divide_it(rng):
  """A sum of vector ops whose length is whole vectors but no multiple of VECTOR_ACCUMULATORS of them (a
  log-softmax's sum of exps over a vocabulary of 2000: 125 vectors of 16) runs in vector lanes with as many
  accumulators as divide it (one here, three for 2016 = 126 vectors), not in scalar lanes (its exps 8 at a time).
  Values against numpy on the interpreter and the CPU."""
  caps = _avx512(rd.get("PYTHON").caps)
  for n, accs in ((2000, 1), (2016, 3), (2048, 4)):
    x = rng.standard_normal((24, n)).astype(np.float32)
    item = one_kernel((fg.Tensor(x) - 1).exp().sum(1))
    opts = heuristic.hand_coded(item.kernel, caps)
    ups = _upcasts(item.kernel, opts, caps)
    assert ups[0] == (n, 16) and (accs == 1 and len(ups) == 1 or ups[1] == (n // 16, accs)), (n, opts)
    want = np.exp(x.astype(np.float64) - 1).sum(1)
    for dev in ("PYTHON", "CPU"):
      np.testing.assert_allclose(run(item, tuple(opts), dev), want, rtol=1e-5)


def test_peel_splits_a_reduction_into_whole_multiples_and_a_tail(rng):
  """OptOp.PEEL: a max and a sum along rows of 70 become the fold of their first 64 and their last 6 (a new REDUCE axis
  of 6 after the axis of 64); values exactly numpy's max and numpy's sum within reassociation, on the interpreter and
  compiled. It refuses what has no such fold: an output axis, a length the multiple divides, and a reduction over more
  than the peeled axis."""
  x = rng.standard_normal((32, 70)).astype(np.float32)
  caps = rd.get("PYTHON").caps
  for y, want, exact in ((fg.Tensor(x).amax(1), x.max(1), True), (fg.Tensor(x).sum(1), x.sum(1), False)):
    item = one_kernel(y)
    k = item.kernel
    r = next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE)
    kp = apply_opt(k, Opt(OptOp.PEEL, r, 64), caps)
    assert [(a.kind, a.size) for a in kp.axes[r:r + 2]] == [(AxisKind.REDUCE, 64), (AxisKind.REDUCE, 6)]
    for dev in ("PYTHON", "CPU"):
      got = run(item, (Opt(OptOp.PEEL, r, 64),), dev)
      if exact: np.testing.assert_array_equal(got, want)
      else: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    g = next(i for i, a in enumerate(k.axes) if a.kind is AxisKind.GLOBAL)
    with pytest.raises(OptError, match="only a reduction axis is peeled"): apply_opt(k, Opt(OptOp.PEEL, g, 16), caps)
    with pytest.raises(OptError, match="no multiple"): apply_opt(k, Opt(OptOp.PEEL, r, 35), caps)
  item = one_kernel(fg.Tensor(rng.standard_normal((4, 6, 70)).astype(np.float32)).sum((1, 2)))
  k = item.kernel
  reds = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE]
  assert [k.axes[i].size for i in reds] == [6, 70]   # one reduction over both axes
  with pytest.raises(OptError, match="only a reduction over the axis alone peels"):
    apply_opt(k, Opt(OptOp.PEEL, reds[-1], 64), caps)


@pytest.mark.parametrize("case", ["softmax", "logsumexp", "softmax_avx2", "masked_softmax", "softmax_100"])
def test_rows_in_registers_compute_each_exp_once(case, rng):
  """A row whose every phase fits in the vector registers (a softmax over 128 classes: its max, its sum of exps,
  its outputs) is unrolled whole in vectors (heuristic._rows_in_registers: UNROLL of the reductions' vectors, UPCAST
  of the outputs'), and the phases' equal loads and exps are merged (passes.dedupe in pipeline.prepare): one exp per
  vector of the row where each phase's loop computed its own; a row of 100 as 7 vectors, the last masked. Values
  against numpy on the interpreter and the CPU."""
  from fusegrad.codegen import pipeline
  from fusegrad.codegen.linearize import Let
  cols = {"softmax_avx2": 64, "softmax_100": 100}.get(case, 128)
  x = rng.standard_normal((48, cols)).astype(np.float32) * 3
  caps = (_avx2 if case == "softmax_avx2" else _avx512)(rd.get("PYTHON").caps)
  e = np.exp(x - x.max(-1, keepdims=True))
  if case == "logsumexp":
    out, want = fg.Tensor(x).logsumexp(-1), np.log(e.sum(-1)) + x.max(-1)
  elif case == "masked_softmax":   # a causal mask's -inf: exp(-inf) is 0, each row keeps its first i + 1 columns
    m = np.triu(np.full((48, cols), -np.inf, np.float32), 1)
    out = (fg.Tensor(x) + fg.Tensor(m)).softmax(-1)
    em = np.exp(x + m - (x + m).max(-1, keepdims=True))
    want = em / em.sum(-1, keepdims=True)
  else: out, want = fg.Tensor(x).softmax(-1), e / e.sum(-1, keepdims=True)
  item = one_kernel(out)
  opts = heuristic.hand_coded(item.kernel, caps)
  assert OptOp.UNROLL in [o.op for o in opts], opts
  listing = pipeline.prepare(item.kernel, caps, opts).listing
  exps = [st for st in listing if isinstance(st, Let) and getattr(st.val, "op", None) == "EXP"]
  assert len(exps) == -(-cols // caps.native_lanes), exps
  for dev in ("PYTHON", "CPU"): np.testing.assert_allclose(run(item, tuple(opts), dev), want, rtol=2e-6, atol=1e-7)
  # a sum over rows of 2 vectors (one phase): a row per lane instead (heuristic.ROW_REGISTER_MIN_VECTORS)
  short = one_kernel(fg.Tensor(x[:, :2 * caps.native_lanes]).sum(-1))
  assert heuristic._rows_in_registers(short.kernel, caps) is None
