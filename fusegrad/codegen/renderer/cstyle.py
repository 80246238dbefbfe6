"""Renderers for C-like languages: C for the CPU and OpenCL C.

Both walk the same linearized listing; they differ only in the tables and hooks below (type
names, how a kernel is declared, how a work item finds its index, how 16-bit floats are loaded
and stored). 16-bit floats are storage types: values live in float registers and are rounded
when stored or cast; lowering casts every computed 16-bit value to its own dtype (ir.round16), so
each op's result is rounded as PyTorch's is.
"""
from __future__ import annotations
import math
from fusegrad import dtype as dt
from fusegrad.graph import symbolic as sym
from fusegrad.graph.node import reduce_identity
from fusegrad.codegen.ir import (tree_top, Kernel, Stage, LocalLoad, Gather, GroupReduce, Load, Const, Param, Index, Valid,
                                 Alu, Reduce, Vectorize, Gep, VecDType, Mma)
from fusegrad.codegen.linearize import Loop, End, Let, Acc, Update, StoreSt, Fetch, Refill, PrefetchSt
from fusegrad.codegen.renderer.base import Caps, RenderError
from fusegrad.codegen.passes import LIDX


def _floordiv(num: str, c: int, may_be_negative: bool) -> str:
  if not may_be_negative: return f"({num}/{c})"
  return f"fg_floordiv({num},{c})"


def _floormod(num: str, c: int, may_be_negative: bool) -> str:
  if not may_be_negative: return f"({num}%{c})"
  return f"fg_floormod({num},{c})"


def _local_length(v) -> int: return v.length if isinstance(v, Stage) else v.size


class _Walk:
  def __init__(self, k: Kernel, indent: str): self.k, self.indent, self.lines = k, indent, []
  def out(self, line: str) -> None: self.lines.append(self.indent + line)


def _infix(o: str):
  return lambda r, a, sd, d: f"({a[0]}{o}{a[1]})"


def _call(name: str):   # a math library function of the operand's precision (or the shared prelude's own)
  return lambda r, a, sd, d: f"{r.math_fn(name, sd)}({','.join(a)})"


def _is_float(r, sd) -> bool: return r.reg_dtype(sd).is_float


def _minmax(o: str):   # NaN propagates; `|`, not `||`: one branch-free condition, which a vectorizer makes a select
  return lambda r, a, sd, d: f"((({a[0]}{o}{a[1]})|({a[0]}!={a[0]}))?{a[0]}:{a[1]})" if _is_float(r, sd) else \
      f"({a[0]}{o}{a[1]}?{a[0]}:{a[1]})"


def _shift(o: str):   # torch's: a count outside [0, bits) gives 0 (or the sign, shifting a negative right)
  def f(r, a, sd, d):
    bits = sd.itemsize * 8
    out = f"(({a[0]})<0?-1:0)" if o == ">>" and sd.is_int and not sd.is_unsigned else "0"
    return f"(({a[1]})<0||({a[1]})>={bits}?{out}:({r.reg_type(sd)})({a[0]}{o}{a[1]}))"
  return f


_SCALAR_OPS = {
  **{op: _infix(o) for op, o in (("ADD", "+"), ("SUB", "-"), ("MUL", "*"), ("CMPLT", "<"), ("CMPLE", "<="),
                                 ("CMPEQ", "=="), ("CMPNE", "!="), ("AND", "&"), ("OR", "|"), ("XOR", "^"))},
  **{op: _call(op.lower()) for op in ("EXP", "LOG", "SQRT", "SIN", "COS", "TAN", "TANH", "ERF", "ATAN", "FLOOR",
                                      "CEIL", "RINT", "TRUNC")},
  "CAST": lambda r, a, sd, d: r.cast(a[0], sd, d),
  "BITCAST": lambda r, a, sd, d: r.bitcast(a[0], sd, d),
  "NEG": lambda r, a, sd, d: f"(!{a[0]})" if sd.is_bool else f"(-{a[0]})",
  "NOT": lambda r, a, sd, d: f"(!{a[0]})" if sd.is_bool else f"(~{a[0]})",
  "ABS": lambda r, a, sd, d: f"{r.math_fn('fabs', sd)}({a[0]})" if _is_float(r, sd) else f"({a[0]}<0?-{a[0]}:{a[0]})",
  "RECIP": lambda r, a, sd, d: f"({r.literal(1, sd)}/{a[0]})",
  "ISNAN": lambda r, a, sd, d: f"({a[0]}!={a[0]})",
  # integer division and remainder: helpers of the prelude (C's truncation; 0 for a zero divisor, never a trap)
  "DIV": lambda r, a, sd, d: f"({a[0]}/{a[1]})" if _is_float(r, sd) else f"fg_idiv_{r._tag(sd)}({a[0]},{a[1]})",
  "MOD": lambda r, a, sd, d: f"{r.math_fn('fmod', sd)}({a[0]},{a[1]})" if _is_float(r, sd) else
      f"fg_imod_{r._tag(sd)}({a[0]},{a[1]})",
  "MAX": _minmax(">"), "MIN": _minmax("<"),
  "POW": _call("pow"), "ATAN2": _call("atan2"),
  "SHL": _shift("<<"), "SHR": _shift(">>"),
  "WHERE": lambda r, a, sd, d: f"({a[0]}?{a[1]}:{a[2]})",
}


def _vhelper(op: str):   # the prelude's lane-by-lane helpers (fg_vmax_fg_float32x8 ...)
  return lambda r, a, sd, d: f"fg_v{op.lower()}_{r.vec_type(d)}({','.join(a)})"


def _vwhere(r, a, sd, d):
  if not isinstance(sd, VecDType): return f"({a[0]}?{a[1]}:{a[2]})"   # one condition for every lane
  m = f"fg_int32x{d.count}"
  return f"(({r.vec_type(d)})(({a[0]} & ({m})({a[1]})) | (~{a[0]} & ({m})({a[2]}))))"


def _vcast(r, a, sd, d):
  if not sd.scalar.is_bool: return r.vconvert(a[0], d)   # 32-bit integer lanes
  return f"(({r.vec_type(d)})({a[0]} & 0x3f800000))"   # a mask's lanes as 1.0f or 0.0f


# GCC's vector extensions (clang has them too): arithmetic operators work lane by lane; a bool vector is a lane mask
# (codegen/passes.VECTOR_CMPS); a shift's count is a constant below 32 (passes.vectorizable)
_VECTOR_OPS = {
  **{op: _infix(o) for op, o in (("ADD", "+"), ("SUB", "-"), ("MUL", "*"), ("DIV", "/"), ("CMPLT", "<"),
                                 ("CMPLE", "<="), ("CMPEQ", "=="), ("CMPNE", "!="), ("XOR", "^"), ("AND", "&"),
                                 ("OR", "|"), ("SHL", "<<"), ("SHR", ">>"))},
  **{op: _vhelper(op) for op in ("MAX", "MIN", "EXP", "LOG", "TANH", "ERF", "SQRT")},
  "CAST": _vcast,
  "BITCAST": lambda r, a, sd, d: r.vbitcast(a[0], d),
  "NEG": lambda r, a, sd, d: f"(-{a[0]})",
  "RECIP": lambda r, a, sd, d: f"(1.0f/{a[0]})",   # a scalar operand applies to every lane
  "ABS": lambda r, a, sd, d: f"(({r.vec_type(d)})((fg_int32x{d.count}){a[0]} & 0x7fffffff))",   # the sign bit cleared
  "WHERE": _vwhere,
}


