"""The tensor-core action (OptOp.TC) against the numpy interpreter, which emulates every entry of the table
(codegen/opt/tc.py): the layouts are bijections, a matmul on a tensor core gives numpy's numbers and the unoptimized
kernel's, the action refuses what it cannot do and says why, and renderers that cannot spell it never see it."""
from __future__ import annotations
from dataclasses import replace
import numpy as np
import pytest
import fusegrad as fg
from fusegrad import dtype as dt
from fusegrad.graph import symbolic as sym
from fusegrad.codegen.ir import AxisKind, Mma
from fusegrad.codegen.opt import Opt, OptOp, OptError, apply_opt, apply_opts, heuristic, search
from fusegrad.codegen.opt import tc as tcs
from fusegrad.codegen.opt.actions import tc_axes
from fusegrad.codegen.renderer.base import RenderError, check_spellable
from fusegrad.codegen import pipeline
from fusegrad.runtime import device as rd
from fusegrad.runtime.python import mma, tf32_round, bf16_round_trip
from tests.unit.kernels import one_kernel, run

K = AxisKind
SM80 = tcs.TENSOR_CORES["sm_80"]
F16, BF16, TF32 = range(3)     # SM80's entries


def _dev():
  return rd.get("PYTHON")


def _t(x, d=None) -> fg.Tensor:
  t = fg.Tensor(x, device="PYTHON")
  return t.to(d).realize() if d is not None else t.realize()


def _tc_opts(item, caps, entry):
  """PADTO where needed, then TC on caps.tensor_cores[entry] (the heuristic's helper, restricted to one entry)."""
  caps = replace(caps, tensor_cores=(caps.tensor_cores[entry],))
  opts = heuristic.tensor_core(item.kernel, caps)
  if not opts:   # tf32: the heuristic leaves float32 alone; the same padding by hand
    k, r = item.kernel, item.kernel.of_kind(K.REDUCE)[-1]
    m, n = tc_axes(k, r, caps.tensor_cores[0])
    ki, opts = k.axis_index(r.var), []
    for x, size in zip((m, n, r), caps.tensor_cores[0].dims):
      if x.size % size:
        opts.append(Opt(OptOp.PADTO, k.axis_index(x.var), size))
        k = apply_opt(k, opts[-1], caps)
    opts.append(Opt(OptOp.TC, ki, 0))
  return tuple(o if o.op is not OptOp.TC else Opt(OptOp.TC, o.axis, entry) for o in opts)


# ---- the table ----

@pytest.mark.parametrize("arch", sorted(tcs.TENSOR_CORES))
def test_every_layout_is_a_bijection(arch):
  for tc in tcs.TENSOR_CORES[arch]:
    M, N, Kd = tc.dims
    for lay, rows, cols in ((tc.a, M, Kd), (tc.b, Kd, N), (tc.c, M, N)):
      assert tcs.layout_errors(lay, rows, cols, tc.threads) == [], tc.name
      assert len(lay[0]) * tc.threads == rows * cols
    assert tcs.tc_errors(tc) == []


def test_the_checker_finds_broken_layouts():
  tc = SM80[F16]
  dup = (tc.c[0][:1] + tc.c[0][:1] + tc.c[0][2:],) + tc.c[1:]      # lane 0 holds (0, 0) twice, (0, 1) never
  assert any("held by lane 0 element 0 and lane 0 element 1" in e for e in tcs.layout_errors(dup, 16, 8, 32))
  assert any("outside" in e for e in tcs.layout_errors(((( 16, 0),) + tc.c[0][1:],) + tc.c[1:], 16, 8, 32))
  assert tcs.layout_errors(tc.c[:31], 16, 8, 32)
  with pytest.raises(ValueError, match="held by"): replace(tc, c=dup)


def test_layouts_are_the_ptx_fragments():
  """A few lanes written out from the PTX ISA's figures (not from the formulas the table is built with)."""
  f16, tf32 = SM80[F16], SM80[TF32]
  assert f16.a[0] == ((0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9))
  assert f16.a[5] == ((1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11))
  assert f16.b[6] == ((4, 1), (5, 1), (12, 1), (13, 1))
  assert f16.c[31] == ((7, 6), (7, 7), (15, 6), (15, 7))
  assert tf32.a[1] == ((0, 1), (8, 1), (0, 5), (8, 5)) and tf32.b[9] == ((1, 2), (5, 2))
  sm75 = tcs.TENSOR_CORES["sm_75"][0]
  assert sm75.dims == (16, 8, 8) and sm75.a[3] == ((0, 6), (0, 7), (8, 6), (8, 7)) and sm75.b[3] == ((6, 0), (7, 0))


