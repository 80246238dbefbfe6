"""codegen/renderer/cstyle: the C and OpenCL C source of canonical kernels, rendered and never compiled (no compiler,
no GPU): the source facts a compiler and a launcher rely on — the signature, vector types where the actions and the
caps make vectors, local memory and barriers for a work-group's reduction, runtime values as arguments rather than
literals, bit casts without type punning — and what a subclass can change by its tables."""
from __future__ import annotations
import re
from dataclasses import replace
import numpy as np
import pytest
import fusegrad as fg
from fusegrad import dtype as dt
from fusegrad.codegen import pipeline
from fusegrad.codegen.ir import BufferArg
from fusegrad.codegen.opt import Opt, OptOp, OptError, apply_opt
from fusegrad.codegen.renderer.base import Caps
from fusegrad.codegen.renderer.cstyle import CRenderer, OpenCLRenderer
from tests.unit.kernels import one_kernel

DEV = "PYTHON"


def _t(rng, *shape, dtype=np.float32) -> fg.Tensor:
  return fg.Tensor(rng.standard_normal(shape).astype(dtype), device=DEV).realize()


def _render(renderer, item, opts=(), caps=None):
  """(source, the optimized kernel) of item with the given actions, optimized for caps (the renderer's own by
  default)."""
  p = pipeline.prepare(item.kernel, caps or renderer.caps, tuple(opts))
  return renderer.render(p.kernel, p.listing), p.kernel


def _signature(src: str, k) -> str:
  """The line that declares the kernel's function (not its C entry point)."""
  (line,) = [ln for ln in src.splitlines() if re.search(rf"\bvoid {k.name}\(", ln)]
  return line


def _body(src: str, k) -> str:
  """The kernel's function from its declaration on (the preludes declare every vector type and helper)."""
  return src[src.index(_signature(src, k)):]


# program -> (C signature, OpenCL signature) after the name; bufs are b0 (the output), b1, ...
SIGNATURES = {
  "elementwise": (lambda r: _t(r, 8, 16) * 2 + _t(r, 8, 16),
                  "(float* restrict b0, const float* restrict b1, const float* restrict b2, long long start, "
                  "long long end) {",
                  "(__global float* restrict b0, __global const float* restrict b1, "
                  "__global const float* restrict b2) {"),
  "matmul": (lambda r: _t(r, 8, 12) @ _t(r, 12, 16),
             "(float* restrict b0, const float* restrict b1, const float* restrict b2, long long p0, long long p1, "
             "long long start, long long end) {",
             "(__global float* restrict b0, __global const float* restrict b1, __global const float* restrict b2, "
             "long p0_, long p1_) {"),
  "int_sum": (lambda r: fg.Tensor(r.integers(-9, 9, (4, 8)).astype(np.int32), device=DEV).realize().sum(1),
              "(long long* restrict b0, const int* restrict b1, long long start, long long end) {",
              "(__global long* restrict b0, __global const int* restrict b1) {"),
  "bool_where": (lambda r: fg.where(fg.Tensor(r.random((4, 8)) < 0.5, device=DEV).realize(), _t(r, 4, 8), 0.0),
                 "(float* restrict b0, const unsigned char* restrict b1, const float* restrict b2, long long start, "
                 "long long end) {",
                 "(__global float* restrict b0, __global const uchar* restrict b1, "
                 "__global const float* restrict b2) {"),
  "half_param": (lambda r: _t(r, 4, 8, dtype=np.float16) * 3,
                 "(unsigned short* restrict b0, const unsigned short* restrict b1, float p0, long long start, "
                 "long long end) {",
                 "(__global half* restrict b0, __global const half* restrict b1, float p0) {"),
}


@pytest.mark.parametrize("case", list(SIGNATURES))
def test_signature_has_one_pointer_per_buffer(case, rng):
  """One restrict pointer per buffer, the output writable and the inputs const, in the buffers' storage types (a
  bool as a byte, a 16-bit float as its bits in C and as OpenCL's half), then the scalar arguments in their
  register types (a float16 Param as float; a view's offset as a 64-bit integer, which OpenCL narrows inside a small
  kernel); C's function takes a [start, end) range of work items, OpenCL's is a __kernel over __global pointers."""
  build, c_sig, cl_sig = SIGNATURES[case]
  item = one_kernel(build(rng))
  src, k = _render(CRenderer(), item)
  assert _signature(src, k) == f"void {k.name}{c_sig}"
  assert f"void {k.name}_entry(void** b, long long start, long long end) {{" in src
  src, k = _render(OpenCLRenderer(), item)
  assert _signature(src, k) == f"__kernel void {k.name}{cl_sig}"
  assert "int gidx = get_global_id(0);" in src
  if case == "matmul": assert "int p0 = (int)p0_;" in src and "int p1 = (int)p1_;" in src