class CStyleRenderer:
  name = "c"
  caps = Caps()
  barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
  index_type = "long long"
  def index_type_of(self, k: Kernel) -> str: return self.index_type
  types = {dt.bool_: "_Bool", dt.int8: "signed char", dt.uint8: "unsigned char", dt.int16: "short",
           dt.int32: "int", dt.uint32: "unsigned int", dt.int64: "long long", dt.float16: "unsigned short",
           dt.bfloat16: "unsigned short", dt.float32: "float", dt.float64: "double"}
  float_suffix = {dt.float32: "f", dt.float64: ""}
  prelude = ""

  # ---- types ----------------------------------------------------------------------------------------
  def storage_type(self, d: dt.DType) -> str: return self.types[d]
  def reg_type(self, d: dt.DType) -> str:
    if isinstance(d, VecDType): return self.vec_type(d)
    return self.types[dt.float32] if d in (dt.float16, dt.bfloat16) else self.types[d]
  def reg_dtype(self, d: dt.DType) -> dt.DType:
    return dt.float32 if d in (dt.float16, dt.bfloat16) else d

  def literal(self, v, d: dt.DType) -> str:
    if isinstance(d, VecDType): return self.vmake(d, [self.literal(v, d.scalar)] * d.count)
    d = self.reg_dtype(d)
    if d.is_bool: return "1" if v else "0"
    if d.is_float:
      v = float(v)
      if math.isnan(v): return "NAN" if d == dt.float32 else "((double)NAN)"
      if math.isinf(v): return ("" if v > 0 else "-") + ("INFINITY" if d == dt.float32 else "((double)INFINITY)")
      return repr(v) + self.float_suffix[d] if "e" in repr(v) or "." in repr(v) else f"{v}.0{self.float_suffix[d]}"
    if d == dt.int64: return f"{int(v)}LL" if v != -2**63 else "(-9223372036854775807LL-1)"
    if d == dt.uint32: return f"{int(v)}u"
    if d == dt.int32 and v == -2**31: return "(-2147483647-1)"
    return str(int(v))

  # ---- expressions -------------------------------------------------------------------------------------
  def idx(self, e) -> str:
    return sym.render(e, lambda v: v.name, _floordiv, _floormod)

  def cond(self, c: sym.Cond) -> str: return sym.render_cond(c, self.idx)

  def load(self, buf: int, idx: str, d: dt.DType) -> str:
    if d == dt.bfloat16: return f"fg_bf16_to_f32(b{buf}[{idx}])"
    if d == dt.float16: return f"fg_half_to_f32(b{buf}[{idx}])"
    return f"b{buf}[{idx}]"

  def store(self, buf: int, idx: str, val: str, d: dt.DType) -> str:
    if d == dt.bfloat16: return f"b{buf}[{idx}] = fg_f32_to_bf16({val});"
    if d == dt.float16: return f"b{buf}[{idx}] = fg_f32_to_half({val});"
    return f"b{buf}[{idx}] = {val};"

  # ---- vectors (ir.VecDType: float32 lanes of a vector UPCAST axis; codegen/passes.vector_axes) ---------------
  # GCC's vector extensions (clang has them too): arithmetic operators work lane by lane; loads and stores go
  # through memcpy (one unaligned vector move); max/min and lanes are helpers of the prelude
  # a bool vector is a lane mask (codegen/passes.VECTOR_CMPS): the int32 vector a comparison of float32 vectors gives
  def vec_type(self, d: VecDType) -> str: return f"fg_int32x{d.count}" if d.scalar.is_bool else f"fg_{d.scalar.name}x{d.count}"
  def vmake(self, d: VecDType, a: list) -> str: return f"(({self.vec_type(d)}){{{','.join(a)}}})"
  def gep(self, a: str, lane: int) -> str: return f"{a}[{lane}]"
  def vconvert(self, a: str, d: VecDType) -> str: return f"__builtin_convertvector({a}, {self.vec_type(d)})"
  def vbitcast(self, a: str, d: VecDType) -> str: return f"(({self.vec_type(d)})({a}))"   # (keeps the bits)
  def vload(self, buf: int, idx: str, d: VecDType) -> str: return self.vload_at(f"b{buf}", idx, d)
  def vload_at(self, ptr: str, idx: str, d: VecDType) -> str:
    if d.scalar.is_bool: return f"fg_vloadb_{d.count}({ptr}+{idx})"   # bools' bytes as a lane mask
    return f"fg_vload_{self.vec_type(d)}({ptr}+{idx})"
  def vstore(self, buf: int, idx: str, val: str, d: VecDType) -> str:
    return f"fg_vstore_{self.vec_type(d)}(b{buf}+{idx}, {val});"
  # a gathered vector (passes._contiguous_base): lanes at positions i .. i+n-1 of a buffer of size elements, each 0
  # outside it (one vector load where all are inside)
  def vgather(self, buf: int, i: str, size: int, d: VecDType) -> str: return f"fg_vgather_{self.vec_type(d)}(b{buf}, {i}, {size})"
  # a masked load or store (ir.Load.lanes): only lanes lo <= i < hi (Caps.masked_vectors: the C renderer's)
  def vload_masked(self, buf: int, idx: str, d: VecDType, lo: str, hi: str) -> str:
    return f"fg_vloadm_{self.vec_type(d)}(b{buf}+{idx}, {lo}, {hi})"
  def vstore_masked(self, buf: int, idx: str, val: str, d: VecDType, lo: str, hi: str) -> str:
    return f"fg_vstorem_{self.vec_type(d)}(b{buf}+{idx}, {val}, {lo}, {hi});"
  # float32 exp/log/tanh/erf from the shared prelude (_MATH): vectorizable, and the same bits on every device
  own_math = {"EXP": "fg_expf", "LOG": "fg_logf", "TANH": "fg_tanhf", "ERF": "fg_erff"}

  def math_fn(self, name: str, d: dt.DType) -> str:
    if self.reg_dtype(d) == dt.float32 and name.upper() in self.own_math: return self.own_math[name.upper()]
    return self.library_fn(name, d)

  def library_fn(self, name: str, d: dt.DType) -> str:
    return name + ("f" if self.reg_dtype(d) == dt.float32 else "")

  def cast(self, a: str, src: dt.DType, d: dt.DType) -> str:
    if d.is_bool: return f"({a} != 0)"
    if d == dt.float16: return f"fg_round_half((float)({a}))"
    if d == dt.bfloat16: return f"fg_bf16_to_f32(fg_f32_to_bf16((float)({a})))"
    return f"({self.reg_type(d)})({a})"

  def bitcast(self, a: str, src: dt.DType, d: dt.DType) -> str:
    """a's bits as d, of the same size (ops.CONVERT). A 16-bit float's register holds its float32 value: its bits
    are its storage's (exact: a NaN's payload and signalling bit kept, fg_f32_to_half); a bool reads its byte as
    x != 0."""
    if src == dt.float16: a = f"fg_f32_to_half({a})"
    elif src == dt.bfloat16: a = f"(fg_f_bits({a}) >> 16)"   # (its value is exact: the upper half of its float32)
    elif src == dt.float32: a = f"fg_f_bits({a})"
    elif src == dt.float64: a = f"fg_d_bits({a})"
    if d == dt.float16: return f"fg_half_to_f32((unsigned short)({a}))"
    if d == dt.bfloat16: return f"fg_bf16_to_f32((unsigned short)({a}))"
    if d == dt.float32: return f"fg_bits_f((uint32_t)({a}))"
    if d == dt.float64: return f"fg_bits_d({a})"   # (the argument converts to the helper's unsigned 64 bits)
    if d.is_bool: return f"({a} != 0)"
    return f"(({self.reg_type(d)})({a}))"

  # ---- ops: spelled from two tables keyed by the op's name (graph/ops.py), one for scalars and one for vectors ------
  # An entry is f(renderer, operands, operand dtype, result dtype) -> the expression; the operand dtype is the first
  # source's (a vector WHERE's condition may be a scalar, a vector CAST may convert a lane mask). A backend that
  # spells one op differently replaces that entry: `code_for_op = {**CStyleRenderer.code_for_op, "MAX": ...}`.
  code_for_op = _SCALAR_OPS
  vec_code_for_op = _VECTOR_OPS

  def alu(self, op: str, d: dt.DType, a: list, srcs: tuple) -> str:
    table = self.vec_code_for_op if isinstance(d, VecDType) else self.code_for_op
    if op not in table:
      kind = "vector " if isinstance(d, VecDType) else ""
      raise RenderError(f"the {self.name} renderer has no {kind}spelling for {op} ({d})")
    return table[op](self, a, srcs[0].dtype if srcs else d, d)

  def _tag(self, d: dt.DType) -> str: return d.name

  def value(self, v, a: list) -> str:
    if isinstance(v, Load):
      ld = self.vload(v.buf, self.idx(v.idx), v.dtype) if isinstance(v.dtype, VecDType) and not v.lanes else \
          self.vload_masked(v.buf, self.idx(v.idx), v.dtype, *map(self.idx, v.lanes)) if v.lanes else \
          self.load(v.buf, self.idx(v.idx), v.dtype)
      return ld if v.valid.is_true else f"({self.cond(v.valid)}?{ld}:{self.literal(0, v.dtype)})"
    if isinstance(v, LocalLoad):
      if not isinstance(v.dtype, VecDType): return f"{a[0]}_l[{self.idx(v.idx)}]"
      if _aligned(v.idx, v.dtype.count): return self.aligned_local(f"{a[0]}_l", self.idx(v.idx), v.dtype)
      return self.vload_at(f"{a[0]}_l", self.idx(v.idx), v.dtype)
    if isinstance(v, Vectorize): return self.vmake(v.dtype, a)
    if isinstance(v, Gep): return self.gep(a[0], v.lane)
    if isinstance(v, Const): return self.literal(v.value, v.dtype)
    if isinstance(v, Param): return f"p{v.slot}"
    if isinstance(v, Gather):
      if isinstance(v.dtype, VecDType): return self.vgather(v.buf, a[0], v.size, v.dtype)
      return f"(({a[0]})>=0&&({a[0]})<{v.size}?{self.load(v.buf, a[0], v.dtype)}:{self.literal(0, v.dtype)})"
    if isinstance(v, Index):
      e = f"({self.reg_type(v.dtype)})({self.idx(v.idx)})"
      return e if v.valid.is_true else f"({self.cond(v.valid)}?{e}:0)"
    if isinstance(v, Valid): return self.cond(v.cond)
    if isinstance(v, Alu): return self.alu(v.op, v.dtype, a, v.src)
    raise TypeError(v)

  def update(self, r: Reduce, acc: str, x: str) -> str:
    if r.op == "SUM": return f"{acc} = {acc} + {x};" if not r.dtype.is_bool else f"{acc} = {acc} | {x};"
    if r.op == "PROD": return f"{acc} = {acc} * {x};" if not r.dtype.is_bool else f"{acc} = {acc} & {x};"
    return f"{acc} = {self.alu(r.op, r.dtype, [acc, x], (r,))};"

  # ---- the kernel: one method per statement type of the listing (codegen/linearize.py) ------------------------
  # (the walk's state is its own object: one renderer serves every thread of its device)
  def body(self, listing: list, k: Kernel, indent: str) -> list[str]:
    w = _Walk(k, indent)
    for st in listing: self.emit[type(st)](self, st, w)
    return w.lines

  def _loop(self, st: Loop, w: "_Walk") -> None:
    v = st.var
    end = v.hi + 1 if st.end is None else self.idx(st.end)
    w.out(f"for ({self.index_type_of(w.k)} {v.name} = 0; {v.name} < {end}; {v.name}++) {{")
    w.indent += "  "

  def _end(self, st: End, w: "_Walk") -> None:
    w.indent = w.indent[:-2]
    w.out("}")

  def _let(self, st: Let, w: "_Walk") -> None:
    if isinstance(st.val, GroupReduce): return self._group_reduce(st, w)
    if isinstance(st.val, Stage): return self._stage(st, w)
    if isinstance(st.val, Mma): return self._mma(st, w)
    w.out(f"{self.reg_type(st.val.dtype)} {st.name} = {self.value(st.val, list(st.args))};")

  def _mma(self, st: Let, w: "_Walk") -> None:
    raise RenderError(f"the {self.name} renderer cannot spell a tensor core's {st.val.tc.name}")

  def _group_reduce(self, st: Let, w: "_Walk") -> None:
    """Partials through local memory, folded as a tree (ir.GroupReduce's order): write mine and meet; then at each
    halving step s the items below s fold the slot s above theirs into their own, and meet; every item reads the
    first slot, and the group meets again (the buffer is reused)."""
    v, buf = st.val, f"{st.name}_l"
    g = len(v.slots)
    mine, first = self.idx(v.mine), self.idx(v.slots[0])
    w.out(f"{buf}[{mine}] = {st.args[0]};")
    w.out(self.barrier)
    if g > 1:
      t, it = f"{st.name}_t", self.index_type_of(w.k)
      w.out(f"{it} {t} = ({mine}) - ({first});")
      w.out(f"for ({it} {st.name}_s = {tree_top(g)}; {st.name}_s > 0; {st.name}_s >>= 1) {{")
      w.out(f"  if ({t} < {st.name}_s && {t} + {st.name}_s < {g}) "
            + self.update(Reduce(v.op, v.dtype, (), v.src), f"{buf}[{mine}]", f"{buf}[{mine} + {st.name}_s]"))
      w.out(f"  {self.barrier}")
      w.out("}")
    w.out(f"{self.reg_type(v.dtype)} {st.name} = {buf}[{first}];")
    w.out(self.barrier)

  def _stage(self, st: Let, w: "_Walk") -> None:
    """A tile into local memory (ir.Stage): meet (the last tile's readers are done), every item copies the
    positions lidx, lidx + local size, ..., meet. A prefetched tile's Let copies the first step's tile (into the
    first buffer)."""
    v, it = st.val, self.index_type_of(w.k)
    j = sym.Var(f"{st.name}_j", 0, v.size - 1)
    env = v.copy_digits(sym.lin(j))
    idx, valid = v.at_step(0) if v.prefetch is not None else (v.idx, v.valid)
    w.out(self.barrier)
    w.out(f"for ({it} {j.name} = lidx; {j.name} < {v.size}; {j.name} += {w.k.local_size[0]}) "
          f"{st.name}_l[{self.idx(v.position(env))}] = {self._tile_load(v, idx, valid, env)};")
    w.out(self.barrier)

  def _tile_load(self, v: Stage, idx, valid, env: dict) -> str:
    """The global load of a tile's value at copy variables env (0 where not valid)."""
    idx, valid = sym.substitute(idx, env), valid.substitute(env)
    ld = self.load(v.buf, self.idx(idx), v.dtype)
    return ld if valid.is_true else f"({self.cond(valid)}?{ld}:{self.literal(0, v.dtype)})"

  def _fetch(self, st: Fetch, w: "_Walk") -> None:
    """The item's share of the next step's tile (ir.Stage.item_steps) into registers, before the step's reads."""
    v = st.stage
    steps = v.item_steps(sym.Var(LIDX, 0, w.k.local_size[0] - 1), w.k.local_size[0])
    regs = [f"{st.name}_r{i}" for i in range(len(steps))]
    w.out(f"{self.reg_type(v.dtype)} {', '.join(regs)};")
    idx, valid = v.at_step(sym.lin(v.prefetch) + 1)
    w.out(f"if ({self.cond(st.valid)}) {{")
    for r, (j, ok) in zip(regs, steps):
      ld = self._tile_load(v, idx, valid, v.copy_digits(j))
      w.out(f"  {r} = {ld};" if ok.is_true else f"  {r} = {self.cond(ok)} ? {ld} : {self.literal(0, v.dtype)};")
    w.out("}")

  def _refill(self, st: Refill, w: "_Walk") -> None:
    """The fetched registers into the tiles' local memory: one buffer between barriers (the step's reads are done;
    the stores are seen by the next step's), two into the next step's buffer and one barrier. The barriers are met
    by every item at every step (the condition guards the stores only)."""
    if any(v.buffers == 1 for v in st.stages): w.out(self.barrier)
    w.out(f"if ({self.cond(st.valid)}) {{")
    for name, v in zip(st.names, st.stages):
      steps = v.item_steps(sym.Var(LIDX, 0, w.k.local_size[0] - 1), w.k.local_size[0])
      at = v.buffer_at(sym.lin(v.prefetch) + 1)
      for i, (j, ok) in enumerate(steps):
        line = f"{name}_l[{self.idx(v.position(v.copy_digits(j)) + at)}] = {name}_r{i};"
        w.out(f"  {line}" if ok.is_true else f"  if ({self.cond(ok)}) {line}")
    w.out("}")
    w.out(self.barrier)

  def local_buffers(self, listing: list) -> list[str]:
    """Declarations of the local buffers of the listing's group reductions and tiles (at the kernel's top scope),
    16-byte aligned (a vector read of 4 at a multiple of 4 is one access)."""
    return [f"  __local {self.reg_type(st.val.dtype)} {st.name}_l[{_local_length(st.val)}] __attribute__((aligned(16)));"
            for st in listing if isinstance(st, Let) and isinstance(st.val, (GroupReduce, Stage))]

  def aligned_local(self, ptr: str, idx: str, d: VecDType) -> str:
    """A vector read of a local buffer at a position that is a multiple of its lanes (so of its size in bytes)."""
    return self.vload_at(ptr, idx, d)

  def _acc(self, st: Acc, w: "_Walk") -> None:
    r = st.reduce
    w.out(f"{self.reg_type(r.dtype)} {st.name} = {self.literal(reduce_identity(r.op, r.dtype), r.dtype)};")

  def _update(self, st: Update, w: "_Walk") -> None:
    for a in st.args: w.out(self.update(st.reduce, st.name, a))

  def _store(self, st: StoreSt, w: "_Walk") -> None:
    line = self.vstore_masked(st.buf, self.idx(st.idx), st.arg, st.vec, *map(self.idx, st.lanes)) if st.lanes else \
        self.vstore(st.buf, self.idx(st.idx), st.arg, st.vec) if st.vec is not None else \
        self.store(st.buf, self.idx(st.idx), st.arg, w.k.bufs[st.buf].dtype)
    w.out(line if st.valid.is_true else f"if ({self.cond(st.valid)}) {line}")

  def _prefetch(self, st: PrefetchSt, w: "_Walk") -> None:
    w.out(self.prefetch(st.buf, self.idx(st.idx)))

  def prefetch(self, buf: int, idx: str) -> str:
    """A read-ahead hint for b{buf}[idx] (ir.Prefetch); a renderer without one writes a comment."""
    return f"/* read ahead: b{buf}[{idx}] */"

  emit = {Loop: _loop, End: _end, Let: _let, Acc: _acc, Update: _update, StoreSt: _store, Fetch: _fetch,
          Refill: _refill, PrefetchSt: _prefetch}

  def helpers(self, k: Kernel) -> str:
    out = [self.prelude]
    ints = {b.dtype for b in k.bufs if b.dtype.is_int} | {dt.int32, dt.int64}
    for d in sorted(ints, key=lambda d: d.name):
      t = self.types[d]
      # x/0 and x%0 give 0 and MIN/-1 wraps, instead of trapping
      out.append(f"static inline {t} fg_idiv_{d.name}({t} a, {t} b) {{ return b == 0 ? 0 : "
                 f"(b == -1 ? ({t})(0 - a) : ({t})(a / b)); }}" if d.is_signed else
                 f"static inline {t} fg_idiv_{d.name}({t} a, {t} b) {{ return b == 0 ? 0 : ({t})(a / b); }}")
      out.append(f"static inline {t} fg_imod_{d.name}({t} a, {t} b) {{ return (b == 0 || b == -1) ? 0 : ({t})(a % b); }}"
                 if d.is_signed else f"static inline {t} fg_imod_{d.name}({t} a, {t} b) {{ return b == 0 ? 0 : ({t})(a % b); }}")
    return "\n".join(out)

  def param_args(self, k: Kernel) -> list[str]:
    """A kernel's scalar arguments (ir.Param), each in its register type."""
    return [f"{self.reg_type(d)} p{i}" for i, d in enumerate(k.params)]

  def render(self, k: Kernel, listing: list) -> str:
    raise NotImplementedError