def test_lane_expressions_give_the_table():
  lane = sym.Var("lane", 0, 31)
  for tc in {t for v in tcs.TENSOR_CORES.values() for t in v}:
    for lay in (tc.a, tc.b, tc.c):
      exprs = tcs.lane_exprs(lay, lane)
      for l in range(32):
        assert tuple((sym.evaluate(r, {lane: l}), sym.evaluate(c, {lane: l})) for r, c in exprs) == lay[l]


# ---- the interpreter's emulation ----

@pytest.mark.parametrize("entry", [F16, BF16, TF32])
def test_mma_gathers_and_scatters_by_the_layouts(entry, rng):
  """Two warps' fragments read from known A, B, C through the layouts: each lane gets its elements of A @ B + C."""
  tc = SM80[entry]
  M, N, Kd = tc.dims
  rnd = {F16: lambda x: x.astype(np.float16).astype(np.float32), BF16: bf16_round_trip, TF32: tf32_round}[entry]
  A, B = (rnd(rng.standard_normal(s).astype(np.float32)) for s in ((2, M, Kd), (2, Kd, N)))
  C = rng.standard_normal((2, M, N)).astype(np.float32)
  frag = lambda X, lay: np.concatenate([np.array([[X[w][rc] for rc in lane] for lane in lay]) for w in range(2)])
  d = mma(tc, frag(A, tc.a), frag(B, tc.b), frag(C, tc.c), 64)
  want = frag((A.astype(np.float64) @ B + C).astype(np.float32), tc.c)
  np.testing.assert_array_equal(d, want)


def test_tf32_rounds_to_nearest_ties_away():
  one = np.float32(1)
  x = np.array([1 + 2.0 ** -11, 1 + 2.0 ** -12, -(1 + 2.0 ** -11), 1 + 3 * 2.0 ** -11, np.inf, np.nan], np.float32)
  got = tf32_round(x)
  np.testing.assert_array_equal(got[:5], [one + 2.0 ** -10, one, -(one + 2.0 ** -10), one + 2.0 ** -9, np.inf])
  assert np.isnan(got[5])


# ---- matmuls on tensor cores ----

def _case(name, rng, d):
  """(item, numpy reference in float64 of the inputs as stored) of a matmul-like kernel with inputs of dtype d."""
  rnd = {dt.float16: lambda x: x.astype(np.float16).astype(np.float32), dt.bfloat16: bf16_round_trip,
         dt.float32: lambda x: x}[d]
  shapes = {"matmul": ((32, 32), (32, 16)), "padded": ((20, 24), (24, 12)), "bmm": ((2, 16, 32), (2, 32, 24)),
            "wide": ((48, 64), (64, 40)), "square": ((64, 64), (64, 32))}
  if name == "epilogue":
    a, b, bias = (rnd(rng.standard_normal(s).astype(np.float32)) for s in ((32, 48), (48, 24), (24,)))
    item = one_kernel((_t(a, d) @ _t(b, d) + _t(bias, d)).relu())
    return item, np.maximum(a.astype(np.float64) @ b + bias, 0)
  sa, sb = shapes[name]
  a, b = rnd(rng.standard_normal(sa).astype(np.float32)), rnd(rng.standard_normal(sb).astype(np.float32))
  return one_kernel(_t(a, d) @ _t(b, d)), a.astype(np.float64) @ b


def _out(x, d):
  from fusegrad.runtime.python import _bf16_to_f32
  return _bf16_to_f32(x.view(np.uint16)) if d is dt.bfloat16 and x.dtype == np.uint16 else x.astype(np.float32)


