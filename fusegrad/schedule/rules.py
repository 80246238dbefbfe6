"""The scheduler's cost rules: where fusing would cost more than a kernel boundary saves, cut.

Lowering (codegen/lower.py) refuses only what one kernel cannot express. Everything it can express is fused
unless a rule here says otherwise; each rule returns the node to cut and its reason, and the reason goes into
the schedule's "why not fused" log (`ScheduleItem.why`, printed by FUSEGRAD_DEBUG=3) as "<rule>: <reason>".
Rules read a device's parameters (`Params`, a per-device table) so a device may trade launches for
parallelism differently.

Three kinds, by what they read:
- graph rewrites, before any cut (`rewrite_reductions`: a big reduction into few outputs becomes two kernels, a long
  contraction into many is computed in chunks of its reduction; a matmul's column operand read across its columns
  is copied transposed first, or packed in panels);
- graph rules over the whole graph in one pass, before lowering (`nested_reduction_cuts`: a matmul feeding a
  reduction is stored);
- fusion rules over what lowering's first pass finds in one fused group: asked as it meets each broadcast or
  padded source (`broadcast_cut`, `padded_reduction`: a cut stops the evaluation there), over the whole group
  (`lower.Fusion`: which indices each node was evaluated at, which dims run in parallel) before its kernel is
  built (`FUSION_RULES`), and after it for the register tile the optimizer will pick (`tile_operands`).
"""
from __future__ import annotations
from dataclasses import dataclass
from fusegrad import dtype as dt
from fusegrad.graph import node as gn
from fusegrad.graph.node import Node
from fusegrad.graph.view import prod
from fusegrad.codegen.lower import Fusion, _alu_count, _OP_COST, _nodes_below
from fusegrad.codegen.ir import Kernel
from fusegrad.codegen.opt import heuristic


@dataclass(frozen=True)
class Params:
  # a fused kernel must keep at least this many independent work items, unless the output is smaller...
  min_parallel: int = 64
  # ...but a kernel this small runs fused anyway: splitting it would cost more launches than it saves
  serial_ok: int = 1 << 14
  # a reduction of at least this many elements, recomputed inside another reduction's loop, gets its own kernel
  nested_min: int = 8
  # a computed value broadcast by a view (or read at several indices) is recomputed for each read; past this many
  # ALU ops it gets a buffer of its own instead (randn feeding a matmul, say)
  recompute_ops: int = 6
  # an elementwise value that several kernels would compute inline is stored past this many ALU ops (weighted as
  # tile_operands weighs them): a recurrence's chain (an LSTM's cell state, its gradient) would otherwise grow
  # with every step, each step's kernel recomputing all steps before it (quadratic scheduling and work)
  share_ops: int = 64
  # a computed operand of a register-blocked kernel is recomputed once per block of rows (the column operand)
  # or of columns (the row operand): past this many blocks it is stored instead
  block_recompute: int = 16
  # a reduction of at least this many elements into fewer than split_outputs outputs is split in two kernels
  # (many partial results in parallel, then the total)
  split_min: int = 1 << 15
  split_outputs: int = 64
  # the number of partial results of a split: 2**(log2(elements)/2) clamped to these powers of two
  split_parts_log2: tuple = (6, 10)
  # a contraction (a SUM of products) of at least chunk_min elements per output into at least chunk_outputs outputs
  # is computed in chunks of its first reduced dim, about chunk_len elements each: [parts, outputs] partial results,
  # then their sum (`chunks`); 0: never. (Fewer outputs: few tiles, each reading its operands about once anyway; a
  # skinny product's weights stream once)
  chunk_min: int = 1 << 11
  chunk_len: int = 1 << 9
  chunk_outputs: int = 1 << 13
  # a reduction whose value is broadcast over some output dims (softmax's max and sum, layernorm's moments) gets a
  # kernel of its own where a work-group cannot share it with the outputs (rule broadcast_reduction; fused and not
  # grouped, one work item walked a whole row: 0.06x torch on an H100)
  store_broadcast_reductions: bool = False


# per device (the part of a device name before ':'); one table for now: the values were measured on CPUs and
# kept for OPENCL and PYTHON so every device computes the same schedule (and the same rounding of big sums)
DEVICE_PARAMS: dict[str, Params] = {"CPU": Params(), "OPENCL": Params(), "PYTHON": Params()}
DEFAULT = Params()


# a GPU wants more partial results of a split reduction than a CPU's threads: 4096 work-groups balance over its
# compute units (H100, sum of 2^28: 0.46 ms per call with 4096 parts, 0.55 with 1024, 0.59 with 16384)
GPU = Params(store_broadcast_reductions=True, split_parts_log2=(6, 12))


def params(device: str) -> Params:
  name = device.split(":")[0].upper()
  return GPU if _is_gpu(name) else DEVICE_PARAMS.get(name, DEFAULT)


_gpu_of: dict[str, bool] = {}