_C_PRELUDE = r"""#include <math.h>
#include <stdint.h>
#include <string.h>
static inline long long fg_floordiv(long long a, long long b) { long long q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline long long fg_floormod(long long a, long long b) { long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline float fg_bf16_to_f32(unsigned short h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline unsigned short fg_f32_to_bf16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  /* a NaN keeps its upper bits (a bitcast's payload, signalling or not) where they hold one, else gets the quiet bit */
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | ((u & 0x7f0000u) ? 0u : 0x40u));
  u += 0x7fffu + ((u >> 16) & 1u);  /* round to nearest even */
  return (unsigned short)(u >> 16);
}
static inline float fg_round_half(float x) {  /* x rounded to the nearest float16 value (ties to even) */
  uint32_t u; memcpy(&u, &x, 4); uint32_t sign = u & 0x80000000u, a = u ^ sign;
  if (a >= 0x7f800000u) return x;
  if (a >= 0x477ff000u) { u = sign | 0x7f800000u; memcpy(&x, &u, 4); return x; }
  if (a < 0x38800000u) { float q; memcpy(&q, &a, 4); q = rintf(q * 16777216.0f) / 16777216.0f; return sign ? -q : q; }
  a += 0xfffu + ((a >> 13) & 1u); a &= 0xffffe000u; u = sign | a; memcpy(&x, &u, 4); return x;
}
static inline float fg_half_to_f32(unsigned short h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u; float f;
  if (e == 0) { f = (float)m * 5.9604644775390625e-8f; return s ? -f : f; }
  u = s | (e == 31 ? 0x7f800000u : ((e + 112u) << 23)) | (m << 13); memcpy(&f, &u, 4); return f;
}
static inline unsigned short fg_f32_to_half(float x) {
  float r = fg_round_half(x); uint32_t u; memcpy(&u, &r, 4);
  unsigned short s = (unsigned short)((u >> 16) & 0x8000u); uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {  /* a NaN keeps the payload's upper bits (a bitcast's), else gets the quiet bit */
    unsigned short m = (unsigned short)((a >> 13) & 0x3ffu); return s | 0x7c00u | (m ? m : 0x200u);
  }
  if (a == 0x7f800000u) return s | 0x7c00u;
  if (a < 0x38800000u) { float q; memcpy(&q, &a, 4); return s | (unsigned short)(q * 16777216.0f); }
  return s | (unsigned short)((((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu));
}
static inline float fg_bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fg_f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline double fg_bits_d(unsigned long long u) { double f; memcpy(&f, &u, 8); return f; }
static inline unsigned long long fg_d_bits(double f) { unsigned long long u; memcpy(&u, &f, 8); return u; }
"""