@pytest.mark.parametrize("renderer,width,vector", [(CRenderer, 4, "fg_float32x4"), (CRenderer, 16, "fg_float32x16"),
                                                   (OpenCLRenderer, 4, "float4"), (OpenCLRenderer, 8, "float8"),
                                                   (OpenCLRenderer, 16, None)])
def test_upcast_of_a_vector_width_is_a_vector(renderer, width, vector, rng):
  """An elementwise kernel with its axis UPCAST by one of the renderer's vector widths (C: 4, 8, 16; OpenCL: 2, 4,
  8) loads, computes and stores vectors of that width: GCC vector types loaded and stored through memcpy helpers
  in C, OpenCL's floatN with vloadN/vstoreN. A width OpenCL has no vector for (16) stays scalar: one load per lane
  of each input and one store per lane."""
  item = one_kernel(_t(rng, 8, 64) * 2 + _t(rng, 8, 64))
  src, k = _render(renderer(), item, [Opt(OptOp.UPCAST, 0, width)])
  body = _body(src, k)
  if renderer is CRenderer and vector:
    assert f"{vector} v0 = fg_vload_{vector}(b1+gidx*{width});" in body
    assert f"fg_vstore_{vector}(b0+gidx*{width}, " in body and "b0[" not in body
  elif vector:
    assert f"{vector} v0 = vload{width}(0, b1+gidx*{width});" in body
    assert re.search(rf"vstore{width}\(v\d+, 0, b0\+gidx\*{width}\);", body) and "b0[" not in body
  else:
    assert "vload" not in body and "float16" not in body
    assert len(re.findall(r"b0\[[^]]*\] = ", body)) == width and len(re.findall(r"= b1\[", body)) == width


def test_caps_without_vector_widths_give_no_vector_types(rng):
  """Caps are read by the optimizer only: the same UPCAST by 16 optimized for caps that have no vector widths is
  scalar C (16 loads and stores, no vector type), and a renderer whose own caps change renders a given listing to
  the same source."""
  item = one_kernel(_t(rng, 8, 64) * 2 + _t(rng, 8, 64))
  opts = (Opt(OptOp.UPCAST, 0, 16),)
  src, k = _render(CRenderer(), item, opts, caps=replace(CRenderer.caps, vector_widths=()))
  body = _body(src, k)
  assert "fg_float32x" not in body and "fg_vload" not in body
  assert len(re.findall(r"b0\[[^]]*\] = ", body)) == 16 and len(re.findall(r"= b1\[", body)) == 16
  p = pipeline.prepare(item.kernel, CRenderer.caps, opts)
  bare = CRenderer()
  bare.caps = Caps()
  assert bare.render(p.kernel, p.listing) == CRenderer().render(p.kernel, p.listing)
  assert "fg_float32x16" in _body(bare.render(p.kernel, p.listing), p.kernel)


def test_group_reduce_uses_local_memory_and_barriers(rng):
  """A row sum with GROUP 16 in OpenCL: a work-group of 16 items (reqd_work_group_size), each finds its group and
  its place in it, the partials go through a __local buffer of 16 floats between barriers (a tree of log2(16)
  steps, each ending at a barrier), and only item 0 stores. Without the action there is no local memory and no
  barrier, and the C renderer's caps (no work-groups) refuse the action."""
  item = one_kernel(_t(rng, 8, 64).sum(1))
  src, k = _render(OpenCLRenderer(), item, [Opt(OptOp.GROUP, 1, 16)])
  assert _signature(src, k).startswith("__attribute__((reqd_work_group_size(16, 1, 1))) __kernel void ")
  assert "int gidx = get_group_id(0);" in src and "int lidx = get_local_id(0);" in src
  (decl,) = re.findall(r"__local float (\w+)\[16\] __attribute__\(\(aligned\(16\)\)\);", src)
  assert f"{decl}[lidx] = acc0;" in src
  assert src.count("barrier(CLK_LOCAL_MEM_FENCE);") == 2 + 1       # partials written, the tree's step, result read
  assert re.search(r"for \(int \w+ = 8; \w+ > 0; \w+ >>= 1\)", src)
  assert re.search(r"if \(\(\(lidx<1\)\)\) b0\[gidx\] = ", src)
  plain, _ = _render(OpenCLRenderer(), item)
  assert "__local" not in plain and "barrier" not in plain and "get_local_id" not in plain
  with pytest.raises(OptError, match="no work-groups"): apply_opt(item.kernel, Opt(OptOp.GROUP, 1, 16), CRenderer.caps)


