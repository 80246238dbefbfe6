"""Tensor cores as data: the warp-level matrix multiply-accumulate shapes each device architecture has, with the
fragment layout of every operand, and the facts the TC action (actions.py) and its pass (passes.tensor_core) read.

A tensor core computes D = A @ B + C for one tile (A: M x K, B: K x N, C and D: M x N) with all `threads` lanes of
a warp at once: lane l holds element e of A's fragment at A[a[l][e]] (a (row, col) pair), and likewise for B and
for C/D. The table is the PTX ISA's "Matrix Fragments for mma.m16n8k16 / mma.m16n8k8" (floating point types), written
out lane by lane so that the numpy interpreter can gather and scatter exactly what the hardware does, and a renderer
that spells `mma.sync` finds each lane's (row, col) as index expressions (`lane_exprs`). Every layout is checked to be
a bijection onto its matrix (`layout_errors`) when its record is made.

The OPENCL renderer of an NVIDIA GPU spells an Mma as inline PTX (runtime/opencl.py declares the GPU's entries); the
interpreter emulates any entry a test asks for (runtime/python.PythonDevice.emulate); other devices have none.
"""
from __future__ import annotations
from dataclasses import dataclass
from fusegrad import dtype as dt
from fusegrad.dtype import DType
from fusegrad.graph import symbolic as sym

# the lanes of a quad: mma.sync's layouts are affine in groupID = lane // 4 and threadID_in_group = lane % 4
QUAD = 4
# how a tensor core rounds its multiplicands: a storage dtype's own values, or float32 cut to tf32 (10 mantissa bits,
# nearest with ties away from zero: the renderer converts with cvt.rna.tf32.f32)
INPUT_FORMATS = ("f16", "bf16", "tf32")


@dataclass(frozen=True)
class TensorCore:
  name: str            # the instruction a renderer emits
  dims: tuple          # (M, N, K)
  dtype_in: DType      # the dtype A and B are loaded as (float32 for tf32)
  dtype_acc: DType     # C and D
  threads: int         # lanes of the warp that compute one tile together
  a: tuple             # a[lane][e] = (row, col) of A (M x K) that the lane holds as its element e
  b: tuple             # b[lane][e] = (row, col) of B (K x N)
  c: tuple             # c[lane][e] = (row, col) of C and D (M x N)
  input_format: str    # how the unit reads A and B: INPUT_FORMATS

  def __post_init__(self):
    errs = [f"{self.name}: {e}" for e in tc_errors(self)]
    if errs: raise ValueError("; ".join(errs))

  def __repr__(self): return f"TensorCore({self.name})"


def layout_errors(layout: tuple, rows: int, cols: int, threads: int) -> list:
  """Why `layout` (layout[lane][e] = (row, col)) is not a bijection from (lane, element) onto a rows x cols matrix:
  every position held by exactly one (lane, element), every lane holding as many elements ([] when it is one)."""
  errs = []
  if len(layout) != threads: errs.append(f"{len(layout)} lanes, not {threads}")
  counts = {len(x) for x in layout}
  if len(counts) > 1: errs.append(f"lanes hold different numbers of elements {sorted(counts)}")
  seen: dict = {}
  for lane, elems in enumerate(layout):
    for e, (r, c) in enumerate(elems):
      if not (0 <= r < rows and 0 <= c < cols):
        errs.append(f"lane {lane} element {e} at ({r}, {c}) is outside {rows}x{cols}")
      elif (r, c) in seen:
        errs.append(f"({r}, {c}) held by lane {seen[(r, c)][0]} element {seen[(r, c)][1]} and lane {lane} element {e}")
      else: seen[(r, c)] = (lane, e)
  missing = rows * cols - len(seen)
  if missing > 0 and not errs: errs.append(f"{missing} positions of the {rows}x{cols} matrix are held by no lane")
  return errs


def tc_errors(tc: TensorCore) -> list:
  """Every layout of tc checked (layout_errors), and its fields: [] for a usable record."""
  M, N, K = tc.dims
  errs = []
  for name, lay, rows, cols in (("A", tc.a, M, K), ("B", tc.b, K, N), ("C", tc.c, M, N)):
    errs += [f"{name}: {e}" for e in layout_errors(lay, rows, cols, tc.threads)]
    if not errs:
      try: lane_exprs(lay, sym.Var("lane", 0, tc.threads - 1))
      except ValueError as e: errs.append(f"{name}: {e}")
  if tc.input_format not in INPUT_FORMATS: errs.append(f"input format {tc.input_format!r} is none of {INPUT_FORMATS}")
  return errs