# float32 exp/log/tanh shared by the C and OpenCL preludes (the same bits on both devices)
_MATH = r"""/* float32 exp/log/tanh in straight-line code, so loops that call them vectorize (libm calls do not);
   within 1 ulp of the correctly rounded result, with IEEE special values */
static inline float fg_expf(float x) {
  float c = x > 88.8f ? 88.8f : (x < -103.972f ? 0.0f : x);   /* (0 there: its result is 0 below, and a tiny
    one made on the way would cost a denormal's microcode assist: a causal mask's -inf, every step) */
  float k = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   /* rint below 2^22, written as fg_vexp's */
  float r = c - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t ki = (int32_t)k, k1 = ki / 2, k2 = ki - k1;
  y = y * fg_bits_f((uint32_t)(k1 + 127) << 23) * fg_bits_f((uint32_t)(k2 + 127) << 23);
  return x < -103.972f ? 0.0f : (x != x ? x : y);
}
static inline float fg_logf(float x) {
  float small = x < 1.17549435e-38f ? 1.0f : 0.0f;       /* subnormals: scale into the normal range */
  float xs = x * (1.0f + small * 8388607.0f);
  uint32_t u = fg_f_bits(xs);
  float fe = (float)(int32_t)((u >> 23) & 0xffu) - 126.0f - 23.0f * small;
  float m = fg_bits_f((u & 0x007fffffu) | 0x3f000000u);   /* mantissa in [0.5, 1) */
  float lo = m < 0.70710678118654752f ? 1.0f : 0.0f;
  fe = fe - lo;
  m = m + m * lo - 1.0f;
  float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f; y = y * m + 1.1676998740e-1f; y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f; y = y * m - 1.6668057665e-1f; y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f; y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = y + -2.12194440e-4f * fe;
  y = y - 0.5f * z;
  float r = m + y + 0.693359375f * fe;
  r = x == INFINITY ? x : r;
  r = x == 0.0f ? -INFINITY : r;
  return (x < 0.0f || x != x) ? NAN : r;
}
static inline float fg_tanhf(float x) {
  float a = fabsf(x);
  float z = x * x;
  float s = -5.70498872745e-3f;
  s = s * z + 2.06390887954e-2f; s = s * z - 5.37397155531e-2f; s = s * z + 1.33314422036e-1f;
  s = s * z - 3.33332819422e-1f;
  s = s * z * x + x;
  float e = fg_expf(2.0f * (a > 20.0f ? 20.0f : a));
  float l = 1.0f - 2.0f / (e + 1.0f);
  l = x < 0.0f ? -l : l;
  return a < 0.625f ? s : l;
}
/* erf: an odd rational function on [-4, 4] (beyond it erf is +-1 in float32); within 8 ulp */
static inline float fg_erff(float x) {
  float c = x > 4.0f ? 4.0f : (x < -4.0f ? -4.0f : x);
  float z = c * c;
  float p = -2.72614225801306e-10f;
  p = p * z + 2.77068142495902e-08f; p = p * z - 2.10102402082508e-06f; p = p * z - 5.69250639462346e-05f;
  p = p * z - 7.34990630326855e-04f; p = p * z - 2.95459980854025e-03f; p = p * z - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * z - 2.13374055278905e-04f; q = q * z - 1.68282697438203e-03f; q = q * z - 7.37332916720468e-03f;
  q = q * z - 1.42647390514189e-02f;
  return c * p / q;
}"""
_C_PRELUDE += "\n" + _MATH + r"""
/* register-blocked kernels are vectorized across their unrolled lanes (SLP); gcc's loop vectorizer
   would instead vectorize the reduction loop around them, spilling every accumulator */
#if defined(__GNUC__) && !defined(__clang__)
#define FG_BLOCKED __attribute__((optimize("no-tree-loop-vectorize")))
#else
#define FG_BLOCKED
#endif
/* kernels with conditional loads (padding, gathers): gcc 12.2 -O2 -march=native miscompiles a loop whose body is
   conditional on the loop variable and feeds interleaved accumulators once it if-converts it -- `for (r...)
   if (r < 8) { a0 += b[2r]; a1 += b[2r+1]; }` sums wrong (AVX2 and AVX-512; tests/test_vectors.py) */
#if defined(__GNUC__) && !defined(__clang__)
#define FG_GUARDED __attribute__((optimize("no-tree-loop-if-convert")))
#define FG_BLOCKED_GUARDED __attribute__((optimize("no-tree-loop-vectorize", "no-tree-loop-if-convert")))
#else
#define FG_GUARDED
#define FG_BLOCKED_GUARDED
#endif
"""


