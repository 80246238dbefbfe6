"""A GPU's softmax and layernorm read each row once (codegen/opt/heuristic.ROW_REGISTERS, codegen/passes.dedupe): a
work-group per row shares the reductions, and each item's share of the row is unrolled in every phase at the same
indices, so its elements are loaded once into registers (neighbouring items reading neighbouring elements) and kept
across the group's barriers. Rendered with a GPU's caps on any machine; run by the interpreter and OpenCL (PoCL
here, the GPU itself under `make gpu-test`, whose own caps choose the actions)."""
from __future__ import annotations
import re
from dataclasses import replace
import numpy as np
import pytest
import fusegrad as fg
from fusegrad import dtype as dt
from fusegrad.graph import symbolic as sym
from fusegrad.codegen import pipeline, passes
from fusegrad.codegen.ir import AxisKind, Kernel, BufferArg, Store, Load, Alu, Axis, Const, toposort
from fusegrad.codegen.opt import OptOp, heuristic, apply_opts
from fusegrad.codegen.renderer.cstyle import OpenCLRenderer
from fusegrad.runtime import device as rd
from tests.unit.kernels import one_kernel, run
from tests.unit.test_actions import GPU, _has_opencl

K = AxisKind
DEVICES = ["PYTHON"] + (["OPENCL"] if _has_opencl() else [])


def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _layernorm(x, w=None, b=None, eps=1e-5):
  x = x.astype(np.float64)
  y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
  if w is not None: y = y * w + b
  return y


def _case(name: str, rows: int, n: int, rng, device: str):
  """(lazy result, numpy reference)."""
  x = rng.standard_normal((rows, n)).astype(np.float32) * 3
  t = fg.Tensor(x, device=device)
  if name == "softmax": return t.softmax(-1), _softmax(x)
  if name == "layernorm": return fg.nn.functional.layer_norm(t, (n,)), _layernorm(x)
  w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  return (fg.nn.functional.layer_norm(t, (n,), fg.Tensor(w, device=device), fg.Tensor(b, device=device)),
          _layernorm(x, w, b))


def _row_loads(src: str, row: int) -> list:
  """The offsets from a row's start (gidx*row) of the kernel's reads of its input row b1, as written."""
  return re.findall(rf"b1\[\(gidx\*{row}\+lidx(?:\+(\d+))?\)\]", src)


# every case on the interpreter; two on OpenCL (a PoCL build of a kernel unrolled 32 times takes seconds)
ROW_CASES = [(name, n, "PYTHON") for name in ("softmax", "layernorm", "layernorm_affine") for n in (1024, 8192)] + \
    ([("softmax", 8192, "OPENCL"), ("layernorm_affine", 1024, "OPENCL")] if _has_opencl() else [])


@pytest.mark.parametrize("name,n,device", ROW_CASES)
def test_each_row_element_is_loaded_once(name, n, device, rng):
  out, want = _case(name, 64, n, rng, device)
  item = one_kernel(out)
  opts = heuristic.hand_coded(item.kernel, GPU)
  per = n // 256
  # a work-group of 256 per row shares every reduction and the outputs; each item's per = n / 256 values unrolled
  assert [o.op for o in opts[:2]] == [OptOp.GROUP] * 2 and OptOp.LOCAL in [o.op for o in opts], opts
  ko = apply_opts(item.kernel, opts, GPU)
  assert ko.local_size == (256,) and not ko.of_kind(K.REDUCE, K.LOOP), ko.axes
  assert sorted(a.size for a in ko.of_kind(K.UNROLL, K.UPCAST)) == [per] * 3, ko.axes
  p = pipeline.prepare(item.kernel, GPU, tuple(opts))
  src = OpenCLRenderer().render(p.kernel, p.listing)
  # one load per element the item owns, at lidx + j * 256 (coalesced: neighbouring items, neighbouring elements),
  # no loop left, every phase reading those registers
  offs = [int(o or 0) for o in _row_loads(src, n)]
  assert sorted(offs) == [j * 256 for j in range(per)], src
  assert "for (int r" not in src and "for (int o" not in src, src
  if name == "softmax": assert src.count("fg_expf(v") == per, src   # exp(x - max) once, for the sum and the outputs
  got = run(item, tuple(opts), device)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_long_rows_keep_their_loops(device, rng):
  """Past ROW_REGISTERS values per item a row is read by a loop in each phase, as before (work-groups of 64 here: a
  row of 4096 is 64 values per item)."""
  caps = replace(GPU, max_local=64)
  n = 64 * heuristic.ROW_REGISTERS * 2
  out, want = _case("softmax", 64, n, rng, device)
  item = one_kernel(out)
  opts = heuristic.hand_coded(item.kernel, caps)
  assert [o.op for o in opts] == [OptOp.GROUP, OptOp.GROUP, OptOp.LOCAL], opts
  p = pipeline.prepare(item.kernel, caps, tuple(opts))
  src = OpenCLRenderer().render(p.kernel, p.listing)
  assert src.count("b1[") == 3 and src.count("for (int") >= 3, src   # a loop per phase, each reading the row
  np.testing.assert_allclose(run(item, tuple(opts), device), want, rtol=2e-5, atol=2e-6)