@pytest.mark.parametrize("d,entry", [(dt.float16, F16), (dt.bfloat16, BF16)])
@pytest.mark.parametrize("name", ["matmul", "padded", "bmm", "epilogue", "wide"])
def test_16bit_matmul_on_a_tensor_core(name, d, entry, rng):
  item, want = _case(name, rng, d)
  with _dev().emulate(SM80) as dev:
    opts = _tc_opts(item, dev.caps, entry)
    k = apply_opts(item.kernel, opts, dev.caps)
    assert k.of_kind(K.WARP) and k.tensor_core is SM80[entry]
    assert any(isinstance(st.val, Mma) for st in dev.compile_with(item.kernel, opts).program.listing
               if hasattr(st, "val"))
    got, plain = _out(run(item, opts), d), _out(run(item, ()), d)
  # the result is rounded to d once: one unit in the last place of d (2^-10 / 2^-7) apart at most
  ulp = 2.0 ** -10 if d is dt.float16 else 2.0 ** -7
  scale = np.abs(want).max()
  np.testing.assert_allclose(got, want, rtol=ulp, atol=ulp * scale / 8)
  np.testing.assert_allclose(got, plain, rtol=ulp, atol=ulp * scale / 8)


@pytest.mark.parametrize("kd", [16, 48])
@pytest.mark.parametrize("arch,entry", [("sm_80", F16), ("sm_75", 0)])
def test_integer_matmul_is_exact(arch, entry, kd, rng):
  """Small integers: every product and sum is exact in float32 and the result in float16, so a tensor core (whatever
  its layouts) must give numpy's numbers bit for bit: a misplaced fragment element could not hide in a tolerance.
  K = 16 on m16n8k16 is one tile: no loop around the Mma."""
  a, b = rng.integers(-4, 5, (2, 32, kd)).astype(np.float16), rng.integers(-4, 5, (2, kd, 16)).astype(np.float16)
  item = one_kernel(_t(a) @ _t(b))
  with _dev().emulate(arch) as dev:
    opts = _tc_opts(item, dev.caps, entry)
    got = run(item, opts)
  np.testing.assert_array_equal(got, (a.astype(np.float64) @ b).astype(np.float16))


@pytest.mark.parametrize("name", ["matmul", "padded", "bmm"])
def test_tf32_matmul_rounds_its_inputs(name, rng):
  """float32 inputs on the tf32 core: numpy's matmul of the inputs rounded to tf32, up to float32 rounding; against
  float32 math the tf32 tolerance, and not equal (the inputs were rounded)."""
  item, _ = _case(name, rng, dt.float32)
  a, b = (i.buffer.numpy().reshape(i.shape) for i in item.inputs)
  want = tf32_round(a).astype(np.float64) @ tf32_round(b)
  with _dev().emulate(SM80) as dev:
    assert heuristic.tensor_core(item.kernel, dev.caps) == []     # float32 keeps float32 math by default
    got = run(item, _tc_opts(item, dev.caps, TF32))
    plain = run(item, ())
  scale = np.abs(want).max()
  np.testing.assert_allclose(got, want.reshape(got.shape), rtol=1e-6, atol=1e-6 * scale)
  np.testing.assert_allclose(got, plain, rtol=2e-3, atol=2e-3 * scale)
  assert not np.array_equal(got, plain)


@pytest.mark.parametrize("more", [
  [(OptOp.UPCAST, "M", 2)], [(OptOp.UPCAST, "N", 2), (OptOp.UPCAST, "M", 2)], [(OptOp.UPCAST, "K", 2)],
  [(OptOp.UNROLL, "K", 2)], [(OptOp.LOCAL, "N", 2), (OptOp.LOCAL, "M", 2)], [(OptOp.SWAP, "M", "N")],
  [(OptOp.LOOP, "M", 2)], [(OptOp.PADTO, "K", 3)]])
def test_actions_after_tc_keep_the_result(more, rng):
  """Register tiles of tiles, more warps per work-group, loop orders: the same numbers."""
  item, want = _case("square", rng, dt.float16)   # [4 x 16 M, 4 x 8 N, 4 x 16 K]
  with _dev().emulate(SM80) as dev:
    caps = dev.caps
    opts = list(_tc_opts(item, caps, F16))
    k = apply_opts(item.kernel, opts, caps)
    outer = {"M": k.of_kind(K.GLOBAL)[0].var, "N": k.of_kind(K.GLOBAL)[1].var, "K": k.of_kind(K.REDUCE)[0].var}
    for op, ax, arg in more:
      o = Opt(op, k.axis_index(outer[ax]), k.axis_index(outer[arg]) if isinstance(arg, str) else arg)
      k = apply_opt(k, o, caps)
      opts.append(o)
      outer = {n: next((a.var for a in k.axes if a.var.name.startswith(v.name)), v) for n, v in outer.items()}
    got, plain = run(item, tuple(opts)), run(item, ())
  np.testing.assert_allclose(got.astype(np.float32), plain.astype(np.float32), rtol=2 ** -10,
                             atol=2 ** -10 * np.abs(want).max())