def _aligned(idx, lanes: int) -> bool:
  """Is the position idx a multiple of lanes for every value of its variables?"""
  lin = sym.lin(idx)
  return lin.const % lanes == 0 and all(k % lanes == 0 for _, k in lin.terms)


def _c_vectors(widths) -> str:
  """The C prelude's float32 vector types (GCC vector extensions) and their helpers, for each width."""
  out = ["/* float32 vectors (codegen/passes.vector_axes): lane-wise arithmetic by operators, unaligned loads and "
         "stores by memcpy, max/min with NaN propagating as the scalar ops do */"]
  for n in widths:
    t, m = f"fg_float32x{n}", f"fg_int32x{n}"
    out += [f"typedef float {t} __attribute__((vector_size({4 * n})));",
            f"typedef int32_t {m} __attribute__((vector_size({4 * n})));",
            f"typedef uint32_t fg_uint32x{n} __attribute__((vector_size({4 * n})));",
            # (32-bit integer lanes loaded and stored: passes.VECTOR_INT_OPS' values, a random draw's bits in a buffer)
            *(f"static inline {v} fg_vload_{v}(const {c}* p) {{ {v} x; memcpy(&x, p, sizeof x); return x; }}\n"
              f"static inline void fg_vstore_{v}({c}* p, {v} x) {{ memcpy(p, &x, sizeof x); }}"
              for v, c in ((m, "int32_t"), (f"fg_uint32x{n}", "uint32_t"))),
            f"static inline {t} fg_vload_{t}(const float* p) {{ {t} v; memcpy(&v, p, sizeof v); return v; }}",
            # (float64 lanes: passes.VECTOR_F64_OPS, a float32 sum accumulated in float64)
            f"typedef double fg_float64x{n} __attribute__((vector_size({8 * n})));",
            f"static inline fg_float64x{n} fg_vload_fg_float64x{n}(const double* p) {{ fg_float64x{n} v; "
            f"memcpy(&v, p, sizeof v); return v; }}",
            f"static inline void fg_vstore_fg_float64x{n}(double* p, fg_float64x{n} v) {{ memcpy(p, &v, sizeof v); }}",
            # (n bools, one byte each, as a lane mask of -1 and 0: passes._masks' bool loads)
            f"typedef unsigned char fg_uint8x{n} __attribute__((vector_size({n})));",
            f"static inline {m} fg_vloadb_{n}(const unsigned char* p) {{ fg_uint8x{n} b; memcpy(&b, p, sizeof b); "
            f"return ({m})(__builtin_convertvector(b, {m}) != 0); }}",
            f"static inline void fg_vstore_{t}(float* p, {t} v) {{ memcpy(p, &v, sizeof v); }}",
            f"static inline {t} fg_vgather_{t}(const float* p, long long i, long long size) {{\n"
            f"  if (i >= 0 && i + {n} <= size) return fg_vload_{t}(p + i);\n"
            f"  {t} v = ({t}){{0}};\n"
            f"  for (int k = 0; k < {n}; k++) if (i + k >= 0 && i + k < size) v[k] = p[i + k];\n"
            f"  return v;\n}}"]
    # masked loads and stores (ir.Load.lanes): lanes lo <= i < hi, no memory touched outside them. AVX-512's and
    # AVX's masked moves where the compiler targets them, through the builtins gcc and clang both define (the mask is
    # loop-invariant: hoisted out of a reduction loop); <immintrin.h> is not included: parsing it added ~0.1 s to
    # every kernel's compile. Elsewhere lane by lane
    # (width: the AVX-512 feature, its builtins' width, mask type; AVX's load and store builtins)
    isa = {16: ("__AVX512F__", "512", "unsigned short", None),
           8: ("__AVX512VL__", "256", "unsigned char", ("maskloadps256", "maskstoreps256")),
           4: ("__AVX512VL__", "128", "unsigned char", ("maskloadps", "maskstoreps"))}.get(n)
    load = [f"static inline {t} fg_vloadm_{t}(const float* p, long long lo, long long hi) {{",
            f"  lo = lo < 0 ? 0 : lo; hi = hi > {n} ? {n} : hi;"]
    store = [f"static inline void fg_vstorem_{t}(float* p, {t} v, long long lo, long long hi) {{",
             f"  lo = lo < 0 ? 0 : lo; hi = hi > {n} ? {n} : hi;"]
    if isa:
      feat, bits, mt, avx = isa
      mask = f"({mt})(hi > lo ? ((1u << hi) - 1u) & ~((1u << lo) - 1u) : 0u)"
      cond = f"#if defined({feat}) && (defined(__GNUC__) || defined(__clang__))"
      # (through void*: gcc's builtins take float*, clang's a vector pointer; either warns of the other's)
      load += [cond, f"  return ({t})__builtin_ia32_loadups{bits}_mask((const void*)p, ({t}){{0}}, {mask});"]
      store += [cond, f"  __builtin_ia32_storeups{bits}_mask((void*)p, v, {mask});"]
      if avx:   # AVX's vmaskmovps: a lane mask of sign bits
        iota = f"({m}){{{','.join(map(str, range(n)))}}}"
        k = f"(({iota} >= ({m}){{0}} + (int)lo) & ({iota} < ({m}){{0}} + (int)hi))"
        load += ["#elif defined(__AVX__) && (defined(__GNUC__) || defined(__clang__))",
                 f"  return ({t})__builtin_ia32_{avx[0]}((const {t}*)p, {k});"]
        store += ["#elif defined(__AVX__) && (defined(__GNUC__) || defined(__clang__))",
                  f"  __builtin_ia32_{avx[1]}(({t}*)p, {k}, v);"]
      load.append("#else")
      store.append("#else")
    load += [f"  {t} v = ({t}){{0}};", "  for (long long i = lo; i < hi; i++) v[i] = p[i];", "  return v;"]
    store += ["  for (long long i = lo; i < hi; i++) p[i] = v[i];"]
    if isa:
      load.append("#endif")
      store.append("#endif")
    out += load + ["}"] + store + ["}"]
    for op, cmp in (("max", ">"), ("min", "<")):
      out.append(f"static inline {t} fg_v{op}_{t}({t} a, {t} b) {{ {m} k = (a {cmp} b) | (a != a); "
                 f"return ({t})((k & ({m})a) | (~k & ({m})b)); }}")
    # sqrt lane by lane in straight-line code, which the compiler's SLP vectorizer makes vector square roots (a lane
    # loop stays scalar under FG_BLOCKED); sqrtf is correctly rounded, and so are they
    out.append(f"static inline {t} fg_vsqrt_{t}({t} x) {{ return ({t}){{"
               + ", ".join(f"sqrtf(x[{i}])" for i in range(n)) + "}; }")
    # fg_expf lane-wise in vector operations (the same steps, so the same bits): its rint is the add-and-subtract of
    # 1.5 * 2^23 (exact round-to-nearest-even below 2^22) in both, so a compiler that contracts `c * log2(e) + 1.5 *
    # 2^23` into one FMA does so in both (with rintf(c * log2(e)) in the scalar one, x = -81.44479, whose product is
    # -117.5000x, rounded k differently: 1 ulp apart), the selects as masks
    sel = lambda k, a, b: f"({t})(({k} & ({m})({a})) | (~{k} & ({m})({b})))"
    # (an x whose result is 0 is computed as 0 and selected 0 after: clamped to -104, its tiny intermediate result
    # took a denormal's microcode assist, a causal mask's -inf in every attention step, 2x a softmax's time)
    # ...where the ISA has them, the upper clamp is a min (a NaN becomes the bound there, and x again below) and
    # the scaling by 2^k one vscalefps (AVX-512: y * 2^k rounded once, as the two products round once: the same bits,
    # checked on 2.4e9 inputs with gcc 12 and clang 14), 37-43% fewer cycles an exp (softmax, GELU, sigmoid)
    mm = {16: ("__AVX512F__", "__builtin_ia32_minps512({a}, {b}, 4)",
               "__builtin_ia32_minps512_mask({a}, {b}, {a}, (unsigned short)-1, 4)"),
          8: ("__AVX__",) + ("__builtin_ia32_minps256({a}, {b})",) * 2,
          4: ("__SSE__",) + ("__builtin_ia32_minps({a}, {b})",) * 2}.get(n)
    scalef = {16: ("__AVX512F__", "__builtin_ia32_scalefps512_mask(y, k, y, (unsigned short)-1, 4)"),
              8: ("__AVX512VL__", "__builtin_ia32_scalefps256_mask(y, k, y, (unsigned char)-1)"),
              4: ("__AVX512VL__", "__builtin_ia32_scalefps128_mask(y, k, y, (unsigned char)-1)")}.get(n)
    clamp = f"  c = {sel('(x > 88.8f)', 'z + 88.8f', sel('(x < -103.972f)', 'z', 'x'))};\n"
    if mm:
      feat, cmin, gmin = mm
      both = lambda mn: f"  c = {sel('(x < -103.972f)', 'z', 'x')}; c = {mn.format(a='c', b='z + 88.8f')};\n"
      clamp = (f"#if defined({feat}) && defined(__clang__)\n{both(cmin)}"
               f"#elif defined({feat}) && defined(__GNUC__)\n{both(gmin)}" if cmin != gmin else
               f"#if defined({feat}) && (defined(__GNUC__) || defined(__clang__))\n{both(cmin)}") + \
          f"#else\n{clamp}#endif\n"
    scale = (f"  {m} ki = __builtin_convertvector(k, {m}), k1 = ki / 2, k2 = ki - k1;\n"
             f"  y = y * ({t})((k1 + 127) << 23) * ({t})((k2 + 127) << 23);\n")
    if scalef:
      scale = (f"#if defined({scalef[0]}) && (defined(__GNUC__) || defined(__clang__))\n  y = {scalef[1]};\n"
               f"#else\n{scale}#endif\n")
    out.append(
      f"static inline {t} fg_vexp_{t}({t} x) {{\n"
      f"  {t} z = ({t}){{0}}, c;\n{clamp}"
      f"  {t} k = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;\n"
      f"  {t} r = c - k * 0.693359375f;\n  r = r - k * -2.12194440e-4f;\n"
      f"  {t} p = z + 1.9875691500e-4f;\n"
      f"  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;\n"
      f"  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;\n"
      f"  {t} y = p * r * r + r + 1.0f;\n"
      f"{scale}"
      f"  y = {sel('(x < -103.972f)', 'z', 'y')};\n"
      f"  return {sel('(x != x)', 'x', 'y')};\n}}")
    # fg_logf, fg_tanhf and fg_erff the same way: each step of the scalar function on the vector
    out.append(
      f"static inline {t} fg_vlog_{t}({t} x) {{\n"
      f"  {t} z0 = ({t}){{0}}, small = {sel('(x < 1.17549435e-38f)', 'z0 + 1.0f', 'z0')};\n"
      f"  {t} xs = x * (1.0f + small * 8388607.0f);\n"
      f"  {m} u = ({m})xs;\n"
      f"  {t} fe = __builtin_convertvector((u >> 23) & 0xff, {t}) - 126.0f - 23.0f * small;\n"
      f"  {t} m = ({t})((u & 0x007fffff) | 0x3f000000);\n"
      f"  {t} lo = {sel('(m < 0.70710678118654752f)', 'z0 + 1.0f', 'z0')};\n"
      f"  fe = fe - lo;\n  m = m + m * lo - 1.0f;\n"
      f"  {t} z = m * m;\n  {t} y = z0 + 7.0376836292e-2f;\n"
      f"  y = y * m - 1.1514610310e-1f; y = y * m + 1.1676998740e-1f; y = y * m - 1.2420140846e-1f;\n"
      f"  y = y * m + 1.4249322787e-1f; y = y * m - 1.6668057665e-1f; y = y * m + 2.0000714765e-1f;\n"
      f"  y = y * m - 2.4999993993e-1f; y = y * m + 3.3333331174e-1f;\n"
      f"  y = y * m * z;\n  y = y + -2.12194440e-4f * fe;\n  y = y - 0.5f * z;\n"
      f"  {t} r = m + y + 0.693359375f * fe;\n"
      f"  r = {sel('(x == INFINITY)', 'x', 'r')};\n"
      f"  r = {sel('(x == 0.0f)', 'z0 - INFINITY', 'r')};\n"
      f"  return {sel('((x < 0.0f) | (x != x))', 'z0 + NAN', 'r')};\n}}")
    out.append(
      f"static inline {t} fg_vtanh_{t}({t} x) {{\n"
      f"  {t} z0 = ({t}){{0}}, a = ({t})(({m})x & 0x7fffffff);\n"
      f"  {t} z = x * x;\n  {t} s = z0 - 5.70498872745e-3f;\n"
      f"  s = s * z + 2.06390887954e-2f; s = s * z - 5.37397155531e-2f; s = s * z + 1.33314422036e-1f;\n"
      f"  s = s * z - 3.33332819422e-1f;\n  s = s * z * x + x;\n"
      f"  {t} e = fg_vexp_{t}(2.0f * {sel('(a > 20.0f)', 'z0 + 20.0f', 'a')});\n"
      f"  {t} l = 1.0f - 2.0f / (e + 1.0f);\n"
      f"  l = {sel('(x < 0.0f)', '-l', 'l')};\n"
      f"  return {sel('(a < 0.625f)', 's', 'l')};\n}}")
    out.append(
      f"static inline {t} fg_verf_{t}({t} x) {{\n"
      f"  {t} z0 = ({t}){{0}}, c = {sel('(x > 4.0f)', 'z0 + 4.0f', sel('(x < -4.0f)', 'z0 - 4.0f', 'x'))};\n"
      f"  {t} z = c * c;\n  {t} p = z0 - 2.72614225801306e-10f;\n"
      f"  p = p * z + 2.77068142495902e-08f; p = p * z - 2.10102402082508e-06f; p = p * z - 5.69250639462346e-05f;\n"
      f"  p = p * z - 7.34990630326855e-04f; p = p * z - 2.95459980854025e-03f; p = p * z - 1.60960333262415e-02f;\n"
      f"  {t} q = z0 - 1.45660718464996e-05f;\n"
      f"  q = q * z - 2.13374055278905e-04f; q = q * z - 1.68282697438203e-03f; q = q * z - 7.37332916720468e-03f;\n"
      f"  q = q * z - 1.42647390514189e-02f;\n  return c * p / q;\n}}")
  return "\n".join(out)