def test_local_axis_makes_a_work_group_without_local_memory(rng):
  """LOCAL 32 on an elementwise axis: work-groups of 32 items indexed by group and local id, no local buffer and no
  barrier (the items share nothing)."""
  item = one_kernel(_t(rng, 8, 64) * 2)
  src, k = _render(OpenCLRenderer(), item, [Opt(OptOp.LOCAL, 0, 32)])
  assert "reqd_work_group_size(32, 1, 1)" in _signature(src, k)
  assert "b0[(gidx*32+lidx)] = " in src
  assert "__local" not in src and "barrier" not in src


def test_runtime_size_is_a_scalar_argument(rng):
  """x[:, :n].sum(1), n a fusegrad.Variable: the sources for two values of n are one source, whose reduction loop
  runs to the argument (an int64 scalar parameter, narrowed to int by OpenCL) and never to the value."""
  x = _t(rng, 6, 40)
  V = fg.Variable("n", 1, 40)
  n1, n2 = int(rng.integers(2, 20)), int(rng.integers(20, 40))
  for r in (CRenderer(), OpenCLRenderer()):
    (s1, k1), (s2, _) = (_render(r, one_kernel(x[:, :V.bind(n)].sum(1))) for n in (n1, n2))
    assert s1 == s2
    (end,) = [a.end for a in k1.axes if a.end is not None]
    sig, body = _signature(s1, k1), _body(s1, k1)
    if isinstance(r, CRenderer):
      assert f"long long {end.name}" in sig
      assert re.search(rf"for \(long long r0 = 0; r0 < {end.name}; r0\+\+\)", body)
    else:
      assert f"long {end.name}_" in sig and f"int {end.name} = (int){end.name}_;" in body
      assert re.search(rf"for \(int r0 = 0; r0 < {end.name}; r0\+\+\)", body)
    assert not re.search(rf"< ({n1}|{n2}|40);", body)


def test_python_number_is_a_scalar_argument(rng):
  """x * 0.3 and x * 0.7 render to one source taking the number as a float argument (p0), not a literal; x * 0.5 (a
  power of two, cheaper as a literal) is spelled in the source and takes no argument."""
  x = _t(rng, 5, 7)
  for r in (CRenderer(), OpenCLRenderer()):
    (s1, k), (s2, _) = (_render(r, one_kernel(x * c)) for c in (0.3, 0.7))
    assert s1 == s2 and "float p0" in _signature(s1, k)
    assert "0.3" not in _body(s1, k) and "0.7" not in _body(s1, k) and re.search(r"= p0;", _body(s1, k))
    s3, k3 = _render(r, one_kernel(x * 0.5))
    assert "p0" not in _signature(s3, k3) and "0.5f" in _body(s3, k3)


@pytest.mark.parametrize("src_dtype,view,calls", [
  (np.float32, fg.int32, ("((int)(fg_f_bits(v0)))",) * 2),
  (np.int32, fg.float32, ("fg_bits_f((uint32_t)(v0))",) * 2),
  (np.float64, fg.int64, ("((long long)(fg_d_bits(v0)))", "((long)(fg_d_bits(v0)))"))])