def lane_exprs(layout: tuple, lane: sym.Var) -> tuple:
  """((row, col), ...) per element: index expressions over the lane variable, fitted to the form
  c0 + c1 * (lane // QUAD) + c2 * (lane % QUAD) that mma.sync's layouts have, and checked against every lane."""
  q, r = sym.div(sym.lin(lane), QUAD), sym.mod(sym.lin(lane), QUAD)
  out = []
  for e in range(len(layout[0])):
    pair = []
    for k in (0, 1):
      f = [layout[l][e][k] for l in range(len(layout))]
      c0, c1, c2 = f[0], f[QUAD] - f[0], f[1] - f[0]
      if any(f[l] != c0 + c1 * (l // QUAD) + c2 * (l % QUAD) for l in range(len(f))):
        what = "row" if k == 0 else "column"
        raise ValueError(f"element {e}'s {what} is not affine in lane // {QUAD} and lane % {QUAD}")
      pair.append(sym.const(c0) + q * c1 + r * c2)
    out.append(tuple(pair))
  return tuple(out)


def _layout(threads: int, count: int, at) -> tuple:
  """layout[lane][e] = at(groupID, threadID_in_group, e), as the PTX ISA writes the fragments."""
  return tuple(tuple(at(lane // QUAD, lane % QUAD, e) for e in range(count)) for lane in range(threads))


# mma.m16n8k16 (.f16 / .bf16 multiplicands): A is four .f16x2 registers (8 elements), B two (4), C/D four .f32
_A_16816 = _layout(32, 8, lambda g, t, e: (g + 8 * ((e >> 1) & 1), t * 2 + (e & 1) + 8 * (e >> 2)))
_B_16816 = _layout(32, 4, lambda g, t, e: (t * 2 + (e & 1) + 8 * (e >> 1), g))
# C/D of m16n8k16 and m16n8k8 (every multiplicand type): rows groupID and groupID + 8, two neighbouring columns
_C_168 = _layout(32, 4, lambda g, t, e: (g + 8 * (e >> 1), t * 2 + (e & 1)))
# mma.m16n8k8 .f16: A two .f16x2 registers (4 elements), B one (2)
_A_1688_F16 = _layout(32, 4, lambda g, t, e: (g + 8 * (e >> 1), t * 2 + (e & 1)))
_B_1688_F16 = _layout(32, 2, lambda g, t, e: (t * 2 + e, g))
# mma.m16n8k8 .tf32: A four .b32 registers (a1, a3 in row groupID + 8; a2, a3 in column threadID_in_group + 4), B two
_A_1688_TF32 = _layout(32, 4, lambda g, t, e: (g + 8 * (e & 1), t + 4 * (e >> 1)))
_B_1688_TF32 = _layout(32, 2, lambda g, t, e: (t + 4 * e, g))

MMA_16816_F16 = TensorCore("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", (16, 8, 16), dt.float16, dt.float32, 32,
                           _A_16816, _B_16816, _C_168, "f16")
MMA_16816_BF16 = TensorCore("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", (16, 8, 16), dt.bfloat16, dt.float32,
                            32, _A_16816, _B_16816, _C_168, "bf16")
MMA_1688_TF32 = TensorCore("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", (16, 8, 8), dt.float32, dt.float32, 32,
                           _A_1688_TF32, _B_1688_TF32, _C_168, "tf32")
MMA_1688_F16 = TensorCore("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32", (16, 8, 8), dt.float16, dt.float32, 32,
                          _A_1688_F16, _B_1688_F16, _C_168, "f16")

# the tensor cores of each NVIDIA architecture that a renderer may use (mma.sync; Hopper's wgmma and Volta's quad-pair
# m8n8k4 are not here: the first needs operands in shared memory, the second a layout of four tiles per warp).
# sm_75 (Turing) has m16n8k8 for f16 only; bf16 and tf32 came with sm_80 (Ampere)
_AMPERE = (MMA_16816_F16, MMA_16816_BF16, MMA_1688_TF32)
TENSOR_CORES = {"sm_75": (MMA_1688_F16,), "sm_80": _AMPERE, "sm_86": _AMPERE, "sm_89": _AMPERE, "sm_90": _AMPERE}


# ---- what the TC action and its pass match ---------------------------------------------------------------------

def product_loads(src, tc: TensorCore):
  """(la, lb): the two loads of a reduction's source that is their product, each optionally CAST to the tensor core's
  accumulator dtype and the whole optionally under a padding guard (ir.guard: WHERE(valid, x, 0) whose condition both
  loads already have, so dropping it changes nothing); or a string saying why it is not one."""
  from fusegrad.codegen.ir import Alu, Load, Valid, Const
  if isinstance(src, Alu) and src.op == "WHERE" and isinstance(src.src[0], Valid) and isinstance(src.src[2], Const) \
     and src.src[2].value == 0:
    cond, src = src.src[0].cond, src.src[1]
  else: cond = None
  if not (isinstance(src, Alu) and src.op == "MUL"): return "the reduction's source is not a product of two loads"
  loads = []
  for x in src.src:
    if isinstance(x, Alu) and x.op == "CAST" and x.dtype is tc.dtype_acc: x = x.src[0]
    if not isinstance(x, Load): return "the reduction's source is not a product of two loads"
    loads.append(x)
  la, lb = loads
  if la.dtype is not tc.dtype_in or lb.dtype is not tc.dtype_in:
    return f"the operands are {la.dtype.name} and {lb.dtype.name}: this tensor core multiplies {tc.dtype_in.name}"
  if cond is not None and not all(p in la.valid.parts and p in lb.valid.parts for p in cond.parts):
    return "the reduction's source is guarded by a condition its loads do not have"
  return la, lb