_C_PRELUDE += _c_vectors((4, 8, 16))


class CRenderer(CStyleRenderer):
  """C99 for the CPU device: one function per kernel over a [start, end) slice of the work items,
  so a thread pool can split the range."""
  name = "c"
  prelude = _C_PRELUDE
  caps = Caps(vector_widths=(4, 8, 16), masked_vectors=True)

  # a bool buffer's bytes as unsigned char (a load converts to a _Bool register): gcc 12 vectorizes no loop that
  # loads _Bool beside float (a causal mask's where: ~10x slower)
  def storage_type(self, d: dt.DType) -> str: return "unsigned char" if d.is_bool else self.types[d]

  # a read for later (0), kept in every cache level (3); no fault where the address is past the buffer
  def prefetch(self, buf: int, idx: str) -> str: return f"__builtin_prefetch(b{buf}+{idx}, 0, 3);"

  def render(self, k: Kernel, listing: list) -> str:
    args = []
    for i, b in enumerate(k.bufs):
      args.append(f"{'' if b.output else 'const '}{self.storage_type(b.dtype)}* restrict b{i}")
    args += self.param_args(k) + ["long long start", "long long end"]
    # (the miscompile needs accumulators: a kernel without reductions keeps if-conversion, so its padded copies
    # vectorize with masked loads)
    guarded = any(isinstance(st, Acc) for st in listing) and \
        any(isinstance(st, Let) and (isinstance(st.val, Gather) or (isinstance(st.val, Load) and not st.val.valid.is_true))
            for st in listing)
    attrs = {(True, True): "FG_BLOCKED_GUARDED ", (True, False): "FG_BLOCKED ", (False, True): "FG_GUARDED ",
             (False, False): ""}[(k.tiled, guarded)]
    lines = [self.helpers(k), "", f"{attrs}void {k.name}({', '.join(args)}) {{",
             f"  for (long long gidx = start; gidx < end; gidx++) {{"]
    lines += self.body(listing, k, "    ")
    lines += ["  }", "}"]
    # one signature for every kernel, for the native launcher (runtime/cpu_pool.c); the Params' values follow the
    # buffers in one block of 8-byte slots (runtime/device.param_block)
    n = len(k.bufs)
    params = "".join(f"({self.reg_type(d)})((const {'double' if d.is_float else 'long long'}*)b[{n}])[{i}], "
                     for i, d in enumerate(k.params))
    lines += [f"void {k.name}_entry(void** b, long long start, long long end) {{",
              f"  {k.name}({''.join(f'b[{i}], ' for i in range(n))}{params}start, end);", "}"]
    return "\n".join(lines) + "\n"