# ---- refusals ----

def _refuses(item, opt, caps, why):
  with pytest.raises(OptError, match=why): apply_opts(item.kernel, opt if isinstance(opt, tuple) else (opt,), caps)


def test_tc_refuses_what_it_cannot_do(rng):
  dev = _dev()
  tc_caps = replace(dev.caps, tensor_cores=SM80)
  mm, _ = _case("matmul", rng, dt.float16)          # [32 M, 16 N, 32 K]
  r = len(mm.kernel.axes) - 1
  _refuses(mm, Opt(OptOp.TC, r, 0), dev.caps, "the device has no tensor cores")
  _refuses(mm, Opt(OptOp.TC, r, 3), tc_caps, "has 3 tensor cores, no entry 3")
  _refuses(mm, Opt(OptOp.TC, 0, F16), tc_caps, "must be the reduction axis K, this one is global")
  _refuses(mm, Opt(OptOp.TC, r, BF16), tc_caps, "operands are float16 and float16: .* multiplies bfloat16")
  _refuses(mm, (Opt(OptOp.UPCAST, 0, 2), Opt(OptOp.TC, r + 1, F16)), tc_caps, "TC comes before any other action")
  _refuses(mm, Opt(OptOp.TC, r, F16), replace(tc_caps, max_local=16), "a work-group of 32 exceeds the device's 16")
  f32, _ = _case("matmul", rng, dt.float32)
  _refuses(f32, Opt(OptOp.TC, r, F16), tc_caps, "operands are float32 and float32: .* multiplies float16")
  padded, _ = _case("padded", rng, dt.float16)      # M = 20
  _refuses(padded, Opt(OptOp.TC, r, F16), tc_caps, r"M axis o0:global\[20\] is not a multiple of 16 \(PADTO first\)")
  x = _t(rng.standard_normal((32, 64)).astype(np.float32), dt.float16)
  _refuses(one_kernel(x.sum(1)), Opt(OptOp.TC, 1, F16), tc_caps, "the sum accumulates in float16, .* in float32")
  _refuses(one_kernel(x.float().sum(1)), Opt(OptOp.TC, 1, F16), tc_caps, "not a product of two loads")
  _refuses(one_kernel(x.float().softmax(-1)), Opt(OptOp.TC, 2, TF32), tc_caps, "the kernel has 2 reductions")
  y = _t(rng.standard_normal((32, 64)).astype(np.float32), dt.float16)
  _refuses(one_kernel((x.float() * y.float()).sum(1)), Opt(OptOp.TC, 1, F16), tc_caps,
           "no output axis that only one operand")
  _refuses(one_kernel((x * 2).relu()), Opt(OptOp.TC, 0, F16), tc_caps, "must be the reduction axis")
  mx = (x.float().reshape(32, 1, 64) * y.float().reshape(1, 32, 64)).max(-1)
  _refuses(one_kernel(mx[0] if isinstance(mx, tuple) else mx), Opt(OptOp.TC, 2, F16), tc_caps,
           "must be a SUM, it is MAX")


def test_work_group_actions_after_tc_say_why(rng):
  item, _ = _case("wide", rng, dt.float16)
  caps = replace(_dev().caps, tensor_cores=SM80)
  k = apply_opts(item.kernel, _tc_opts(item, caps, F16), caps)
  ko = k.axis_index(k.of_kind(K.REDUCE)[0].var)
  for o in (Opt(OptOp.GROUP, ko, 2), Opt(OptOp.STAGE, ko, 2)):
    with pytest.raises(OptError, match="computes on tensor cores"): apply_opt(k, o, caps)
  with pytest.raises(OptError, match="TC comes before"): apply_opt(k, Opt(OptOp.TC, ko, F16), caps)