def _is_gpu(name: str) -> bool:
  """Does the device work in work-groups rather than register blocks (its caps: codegen/renderer/base.py)?"""
  hit = _gpu_of.get(name)
  if hit is None:
    from fusegrad.runtime import device as rd
    caps = rd.get(name).caps
    hit = _gpu_of[name] = caps.has_local and not caps.prefers_blocking
  return hit


def reason(rule: str, why: str) -> str:
  """The log entry of a cut: the rule's name, then why."""
  return f"{rule}: {why}"


# names that start every cut's reason in the log (besides "requested": the caller asked for the node)
RULES = ("boundary", "gather_source", "shared_reduction", "shared_value", "split_reduce", "chunk_reduce",
         "operand_layout",
         "nested_reduction",
         "broadcast_recompute",
         "index_recompute", "padded_reduction", "parallel_work", "tile_operands", "broadcast_reduction",
         "gathered_reduction", "structural")


# ---- graph rewrite: split a big reduction ---------------------------------------------------------------------

def wants_split(n: Node, p: Params) -> bool:
  op, axes = n.arg
  src = n.src[0]
  return prod(src.shape[a] for a in axes) >= p.split_min and n.numel < p.split_outputs


# a split reduction's parts are a multiple of this many elements that divides its length where one is within twice
# the even share (400000 as 512 parts of 782, padded: scalar lanes under a guard, 0.6 ms; as 500 parts of 800, 50
# vectors of 16 each, no padding)
SPLIT_ALIGN = 16