_CL_PRELUDE = r"""#pragma OPENCL EXTENSION cl_khr_fp64 : enable
static inline long fg_floordiv(long a, long b) { long q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline long fg_floormod(long a, long b) { long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline float fg_bf16_to_f32(ushort h) { return as_float((uint)h << 16); }
static inline ushort fg_f32_to_bf16(float f) {
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | ((u & 0x7f0000u) ? 0u : 0x40u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}
static inline float fg_round_half(float x) {
  uint u = as_uint(x); uint sign = u & 0x80000000u, a = u ^ sign;
  if (a >= 0x7f800000u) return x;
  if (a >= 0x477ff000u) return as_float(sign | 0x7f800000u);
  if (a < 0x38800000u) { float q = rint(as_float(a) * 16777216.0f) / 16777216.0f; return sign ? -q : q; }
  a += 0xfffu + ((a >> 13) & 1u); a &= 0xffffe000u; return as_float(sign | a);
}
typedef uint uint32_t;
typedef int int32_t;
#define rintf rint
#define fabsf fabs
static inline float fg_bits_f(uint u) { return as_float(u); }
static inline uint fg_f_bits(float f) { return as_uint(f); }
static inline double fg_bits_d(ulong u) { return as_double(u); }
static inline ulong fg_d_bits(double f) { return as_ulong(f); }
/* float16's bits and back in plain integer code (a bitcast: vload_half/vstore_half may not keep a NaN's payload) */
static inline float fg_half_to_f32(ushort h) {
  uint s = (uint)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) { float f = (float)m * 5.9604644775390625e-8f; return s ? -f : f; }
  return as_float(s | (e == 31 ? 0x7f800000u : ((e + 112u) << 23)) | (m << 13));
}
static inline ushort fg_f32_to_half(float x) {
  uint u = as_uint(fg_round_half(x)); ushort s = (ushort)((u >> 16) & 0x8000u); uint a = u & 0x7fffffffu;
  if (a > 0x7f800000u) { ushort m = (ushort)((a >> 13) & 0x3ffu); return s | 0x7c00u | (m ? m : 0x200u); }
  if (a == 0x7f800000u) return s | 0x7c00u;
  if (a < 0x38800000u) return s | (ushort)(as_float(a) * 16777216.0f);
  return s | (ushort)((((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu));
}
"""
_CL_PRELUDE += "\n" + _MATH


def _cl_minmax(o: str):
  return lambda r, a, sd, d: f"select({a[1]},{a[0]},({a[0]}{o}{a[1]})|isnan({a[0]}))"


def _cl_lanes(op: str):   # the shared prelude's fg_expf etc., lane by lane (the same bits as the scalar kernels)
  def f(r, a, sd, d): return f"(({r.vec_type(d)})({','.join(f'{r.own_math[op]}({a[0]}.s{i:x})' for i in range(d.count))}))"
  return f


def _cl_where(r, a, sd, d):
  return f"select({a[2]},{a[1]},{a[0]})" if isinstance(sd, VecDType) else _vwhere(r, a, sd, d)


def _cl_cast(r, a, sd, d):
  if sd.scalar.is_bool: return f"select(({r.vec_type(d)})(0.0f),({r.vec_type(d)})(1.0f),{a[0]})"
  return _vcast(r, a, sd, d)