def test_renderers_never_see_an_mma(rng, monkeypatch):
  """The C renderer does not declare a tensor core: a listing with an Mma (caps swapped under the device) is refused
  before it is rendered, saying why."""
  item, _ = _case("matmul", rng, dt.float16)
  caps = replace(_dev().caps, tensor_cores=SM80)
  opts = _tc_opts(item, caps, F16)
  p = pipeline.prepare(item.kernel, caps, opts)
  cpu = rd.get("CPU")
  with pytest.raises(RenderError, match="c renderer cannot spell .*m16n8k16"): check_spellable(cpu.renderer, p.listing)
  monkeypatch.setattr(cpu, "_caps", replace(cpu.caps, tensor_cores=SM80, has_local=True, max_local=1024))
  with pytest.raises(RenderError, match="declares no such tensor core"): cpu.compile_with(item.kernel, opts)
  monkeypatch.undo()
  with pytest.raises(OptError, match="no tensor cores"): cpu.compile_with(item.kernel, opts)


@pytest.mark.parametrize("entry,cvt", [(F16, "cvt.rn.f16x2.f32"), (BF16, "cvt.rn.bf16x2.f32"), (TF32, "cvt.rna.tf32.f32")])
def test_opencl_spells_an_mma_as_ptx(entry, cvt, rng):
  """An OpenCL renderer that declares a tensor core (an NVIDIA GPU's: runtime/opencl.py) spells the Mma as inline
  PTX: the fragments packed into 32-bit registers, mma.sync with D, A, B and C register groups of the table's sizes,
  D as the lane's float vector; one that does not declare it refuses (the hardware check of the layouts and the
  kernels' numbers is `make gpu-test` on an NVIDIA GPU)."""
  from fusegrad.codegen.renderer.cstyle import OpenCLRenderer
  tc = SM80[entry]
  item, _ = _case("matmul", rng, tc.dtype_in)
  caps = replace(_dev().caps, tensor_cores=SM80)
  p = pipeline.prepare(item.kernel, caps, _tc_opts(item, caps, entry))
  r = OpenCLRenderer()
  with pytest.raises(RenderError, match="cannot spell"): r.render(p.kernel, p.listing)
  r.caps = replace(r.caps, tensor_cores=SM80)
  src = r.render(p.kernel, p.listing)
  regs = lambda n: n if tc.input_format == "tf32" else n // 2
  na, nb, nc = regs(len(tc.a[0])), regs(len(tc.b[0])), len(tc.c[0])
  group = lambda start, n: "{" + ",".join(f"%{i}" for i in range(start, start + n)) + "}"
  assert f"{tc.name} {group(0, nc)}, {group(nc, na)}, {group(nc + na, nb)}, {group(nc + na + nb, nc)};" in src
  assert src.count(cvt) == na + nb
  assert "reqd_work_group_size(32, 1, 1)" in src


# ---- the heuristic and the search ----

def test_heuristic_uses_a_tensor_core_where_the_device_has_one(rng):
  pad, _ = _case("padded", rng, dt.float16)         # [20, 12, 24]: every axis padded first
  caps = replace(_dev().caps, tensor_cores=SM80)
  assert heuristic.hand_coded(pad.kernel, caps) == [Opt(OptOp.PADTO, 0, 16), Opt(OptOp.PADTO, 1, 8),
                                                     Opt(OptOp.PADTO, 2, 16), Opt(OptOp.TC, 2, F16)]
  bf, _ = _case("bmm", rng, dt.bfloat16)
  assert heuristic.hand_coded(bf.kernel, caps) == [Opt(OptOp.TC, 3, BF16)]
  assert heuristic.hand_coded(bf.kernel, replace(caps, tensor_cores=(SM80[F16],))) == \
      heuristic.hand_coded(bf.kernel, _dev().caps)   # no core for bfloat16: the usual choice
  for name in ("matmul", "softmax_wide", "sum_rows"):   # float32 kernels: unchanged
    from tests.unit.kernels import make
    it = one_kernel(make(name, rng))
    assert heuristic.hand_coded(it.kernel, caps) == heuristic.hand_coded(it.kernel, _dev().caps)