def split(n: Node, p: Params) -> tuple[Node, Node]:
  """REDUCE n as two reductions: the source, its reduced axes flattened last and padded with the identity, as
  [kept..., parts, chunk] reduced over chunk into a stored [kept..., parts, 1] (the partial results, in
  parallel), then over parts. A 16-bit sum or product accumulates in float32 across both and rounds once.
  Returns (the node computing n's value, the node to cut: the partial results)."""
  op, axes = n.arg
  src = n.src[0]
  if op in ("SUM", "PROD") and src.dtype in (dt.float16, dt.bfloat16):
    total, partial = split(gn.make("REDUCE", dt.float32, (gn.cast(src, dt.float32),), n.arg, n.shape, n.device), p)
    return gn.cast(total, n.dtype), partial
  keep = [i for i in range(len(src.shape)) if i not in axes]
  kept = [src.shape[i] for i in keep]
  red = prod(src.shape[a] for a in axes)
  x = gn.movement(gn.movement(src, "PERMUTE", tuple(keep) + tuple(axes)), "RESHAPE", tuple(kept) + (red,))
  lo, hi = p.split_parts_log2
  parts = 1 << max(lo, min(hi, (red.bit_length() - 1) // 2))
  chunk = -(-red // parts)
  if chunk % SPLIT_ALIGN or red % chunk:   # parts of whole vectors that divide the length, where one is near
    c = next((c for c in range(chunk + -chunk % SPLIT_ALIGN, 2 * chunk + 1, SPLIT_ALIGN) if red % c == 0), None)
    if c is not None: chunk, parts = c, red // c
  if chunk * parts != red:
    pad = ((0, 0),) * len(kept) + ((0, chunk * parts - red),)
    x = gn.movement(x, "PAD", pad)
    ident = gn.reduce_identity(op, src.dtype)
    if ident != 0:
      mask = gn.movement(gn.const(True, dt.bool_, tuple(kept) + (red,), src.device), "PAD", pad)
      x = gn.alu("WHERE", mask, x, gn.const(ident, src.dtype, x.shape, src.device))
  x = gn.movement(x, "RESHAPE", tuple(kept) + (parts, chunk))
  partial = gn.contiguous(gn.reduce(x, op, (len(kept) + 1,)))
  total = gn.reduce(partial, op, (len(kept),))
  return gn.movement(total, "RESHAPE", n.shape), partial


def chunks(n: Node, p: Params) -> int:
  """The parts a contraction's reduction is computed in (`chunk`), or 0: a SUM of the product of two views, each
  broadcast along some output dim (each element read for several outputs: a matmul, a convolution's weight gradient).
  A register tile of a long contraction streams its whole share of both operands once per tile (a 3x3 convolution's
  weight gradient, 64 -> 64 channels over 8 x 56 x 56 positions: each of its 144 tiles streamed 4 MB, 30 GB/s from the
  last-level cache of a 2-core Xeon, 18.8 ms); chunked, the tiles of one chunk run one after another on a thread and
  find its operands in that core's cache (a transformer's weight gradients over 2048 tokens: 76 GFLOP/s in one pass on
  the same machine). Parts: the largest divisor of the first reduced dim (so each chunk's index stays affine) that
  leaves at least chunk_len elements per chunk and partial results of at most 1/CHUNK_SHARE of the operands' elements;
  float32 and float64 sums only (a 16-bit sum rounds once, in one kernel)."""
  op, axes = n.arg
  src = n.src[0]
  if op != "SUM" or src.op != "MUL" or not p.chunk_min or n.numel < p.chunk_outputs or \
     src.dtype not in (dt.float32, dt.float64): return 0
  red = prod(src.shape[a] for a in axes)
  if red < p.chunk_min: return 0
  keep = [d for d in range(len(src.shape)) if d not in axes]
  def shared(x) -> bool:   # a view (maybe cast) each of whose elements serves several outputs: broadcast along one
    v = x.src[0] if x.op == "CAST" else x
    return v.op == "VIEW" and any(v.arg.strides[d] == 0 and v.shape[d] > 1 for d in keep)
  if not all(shared(x) for x in src.src): return 0   # (a sum of squares reads each element for one output)
  # the partial results (parts x outputs) stay a fraction of what the operands hold (a square matmul, whose output
  # is as big as its operands, is not chunked)
  held = sum(prod(s for s, st in zip(v.shape, v.arg.strides) if st != 0)
             for v in (x.src[0] if x.op == "CAST" else x for x in src.src))
  first, most = src.shape[min(axes)], min(red // p.chunk_len, held // (CHUNK_SHARE * n.numel))
  return max((d for d in range(2, min(first, most) + 1) if first % d == 0), default=0)


# a chunked contraction's partial results are at most 1/CHUNK_SHARE of its operands' elements
CHUNK_SHARE = 4


def chunk(n: Node, parts: int) -> tuple[Node, Node]:
  """SUM n computed in `parts` chunks of its first reduced dim: the source with that dim first and split as
  [parts, dim / parts, ...], summed over all but the parts into a stored [parts, ...] (the chunks' partial results,
  parts outermost: the tiles of one chunk are neighbouring work items), then over the parts. Returns (the node
  computing n's value, the node to cut: the partial results)."""
  op, axes = n.arg
  src = n.src[0]
  a0, nd = min(axes), len(src.shape)
  order = (a0,) + tuple(i for i in range(nd) if i != a0)
  x = gn.movement(src, "PERMUTE", order)
  x = gn.movement(x, "RESHAPE", (parts, src.shape[a0] // parts) + x.shape[1:])
  red = (1,) + tuple(order.index(a) + 1 for a in axes if a != a0)
  partial = gn.contiguous(gn.reduce(x, op, red))
  return gn.movement(gn.reduce(partial, op, (0,)), "RESHAPE", n.shape), partial


def rewrite_reductions(roots: list[Node]) -> tuple[list[Node], dict[int, Node], dict[int, str]]:
  """The graph behind roots with every reduction that `wants_split` split in two and every matmul whose column
  operand wants another layout (`layout_operand`) rebuilt on a copy of it: (the new roots, the original node of each
  new node that replaces one, and the cuts the rewrite makes with their reasons). Nodes above a rewritten reduction
  are rebuilt on its replacement; the rest of the graph is shared. Nothing to rewrite: roots unchanged."""
  order, seen, want = [], set(), False
  stack = list(roots)
  while stack:   # the unrealized graph, and whether anything in it is rewritten
    n = stack.pop()
    if id(n) in seen or n.realized: continue
    seen.add(id(n)); order.append(n); stack.extend(n.src)
    if n.op == "REDUCE" and (wants_split(n, params(n.device)) or chunks(n, params(n.device)) or
                             layout_operand(n) is not None): want = True
  if not want: return roots, {}, {}
  order.sort(key=lambda n: n.seq)   # sources first
  new: dict[int, Node] = {}
  back: dict[int, Node] = {}
  cuts: dict[int, str] = {}
  for n in order:
    src = tuple(new.get(id(s), s) for s in n.src)
    m = n if all(a is b for a, b in zip(src, n.src)) else gn.make(n.op, n.dtype, src, n.arg, n.shape, n.device)
    if m.op == "REDUCE" and wants_split(m, params(m.device)):
      red = prod(m.src[0].shape[a] for a in m.arg[1])
      m, partial = split(m, params(m.device))
      cuts[id(partial)] = reason("split_reduce", f"the partial results of a reduction of {red} elements into {n.numel}, "
                                                 "computed in parallel")
    else:
      # a matmul's column operand in its tile's layout first, then (a long contraction) in chunks: chunked without
      # it, `x @ w.T` over 2048 ran its column operand a row apart, untiled (256x2048 @ 2048x512: 19 ms, 28 GFLOP/s)
      if m.op == "REDUCE" and (lay := layout_operand(m)) is not None:
        m, copies = relayout(m, *lay)
        for copy, why in copies: cuts[id(copy)] = reason("operand_layout", why)
      chain, r = [], m   # (the relaid product below its reshape, and the crop of a padded one; not into what is
      # realized already: a computed buffer keeps its op, not its sources)
      while r.op in ("VIEW", "CONTIGUOUS") and len(r.src) == 1 and not r.src[0].realized and \
          r.src[0].op in ("VIEW", "CONTIGUOUS", "REDUCE"):
        chain.append(r)
        r = r.src[0]
      if r.op == "REDUCE" and (parts := chunks(r, params(r.device))):
        red = prod(r.src[0].shape[a] for a in r.arg[1])
        m, partial = chunk(r, parts)
        for c in reversed(chain): m = gn.make(c.op, c.dtype, (m,), c.arg, c.shape, c.device)
        cuts[id(partial)] = reason("chunk_reduce", f"a contraction of {red} elements per output computed in {parts} "
                                                   "chunks (each chunk's operands stay in cache)")
    if m is not n:
      new[id(n)] = m
      back.setdefault(id(m), n)
  return [new.get(id(r), r) for r in roots], back, cuts


# ---- graph rewrite: a matmul's column operand in the layout its register tile reads --------------------------------

# a matmul's column operand read with a stride along its columns and stride 1 along the reduction (`x @ w.T`) is
# copied transposed first where the product has at least this many multiply-adds and rows
TRANSPOSE_MIN_WORK = 1 << 20
TRANSPOSE_MIN_ROWS = 16
# large float32 matmuls on devices with vector register tiles read their column operand from panels (relayout):
# at least this many multiply-adds (batch aside), rows, and reduction length
PANEL_MIN_WORK = 1 << 24
# ...the copy is paid once per matmul and saved once per row tile. From as few rows as a transposed copy: the panel
# copy reads each row of b for 16 columns at once where the transposed copy's neighbouring work items read other
# rows, a page apart (2-core Xeon, `x @ w.T`: 32x4096 @ 4096x4096 104 -> 14 ms, 64x2048 @ 2048x2048 27 -> 3.5,
# 256x2048 @ 2048x512 7.3 -> 2.1; an MLP 784-256-256-10's step on batch 256 alike; it had been 1024 rows)
PANEL_MIN_ROWS = 16
PANEL_MIN_K = 128
# ...and columns no multiple of the panel are padded to one (zeros, cropped from the product) where that adds at
# most this share of them (1000 classes as 1008: the transposed copy it took instead ran 512x4096 @ 4096x1000 at
# half torch's speed)
PANEL_PAD_WASTE = 1 / 16
# a row operand read across the reduction (_rows_across) is copied where its rows step a page (bytes) per step of the
# reduction, or at least ROWS_COPY_MIN_STRIDE bytes in a product of at least ROWS_COPY_MIN_COLS columns and a
# reduction of ROWS_COPY_MIN_K (from PANEL_MIN_WORK multiply-adds, on devices that read panels)
ROWS_COPY_PAGE = 4096
ROWS_COPY_MIN_K = 1024
ROWS_COPY_MIN_STRIDE = 256
ROWS_COPY_MIN_COLS = 384


def _matmul_operands(r: Node):
  """(a, b, cast of a or None, cast of b or None) of a matmul-like reduction: a SUM over the second-last axis of
  MUL(a', b') where a' and b' are VIEWs of shape [..., n, k, m] (each maybe under one CAST), a broadcast along the
  columns m (the row operand), b along the rows n (the column operand); None for anything else."""
  op, axes = r.arg
  src = r.src[0]
  nd = len(src.shape)
  if op != "SUM" or src.op != "MUL" or axes != (nd - 2,) or nd < 3: return None
  peeled = []
  for x in src.src:
    cast = x if x.op == "CAST" else None
    v = x.src[0] if cast is not None else x
    if v.op != "VIEW" or v.realized: return None
    peeled.append((v, cast))
  n, m = src.shape[-3], src.shape[-1]
  along = lambda v, d: v.arg.strides[d] == 0 and v.shape[d] > 1
  for (a, ca), (b, cb) in (peeled, peeled[::-1]):
    if along(a, -1) and along(b, -3) and not along(a, -3) and not along(b, -1) and n > 1 and m > 1:
      return a, b, ca, cb
  return None


def _panel_width(device: str, dtype, n: int, k: int, m: int) -> int:
  """Columns per panel when a matmul's column operand is worth packing first, else 0. The register tile reads a
  vector of b's columns per step of the reduction; in b's own layout those rows lie a row apart (an 8 KB stride for
  2048 columns), so a long reduction walks a new page per step and the cache keeps few of the rows (they fall into a
  handful of sets). Packed as (m/panel, k, panel), each panel is one consecutive stream, read once per row tile from
  cache; the copy costs one pass over b. Devices whose kernels use vector register tiles (caps), float32."""
  if dtype != dt.float32 or k < PANEL_MIN_K or n < PANEL_MIN_ROWS or n * k * m < PANEL_MIN_WORK: return 0
  from fusegrad.runtime import device as rd
  caps = rd.get(device).caps
  if not caps.prefers_blocking or caps.has_local: return 0
  # the register tile's vector width (a panel of fewer columns leaves the tile without its column vectors: 200
  # columns in panels of 8 ran a [700, 800] @ [800, 200] product as lanes along its reduction, 11 GFLOP/s)
  from fusegrad.codegen.opt.heuristic import tile_lanes
  p = tile_lanes(caps)
  return p if (m % p == 0 or (-m) % p <= m * PANEL_PAD_WASTE) and p >= 8 and m >= 4 * p else 0


def _rows_across(a: Node, ca, n: int, k: int, m: int, work: int) -> bool:
  """Is the matmul's row operand a worth a copy with its reduction axis consecutive? Read a row apart per step of
  the reduction (`g.T @ x`, a Linear layer's weight gradient over a batch), the register tile's rows walk a new line
  per step, and from a page apart a new page per step: the hardware prefetcher stops at pages, and rows 4 KB apart
  share a cache set. Copied, the product is a @ b's; the copy is one pass over a, paid back by many columns. 2-core
  Xeon (AVX-512), a.T @ b as [n x k] @ [k x m] (a stored [k, n]): 1024x1024x1024 22.2 -> 8.4 ms, 2048x2048x128
  12.7 -> 8.7, 512x8192x512 40.9 -> 19.9, 128x2048x512 1.65 -> 1.44, GPT-2's [3072x4096] @ [4096x768] ~230 -> 81;
  slower copied: 768x4096x128 3.8 -> 5.0, 512x2048x128 1.6 -> 1.8, 256x2048x256 1.48 -> 1.58, and a ResNet-18's
  convolution weight gradients over short reductions, rows 256-512 bytes apart ([64 x 512] @ [512 x 576]: 1.9 ->
  14 ms a step; rows closer than a page are copied from ROWS_COPY_MIN_K only)."""
  st = a.arg.strides
  if ca is not None or a.arg.mask is not None or st[-2] in (0, 1) or n < TRANSPOSE_MIN_ROWS or \
     k < TRANSPOSE_MIN_ROWS or m < TRANSPOSE_MIN_ROWS or work < PANEL_MIN_WORK: return False
  step = abs(st[-2]) * a.dtype.itemsize
  return step >= ROWS_COPY_PAGE or (step >= ROWS_COPY_MIN_STRIDE and m >= ROWS_COPY_MIN_COLS and k >= ROWS_COPY_MIN_K)


def layout_operand(r: Node):
  """(the matmul's operands (_matmul_operands), the column operand's panel width, 0 for a transposed copy or None
  to keep it, whether the row operand is copied with its reduction consecutive) when reduction r is a matmul
  whose operands are worth another layout first, else None."""
  mm = _matmul_operands(r)
  if mm is None: return None
  a, b, ca, cb = mm
  *batch, n, k, m = r.src[0].shape
  rows = _rows_across(a, ca, n, k, m, prod(batch) * n * k * m) and _panel_width(r.device, a.dtype, n, k, m) > 0
  p = _panel_width(r.device, r.src[0].dtype, n, k, m) if ca is None and cb is None else 0
  if p: return mm, p, rows
  st = b.arg.strides
  if b.arg.mask is None and st[-2] == 1 and st[-1] not in (0, 1) and n >= TRANSPOSE_MIN_ROWS and \
     prod(batch) * n * k * m >= TRANSPOSE_MIN_WORK:
    return mm, 0, rows
  return (mm, None, True) if rows else None


def _core(v: Node) -> Node:
  """View v without its broadcasts: each dim it broadcasts (stride 0, size > 1) at size 1."""
  from fusegrad.graph.view import View
  a = v.arg
  shape = tuple(1 if st == 0 and s > 1 else s for s, st in zip(a.shape, a.strides))
  mask = None if a.mask is None else tuple((0, 1) if st == 0 and s > 1 else mk for s, st, mk in zip(a.shape, a.strides, a.mask))
  return gn._with_view(v.src[0], View(shape, a.strides, a.offset, mask))


def relayout(r: Node, operands: tuple, panel: int | None, rows: bool = False) -> tuple[Node, list]:
  """Matmul r rebuilt on copies of its operands: the row operand a with its reduction consecutive where `rows`
  (_rows_across); the column operand b transposed (panel 0: its columns consecutive, the copy once, then every row
  tile reads vectors), or packed in panels of `panel` columns ([..., m/panel, k, panel]: each panel one stream) with
  r computed as [..., n, m/panel, 1, panel] and reshaped back, or kept (panel None). Returns (the node computing r's
  value, [(a copy, why), ...])."""
  (a, b, ca, cb) = operands
  src = r.src[0]
  *batch, n, k, m = src.shape
  cast = lambda x, c: gn.cast(x, c.dtype) if c is not None else x
  a_first = src.src[0] in (a, ca)
  copies = []
  if rows:
    acopy = gn.contiguous(_core(a))                   # [..., n, k, 1]: each row's reduction consecutive
    copies.append((acopy, f"the row operand of a [{n}x{k}] @ [{k}x{m}] matmul read across its reduction: copied "
                          "with the reduction consecutive"))
    a = gn.movement(acopy, "EXPAND", a.shape)
  mul = lambda x, y: gn.alu("MUL", x, y) if a_first else gn.alu("MUL", y, x)
  if panel is None:
    return gn.reduce(mul(cast(a, ca), cast(b, cb)), "SUM", r.arg[1]), copies
  bc = _core(b)                                       # [..., 1, k, m] (its own batch dims, broadcast ones at 1)
  if not panel:
    copy = gn.contiguous(bc)
    nb = cast(gn.movement(copy, "EXPAND", b.shape), cb)
    return gn.reduce(mul(cast(a, ca), nb), "SUM", r.arg[1]), copies + [
        (copy, f"the column operand of a [{n}x{k}] @ [{k}x{m}] matmul read across its columns: copied transposed")]
  lead = bc.shape[:-2]
  mp = m + (-m) % panel                               # (columns padded to whole panels: zeros, cropped below)
  if mp != m: bc = gn.movement(bc, "PAD", ((0, 0),) * (len(bc.shape) - 1) + ((0, mp - m),))
  packed = gn.movement(gn.movement(bc, "RESHAPE", lead + (k, mp // panel, panel)), "PERMUTE",
                       tuple(range(len(lead))) + tuple(len(lead) + i for i in (1, 0, 2)))
  copy = gn.contiguous(packed)                        # [..., 1, m/panel, k, panel]
  full = tuple(batch) + (n, mp // panel, k, panel)
  nb = cast(gn.movement(copy, "EXPAND", full), cb)
  ac = _core(a)                                       # [..., n, k, 1]
  na = cast(gn.movement(gn.movement(ac, "RESHAPE", ac.shape[:-2] + (1, k, 1)), "EXPAND", full), ca)
  out = gn.reduce(gn.alu("MUL", na, nb), "SUM", (len(full) - 2,))     # [..., n, m/panel, 1, panel]
  out = gn.movement(out, "RESHAPE", r.shape[:-1] + (mp,))
  # (padded: the product stored whole, its readers reading the columns they want; computed through the crop, its
  # kernel indexed the panels by division and took no tile)
  if mp != m: out = gn.movement(gn.contiguous(out), "SHRINK", tuple((0, s) for s in r.shape))
  return out, copies + [
      (copy, f"the column operand of a [{n}x{k}] @ [{k}x{m}] float32 matmul packed in panels of {panel} columns" +
       (f" (padded to {mp})" if mp != m else ""))]


# ---- graph rule: a reduction's source that is itself a big reduction (a matmul feeding a sum) -------------------

def _reads_once(n: Node) -> bool:
  """A view that reads each element of its source at most once (a permute, reshape or shrink: no broadcast,
  no padding), so the index of its source depends on every index of its own."""
  v = n.arg
  return n.src[0].op != "VIEW" and v.mask is None and all(st != 0 or s == 1 for st, s in zip(v.strides, v.shape)) and \
    len({st for st, s in zip(v.strides, v.shape) if s > 1}) == sum(1 for s in v.shape if s > 1)


# the most reductions one kernel adds up where a sum of them is stored whole (reduction_sum)
ACCUMULATE_MAX = 64


def reduction_sum(x: Node, is_cut, budget: list) -> list | None:
  """The reductions x adds up when x is a sum (a tree of ADDs, at x's size) of reductions (each maybe seen through a
  view of its size) and of stored values: a recurrent weight's gradient, the sum over the steps of dgates_t^T @ h_t
  that autograd adds up as the backward goes. None otherwise, or past `budget[0]` reductions (a one-item list,
  decremented)."""
  out, stack = [], [x]
  while stack:
    y = stack.pop()
    if y.numel != x.numel: return None
    if y.realized or is_cut(y): continue
    if y.op == "ADD":
      stack.extend(y.src)
      continue
    z = y.src[0] if y.op == "VIEW" and y.src[0].numel == y.numel else y
    if z.op != "REDUCE" or (z is not y and (z.realized or is_cut(z))): return None
    out.append(z)
    budget[0] -= 1
    if budget[0] < 0: return None
  return out


def _through_views(x: Node) -> Node:
  """x below the views that read each element once (a permute, a reshape)."""
  while x.op == "VIEW" and not x.realized and _reads_once(x): x = x.src[0]
  return x


def nested_reduction_cuts(order: list[Node], is_cut) -> dict[int, tuple[Node, str]]:
  """One pass over the graph (sources first): a reduction R whose source reaches another reduction X through
  elementwise ops and views that read each element once recomputes X in every iteration of its loop, serially
  and without the blocking a matmul needs ((a @ b).sum()). Cut X when X reduces at least `nested_min` elements
  and R's loop makes its work at least `serial_ok`: stored by its own kernel X runs as a matmul and R reads it.
  (Lowering's facts judge the same case where views are more complex: `nested_reduction`.) Where R reaches a sum of
  such reductions (reduction_sum: a recurrent weight's gradient, read by its norm), the sum is cut whole: one kernel
  computes its terms and stores it (cut at each term, each was a kernel and a buffer, and every reader of the sum
  added all of them up again)."""
  cuts: dict[int, tuple[Node, str]] = {}
  big = lambda x, red_r, p: (red := prod(x.src[0].shape[a] for a in x.arg[1])) >= p.nested_min and red * red_r >= p.serial_ok
  for r in order:
    if r.op != "REDUCE" or r.realized: continue
    p = params(r.device)
    red_r = prod(r.src[0].shape[a] for a in r.arg[1])
    stack, seen = [r.src[0]], set()
    while stack:
      x = stack.pop()
      if id(x) in seen or x.realized or is_cut(x) or id(x) in cuts: continue
      seen.add(id(x))
      if x.op == "REDUCE":
        if big(x, red_r, p):
          cuts[id(x)] = (x, reason("nested_reduction", "a reduction recomputed in every iteration of another's loop"))
        continue
      if x.op == "ADD" and (terms := reduction_sum(x, is_cut, [ACCUMULATE_MAX])) and len(terms) > 1 and \
         any(big(t, red_r, p) for t in terms):
        cuts[id(x)] = (x, reason("nested_reduction", f"a sum of {len(terms)} reductions recomputed in every iteration of "
                                                     "another's loop"))
        continue
      if x.op == "VIEW" and not _reads_once(x):
        # a reduction broadcast along one of R's output dims is recomputed for each of its indices (bilinear
        # interpolation's two resampling products, fused: every output summed the whole 64x64 input, 248 ms; 4.3 now)
        wide = prod(n for d, (n, st) in enumerate(zip(x.shape, x.arg.strides)) if st == 0 and d not in r.arg[1])
        if x.shape == r.src[0].shape and wide > 1 and (y := _through_views(x.src[0])).op == "REDUCE" and \
           not y.realized and not is_cut(y) and id(y) not in cuts and big(y, red_r * wide, p):
          cuts[id(y)] = (y, reason("nested_reduction", "a reduction broadcast along another's outputs, recomputed for "
                                                       "each"))
        continue
      if x.op in ("CAST", "CONTIGUOUS", "VIEW") or (x.op not in ("GATHER", "COPY", "CONST", "IOTA", "BUFFER")
                                                      and all(s.shape == x.shape for s in x.src)):
        stack.extend(x.src)
  return cuts


# ---- fusion rules: over what lowering's first pass found -------------------------------------------------------

def broadcast_cut(src: Node, is_leaf, p: Params) -> str | None:
  """A computed value broadcast by a view is recomputed for every element it is broadcast to: past
  `recompute_ops` it is stored. Asked by lowering as it meets each broadcast source (so a cut stops the
  evaluation there)."""
  if _alu_count(src, is_leaf, p.recompute_ops) > p.recompute_ops:
    return reason("broadcast_recompute", "an expensive value broadcast by a view would be recomputed per element")


def padded_reduction(src: Node, is_leaf, p: Params) -> str | None:
  """A reduction read through padding (a cat, a pad of a sum) runs its loop for every element of the padded view,
  the padding included: the value is read, not used. Fused into `cat([x.grad, w.grad])`, a convolution's two
  gradient reductions ran for each other's elements (48 s instead of a fraction of one). Stored by a kernel of
  its own, it runs once per element of its own. Asked by lowering as it meets each padded computed source."""
  stack, seen = [src], set()
  while stack:
    x = stack.pop()
    if id(x) in seen or (x is not src and is_leaf(x)): continue
    seen.add(id(x))
    if x.op == "REDUCE" and prod(x.src[0].shape[a] for a in x.arg[1]) >= p.nested_min:
      return reason("padded_reduction", "a reduction read through padding would also run for the padded elements")
    stack.extend(x.src)
  return None


def index_recompute(f: Fusion, p: Params):
  """A value read at several indices (a shifted copy of itself: x[1:] + x[:-1]) is computed once per index."""
  for n in f.repeated:
    if _alu_count(n, f.is_leaf, p.recompute_ops) > p.recompute_ops:
      return n, "an expensive value would be computed at several indices"


def nested_reduction(f: Fusion, p: Params):
  """A reduction evaluated inside another's loop runs again in every iteration of the loop dims its index
  depends on ((a @ b).sum(): the matmul, serially and unblocked); stored by a kernel of its own it gets the
  parallel dims and register blocking a matmul needs."""
  for n, inner, per in f.nested:
    if inner >= p.nested_min and inner * per >= p.serial_ok:
      return n, "a reduction recomputed in every iteration of another's loop"


def parallel_work(f: Fusion, p: Params):
  """The dims every reduction depends on run in parallel; the others become loops inside a work item. Too few
  parallel items (and enough work to matter): give the reduction that depends on the fewest dims its own kernel
  (an output of the kernel already is one: its other dims become loops, there is no better cut)."""
  if f.reduces and f.parallel < min(p.min_parallel, f.numel) and f.parallel < f.full and f.numel >= p.serial_ok \
     and f.inner:
    n, _ = min(f.inner, key=lambda ne: ne[1])
    return n, "fusing this reduction leaves too little parallel work"


def broadcast_reduction(f: Fusion, p: Params):
  """A reduction broadcast over output dims, on a device that groups reductions (Params.store_broadcast_reductions),
  when a work-group cannot share it with the outputs: its length has no power-of-two factor of GROUP_MIN (the
  work-group form, codegen/opt/heuristic._work_groups, splits every reduction and output loop of the kernel by
  one such factor; without it one work item would walk a whole row)."""
  if p.store_broadcast_reductions:
    for n, extent in f.inner:
      red = prod(n.src[0].shape[a] for a in n.arg[1])
      if extent < f.full and red & -red < heuristic.GROUP_MIN:
        return n, "a reduction broadcast over outputs that a work-group cannot share is grouped in a kernel of its own"


def gathered_reduction(f: Fusion, p: Params):
  """A gather evaluated inside a reduction's loop (an embedding's rows, then a layer norm's statistics, its weight
  gradient, a bias gradient over the tokens) keeps the reduction scalar and loads its indices again in every kernel
  that reads it (a char transformer's step on a 2-core Xeon: three such weight gradients 2.3 ms); past serial_ok
  elements the gathered value is stored once."""
  for n, _r in f.reduces:
    for x in _nodes_below([n], f.is_leaf):
      if x.op == "GATHER" and prod(x.shape) >= p.serial_ok and not f.is_leaf(x) and not any(x is o for o in f.outputs):
        return x, "a gather inside a reduction's loop would keep the reduction scalar"


# in the order they are asked (the first that cuts wins; the group is analyzed again with the cut)
FUSION_RULES = (index_recompute, nested_reduction, parallel_work, broadcast_reduction, gathered_reduction)


# a read through padding (a masked view: a concatenation's parts, a convolution's border) costs its condition and
# its index arithmetic beside the load: as an operand recomputed in a tile's inner loop it counts as this many ops
# (the q/k/v gradients concatenated into a weight gradient's operand took 2.5 ms where the stored operand takes 1.1)
MASKED_READ_COST = 2


def tile_operands(f: Fusion, k: Kernel, p: Params):
  """The register tile the optimizer picks for k (codegen/opt/heuristic) recomputes a computed operand once per
  block: the operand along the tile's columns (the vectorized inner loop) must be plain stride-1 loads, and an
  expensive operand, or a cheap one recomputed for many blocks, is stored once instead."""
  tile = heuristic.register_tile(k)
  if not tile: return None
  col, rows = next(v for v, _ in reversed(tile) if v is not None), heuristic.ROW_LANES
  width = prod(n for v, n in tile if v is col or v is None)   # the columns one block computes
  for src, along, strided, bcast in f.operands(col):
    ops = _alu_count(src, f.is_leaf, p.recompute_ops, _OP_COST, 0 if along else MASKED_READ_COST)
    if along:
      if strided or ops > p.recompute_ops or (ops and bcast // rows >= p.block_recompute):
        return src, "a computed operand read across the vectorized column lanes"
    # each element of a row operand is computed once per block of columns: bcast // width times (a ReLU's backward
    # mask on dh in dW = x^T @ dh, 784 columns in blocks of 16, was 5x the matmul's time)
    elif ops > p.recompute_ops or (ops and bcast // width >= p.block_recompute):
      return src, "a computed operand recomputed for every block of columns"
    elif ops and _expensive(src, f.is_leaf) and not _turnable(f.outputs[0].device, col):
      return src, "a row operand computing an exp, log, tanh or erf that no turned tile vectorizes"


def _expensive(n: Node, is_leaf) -> bool:
  """Does n compute an op of _OP_COST's (exp, log, tanh, erf, ...) inside its kernel (up to leaves and reductions)?"""
  seen, stack = set(), [n]
  while stack:
    x = stack.pop()
    if id(x) in seen or is_leaf(x) or x.op == "REDUCE": continue
    seen.add(id(x))
    if x.op in _OP_COST: return True
    stack.extend(x.src)
  return False


def _turnable(device: str, col) -> bool:
  """Can the heuristic's turned tile (heuristic._turned_tile: the rows in vector lanes, all the columns as
  accumulators) hold this product's columns on the device? Without it, a row operand computing an exp per element is
  vectorized across rows by gathers, with one accumulator per column: attention's softmax fused into p @ v over a head
  of 32 dims (32 accumulators of 8 lanes, spilled) ran 4x slower than the plain product of the stored softmax (2-core
  Xeon, AVX-512: [128 heads, 64, 64] @ [64, 32] 550 -> 135 us, the softmax stored in 95 us). Devices without register
  tiles keep their fusion."""
  from fusegrad.runtime import device as rd
  caps = rd.get(device).caps
  if not caps.prefers_blocking or caps.has_local: return True
  return col.hi + 1 <= heuristic.accumulator_vectors(caps)


def judge(f: Fusion, p: Params):
  """(node, reason) of the first fusion rule that cuts this group before its kernel is built, or None."""
  for rule in FUSION_RULES:
    hit = rule(f, p)
    if hit is not None: return hit[0], reason(rule.__name__, hit[1])
  return None