class OpenCLRenderer(CStyleRenderer):
  """OpenCL C: one work item per parallel index. Half values are stored with vload/vstore_half so
  no device extension is needed; bool is stored as uchar."""
  name = "opencl"
  index_type = "long"
  def index_type_of(self, k: Kernel) -> str:
    """32-bit index arithmetic where every buffer and the launch are far below 2^31 (GPUs emulate 64-bit integer
    multiplies and divisions: the index math of a kernel is then several times its loads); padding may reach
    indices up to twice a size, hence the margin."""
    most = max([b.size for b in k.bufs] + [k.global_size])
    return "int" if most < (1 << 29) else "long"
  types = {dt.bool_: "bool", dt.int8: "char", dt.uint8: "uchar", dt.int16: "short", dt.int32: "int",
           dt.uint32: "uint", dt.int64: "long", dt.float16: "half", dt.bfloat16: "ushort", dt.float32: "float",
           dt.float64: "double"}
  prelude = _CL_PRELUDE
  # float16 vectors are left out: PoCL's CPU target (no avx512f) builds a program holding float16 vloads/vstores
  # without its kernel (INVALID_KERNEL_NAME), and GPUs load at most 16 bytes per lane anyway
  caps = Caps(has_local=True, max_local=256, local_bytes=16384, vector_widths=(2, 4, 8))

  def storage_type(self, d: dt.DType) -> str: return "uchar" if d.is_bool else self.types[d]
  # OpenCL C's own vector types and built-ins (16-bit floats in float registers, as their scalars: a tensor core's
  # fragments)
  def vec_type(self, d: VecDType) -> str:
    if d.scalar.is_bool: return f"int{d.count}"   # a lane mask: what comparing float vectors gives
    return f"float{d.count}" if d.scalar.name in ("float16", "bfloat16") else f"{self.types[d.scalar]}{d.count}"
  def vmake(self, d: VecDType, a: list) -> str: return f"(({self.vec_type(d)})({','.join(a)}))"
  def gep(self, a: str, lane: int) -> str: return f"{a}.s{lane:x}"
  def vconvert(self, a: str, d: VecDType) -> str: return f"convert_{self.vec_type(d)}({a})"
  def vbitcast(self, a: str, d: VecDType) -> str: return f"as_{self.vec_type(d)}({a})"
  def vload_at(self, ptr: str, idx: str, d: VecDType) -> str:
    if d.scalar.is_bool: return f"(convert_int{d.count}(vload{d.count}(0, {ptr}+{idx})) != 0)"   # a lane mask
    return f"vload{d.count}(0, {ptr}+{idx})"
  def vgather(self, buf: int, i: str, size: int, d: VecDType) -> str:
    n = d.count
    lanes = ",".join(f"(({i})+{k}>=0&&({i})+{k}<{size}?b{buf}[({i})+{k}]:0.0f)" for k in range(n))
    return f"((({i})>=0&&({i})+{n}<={size})?vload{n}(0, b{buf}+({i})):(({self.vec_type(d)})({lanes})))"
  # vloadN may read any float's address, so it compiles to N scalar reads (ld.shared.f32 on NVIDIA); a pointer to the
  # vector type says the address is aligned: one 16-byte read (ld.shared.v4)
  def aligned_local(self, ptr: str, idx: str, d: VecDType) -> str:
    return f"(*(__local {self.vec_type(d)}*)({ptr}+{idx}))" if d.count * 4 <= 16 else self.vload_at(ptr, idx, d)
  def vstore(self, buf: int, idx: str, val: str, d: VecDType) -> str: return f"vstore{d.count}({val}, 0, b{buf}+{idx});"
  # OpenCL C's vector built-ins where GCC's extensions differ (select takes the condition last)
  vec_code_for_op = {**CStyleRenderer.vec_code_for_op,
                     **{op: _cl_lanes(op) for op in CStyleRenderer.own_math},
                     "MAX": _cl_minmax(">"), "MIN": _cl_minmax("<"),
                     "SQRT": lambda r, a, sd, d: f"sqrt({a[0]})", "ABS": lambda r, a, sd, d: f"fabs({a[0]})",
                     "WHERE": _cl_where, "CAST": _cl_cast}
  def library_fn(self, name: str, d: dt.DType) -> str: return name    # overloaded builtins
  def literal(self, v, d: dt.DType) -> str:
    r = super().literal(v, d)
    return r.replace("LL", "L").replace("((double)NAN)", "(double)NAN").replace("((double)INFINITY)", "(double)INFINITY")
  def load(self, buf: int, idx: str, d: dt.DType) -> str:
    if d == dt.float16: return f"vload_half({idx}, b{buf})"
    if d.is_bool: return f"(bool)b{buf}[{idx}]"
    return super().load(buf, idx, d)
  def store(self, buf: int, idx: str, val: str, d: dt.DType) -> str:
    if d == dt.float16: return f"vstore_half_rte({val}, {idx}, b{buf});"
    if d.is_bool: return f"b{buf}[{idx}] = (uchar)({val});"
    return super().store(buf, idx, val, d)
  # an NVIDIA GPU's OpenCL compiler takes inline PTX: its tensor cores' mma.sync (runtime/opencl.py declares them)
  _CVT = {"f16": "cvt.rn.f16x2.f32", "bf16": "cvt.rn.bf16x2.f32"}

  def _mma(self, st: Let, w: "_Walk") -> None:
    """ir.Mma as PTX: the lane's fragments packed into the 32-bit registers mma.sync takes (two 16-bit values per
    register, the element of the lower index in the lower half; tf32 converted with rounding to nearest, ties away),
    the instruction, its D registers as the lane's float vector."""
    tc, (a, b, c) = st.val.tc, st.args
    if tc not in self.caps.tensor_cores: return super()._mma(st, w)
    def regs(tag: str, v: str, n: int) -> list:
      out = []
      for i in range(n if tc.input_format == "tf32" else n // 2):
        r = f"{st.name}_{tag}{i}"
        if tc.input_format == "tf32": w.out(f'uint {r}; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"({r}) : "f"({v}.s{i:x}));')
        else:
          w.out(f'uint {r}; asm("{self._CVT[tc.input_format]} %0, %1, %2;" : "=r"({r}) : "f"({v}.s{2 * i + 1:x}), '
                f'"f"({v}.s{2 * i:x}));')
        out.append(r)
      return out
    ra, rb, nc = regs("a", a, len(tc.a[0])), regs("b", b, len(tc.b[0])), len(tc.c[0])
    ds = [f"{st.name}_d{i}" for i in range(nc)]
    slots = iter(range(2 * nc + len(ra) + len(rb)))
    group = lambda n: "{" + ",".join(f"%{next(slots)}" for _ in range(n)) + "}"
    text = f"{tc.name} {group(nc)}, {group(len(ra))}, {group(len(rb))}, {group(nc)};"
    w.out(f"float {', '.join(ds)};")
    outs = ", ".join('"=f"(%s)' % d for d in ds)
    ins = ", ".join(['"r"(%s)' % r for r in ra + rb] + ['"f"(%s.s%x)' % (c, i) for i in range(nc)])
    w.out(f'asm volatile("{text}" : {outs} : {ins});')
    w.out(f"float{nc} {st.name} = (float{nc})({', '.join(ds)});")

  def render(self, k: Kernel, listing: list) -> str:
    args = []
    for i, b in enumerate(k.bufs):
      args.append(f"__global {'' if b.output else 'const '}{self.storage_type(b.dtype)}* restrict b{i}")
    t = self.index_type_of(k)
    # index arguments arrive as long; with 32-bit index math they are narrowed once (the values fit: see above)
    narrow = {a.slot for a in k.arg_vars} if t != "long" else set()
    args += [f"long p{i}_" if i in narrow else a for i, a in enumerate(self.param_args(k))]
    ids = [f"  {t} gidx = get_group_id(0);", f"  {t} lidx = get_local_id(0);"] if k.local_size else \
          [f"  {t} gidx = get_global_id(0);"]
    ids += [f"  {t} p{i} = ({t})p{i}_;" for i in sorted(narrow)]
    attr = f"__attribute__((reqd_work_group_size({k.local_size[0]}, 1, 1))) " if k.local_size else ""
    lines = [self.helpers(k), "", f"{attr}__kernel void {k.name}({', '.join(args)}) {{", *ids, *self.local_buffers(listing)]
    lines += self.body(listing, k, "  ")
    lines += ["}"]
    return "\n".join(lines) + "\n"