def test_bitcast_keeps_the_bits_without_type_punning(src_dtype, view, calls, rng):
  """Tensor.view(dtype) of the same size renders through the preludes' bit helpers: memcpy in C (no pointer cast
  that strict aliasing would break), as_type in OpenCL."""
  a = (rng.standard_normal((4, 8)) * 1000).astype(src_dtype)
  item = one_kernel(fg.Tensor(a, device=DEV).realize().view(view))
  helper = re.search(r"fg_\w+", calls[0]).group(0)
  defs = {"fg_f_bits": ("uint32_t u; memcpy(&u, &f, 4); return u;", "as_uint(f)"),
          "fg_bits_f": ("float f; memcpy(&f, &u, 4); return f;", "as_float(u)"),
          "fg_d_bits": ("unsigned long long u; memcpy(&u, &f, 8); return u;", "as_ulong(f)")}[helper]
  for r, definition, call in zip((CRenderer(), OpenCLRenderer()), defs, calls):
    src, k = _render(r, item)
    body = _body(src, k)
    assert call in body and "*(" not in body
    (line,) = [ln for ln in src.splitlines() if re.match(rf"static inline \w[\w ]* {helper}\(", ln)]
    assert definition in line


def test_vector_bitcast(rng):
  """A bit cast of float32 vectors to int32 vectors: GCC's vector cast (which keeps the bits) in C, as_int4 in
  OpenCL."""
  item = one_kernel(_t(rng, 8, 64).view(fg.int32) ^ 5)
  src, k = _render(CRenderer(), item, [Opt(OptOp.UPCAST, 0, 16)])
  assert "fg_int32x16 v1 = ((fg_int32x16)(v0));" in _body(src, k)
  src, k = _render(OpenCLRenderer(), item, [Opt(OptOp.UPCAST, 0, 4)])
  assert "int4 v1 = as_int4(v0);" in _body(src, k)


def test_half_floats_are_loaded_and_stored_through_their_bits(rng):
  """float16 values live in float registers: C converts the stored bits with the prelude's helpers (no compiler
  _Float16), OpenCL with vload_half / vstore_half_rte (no cl_khr_fp16)."""
  item = one_kernel(_t(rng, 4, 8, dtype=np.float16) + 1)
  src, k = _render(CRenderer(), item)
  body = _body(src, k)
  assert "float v0 = fg_half_to_f32(b1[gidx]);" in body and re.search(r"b0\[gidx\] = fg_f32_to_half\(v\d+\);", body)
  src, k = _render(OpenCLRenderer(), item)
  body = _body(src, k)
  assert "float v0 = vload_half(gidx, b1);" in body and re.search(r"vstore_half_rte\(v\d+, gidx, b0\);", body)
  assert "cl_khr_fp16" not in src


def test_padded_loads_are_guarded(rng):
  """A padded read loads only where its condition holds and is 0 elsewhere (no access outside the buffer)."""
  item = one_kernel(fg.nn.functional.pad(_t(rng, 3, 4), (1, 2, 0, 1)) * 3)
  src, k = _render(CRenderer(), item)
  (load,) = re.findall(r"float v0 = \((.*)\);", _body(src, k))
  cond, rest = load.split("?", 1)
  assert ">=" in cond and "<" in cond and re.fullmatch(r"b1\[.*\]:0\.0f", rest)


def test_opencl_index_type_follows_the_kernel_size(rng):
  """OpenCL computes indices in 32 bits where every buffer and the launch are far below 2^31, in 64 bits otherwise
  (a kernel's sizes changed, not allocated: rendering reads them only); C always uses 64 bits."""
  item = one_kernel(_t(rng, 8, 64) * 2)
  p = pipeline.prepare(item.kernel, OpenCLRenderer.caps, ())
  assert "int gidx = get_global_id(0);" in OpenCLRenderer().render(p.kernel, p.listing)
  big = replace(p.kernel, bufs=tuple(BufferArg(b.dtype, 1 << 30, b.output) for b in p.kernel.bufs))
  assert "long gidx = get_global_id(0);" in OpenCLRenderer().render(big, p.listing)
  assert "for (long long gidx = start; gidx < end; gidx++) {" in CRenderer().render(p.kernel, p.listing)


def test_literals():
  """Constants as each language spells them: float32 with an f suffix, infinities and NaN by name (a double's cast),
  64-bit integers with C's LL or OpenCL's L, the most negative integers without an out-of-range literal."""
  c, cl = CRenderer(), OpenCLRenderer()
  cases = [(1.5, dt.float32, "1.5f", "1.5f"), (2.0, dt.float32, "2.0f", "2.0f"), (1.5, dt.float64, "1.5", "1.5"),
           (1e-8, dt.float32, "1e-08f", "1e-08f"), (float("inf"), dt.float32, "INFINITY", "INFINITY"),
           (float("-inf"), dt.float64, "-((double)INFINITY)", "-(double)INFINITY"),
           (float("nan"), dt.float32, "NAN", "NAN"), (5, dt.int64, "5LL", "5L"), (7, dt.uint32, "7u", "7u"),
           (-2 ** 31, dt.int32, "(-2147483647-1)", "(-2147483647-1)"),
           (-2 ** 63, dt.int64, "(-9223372036854775807LL-1)", "(-9223372036854775807L-1)"), (True, dt.bool_, "1", "1")]
  for v, d, want_c, want_cl in cases:
    assert (c.literal(v, d), cl.literal(v, d)) == (want_c, want_cl), (v, d)