@pytest.mark.parametrize("d,entry", [(dt.float16, F16), (dt.bfloat16, BF16)])
def test_heuristic_gives_each_warp_a_tile_of_tiles(d, entry, rng, monkeypatch):
  """Where the work allows (here: any, TC_MIN_WARPS lowered), each warp computes a WARP_TILES block of tensor-core
  tiles (UPCASTs of N's and M's outer parts): the fragments of A serve several N tiles and B's several M tiles, with
  numpy's numbers."""
  monkeypatch.setattr(heuristic, "TC_MIN_WARPS", 1)
  item, want = _case("square", rng, d)            # [64, 32, 64]: M outer 4, N outer 4
  with _dev().emulate(SM80[entry:entry + 1]) as dev:
    opts = heuristic.hand_coded(item.kernel, dev.caps)
    assert opts == [Opt(OptOp.TC, 2, 0), Opt(OptOp.UPCAST, 2, 4), Opt(OptOp.UPCAST, 0, 2)]
    got = _out(run(item, opts), d)
  np.testing.assert_allclose(got, want, rtol=1e-2 if d is dt.bfloat16 else 2e-3, atol=0.05 if d is dt.bfloat16 else 1e-2)


def test_search_tries_tensor_cores(rng):
  item, _ = _case("matmul", rng, dt.float16)
  caps = _dev().caps
  assert not any(o.op is OptOp.TC for o in search.candidate_actions(item.kernel, caps))
  tcs_found = [o for o in search.candidate_actions(item.kernel, replace(caps, tensor_cores=SM80)) if o.op is OptOp.TC]
  assert tcs_found == [Opt(OptOp.TC, 2, F16)]


def test_track_shows_the_tc_action(rng):
  a = rng.standard_normal((64, 32)).astype(np.float16)
  b = rng.standard_normal((32, 48)).astype(np.float16)
  with _dev().emulate("sm_86"), fg.track() as t:
    got = (fg.Tensor(a, device="PYTHON") @ fg.Tensor(b, device="PYTHON")).numpy()
  assert any(o.op is OptOp.TC for rec in t.kernels for o in rec.opts), [rec.opts for rec in t.kernels]
  assert any("mma.sync.aligned.m16n8k16" in rec.source for rec in t.kernels)
  want = a.astype(np.float64) @ b
  np.testing.assert_allclose(got.astype(np.float32), want, rtol=2 ** -10, atol=2 ** -10 * np.abs(want).max() / 8)
  assert _dev().caps.tensor_cores == ()


# ---- on an NVIDIA GPU (make gpu-test) ----

def _opencl_tensor_cores():
  try:
    return rd.get("OPENCL").caps.tensor_cores
  except Exception:
    return ()


@pytest.mark.skipif(not _opencl_tensor_cores(), reason="no OPENCL device with tensor cores (an NVIDIA GPU)")
@pytest.mark.parametrize("d", [dt.float16, dt.bfloat16])
@pytest.mark.parametrize("shape", [(64, 64, 32), (20, 12, 24), (2, 48, 40, 24), (512, 256, 1024)])
def test_matmul_on_the_gpus_tensor_cores_OPENCL(d, shape, rng):
  """The heuristic puts a 16-bit matmul on the GPU's tensor cores (mma.sync through inline PTX; with a block of
  tiles per warp where the work allows) and the result is numpy's within the dtype's rounding."""
  *batch, m, k, n = shape
  rnd = (lambda x: x.astype(np.float16).astype(np.float32)) if d is dt.float16 else bf16_round_trip
  a, b = rnd(rng.standard_normal((*batch, m, k)).astype(np.float32)), rnd(rng.standard_normal((*batch, k, n)).astype(np.float32))
  ta = fg.Tensor(a, device="OPENCL").to(d).realize()
  tb = fg.Tensor(b, device="OPENCL").to(d).realize()
  with fg.track() as t:
    out = (ta @ tb).float().numpy()
  mm = [r for r in t.kernels if any(o.op is OptOp.TC for o in r.opts)]
  assert len(mm) == 1 and "mma.sync.aligned" in mm[0].source
  want = a.astype(np.float64) @ b
  tol = 8e-3 if d is dt.float16 else 3e-2
  np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.abs(want).max())
