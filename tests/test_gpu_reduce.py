"""A GPU's long reductions stream their input as vectors (codegen/opt/heuristic._long_reduction): the first kernel of a
big split sum (2^28 floats: 4096 partial sums of 65536) reads a float4 per work item and step, neighbouring items
reading neighbouring vectors, and its lanes fold in registers before the work-group combines one partial per item
(codegen/passes.expand, _vectorize, group). Rendered with a GPU's caps on any machine; run by the interpreter and
OpenCL (PoCL here, the GPU itself under `make gpu-test`)."""
from __future__ import annotations
import re
from dataclasses import replace
import numpy as np
import pytest
import fusegrad as fg
from fusegrad.codegen import pipeline
from fusegrad.codegen.ir import AxisKind
from fusegrad.codegen.opt import Opt, OptOp, heuristic, apply_opts
from fusegrad.codegen.renderer.cstyle import OpenCLRenderer
from fusegrad.schedule import rules
from fusegrad.schedule import schedule as S
from tests.unit.kernels import one_kernel, run
from tests.unit.test_actions import GPU, _has_opencl

K = AxisKind
DEVICES = ["PYTHON"] + (["OPENCL"] if _has_opencl() else [])
# the first kernel of a GPU's split sum of 2^28 floats: 4096 rows of CHUNK (test_split_of_a_big_sum_on_a_gpu)
CHUNK = 1 << 16


@pytest.fixture
def no_split(monkeypatch):
  """Schedules where no reduction is split, so a sum over rows of CHUNK is one kernel of the split's first kind (a
  GPU's own parameters too: OPENCL on a GPU under `make gpu-test`)."""
  for d in ("PYTHON", "OPENCL"):
    monkeypatch.setitem(rules.DEVICE_PARAMS, d, replace(rules.DEVICE_PARAMS[d], split_min=1 << 40))
  monkeypatch.setattr(rules, "GPU", replace(rules.GPU, split_min=1 << 40))
  S._schedule_cache.clear(); S._lower_cache.clear()
  yield
  S._schedule_cache.clear(); S._lower_cache.clear()


def _source(item, opts, caps=GPU) -> str:
  p = pipeline.prepare(item.kernel, caps, tuple(opts))
  src = OpenCLRenderer().render(p.kernel, p.listing)
  return src[src.index("__kernel"):]


def test_split_of_a_big_sum_on_a_gpu():
  """A GPU splits a sum of 2^28 into 4096 partial sums of CHUNK (then one work-group sums those); a CPU into 1024."""
  red = fg.randn(1 << 28, device="PYTHON").sum().node.src[0]
  assert red.op == "REDUCE" and rules.wants_split(red, rules.GPU)
  _, partial = rules.split(red, rules.GPU)
  assert partial.shape == (4096, 1) and partial.src[0].src[0].shape == (4096, CHUNK), partial.src[0].src[0].shape
  _, partial = rules.split(red, rules.Params())
  assert partial.shape == (1024, 1)