def test_tables_are_overridden_entry_by_entry(rng):
  """A renderer's spellings kept as tables change one entry at a time in a subclass: the math table (own_math: EXP
  to another function, LOG kept) and the type table (int32 spelled int32_t, the other types kept)."""
  class MyC(CRenderer):
    own_math = {**CRenderer.own_math, "EXP": "my_expf"}
    types = {**CRenderer.types, dt.int32: "int32_t"}
  x = _t(rng, 8, 16)
  item = one_kernel(x.exp() + x.log())
  src, k = _render(MyC(), item)
  body = _body(src, k)
  assert "my_expf(v0)" in body and "fg_expf" not in body and "fg_logf(v0)" in body
  base, _ = _render(CRenderer(), item)
  assert "fg_expf(v0)" in _body(base, k) and "my_expf" not in base
  item = one_kernel(fg.Tensor(rng.integers(-9, 9, (4, 8)).astype(np.int32), device=DEV).realize() * 3)
  src, k = _render(MyC(), item)
  assert _signature(src, k) == f"void {k.name}(int32_t* restrict b0, const int32_t* restrict b1, long long start, " \
                               "long long end) {"


def test_op_tables_are_overridden_entry_by_entry(rng):
  """Arithmetic is spelled from two tables keyed by the op's name (code_for_op for scalars, vec_code_for_op for
  vectors): a subclass that replaces the scalar MAX and the vector MUL changes only those spellings, the other ops
  of the same kernel keep the base renderer's, and the base class's tables are not touched."""
  def my_max(r, a, sd, d): return f"my_max({a[0]},{a[1]})"
  class MyC(CRenderer):
    code_for_op = {**CRenderer.code_for_op, "MAX": my_max}
    vec_code_for_op = {**CRenderer.vec_code_for_op, "MUL": lambda r, a, sd, d: f"my_vmul({a[0]},{a[1]})"}
  x, y = _t(rng, 8, 16), _t(rng, 8, 16)
  item = one_kernel(x.maximum(y) - y)
  body = _body(*_render(MyC(), item))
  assert "my_max(" in body and re.search(r"\(v\d+-v\d+\)", body), body
  base = _body(*_render(CRenderer(), item))
  assert "my_max" not in base and "!=" in base   # the base MAX: NaN-propagating select
  item = one_kernel(x * y + x)
  opts = (Opt(OptOp.UPCAST, 0, 8),)   # (one flat axis of 128)
  body = _body(*_render(MyC(), item, opts))
  assert "my_vmul(" in body and "fg_float32x8" in body and re.search(r"\(v\d+\+v\d+\)", body), body
  assert "my_vmul" not in _body(*_render(CRenderer(), item, opts))
  assert CRenderer.code_for_op["MAX"] is not my_max


@pytest.mark.parametrize("renderer", [CRenderer(), OpenCLRenderer()], ids=["c", "opencl"])
def test_every_elementwise_op_has_a_scalar_spelling(renderer):
  """Every elementwise op of the graph (graph/ops.ALU, the conversions) has an entry in the scalar table, so no kernel
  of the frontend's ops meets a missing spelling; an op outside the table is a RenderError naming the renderer and
  the op, not a KeyError."""
  from fusegrad.graph import ops
  from fusegrad.codegen.renderer.base import RenderError
  assert set(ops.ELEMENTWISE) <= set(renderer.code_for_op), set(ops.ELEMENTWISE) - set(renderer.code_for_op)
  from fusegrad.codegen.ir import VecDType
  with pytest.raises(RenderError, match=f"{renderer.name} renderer has no vector spelling for ATAN2"):
    renderer.alu("ATAN2", VecDType(dt.float32, 4), ["a", "b"], ())