def test_cpu_rows_unchanged(rng):
  """The rule is the GPU heuristic's (caps with local memory and no preference for blocking): a CPU's softmax keeps
  its reduction lanes and output vectors, with no work-group or unrolled row."""
  item = one_kernel(_case("softmax", 64, 1024, rng, "CPU")[0])
  opts = heuristic.hand_coded(item.kernel, rd.get("CPU").caps)
  assert not {o.op for o in opts} & {OptOp.GROUP, OptOp.LOCAL, OptOp.UNROLL}, opts


def _kernel(stores, nbufs: int) -> Kernel:
  bufs = (BufferArg(dt.float32, 8, True),) + tuple(BufferArg(dt.float32, 8, False) for _ in range(nbufs - 1))
  return Kernel("dedupe_test", bufs, (Axis(sym.Var("i", 0, 7), K.GLOBAL),), tuple(stores))


def test_dedupe_merges_equal_values_but_not_loads_of_a_stored_buffer():
  i = sym.Var("i", 0, 7)
  ld = lambda buf: Load(buf, sym.lin(i), sym.TRUE, dt.float32)
  add = lambda a, b: Alu("ADD", dt.float32, (a, b))
  # two equal loads of the input b1 (and equal sums of them) become one value
  k = passes.dedupe(_kernel([Store(0, sym.lin(i), add(add(ld(1), ld(1)), add(ld(1), ld(1))))], 2))
  loads = [v for v in toposort([k.stores[0].value]) if isinstance(v, Load)]
  top = k.stores[0].value
  assert len(loads) == 1 and top.src[0] is top.src[1]
  # b0 is stored by the kernel: its reads stay apart (a store may come between them)
  k = passes.dedupe(_kernel([Store(0, sym.lin(i), add(ld(0), ld(0)))], 1))
  assert len([v for v in toposort([k.stores[0].value]) if isinstance(v, Load)]) == 2
  # equal constants merge; 0.0 and -0.0 are equal numbers but not one value
  c = lambda x: Const(x, dt.float32)
  k = passes.dedupe(_kernel([Store(0, sym.lin(i), add(add(c(0.0), c(-0.0)), add(c(0.0), c(-0.0))))], 1))
  top = k.stores[0].value
  assert top.src[0] is top.src[1] and top.src[0].src[0] is not top.src[0].src[1]
  # nothing to merge: the kernel itself
  k0 = _kernel([Store(0, sym.lin(i), add(ld(1), ld(2)))], 3)
  assert passes.dedupe(k0) is k0


@pytest.mark.skipif(not _has_opencl(), reason="no OpenCL device (pyopencl) on this machine")
@pytest.mark.parametrize("name", ["softmax", "layernorm_affine"])
def test_rows_on_the_OPENCL_device(name, rng):
  """Through the device's own path (its caps, the schedule, the cache): the values, and where the device is a GPU
  (`make gpu-test`) each row element loaded once."""
  n = 8192
  out, want = _case(name, 64, n, rng, "OPENCL")
  with fg.track() as tr:
    got = out.numpy()
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  caps = rd.get("OPENCL").caps
  if caps.has_local and not caps.prefers_blocking:
    (rec,) = [r for r in tr.kernels if OptOp.UNROLL in [o.op for o in r.opts]]
    assert sorted(int(o or 0) for o in _row_loads(rec.source, n)) == [j * 256 for j in range(n // 256)], rec.source