REFERENCE = {"sum": lambda x: x.astype(np.float64).sum(1), "max": lambda x: x.max(1),
             "mean": lambda x: x.astype(np.float64).mean(1)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_long_reduction_reads_float4_vectors(op, device, rng, no_split):
  x = rng.standard_normal((6, CHUNK)).astype(np.float32) * 2 + 0.5
  t = fg.tensor(x, device=device)
  item = one_kernel(getattr(t, op)(1) if op != "max" else t.amax(1))
  opts = heuristic.hand_coded(item.kernel, GPU)
  # four neighbouring values per step as one vector, the rest of the row across 256 items
  assert opts == [Opt(OptOp.UPCAST, 1, 4), Opt(OptOp.GROUP, 1, 256)], opts
  ko = apply_opts(item.kernel, opts, GPU)
  assert ko.local_size == (256,) and [a.size for a in ko.of_kind(K.REDUCE)] == [CHUNK // 1024], ko.axes
  src = _source(item, opts)
  # one float4 load per step at the item's own vector (lidx*4: coalesced), no scalar reads of the input, a vector
  # accumulator, and one local buffer: the lanes fold in registers before the group's one tree
  loads = re.findall(r"vload4\(0, b1\+\(([^;]*)\)\);", src)
  assert len(loads) == 1 and "lidx*4" in loads[0] and "r0oo*1024" in loads[0], src
  assert "b1[" not in src and "float4 acc0" in src and src.count("__local") == 1, src
  got = run(item, tuple(opts), device)
  np.testing.assert_allclose(got, REFERENCE[op](x), rtol=1e-5, atol=2e-3 if op == "sum" else 1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_accumulators_fold_before_the_group(device, rng, no_split):
  """Two float4 accumulators per item (an UPCAST of the steps after the GROUP) and, without vectors, eight scalar
  ones: each item folds its own before the work-group combines them, one local buffer either way (one tree per
  accumulator before: 8 trees, 64 barriers)."""
  x = rng.standard_normal((3, CHUNK)).astype(np.float32)
  item = one_kernel(fg.tensor(x, device=device).sum(1))
  opts = (Opt(OptOp.UPCAST, 1, 4), Opt(OptOp.GROUP, 1, 256), Opt(OptOp.UPCAST, 1, 2))
  src = _source(item, opts)
  assert src.count("vload4(0, b1+") == 2 and "float4 acc1" in src and src.count("__local") == 1, src
  scalar = replace(GPU, vector_widths=())
  src = _source(item, opts, scalar)
  assert "vload4" not in src and "float acc7" in src and src.count("__local") == 1, src
  got = run(item, opts, device)
  np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-5, atol=2e-3)


def test_other_reductions_keep_their_actions(rng, no_split):
  """Only a long reduction along contiguous memory takes the vectors: a short row (its items' shares unrolled in
  registers, heuristic.ROW_REGISTERS), a sum over columns (strided along the reduction), an int32 sum (no vector
  values) and a padded row (its reads masked along the reduction) keep the rules after it; a CPU's actions do not
  change (no work-groups)."""
  f32 = lambda *s: fg.tensor(rng.standard_normal(s).astype(np.float32), device="PYTHON")
  cases = {
    "short rows": (f32(8, 8192).sum(1), [Opt(OptOp.GROUP, 1, 256), Opt(OptOp.UNROLL, 1, 32)]),
    "columns": (f32(CHUNK, 4).sum(0), None),
    "int32": (fg.tensor(rng.integers(-9, 9, (4, CHUNK)).astype(np.int32), device="PYTHON").sum(1),
              [Opt(OptOp.GROUP, 1, 256)]),
    "padded": (fg.nn.functional.pad(f32(4, CHUNK - 3), (0, 3)).sum(1), None),
  }
  for name, (out, want) in cases.items():
    item = one_kernel(out)
    opts = heuristic.hand_coded(item.kernel, GPU)
    assert opts and opts[0].op is not OptOp.UPCAST, (name, opts)
    if want is not None: assert opts == want, (name, opts)
    # (float32 sums of CHUNK standard normals in another order: |error| ~ sqrt(CHUNK) * 2^-24 * |partial sums| up to
    # a few hundred, ~3e-3 typical: a fresh draw once gave 3.6e-3)
    np.testing.assert_allclose(run(item, tuple(opts)), run(item, ()), rtol=1e-5, atol=2e-2)
  cpu = replace(GPU, has_local=False, prefers_blocking=True)
  item = one_kernel(f32(4, CHUNK).sum(1))
  assert all(o.op is not OptOp.GROUP for o in heuristic.hand_coded(item.kernel, cpu))


@pytest.mark.parametrize("device", DEVICES)
def test_split_sum_values(device, rng):
  """A sum and a max of 2^22 floats, split in two kernels as the device's rules say, against numpy (fresh inputs)."""
  x = (rng.standard_normal(1 << 22) * 3 + 1).astype(np.float32)
  t = fg.tensor(x, device=device)
  np.testing.assert_allclose(t.sum().numpy(), x.astype(np.float64).sum(), rtol=1e-5, atol=0.5)
  np.testing.assert_allclose(t.max().numpy(), x.max())


@pytest.fixture
def one_softmax_kernel(monkeypatch):
  """The softmax of a 40-long row as one kernel on every device: a GPU's own parameters (OPENCL on a GPU under
  `make gpu-test`) store its max in a kernel of its own (rules.broadcast_reduction: 40 has no power-of-two factor
  of heuristic.GROUP_MIN)."""
  monkeypatch.setattr(rules, "GPU", replace(rules.GPU, store_broadcast_reductions=False))
  S._schedule_cache.clear(); S._lower_cache.clear()
  yield
  S._schedule_cache.clear(); S._lower_cache.clear()


@pytest.mark.parametrize("device", DEVICES)
def test_vectors_beside_a_grouped_reduction(device, rng, one_softmax_kernel):
  """A softmax whose max is grouped and whose sum runs in vector lanes (a sequence a search may try): the sum reads
  the group's max broadcast into a vector, which passes.group must see through (it once left a second, serial copy
  of the max inside the vector: wrong values)."""
  from tests.unit.kernels import make
  item = one_kernel(make("softmax", rng, device))
  assert [(a.kind, a.size) for a in item.kernel.axes][2:] == [(K.REDUCE, 40), (K.REDUCE, 40)], item.kernel.axes
  opts = (Opt(OptOp.GROUP, 2, 2), Opt(OptOp.UPCAST, 4, 8))
  src = _source(item, opts)
  assert src.count("__local") == 1 and "float8 acc" in src and src.count("for (int r0") == 1, src
  np.testing.assert_allclose(run(item, opts, device), run(item, (), device), rtol=2e-5, atol=2e-6)
