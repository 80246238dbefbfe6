"""The default choice of actions for a kernel on a device (no search): a short list of rules that read only the
kernel and the device's capabilities (renderer/base.Caps).

- Register tile: a reduction kernel whose reads are shared along the last one or two parallel axes (a matmul:
  a row of b serves a block of rows of a) computes a ROW_LANES x (COL_VECTORS x OUT_LANES) block of outputs per
  work item, the columns in vectors, the row blocks fastest (neighbouring work items share a panel of
  columns in cache). A tile whose rows compute an exp (or another op of passes.OP_WORK) per element and whose
  columns fit its accumulators whole is turned over: the rows in vector lanes (attention's softmax @ v). A sum over
  rows takes its columns in vectors however few work items that leaves.
- Reduction lanes: otherwise a reduction whose innermost axis divides evenly keeps REDUCE_LANES partial
  accumulators, folded at the end (a kernel's only reduction of vector ops: VECTOR_ACCUMULATORS vectors of the
  machine's native width). Where no reduction takes lanes, the innermost output axis does (one chain per lane).
- Small reductions: a kernel whose reductions each fold at most UNROLL_MAX elements (a pooling window) has them
  unrolled whole and its innermost output axes as loops in each work item (LOOP).
- Gathered tile: a product strided along its outputs and contiguous along a reduction too short for a dot tile
  (`x @ w.T` with few features read in place) computes rows x one vector of columns loaded lane by lane.
- Elementwise kernels of vector ops run their innermost axis in the widest vector that divides it (a row read through a
  concatenation's bounds is expanded whole, so its conditions are constants); others run it
  as a loop in each work item (LOOP), which the C compiler vectorizes.
- GPUs (caps with local memory and no preference for blocking): `_work_groups` below (work-groups, a kernel's
  reductions and output loops shared by one, matmul register tiles with local-memory tiles).
- Tensor cores (caps.tensor_cores: an NVIDIA GPU through OPENCL): a float16/bfloat16 matmul-like kernel runs on the first
  that multiplies its dtype (`tensor_core` below), before any of the above.
The column and reduction lanes become vector values where the device has vectors (codegen/passes.vector_axes).
"""
from __future__ import annotations
import math
from fusegrad.graph import symbolic as sym
from fusegrad import dtype as dt
from fusegrad.codegen.ir import (Kernel, AxisKind, Reduce, Load, Gather, Index, Valid, Alu, toposort, dependencies,
                                 index_exprs)
from fusegrad.codegen.renderer.base import Caps
from fusegrad.codegen.opt.actions import Opt, OptOp, OptError, apply_opt, tc_axes
from fusegrad.codegen.passes import vector_axes, OP_WORK, streamed_loads, expand_pieces

K = AxisKind
# a register-tiled kernel keeps at least this many work items
MIN_PARALLEL = 64
# partial accumulators of a reduction whose innermost axis divides evenly
REDUCE_LANES = 8
# vector accumulators of a reduction of vector values (each the machine's native vector width)
VECTOR_ACCUMULATORS = 4
# the register tile: vectors of OUT_LANES columns (or the widest vector below that the device holds in one register:
# `tile_lanes`; 32 measured far slower with gcc's SLP) by ROW_LANES rows
OUT_LANES = 16
ROW_LANES = 4
# column vectors per register tile without the machine's registers known (a GPU's; the schedule's rules)
COL_VECTORS = 2
# with them known (Caps.vector_registers): TILE_COLUMNS columns per tile (or Caps.tile_columns) in vectors of
# `tile_lanes`, fewer where the registers do not hold them, the row counts tried (most first) and the registers left
# for the operands beside the accumulators. gcc 12: AVX-512 8 rows x 2 vectors of 16 (8 rows measured 1.8x faster
# than 4 on a 3x3 convolution; 2 vectors rather than 1: the same on big matmuls, 1.8x faster on a transformer's
# attention, whose row operand is recomputed per block of columns), AVX2 6 rows x 2 vectors of 8 (12 of its 16
# registers). clang 14 (runtime/cpu.py): 16 columns, half the registers: AVX-512 8 x 1, AVX2 4 x 2
TILE_COLUMNS = 32
TILE_ROWS = (8, 6, 4, 2)
# a register tile's row blocks run fastest only where its reduction has at least this many steps; a shorter one
# keeps the columns fastest, so its output (and an optimizer update fused into it) streams through memory in order
# (ResNet-18's last weight gradients, 8 steps into 2.4M weights and their momentum: 2.2 -> 1.1 ms a call on a 2-core
# Xeon; with 512 steps the row blocks fastest were 10% faster)
SWAP_MIN_REDUCE = 256
# a register tile's loads that step a cache line or more per iteration of their loop (a panel of columns: a vector a
# step) are asked for this many bytes ahead (OptOp.READAHEAD): 16 steps of a panel. 2048^2 matmul on a 2-core Xeon
# (Granite Rapids-class), its kernel alone: 156 -> 163 GFLOP/s on one core; 256, 1024 and 2048 bytes within noise
READ_AHEAD = 1024
# the most rows that fit are taken with the row axis padded to a multiple of them (PADTO) when that adds at most this
# fraction of rows: AVX2's 16 registers hold 6 rows x 2 vectors of 8, which no power-of-two size divides (Zen 4 in
# AVX2 code: a 1024^3 matmul 14.9 -> 10.0 ms with rows padded to 1026; a 3x3 convolution's 64 output channels padded
# to 66: 19.1 -> 10.5 ms)
ROW_PAD_WASTE = 1 / 16
# ...and its columns to whole vectors where that adds at most this share of them (register_tile; the last vector
# masked where the device has masked vectors, else a fraction of COL_PAD_WASTE). A convolution's output rows of 56
# as 4 vectors of 16 (1/7 more): without the tile its kernel ran on reduction lanes, 8x slower
COL_PAD_WASTE = 1 / 6
COL_PAD_WASTE_UNMASKED = 1 / 16
# ...and its column vectors to a multiple of the tile's where the device has masked vectors and that adds at most this
# share of them (13 vectors of a 200-column product as 4 tiles of 4: each multiply-add wastes 19%, against 1 vector
# per row, 9 loads per 8 multiply-adds)
COL_TILE_PAD_WASTE = 0.25
# an elementwise kernel whose innermost axis no native vector divides (rows of 200 floats read from rows 800 apart: an
# LSTM cell's gates) pads it to whole native vectors (the last one masked, Caps.masked_vectors) where that adds at most
# this share of it, instead of taking a narrower vector that divides it (AVX-512: 13 vectors of 16, not 25 of 8)
ELEMENTWISE_PAD_WASTE = 1 / 8
# a reduction's innermost loop and an output loop beside it (a softmax's row) no multiple of the native vectors are
# padded to whole vectors (masked) where that adds at most this share of them (hand_coded)
REDUCE_PAD_WASTE = 1 / 4
SPARE_REGISTERS = 4
# the vector accumulators a register tile wants (an FMA's latency of 4 cycles at 2 a cycle: 8 chains): a tile of at
# most half as many (few rows and one column vector: a small product keeping its work items) takes 2 or 4 partial sums
# along its reduction beside each. [20, 800] @ [800, 200] on 2 threads (4 rows x 1 vector of 16, 52 items), its
# kernel on a 2-core Xeon (AVX-512): 169 -> 68 us
TILE_MIN_ACCUMULATORS = 8
# a sum over the rows of a matrix (a bias gradient) takes up to this many column vectors per work item: with one, the
# items of a [2048, 128] sum each read a line of every row, 512 bytes apart (the prefetcher stops at every page): 0.23
# ms, 4.5 GB/s on a 2-core Xeon; with 8 each reads whole rows
COLUMN_SUM_VECTORS = 8
# an elementwise kernel without vector values runs an innermost axis of at least this many indices as a loop
INNER_LOOP_MIN = 16
# an elementwise kernel in vectors computes up to this many vectors of a row per work item (_row_vectors)
ROW_VECTORS = 8
# a reduction of at most this many elements per output (a pooling window) is unrolled whole
UNROLL_MAX = 16


def tile_lanes(caps: Caps | None) -> int:
  """Columns in one vector of a register tile: OUT_LANES, or the widest of caps' vector widths below it (an AVX2 CPU's
  8: runtime/cpu.host_vector_widths)."""
  if caps is None or not caps.vector_widths: return OUT_LANES
  return max((w for w in caps.vector_widths if w <= OUT_LANES), default=OUT_LANES)


def accumulator_vectors(caps: Caps) -> int:
  """The vectors of `tile_lanes` a register tile's accumulators may take (the registers but SPARE_REGISTERS, or
  Caps.tile_registers, over the registers one such vector takes)."""
  per_vector = max(1, tile_lanes(caps) // caps.native_lanes)
  return (caps.tile_registers or caps.vector_registers - SPARE_REGISTERS) // per_vector


def tile_shapes(caps: Caps | None) -> list[tuple[tuple, int]]:
  """[(row counts to try, most first; column vectors)] of register tiles whose accumulators fit in the registers,
  the most column vectors first (each column count a tile may fall back to where its columns do not divide)."""
  if caps is None: return [((ROW_LANES,), COL_VECTORS)]
  budget = accumulator_vectors(caps)
  want = max(1, (caps.tile_columns or TILE_COLUMNS) // tile_lanes(caps))
  out = []
  for cv in sorted({want, *(c for c in (4, 2, 1) if c < want)}, reverse=True):   # fewer where the rows do not fit
    rows = tuple(r for r in TILE_ROWS if r * cv <= budget)
    if rows and rows[0] >= ROW_LANES: out.append((rows, cv))
  return out or [((ROW_LANES,), 1)]


# column vectors a register tile takes, with the rows its accumulators leave, where the columns divide into none of
# tile_shapes' counts but into one of these (784 = 49 vectors of 16: 7 vectors x 3 rows; 400 = 25: 5 x 4)
ODD_COLUMN_VECTORS = (7, 5, 3)


def _odd_tile(caps: Caps | None, vectors: int) -> tuple[tuple, int] | None:
  """((rows,), column vectors) of a tile over a column count that only one vector divides of those tile_shapes tries,
  where the machine's tile takes several vectors and an odd count from ODD_COLUMN_VECTORS divides it, leaving at least
  3 rows within the accumulators of that tile: fewer loads per multiply-add than one vector (8 rows x 1: 9 loads per
  8; 3 x 7: 10 per 21). The MLP's first weight gradient, [256, 784] over a batch of 256, 2-core Xeon (AVX-512): 0.64
  -> 0.47 ms. None otherwise."""
  if caps is None or not caps.vector_registers: return None
  (rows0, *_), want = tile_shape(caps)
  if want == 1: return None
  for cv in ODD_COLUMN_VECTORS:
    rows = rows0 * want // cv   # at most the accumulators of the machine's own tile
    if vectors % cv == 0 and rows >= 3 and rows * cv * tile_lanes(caps) <= caps.max_registers: return (rows,), cv
  return None


def _exact_tile(caps: Caps | None, n: int, nvec: int, tile: tuple, work: int, items: int) -> tuple | None:
  """(rows, column vectors) of a tile with at least the accumulators of `tile` (rows, column vectors) and no more
  registers in all (its accumulators and a row's column vectors) whose rows divide n and column vectors divide nvec,
  the most accumulators first, then the most rows; None where none does. A tile whose rows would be padded takes it
  instead: 64 output channels of a 3x3 convolution on a Zen 4 (AVX-512, tiles of 4 vectors of 16) as 8 rows x 3
  vectors rather than 6 x 4 with the channels padded to 66: its kernel 8.80 -> 8.56 ms (98% of the machine's
  multiply-adds). AVX2's 6 x 2 (15 of its 16 registers with a row's broadcast) has no such tile: 4 x 3 takes all 16
  and ran 1.7x slower (gcc 12 spills)."""
  if caps is None or not caps.vector_registers: return None
  accumulators, registers = tile[0] * tile[1], tile[0] * tile[1] + tile[1]
  fits = [(r * cv, r, cv) for r in TILE_ROWS if n % r == 0 and work // r >= items
          for cv in range(2, min(nvec, registers) + 1)
          if nvec % cv == 0 and accumulators <= r * cv and r * cv + cv <= registers]
  return max(fits)[1:] if fits else None


def tile_shape(caps: Caps | None) -> tuple[tuple, int]:
  """(row counts to try, most first; column vectors) of the register tile the machine prefers."""
  return tile_shapes(caps)[0]


def _reduces(k: Kernel) -> list:
  return [v for v in toposort([st.value for st in k.stores]) if isinstance(v, Reduce)]


def _reused_without(var, reduces, deps) -> bool:
  """Does some reduction read memory, inside its loops, at an index that does not depend on var?
  Then a block of outputs along var shares that read: register blocking along var pays."""
  for r in reduces:
    loops = set(r.loops)
    for x in toposort([r.src]):
      if isinstance(x, (Load, Gather)) and var not in deps[id(x)] and deps[id(x)] & loops: return True
  return False


def _steps_along(k: Kernel, r, var) -> bool:
  """Does some load that reduction r reads move along var by 1 (or r reads no load along var at all)?"""
  from fusegrad.codegen.passes import _stride
  deps = dependencies([r.src])
  moving = [x for x in toposort([r.src]) if isinstance(x, (Load, Gather)) and var in deps[id(x)]]
  return not moving or any(isinstance(x, Load) and _stride(x.idx, var) == 1 for x in moving)


def _reduce_loads(reduces) -> list:
  return [x for r in reduces for x in toposort([r.src]) if isinstance(x, (Load, Gather))]


def _columns_contiguous(var, reduces) -> bool:
  """Does every read inside the reductions that moves along var step by 1 along it, and by more along the
  reduction (a sum over rows, a bias gradient; a per-row value beside it, layernorm's statistics, is broadcast)?
  Then a block of columns per work item is one vector add per row."""
  loads = _reduce_loads(reduces)
  if not loads or any(not isinstance(x, Load) for x in loads): return False
  rvars = {v for r in reduces for v in r.loops}
  along = 0
  for x in loads:
    terms = dict(sym.lin(x.idx).terms)
    if var in x.valid.variables() or terms.get(var, 1) != 1: return False
    if var not in terms: continue
    along += 1
    if any(a in rvars and c == 1 for a, c in terms.items()): return False
  return along > 0


def register_tile(k: Kernel, caps: Caps | None = None) -> list:
  """[(var, n), ...]: the output axes a register tile blocks, in the order they are split, the column axis (its
  vector lanes) last among the named ones, or [] when none pays; var None: the outer part of the axis split just
  before (the column vectors of a tile). The tile's size fits caps' registers (without caps: ROW_LANES x
  COL_VECTORS).
  The rows are an axis the column operand does not move along (a matmul's rows of a, a convolution's output
  channels); a matmul whose b was packed in panels (schedule/rules.relayout) has its columns in two axes, the panel and
  its lanes, and takes its column vectors from the panel axis. A column operand read with a stride along the
  columns (a multiple of the column index in its index) would make the tile scalar registers (spilled): no tile.
  The schedule's rules read it too: a tile recomputes a computed operand once per block, so they store expensive
  ones."""
  reduces = _reduces(k)
  gvars = [a.var for a in k.of_kind(K.GLOBAL)]
  if not reduces or not gvars or k.of_kind(K.LOOP, K.LOCAL, K.UPCAST, K.UNROLL, K.GROUP_REDUCE): return []
  if any(isinstance(x, Reduce) for r in reduces for x in toposort([r.src]) if x is not r): return []
  deps = dependencies([st.value for st in k.stores])
  extent = 1
  for v in gvars: extent *= v.hi + 1
  cols = tile_lanes(caps)
  loads = _reduce_loads(reduces)
  def stride_one(v) -> bool:   # the reads that move along v step by 1 along it (and some do)
    moving = [x for x in loads if v in deps[id(x)]]
    return bool(moving) and all(isinstance(x, Load) and dict(sym.lin(x.idx).terms).get(v) == 1 for x in moving)
  # the columns: the last output axis, or else the last one the column operand is read along in a row (an output
  # stored in another order than its operands are laid out: a convolution's weight gradient [o, ci, kh, kw] computed
  # from the input with its channels last; the stores are then one per lane)
  col = gvars[-1]
  if (col.hi + 1) % cols or not stride_one(col):
    col = next((v for v in reversed(gvars[:-1]) if (v.hi + 1) % cols == 0 and stride_one(v)), col)
  # columns no multiple of the lanes (a hidden size of 200) are padded to whole vectors where that adds little: without
  # a tile such a product ran its column operand gathered a row apart along the reduction (700x2000 @ 2000x200:
  # 116 ms at 5 GFLOP/s; padded to 208, 16 ms)
  waste = COL_PAD_WASTE if caps is not None and caps.masked_vectors else COL_PAD_WASTE_UNMASKED
  if (col.hi + 1) % cols and not (caps is not None and stride_one(col) and
                                  (-(col.hi + 1)) % cols <= (col.hi + 1) * waste): return []
  nvec = -(-(col.hi + 1) // cols)   # the column vectors (the last one padded)
  # a sum over rows takes its columns in vectors however few work items remain where the machine's vectors are known
  # (a small GPT's [256, 32] layernorm gradients summed into 32 weights: as 32 items of 8 reduction lanes gathered a
  # row apart, 9-19 us; as 1-2 items of column vectors, 1-6 us). The schedule's rules ask without caps: a column
  # sum recomputes nothing, and the operands they store for a tile are left as they were
  items = (caps.tile_items if caps is not None else 0) or MIN_PARALLEL
  if not ((extent // cols >= items and _reused_without(col, reduces, deps)) or
          (extent // cols >= (1 if caps is not None else 4) and _columns_contiguous(col, reduces))): return []
  col_loads = [x for x in loads if col in deps[id(x)]]
  if any(dict(sym.lin(x.idx).terms).get(col, 1) != 1 for x in col_loads if isinstance(x, Load)): return []
  tile, work = [(col, cols)], extent // cols
  moving = set().union(*(deps[id(x)] for x in col_loads)) if col_loads else set()
  others = [v for v in gvars if v is not col]
  rowlike = [v for v in others if v not in moving]
  row_var = rowlike[-1] if rowlike else (others[-1] if others else None)
  turned = _turned_tile(k, caps, reduces, deps, col, row_var)
  if turned: return turned
  def panel_of(cv: int):   # a panel axis of b's packed columns that takes cv vectors
    return next((v for v in reversed(others) if v is not row_var and v in moving and (v.hi + 1) % cv == 0), None) \
        if col.hi + 1 == cols else None
  # the most column vectors the columns divide into (a row convolution's 3424 positions: 2 vectors of 16, not 4)
  padded = lambda cv: caps is not None and caps.masked_vectors and nvec * cols != col.hi + 1 and \
      (-nvec) % cv <= (nvec + (-nvec) % cv) * COL_TILE_PAD_WASTE
  row_counts, col_vectors = next(((r, cv) for r, cv in tile_shapes(caps) if cv == 1 or nvec % cv == 0
                                  or panel_of(cv) is not None or padded(cv)), tile_shapes(caps)[-1])
  if col_vectors == 1 and (odd := _odd_tile(caps, nvec)) is not None: row_counts, col_vectors = odd
  def fits(r: int) -> bool:
    n = row_var.hi + 1
    return work // r >= items and (n % r == 0 or (r == row_counts[0] and (-n) % r <= n * ROW_PAD_WASTE))
  rows = next((r for r in row_counts if fits(r)), None) if row_var is not None else None
  if rows is not None and (row_var.hi + 1) % rows and nvec * cols == col.hi + 1 and \
      (exact := _exact_tile(caps, row_var.hi + 1, nvec, (rows, col_vectors), work, items)) is not None:
    rows, col_vectors = exact
  if rows is not None and _reused_without(row_var, reduces, deps):
    tile.insert(0, (row_var, rows))
    work //= rows
    # several column vectors per row (a matmul): fewer reads of the rows per multiply-add
    panel = panel_of(col_vectors)
    if col_vectors > 1 and work // col_vectors >= items:
      if nvec % col_vectors == 0 or padded(col_vectors): tile.append((None, col_vectors))
      elif panel is not None: tile.insert(1, (panel, col_vectors))
  elif caps is not None and _columns_contiguous(col, reduces):
    # a sum over rows (a bias gradient): several column vectors per work item, so each reads a stretch of every row
    # (with the machine's registers known: a GPU's work-groups read [rows x columns] tiles as matmuls, _work_groups)
    cv = _pow2_divisor(nvec, COLUMN_SUM_VECTORS)
    if cv > 1: tile.append((None, cv))
  return tile


# row blocks fastest (SWAP) only where the row operand is read along the reduction; set False to swap wherever the
# reduction is long (the rule before: a transformer's weight gradients ran 1.2x slower)
ROWS_ALONG_ONLY = True


def _rows_along_reduction(k: Kernel, row) -> bool:
  """Does every read of a register tile's row operand (the loads inside the reductions that move along the tile's
  rows, `row` of the canonical kernel k) step by 1 along its reduction's innermost loop? A matmul's a[i, k] does:
  its row block streams along k, and running the row blocks fastest keeps a panel of columns in cache for the next
  item. A weight gradient g^T x over a batch reads its rows across the reduction (g[t, o]: each step's rows one line
  of g, the next step's a row of g further, 2 KB for 512 outputs): there each item's rows are one line a step for a
  few of its floats, and keeping the columns fastest (the same row block for every panel, from L1) measured faster:
  the char transformer's chunked weight gradients [4, 512, 128] 1.45 -> 1.19 ms, [4, 384, 128] 1.05 -> 0.87 ms,
  its jitted step ~5% (2-core Xeon, AVX-512)."""
  if not ROWS_ALONG_ONLY or row is None: return True
  deps = dependencies([st.value for st in k.stores])
  for r in _reduces(k):
    inner = r.loops[-1]
    for x in toposort([r.src]):
      if isinstance(x, (Load, Gather)) and row in deps[id(x)] and (not isinstance(x, Load) or
                                                                  dict(sym.lin(x.idx).terms).get(inner) != 1):
        return False
  return True


# a kernel whose reductions are chains that take no lanes has its outputs in lanes where this many work items remain
CHAIN_MIN_ITEMS = 16
# a turned register tile (_turned_tile) keeps at least this many work items (fewer than MIN_PARALLEL: its columns are
# whole in each item, and attention's [8, 32, 2, 16] output in 32 items ran as fast as in 64 of half the columns,
# which compute each exp twice)
TURN_MIN_ITEMS = 16


def _turned_tile(k: Kernel, caps: Caps | None, reduces, deps, col, row) -> list:
  """[(col, n), (row, lanes)]: a register tile turned over, its rows in vector lanes and all n of its columns as
  the rows of one block, where the row operand computes an expensive op per element (passes.OP_WORK: an exp, a
  division; attention's softmax fused into its product with v, and into v's gradient) and the columns fit the
  accumulators whole. The plain tile computes that op lane by lane, once per row and reduction step, and feeds
  each result to one column vector's multiply-add; turned, it is one vector op per `lanes` rows, each column's
  value a broadcast load (passes.vector_axes takes the rows' lanes first: they save more work). 2-core Xeon
  (AVX-512), one core: attention's softmax @ v [8, 32, 2, 16] 40 -> 19 us, its gradient of v 39 -> 19 us.
  [] where that does not apply."""
  if caps is None or row is None: return []
  lanes, n = tile_lanes(caps), col.hi + 1
  extent = _extent(a.var for a in k.of_kind(K.GLOBAL))
  if lanes not in caps.vector_widths or (row.hi + 1) % lanes or n > accumulator_vectors(caps) or \
     extent // (n * lanes) < TURN_MIN_ITEMS: return []
  if not any(isinstance(v, Alu) and OP_WORK.get(v.op, 1) > 1 and row in deps[id(v)] and col not in deps[id(v)]
             for r in reduces for v in toposort([r.src])): return []
  try:
    kc = apply_opt(k, Opt(OptOp.UPCAST, k.axis_index(col), n), caps)
    kt = apply_opt(kc, Opt(OptOp.UPCAST, kc.axis_index(row), lanes), caps)
  except OptError:
    return []
  lane = {a.var for a in kt.axes if a.kind is K.UPCAST} - {a.var for a in kc.axes if a.kind is K.UPCAST}
  va = vector_axes(kt, caps, dependencies([st.value for st in kt.stores]))
  return [(col, n), (row, lanes)] if va and va[0] in lane else []


def hand_coded(k: Kernel, caps: Caps) -> list:
  """The actions the default heuristic picks for k (each legal in turn: apply them in order)."""
  opts: list = []
  def do(op, var, arg) -> int:
    """Apply the action if it is legal here (a device's limits may refuse it); the axis index it acted on."""
    nonlocal k
    o = Opt(op, k.axis_index(var), arg)
    try:
      k = apply_opt(k, o, caps)
      opts.append(o)
    except OptError:
      pass
    return o.axis
  if caps.tensor_cores:
    tc = tensor_core(k, caps)
    if tc: return tc
  if not caps.prefers_blocking: return _work_groups(k, caps) if caps.has_local else opts
  tile, k0 = register_tile(k, caps), k
  if tile:
    outer = []
    for var, n in tile:
      if var is None:
        if not outer: continue
        var = outer.pop()
      if k.axes[k.axis_index(var)].size % n:   # the rows, padded (ROW_PAD_WASTE): the axis gets a new variable
        i = do(OptOp.PADTO, var, n)
        var = k.axes[i].var
      i = do(OptOp.UPCAST, var, n)   # a split keeps the outer half in place
      if k.axes[i].kind is K.GLOBAL: outer.append(k.axes[i].var)
    # a thin tile (few rows and column vectors: a small product keeping its Caps.tile_items work items) has too few
    # accumulators to hide a multiply-add's latency: its reduction's innermost loop takes partial sums beside them
    accs = 1
    for _var, n in tile: accs *= n
    accs //= tile_lanes(caps)
    reds = _reduces(k)
    if 2 * accs <= TILE_MIN_ACCUMULATORS and len(reds) == 1 and reds[0].loops:
      last = reds[0].loops[-1]
      m = 2 if 2 * accs >= TILE_MIN_ACCUMULATORS else 4
      if (last.hi + 1) % m == 0 and last.hi + 1 >= 32 * m: do(OptOp.UPCAST, last, m)
    # the row blocks run fastest (neighbouring work items share a panel of columns in cache) where the panels are long
    # and the rows are read along the reduction (_rows_along_reduction)
    if len(outer) == 2 and max(_extent(r.loops) for r in _reduces(k)) >= SWAP_MIN_REDUCE and \
       _rows_along_reduction(k0, tile[0][0]):
      do(OptOp.SWAP, outer[0], k.axis_index(outer[1]))
    # the loads streamed along each reduction's innermost loop (the panels of columns, and rows that step a line or
    # more: a weight gradient's), read ahead where it is long; the rows' scalars that step a line in 16 iterations are
    # left to the hardware's prefetcher, which follows those
    roots = [st.value for st in k.stores]
    loops = {a.var for a in k.of_kind(K.REDUCE)}   # (a reduction's partial sums are an UPCAST inside its loop)
    inner = {[x for x in r.loops if x in loops][-1] for r in _reduces(k) if any(x in loops for x in r.loops)}
    for a in k.of_kind(K.REDUCE):
      if a.var in inner and a.size >= SWAP_MIN_REDUCE and streamed_loads(roots, a.var):
        do(OptOp.READAHEAD, a.var, READ_AHEAD)
    return opts
  reduces = _reduces(k)
  dot = (dot_tile(k, caps) or gathered_tile(k, caps)) if reduces else []
  if dot:
    for var, n in dot: do(OptOp.UPCAST, var, n)
    return opts
  if not reduces and caps.vector_widths and k.of_kind(K.GLOBAL):
    # elementwise: the innermost output axis in vector lanes, where every value along it is a vector op
    done = len(k.opts)
    k = _pieces(k, caps)
    opts += list(k.opts[done:])
    if not k.of_kind(K.GLOBAL): return opts   # (cut whole: every index its own piece)
    g = k.of_kind(K.GLOBAL)[-1].var
    w = next((w for w in sorted(caps.vector_widths, reverse=True) if (g.hi + 1) % w == 0 and k.groups >= w * MIN_PARALLEL),
             None)
    kv = _in_vectors(k, g, w, caps) if w is not None else None
    nat, size = caps.native_lanes, g.hi + 1
    if caps.masked_vectors and (w or 0) < nat and nat in caps.vector_widths and size > nat and \
       (-size) % nat <= size * ELEMENTWISE_PAD_WASTE and k.groups >= nat * MIN_PARALLEL:
      try:
        kp = apply_opt(k, Opt(OptOp.PADTO, k.axis_index(g), nat), caps)
        kvp = _in_vectors(kp, kp.of_kind(K.GLOBAL)[-1].var, nat, caps)
      except OptError:
        kvp = None
      if kvp is not None: kv, w = kvp, nat
    if kv is not None:
      opts += list(kv.opts[len(k.opts):])
      k = kv
      t = _transposing_read(k, w)
      if t is not None:   # the most indices up to the wanted count that divide the axis (49 panels of 16: 7); a
        # transpose's whole vectors of them while TRANSPOSE_MIN_ITEMS work items remain, else up to one vector's
        n = max(d for d in range(1, min(t[1], w) + 1) if t[0].size % d == 0)
        n = max((d for d in range(n, t[1] + 1, n) if t[0].size % d == 0 and k.groups // d >= TRANSPOSE_MIN_ITEMS),
                default=n)
        if n > 1: do(OptOp.LOOP, t[0].var, n)
      else: _row_vectors(k, do)
    else:
      # no vector values (a transcendental function, a gather, a copy into windows): the innermost axes as loops in
      # each work item, nested, until they hold INNER_LOOP_MIN indices (a plain stride-1 loop the C compiler
      # vectorizes, or an im2col copy's [.., Cg, 3, 3] block: index arithmetic by additions) instead of one flat
      # index divided back into every axis (64-bit divisions cost tens of cycles each: 7 ms for a 1.2 MB copy)
      g = k.of_kind(K.GLOBAL)[-1]
      c = max((c for c in _divisors_along(k, g.var) if INNER_LOOP_MIN <= c < g.size and
               (-g.size) % c <= g.size * ROW_PAD_WASTE), default=0)
      if c:
        # positions read as rows of c (a row convolution's padded rows: o / 58 and o % 58 in every index): the axis
        # padded to a multiple of c and split, so the inner loop of c reads without a division per element
        i = do(OptOp.PADTO, g.var, c) if g.size % c else k.axis_index(g.var)
        do(OptOp.LOOP, k.axes[i].var, c)
      else:
        for a in _inner_loops(k): do(OptOp.LOOP, a.var, a.size)
    return opts
  if not k.of_kind(K.LOOP) and all(_extent(r.loops) <= UNROLL_MAX for r in reduces):
    # only small reductions (a pooling window, its argmax): each unrolled whole, straight-line code instead of a loop
    # of a few steps around every output, and the innermost output axes as loops in each work item (_inner_loops), so
    # the index arithmetic is additions, not one flat index divided back into every axis (the MNIST convnet's 2x2
    # max-pool: 0.75 -> 0.16 ms)
    for a in k.of_kind(K.REDUCE):
      if a.size > 1: do(OptOp.UNROLL, a.var, a.size)
    for a in _inner_loops(k): do(OptOp.LOOP, a.var, a.size)
    return opts
  rows = _rows_in_registers(k, caps)
  if rows is not None: return opts + rows
  w = caps.native_lanes if caps.native_lanes in caps.vector_widths else 0
  n0 = len(opts)
  if w and caps.masked_vectors:
    # a reduction along a row no multiple of the vectors (a softmax over 1000 classes or 300 features, a layer norm
    # of 300) pads its innermost loop to whole vectors, the last one masked (ir.guard: its padded lanes add the
    # identity), where that adds at most REDUCE_PAD_WASTE of it: without, its row ran as scalar lanes or one chain
    # (AVX-512, [4096, 300] softmax 3.8 ms against torch's 0.39)
    # Only float32 sums, maxes and mins (vector reductions), and only where the padded length takes vector
    # accumulators below or the length takes no lanes unpadded (a length of whole REDUCE_LANES keeps them: padded
    # to whole vectors too short for the accumulators, [4096, 200] sums ran 0.10 -> 0.16 ms)
    for last in dict.fromkeys(r.loops[-1] for r in reduces):
      size, mine = last.hi + 1, [r for r in reduces if last in r.loops]
      if size % w == 0 or size < w or not all(r.dtype is dt.float32 and r.op in ("SUM", "MAX", "MIN") and
                                              _steps_along(k, r, last) for r in mine): continue
      if size >= 4 * w * VECTOR_ACCUMULATORS:
        # long: its whole vector accumulators' steps unmasked, the tail after them (OptOp.PEEL) one masked loop
        i = do(OptOp.PEEL, last, w * VECTOR_ACCUMULATORS)
        if k.axes[i].var is not last and k.axes[i + 1].size > 1:
          tail = k.axes[i + 1].var
          if k.axes[i + 1].size % w:
            j = do(OptOp.PADTO, tail, w)
            tail = k.axes[j].var
          do(OptOp.UPCAST, tail, w)
        continue
      step = next(w * a for a in (VECTOR_ACCUMULATORS, 2, 1) if (-size) % (w * a) <= size * REDUCE_PAD_WASTE or a == 1)
      padded = size + (-size) % step
      if (-size) % step <= size * REDUCE_PAD_WASTE and (padded >= 4 * w * VECTOR_ACCUMULATORS or size % REDUCE_LANES):
        do(OptOp.PADTO, last, step)
    reduces = _reduces(k)
  done = set()
  for r in reduces:
    last = r.loops[-1]
    if last in done: continue   # a loop two reductions share, upcast already
    done.add(last)
    size = last.hi + 1
    # a reduction whose every read strides along its loop (a softmax over dim 0: each column summed down its rows)
    # takes no lanes along it: the output axis below takes the vectors (passes, loads along the rows), where lanes
    # of both made 16 x 64 scalar accumulators (a [2048, 2048] softmax over dim 0: 202 ms; now 10.8, torch 7.4)
    if not _steps_along(k, r, last): continue
    # a sum of vector ops: one vector register of lanes per accumulator, and a few accumulators (an add's latency
    # hides behind the others'); anything else keeps REDUCE_LANES scalar accumulators. Each reduction of a kernel
    # (a softmax's max and sum) is its own vectors
    # (a length of whole vectors but no multiple of VECTOR_ACCUMULATORS of them takes as many accumulators as divide
    # it: a log-softmax's sum of exps over a vocabulary of 2000, 125 vectors of 16 in one accumulator, where scalar
    # lanes ran its exps 8 at a time: 1.15 -> 0.6 ms a call on [700, 2000])
    # (a float64 sum, a float32 one accumulated in float64 too: a layer norm's statistics, in vectors of half as many
    # lanes, one register each: passes.VECTOR_F64_OPS)
    wr = w // 2 if r.dtype is dt.float64 and w // 2 in caps.vector_widths else w
    accs = next((a for a in range(VECTOR_ACCUMULATORS, 0, -1) if wr and size % (wr * a) == 0), 0)
    kv = _in_vectors(k, last, wr, caps) if accs and size >= 4 * w * VECTOR_ACCUMULATORS else None
    if kv is not None:
      i = k.axis_index(last)
      k = kv
      opts.append(kv.opts[-1])
      if accs > 1: do(OptOp.UPCAST, k.axes[i].var, accs)   # the outer part of the split, in the axis's place
    elif size % REDUCE_LANES == 0 and size >= 4 * REDUCE_LANES:
      do(OptOp.UPCAST, last, REDUCE_LANES)
  # output loops that read no vector along themselves (a softmax over dim 0: each column's outputs a row apart)
  strided_loops = bool(k.of_kind(K.LOOP)) and all(not _vector_reads(k, a.var) for a in k.of_kind(K.LOOP))
  if len(opts) == n0 and (not k.of_kind(K.LOOP) or strided_loops):
    # no reduction took lanes (a length no multiple of them: a max over a vocabulary of 65): each output's reduction
    # is one chain of dependent steps (a NaN-propagating max: a compare and a select a step). The innermost output
    # axis takes the lanes instead where they are vectors (passes.vector_axes), one independent chain per lane: a small
    # GPT's [256, 65] logits' max 16 -> 5 us, a batch norm's statistics over [8, 8, 8] per channel 150 -> 50 us.
    # (As scalar copies, float64 steps in the chain, 8 chains ran 2x slower than one: a loop body 8 times as long.)
    g = k.of_kind(K.GLOBAL)[-1] if k.of_kind(K.GLOBAL) else None
    v = next((x for x in sorted(caps.vector_widths, reverse=True)
              if g is not None and g.size % x == 0 and k.groups // x >= CHAIN_MIN_ITEMS), 0)
    kv = _in_vectors(k, g.var, v, caps) if v else None
    if kv is not None:
      k = kv
      opts.append(kv.opts[-1])
  # the loop over a row's outputs after its reductions (a softmax's exp(x - max) / sum) in vectors too, so no
  # compiler's vectorizer decides its speed (gcc gives up on fg_expf's selects without AVX-512's masks)
  for a in k.of_kind(K.LOOP):
    if strided_loops: break   # (its reads a row apart: gathered lane by lane, the output axis's vectors above instead)
    if w and caps.masked_vectors and a.size % w and a.size > w and (-a.size) % w <= a.size * REDUCE_PAD_WASTE:
      i = do(OptOp.PADTO, a.var, w)   # (whole vectors, the last one masked, as the reductions above)
      a = k.axes[i]
    v = next((x for x in sorted(caps.vector_widths, reverse=True) if a.size % x == 0 and a.size >= 4 * x), 0)
    kv = _in_vectors(k, a.var, v, caps) if v else None
    if kv is not None:
      k = kv
      opts.append(kv.opts[-1])
  return opts


# a row's reductions and outputs (a softmax's max, sum and exp(x - max) / sum over rows of 128) whose every phase takes
# at most this share of the vector registers (and Caps.max_registers values: AVX-512 rows up to 256, AVX2 up to 128)
# are unrolled whole in vectors (_rows_in_registers): each element is loaded and its exp computed once for every phase
# (passes.dedupe), where each phase's loop read and computed it again. Rows spilled past the registers (AVX-512 rows of
# 512-2048 unrolled) measured no faster than the loops
ROW_REGISTER_SHARE = 1
# ...and a kernel of one phase (a sum, a max) where its row takes at least this many vectors. 2-vCPU Zen 4, one call,
# ms, AVX-512: softmax [8192, 128] 0.69 -> 0.35 (torch 0.33), [8192, 256] 1.43 -> 0.65, [16384, 64] 0.75 -> 0.40,
# [16384, 32] 0.37-0.50 -> 0.31-0.36; logsumexp [8192, 128] 0.73-0.82 -> 0.54-0.59, [16384, 256] 2.4 -> 1.4-1.55;
# amax [8192, 128] 0.18-0.21 -> 0.13, [16384, 256] 1.2 -> 0.37; sum [16384, 32] (2 vectors a row) 0.068 -> 0.084
# without this bound. AVX2 code: softmax [8192, 64] 0.43-0.51 -> 0.28, [8192, 128] 1.01-1.04 -> 0.50-0.52
ROW_REGISTER_MIN_VECTORS = 4


def _rows_in_registers(k: Kernel, caps: Caps) -> list | None:
  """The actions that keep a row in vector registers through every phase of its kernel, or None where it does not
  fit: each reduction a float32 SUM/MAX/MIN over one contiguous loop, at most one output loop beside them, each at
  most ROW_REGISTER_SHARE of the registers in vectors. Each loop becomes a vector (UPCAST) and its vectors registers
  (UNROLL of a reduction's, UPCAST of the outputs'); codegen/pipeline merges the phases' equal loads and values."""
  w = caps.native_lanes if caps.native_lanes in caps.vector_widths else 0
  most = int(caps.vector_registers * ROW_REGISTER_SHARE)
  reduces = _reduces(k)
  if not w or not reduces or k.of_kind(K.UPCAST, K.UNROLL, K.LOCAL, K.GROUP_REDUCE, K.GROUP_LOOP): return None
  loops = k.of_kind(K.LOOP)
  if len(loops) > 1 or any(len(r.loops) != 1 or r.dtype is not dt.float32 or r.op not in ("SUM", "MAX", "MIN") or
                           not _steps_along(k, r, r.loops[0]) for r in reduces): return None
  rows = list(dict.fromkeys(r.loops[0] for r in reduces)) + [a.var for a in loops]
  # whole vectors, the last one masked where the device has masked vectors and that adds at most REDUCE_PAD_WASTE
  # (a softmax over 100 classes: 7 vectors of 16); (a row of a runtime length, ir.Axis.end, keeps its loop: it ends at
  # the length, not at the bound)
  pad = lambda n: (-n) % w if caps.masked_vectors and (-n) % w <= n * REDUCE_PAD_WASTE else None
  if any(pad(v.hi + 1) is None or not 1 < (v.hi + w) // w <= most or k.axes[k.axis_index(v)].end is not None
         for v in rows): return None
  # one phase over a row of few vectors (a sum over rows of 32) runs faster with a row per lane (the chains below)
  if len(rows) == 1 and (rows[0].hi + w) // w < ROW_REGISTER_MIN_VECTORS: return None
  if loops and not _vector_reads(k, loops[0].var): return None
  start = len(k.opts)
  try:
    for v in rows:
      i = k.axis_index(v)   # (after the split, the vectors: its outer part, in the axis's place)
      if (v.hi + 1) % w:
        k = apply_opt(k, Opt(OptOp.PADTO, i, w), caps)
        v = k.axes[i].var
      kind, kv = k.axes[i].kind, _in_vectors(k, v, w, caps)
      if kv is None: return None
      k = apply_opt(kv, Opt(OptOp.UNROLL if kind is K.REDUCE else OptOp.UPCAST, i, kv.axes[i].size), caps)
  except OptError:
    return None
  return list(k.opts[start:])


# a copy whose work items write consecutive vectors but read them far apart (packing a matmul's operand in panels:
# one row of b per item) reads this many neighbouring vectors per work item instead, looping over the axis the read
# runs along: 2048^2 floats packed in 3.6 -> 2.2 ms, 1024^2 0.46 -> 0.30 ms (2-core Xeon, AVX-512). A transpose
# (the read steps by 1 along another axis) loops over as many indices of it as a vector has lanes: [4100, 4096].T
# copied at 0.8 GB/s before, each work item's 16 lanes a page apart and its neighbours reading other rows
TRANSPOSE_LOOP = 8
# ...and a transpose loops over TRANSPOSE_VECTORS vectors' worth of its read axis (each lane's row read four cache lines
# at a time; 2-core Xeon, AVX-512: [4096, 3072].T copied 23 -> 15 ms, [4096, 768].T 1.4 -> 1.05; one line, 16 indices,
# was the rule before), keeping at least TRANSPOSE_MIN_ITEMS work items ([2048, 128].T in 128 items: 0.07 -> 0.34 ms)
TRANSPOSE_VECTORS = 4
TRANSPOSE_MIN_ITEMS = 256


def _transposing_read(k: Kernel, w: int):
  """(the GLOBAL axis a load of k continues along, how many of its indices a work item takes) when the work items
  run fastest along an axis that all stores step along by w (consecutive vectors) and that load jumps along by more
  than a few cache lines: an axis it reads by w (after its vector of w lanes: TRANSPOSE_LOOP vectors), or one it
  reads by 1 (a transpose: each lane's row read TRANSPOSE_VECTORS cache lines at a time); else None."""
  gl = k.of_kind(K.GLOBAL)
  if len(gl) < 2: return None
  fast = gl[-1].var
  coef = lambda x: dict(sym.lin(x).terms).get(fast, 0)
  if any(coef(st.idx) != w for st in k.stores): return None
  for x in (v for st in k.stores for v in toposort([st.value]) if isinstance(v, Load)):
    terms = dict(sym.lin(x.idx).terms)
    if terms.get(fast, 0) >= 4 * w:
      for step, n in ((w, TRANSPOSE_LOOP), (1, w * TRANSPOSE_VECTORS)):
        a = next((g for g in gl[:-1] if terms.get(g.var) == step and g.size >= 2), None)
        if a is not None: return a, n
  return None


def _divisors_along(k: Kernel, var) -> set:
  """The constants c of the floor divisions and moduli x // c, x % c in k's indices and conditions whose x steps by 1
  along var."""
  out: set = set()
  def walk(e):
    if isinstance(e, (sym.Div, sym.Mod)):
      if dict(sym.lin(e.x).terms).get(var) == 1: out.add(e.c)
      walk(e.x)
    elif isinstance(e, sym.Lin):
      for a, _ in e.terms: walk(a)
  for x in index_exprs(k): walk(sym.lin(x))
  return out


def _extent(vs) -> int:
  n = 1
  for v in vs: n *= v.hi + 1
  return n


def _inner_loops(k: Kernel) -> list:
  """The innermost GLOBAL axes (never the first), innermost first, that make loops of at least INNER_LOOP_MIN indices
  in each work item while MIN_PARALLEL work items remain; [] when they do not reach INNER_LOOP_MIN."""
  gl, inner, loops = k.of_kind(K.GLOBAL), 1, []
  for a in reversed(gl[1:]):
    if inner >= INNER_LOOP_MIN or k.groups // (inner * a.size) < MIN_PARALLEL: break
    loops.append(a)
    inner *= a.size
  return loops if inner >= INNER_LOOP_MIN else []


def dot_tile(k: Kernel, caps: Caps) -> list:
  """[(var, n), ...] for a block of dot products whose operands are both contiguous along the reduction (a
  convolution's weight gradient: the output gradient and the input windows, both stride 1 along the positions
  summed over; `a @ b.T` read in place): the reduction in vector lanes, and a few outputs along two dims that
  each leave one operand's reads shared, so every vector load feeds several multiply-adds ([] when it does not
  apply). 4 x 3 such outputs measured 3.6x faster than reduction lanes alone on a 3x3 convolution's weight
  gradient."""
  reduces = _reduces(k)
  gvars = [a.var for a in k.of_kind(K.GLOBAL)]
  if len(reduces) != 1 or not gvars or k.of_kind(K.LOOP, K.LOCAL, K.UPCAST, K.UNROLL, K.GROUP_REDUCE): return []
  r = reduces[0]
  last, lanes = r.loops[-1], tile_lanes(caps)
  if (last.hi + 1) % lanes or last.hi + 1 < 4 * lanes or lanes not in caps.vector_widths: return []
  loads = [x for x in toposort([r.src]) if isinstance(x, (Load, Gather))]
  if not loads or any(not isinstance(x, Load) or not x.valid.is_true or dict(sym.lin(x.idx).terms).get(last) != 1
                      for x in loads): return []
  deps = dependencies([st.value for st in k.stores])
  shared = [v for v in gvars if _reused_without(v, reduces, deps)]
  work = 1
  for v in gvars: work *= v.hi + 1
  small = next((v for v in reversed(shared) if v.hi + 1 <= 4), None)
  big = next((v for v in shared if v is not small and (v.hi + 1) % 4 == 0), None)
  if small is None and caps.vector_registers:
    # a skinny product (a few rows: a small batch through a Linear layer, a ResNet's last convolutions as im2col
    # matmuls): all its rows in the tile and as many columns as the registers then hold, so the big operand (the
    # weights) streams through once. Each output alone re-read it for every row (ResNet-18's 8 x 4608 @ 4608 x 512:
    # 1.2 ms at 8 GB/s)
    budget = accumulator_vectors(caps)
    rows = next((v for v in reversed(shared) if 4 < v.hi + 1 <= budget // 2), None)
    if rows is not None:
      n = 1
      fits = lambda c: c * (rows.hi + 1) <= budget and c * (rows.hi + 1) * lanes <= caps.max_registers
      while n < 4 and fits(2 * n): n *= 2
      cols = next((v for v in shared if v is not rows and (v.hi + 1) % n == 0), None)
      if cols is not None and n > 1 and work // (n * (rows.hi + 1)) >= MIN_PARALLEL:
        return [(last, lanes), (cols, n), (rows, rows.hi + 1)]
  if small is None or big is None: return []
  if work // (4 * (small.hi + 1)) < MIN_PARALLEL: return []
  return [(last, lanes), (big, 4), (small, small.hi + 1)]


# a gathered tile (gathered_tile): at most this many rows (the column vector's gathered lanes serve each once), and at
# least this many work items (fewer than register_tile's MIN_PARALLEL: such a product is small, and a 256 x 32 output
# in 32 items of 16 x 16 ran 1.6x faster than in 64 of 8 x 16 on a 2-core Xeon)
GATHER_ROWS = 16
GATHER_MIN_ITEMS = 16


def gathered_tile(k: Kernel, caps: Caps) -> list:
  """[(rows, r), (cols, lanes)]: a register tile whose column vectors are gathered lane by lane, for a product whose
  operands are both contiguous along a reduction too short for a dot tile (dot_tile: 4 vectors) and strided along
  the outputs (`x @ w.T` with 32 input features, attention's q @ k^T over a head's 16 dims): a block of r rows x
  `tile_lanes` columns per work item, one accumulator vector per row, each reduction step one gathered column vector
  (one load per lane) and r broadcast row values. Reduction lanes instead folded a vector of 8 lanes per output (a
  horizontal sum for every 32 multiply-adds): [256, 32] @ [32, 96]^T 84 -> 27 us, q @ k^T with its causal mask 45 ->
  21-23 us on one core of a 2-core Xeon (AVX-512). The columns are the last output axis the lanes divide that some read moves along
  and another does not; the rows the last axis no read that moves along the columns moves along. [] where that
  does not apply."""
  reduces = _reduces(k)
  gvars = [a.var for a in k.of_kind(K.GLOBAL)]
  if not reduces or len(gvars) < 2 or k.of_kind(K.LOOP, K.LOCAL, K.UPCAST, K.UNROLL, K.GROUP_REDUCE): return []
  if any(isinstance(x, Reduce) for r in reduces for x in toposort([r.src]) if x is not r): return []
  lanes = tile_lanes(caps)
  if lanes not in caps.vector_widths or max(_extent(r.loops) for r in reduces) >= 4 * lanes: return []
  loads = _reduce_loads(reduces)
  if not loads or any(not isinstance(x, Load) for x in loads): return []
  deps = dependencies([st.value for st in k.stores])
  work = _extent(gvars)
  for col in reversed(gvars):
    if (col.hi + 1) % lanes or not _reused_without(col, reduces, deps): continue
    moving = [x for x in loads if col in deps[id(x)]]
    if not moving: continue
    along = set().union(*(deps[id(x)] for x in moving))
    row = next((v for v in reversed(gvars) if v not in along and _reused_without(v, reduces, deps)), None)
    if row is None: continue
    budget = min(GATHER_ROWS, accumulator_vectors(caps))
    r = next((r for r in range(budget, 1, -1) if (row.hi + 1) % r == 0 and work // (lanes * r) >= GATHER_MIN_ITEMS), 0)
    if r >= ROW_LANES: return [(row, r), (col, lanes)]
  return []


# a row read through the bounds of a concatenation's parts is expanded whole where it holds at most this many vectors
# the most pieces a concatenated axis is cut into (PIECES)
MAX_PIECES = 64


def _pieces(k: Kernel, caps: Caps) -> Kernel:
  """k with its innermost global axis, where conditions on it alone cut it into parts (a concatenation: the four gates'
  gradients of an LSTM into one [20, 800] tensor, each part's loads and selects guarded by `200 <= o < 400`), cut into
  PIECES at those parts' bounds (their greatest common divisor with the size, at most MAX_PIECES pieces): every
  copy's conditions are decided (passes.expand folds them), so it reads its own part with plain loads and computes
  no other part's terms. Guarded, each element computed every part's terms and selected one: the LSTM's [20, 800]
  gate gradients (four parts with an exp each) 350 -> 40 us a call (gcc vectorized none of the guarded loads; the
  vector pass takes no lanes under a condition on them). Not an outer axis: a [35, 20, 800] stack of 35 steps cut
  so writes 35 places per work item, 1.6x slower than its guarded loads (whose conditions are the same for a whole
  row). A padding (one range guards the axis: no parts to add up) is not cut into pieces shorter than a native
  vector (a padded map's 58 columns, cut at 1 and 57, into 58 of one): the axis keeps its vectors, its loads' guard
  their lanes' range (masked loads, passes._lane_range); cut, its rows took the lanes, loaded one by one (a 3x3
  convolution's padded [8, 64, 58, 58] input: 1.1 -> 0.45 ms). A concatenation is cut however short its pieces (each
  piece computes its own part's terms only)."""
  a = k.of_kind(K.GLOBAL)[-1]
  ranges = _ranges_on(k, a.var)
  cuts = {b for r in ranges or () for b in r if 0 < b < a.size}
  if not cuts or a.size // math.gcd(a.size, *cuts) > MAX_PIECES: return k
  if math.gcd(a.size, *cuts) < caps.native_lanes and len(ranges) == 1: return k
  try:
    return apply_opt(k, Opt(OptOp.PIECES, k.axis_index(a.var), a.size // math.gcd(a.size, *cuts)), caps)
  except OptError:
    return k


def _ranges_on(k: Kernel, var) -> set | None:
  """The distinct ranges over var that k's conditions hold (`lo <= var + c < hi` as (lo - c, hi - c): a concatenation's
  parts, a padding's one), or None where some condition reads var with anything else (a padded window: `1 <= h + kh
  < 57`)."""
  out = set()
  for cond in _conditions(k):
    for x, lo, hi in cond.parts:
      x = sym.lin(x)
      if var not in sym.variables(x): continue
      if x.terms != ((var, 1),): return None
      out.add((lo - x.const, hi - x.const))
  return out


def _conditions(k: Kernel) -> list:
  """Every validity condition of k: its stores', loads' and Valid values'."""
  out = []
  for st in k.stores:
    out.append(st.valid)
    for v in toposort([st.value]):
      if isinstance(v, (Load, Index)): out.append(v.valid)
      elif isinstance(v, Valid): out.append(v.cond)
  return out


def _row_vectors(k: Kernel, do) -> None:
  """An elementwise kernel in vectors whose work item is one vector of a row (its innermost axis in several vectors,
  with outer axes beside it) computes up to ROW_VECTORS of the row's vectors (UPCAST of the vectors' axis, the most
  that divide them): each item divides its flat index back into the axes (64-bit divisions, tens of cycles each) once
  for all of them. Kernels alone, inputs in cache, 2-vCPU Zen 4 (AVX-512): a 3x3 convolution's padded copy of [8, 64,
  56, 56] (rows of 4 vectors, the padding's lanes masked) 309 -> 97 us, the crop of [8, 64, 58, 58] to 56 x 56 (7
  vectors of 8) 289 -> 94 us, [1024, 768] * [768] 56 -> 50 us; a bias over [8, 64, 56, 56] unchanged."""
  gl = k.of_kind(K.GLOBAL)
  # (not a kernel cut into PIECES: its body is already one copy per piece, and an LSTM's gates measured the same)
  if len(gl) < 2 or len(k.of_kind(K.UPCAST)) != 1 or any(o.op is OptOp.PIECES for o in k.opts): return
  rows = gl[-1]   # the vectors of the innermost axis (the outer half of its split: it stays in place)
  if rows.size < 2: return
  n = max((d for d in range(2, ROW_VECTORS + 1) if rows.size % d == 0 and k.groups // d >= MIN_PARALLEL), default=0)
  if n: do(OptOp.UPCAST, rows.var, n)


def _in_vectors(k: Kernel, var, width: int, caps: Caps) -> Kernel | None:
  """k with axis var upcast by width, when expand would make its lanes vectors (passes.vector_axes), else None."""
  try:
    kv = apply_opt(k, Opt(OptOp.UPCAST, k.axis_index(var), width), caps)
  except OptError:
    return None
  new = {a.var for a in kv.axes if a.kind is K.UPCAST} - {a.var for a in k.axes if a.kind is K.UPCAST}
  kx = expand_pieces(kv)   # (what the vector pass sees: a concatenation's parts each its own copy)
  return kv if new & set(vector_axes(kx, caps, dependencies([st.value for st in kx.stores]))) else None


# ---- GPUs (caps.has_local and not prefers_blocking): work-groups -----------------------------------------------
# work items per work-group of an elementwise kernel, and of a reduction shared by a work-group
GROUP_SIZE = 256
# the fewest work items that share a kernel's reductions and output loops (the schedule keeps such a fused kernel
# only when its reductions' lengths have a power-of-two factor this large)
GROUP_MIN = 16
# a kernel whose reductions and output loops a work-group shares (softmax, layernorm) keeps each item's share of the
# row in registers, loaded once for every phase, when that share is at most this many values per reduction and per
# output loop; past it the values (and a softmax's exps beside them) would crowd the registers that let several
# groups share a multiprocessor (or spill), and it keeps one loop per phase. H100 through OpenCL, kernel times:
# softmax 8192x8192 (32 per item) 0.312 -> 0.222 ms, layernorm 0.210 -> 0.206; the second kernel of a 4096x16384
# softmax (its sum and outputs, 64 per item) 0.456 -> 0.349, of layernorm 0.422 -> 0.317; softmax 16384x4096
# 0.250 -> 0.202; layernorm of 4096 and rows of 2048 within noise (bench/README.md, GPU)
ROW_REGISTERS = 64
# a matmul's work-group: MM_LOCAL x MM_LOCAL work items, each a t x t register tile (columns in a vector), t the first
# of MM_TILES whose block divides the matrix (H100, f32 4096^3 through OpenCL: t=8 18.8 TFLOP/s, 4 13.0, 2 10.1)
MM_LOCAL, MM_TILES = 16, (8, 4)
# the reduction's tile a matmul's work-group copies to local memory per step (0: none; H100 f32 4096^3: 16 or 32
# 21.1-21.3 TFLOP/s, 8 19.4, none 19.5)
MM_STAGE = 16
# a matmul item's rows and columns in groups of this many neighbours (0: all t together)
MM_VECTOR = 4
# the staged tiles' next step loaded into registers while each step computes (OptOp.PREFETCH), into this many local
# buffers (2: one barrier per step, twice the local memory; where the device's local memory does not hold two, one);
# 0: none
MM_PREFETCH = 2


def _pow2_divisor(n: int, most: int, least: int = 1) -> int:
  """The largest power of two <= most dividing n, or 0 when it is below least."""
  d = 1
  while d * 2 <= most and n % (d * 2) == 0: d *= 2
  return d if d >= least else 0


# a GPU's elementwise kernel of at least this many elements computes four per work item even without vector values
# (where its loads step along the axis: a transposed read, 0.285 -> 0.332 ms with four, keeps one)
ELEMENTWISE_UPCAST_MIN = 1 << 20


def _reads_along(k: Kernel, var) -> bool:
  """Does every load of k step by 0 or 1 along var (neighbouring items read neighbouring elements)?"""
  from fusegrad.codegen.passes import _stride
  loads = [v for st in k.stores for v in toposort([st.value]) if isinstance(v, (Load, Gather))]
  return all(isinstance(x, Load) and _stride(x.idx, var) in (0, 1) for x in loads)


# a long reduction along contiguous memory (the first kernel of a split sum: 2^28 floats as 4096 parts of 65536; a
# row too long for ROW_REGISTERS) reads REDUCE_VECTOR neighbouring values per item and step, one vector load (a float4:
# 16 bytes in flight per load, four accumulator lanes folded before the work-group combines its items' partials);
# neighbouring items read neighbouring vectors. H100 through OpenCL, raw kernels of this shape, 2^28 floats in 4096
# groups of 256: 0.368 ms a scalar per item and step (one accumulator, 2.9 TB/s), 0.352-0.354 a float4 (3.05 TB/s;
# 2 or 4 float4 per step, groups of 512, 8192 parts: all within 2%; torch's sum kernel 0.384)
REDUCE_VECTOR = 4


def _vector_reads(k: Kernel, var) -> bool:
  """Does every read that moves along var step by 1 along it, unmasked along it (vector loads), and some read?"""
  from fusegrad.codegen.passes import _stride
  deps = dependencies([st.value for st in k.stores])
  moving = [x for st in k.stores for x in toposort([st.value]) if isinstance(x, (Load, Gather)) and var in deps[id(x)]]
  return bool(moving) and all(isinstance(x, Load) and _stride(x.idx, var) == 1 and var not in x.valid.variables()
                              for x in moving)


def _long_reduction(k: Kernel, caps: Caps, most: int) -> list | None:
  """The actions for a kernel whose one reduction runs along contiguous memory, longer than a work-group's items
  hold in registers (ROW_REGISTERS each) and with no output loops: UPCAST of REDUCE_VECTOR lanes (vector loads) then
  GROUP of the rest across the work-group, the lanes innermost (neighbouring items, neighbouring vectors); None
  where that does not apply (other reductions keep the rules after it)."""
  reduces = _reduces(k)
  if len(reduces) != 1 or not reduces[0].loops or k.of_kind(K.LOOP): return None
  last = reduces[0].loops[-1]
  n = last.hi + 1
  g = _pow2_divisor(n // REDUCE_VECTOR if n % REDUCE_VECTOR == 0 else 1, most, GROUP_MIN)
  if not g or n // g <= ROW_REGISTERS or not _vector_reads(k, last): return None
  kv = _in_vectors(k, last, REDUCE_VECTOR, caps)
  if kv is None: return None
  try:
    kg = apply_opt(kv, Opt(OptOp.GROUP, k.axis_index(last), g), caps)   # the outer part kept the axis's place
  except OptError:
    return None
  return list(kg.opts[len(k.opts):])


def _work_groups(k: Kernel, caps: Caps) -> list:
  """A GPU's defaults: neighbouring work items read neighbouring elements (coalesced), a reduction is shared by a
  work-group through local memory, a matmul computes register tiles in 16 x 16 work-groups."""
  opts: list = []
  def do(op, var, arg):
    """The action applied if legal: the variable of the axis's outer part (a split keeps it in place), else None."""
    nonlocal k
    i = k.axis_index(var)
    try:
      k = apply_opt(k, Opt(op, i, arg), caps)
    except OptError:
      return None
    opts.append(k.opts[-1])
    return k.axes[i].var
  def last_global():
    g = k.of_kind(K.GLOBAL)
    return g[-1].var if g else None
  most = min(caps.max_local, GROUP_SIZE)
  reduces = _reduces(k)
  tile = register_tile(k) if reduces else []
  if len(tile) >= 2:   # a matmul: rows x columns of register tiles, the columns' work items fastest
    rows, cols = tile[0][0], tile[-1][0] if tile[-1][0] is not None else tile[-2][0]
    t = next((t for t in MM_TILES if (rows.hi + 1) % (MM_LOCAL * t) == 0 and (cols.hi + 1) % (MM_LOCAL * t) == 0), 0)
    if t:
      # each item's t rows and columns as t / MM_VECTOR groups of MM_VECTOR neighbours, the groups MM_LOCAL * MM_VECTOR
      # apart: the columns a work-group's 16 items read at one step of the reduction are one contiguous run of its
      # local tile, read MM_VECTOR at a time without bank conflicts (passes.stage lays such a tile out in memory order)
      v = MM_VECTOR if MM_VECTOR and t % MM_VECTOR == 0 and t > MM_VECTOR else t
      co, ro = do(OptOp.UPCAST, cols, v), do(OptOp.UPCAST, rows, v)
      if co is not None and ro is not None:
        ro, co = do(OptOp.LOCAL, ro, MM_LOCAL), do(OptOp.LOCAL, co, MM_LOCAL)
        if v < t and ro is not None and co is not None:
          do(OptOp.UPCAST, co, t // v)
          do(OptOp.UPCAST, ro, t // v)
        # the group's rows and columns of the operands through local memory, a tile of the reduction at a time
        red = next((a.var for a in k.of_kind(K.REDUCE) if MM_STAGE and a.size % MM_STAGE == 0), None)
        if red is not None and do(OptOp.STAGE, red, MM_STAGE) is not None and MM_PREFETCH:
          # the next tile's global loads in flight while the step computes on its own (software pipelining)
          staged = k.of_kind(K.STAGE)[0].var
          if do(OptOp.PREFETCH, staged, MM_PREFETCH) is None and MM_PREFETCH > 1: do(OptOp.PREFETCH, staged, 1)
      return opts
  if reduces and (lr := _long_reduction(k, caps, most)) is not None: return lr
  if reduces and all(r.loops for r in reduces):
    # every reduction shared by the work-group, and the output loops after them (softmax, layernorm: one group per
    # row, the row read by neighbouring items, its statistics through local memory, its outputs by every item)
    loops = [a.var for a in k.of_kind(K.LOOP)]
    g = most
    for n in [r.loops[-1].hi + 1 for r in reduces] + [v.hi + 1 for v in loops]: g = _pow2_divisor(n, g)
    if g >= GROUP_MIN:
      k0, n0 = k, len(opts)
      if all(do(OptOp.GROUP, r.loops[-1], g) is not None for r in reduces) and \
         all(do(OptOp.LOCAL, v, g) is not None for v in loops):
        # each item's share of the row in registers: what is left of every reduction's loops (UNROLL, in order) and
        # of the output loops (UPCAST) becomes straight-line code at the same indices in every phase, so each element
        # is loaded once (passes.dedupe merges the phases' loads, and the exp of a softmax) and kept across the
        # group's barriers, instead of a loop per phase reading the row again (softmax: three reads, layernorm three)
        rest = [a for a in k.axes if a.kind in (K.REDUCE, K.LOOP) and a.size > 1]
        per = [_extent([a.var for a in rest if a.kind is K.LOOP])] + \
            [_extent([x for x in r.loops if k.axes[k.axis_index(x)].kind is K.REDUCE]) for r in _reduces(k)]
        if rest and max(per) <= ROW_REGISTERS:
          k1, n1 = k, len(opts)
          if not all(do(OptOp.UNROLL if a.kind is K.REDUCE else OptOp.UPCAST, a.var, a.size) is not None for a in rest):
            k, opts[n1:] = k1, []
        return opts
      k, opts[n0:] = k0, []
    if len(reduces) == 1:   # the reduction alone (its outputs' loops run in every item, the first stores)
      g = _pow2_divisor(reduces[0].loops[-1].hi + 1, most, GROUP_MIN)
      if g and do(OptOp.GROUP, reduces[0].loops[-1], g) is not None: return opts
  g = last_global()
  if g is None: return opts
  if not reduces and (g.hi + 1) % 4 == 0 and (g.hi + 1) // 4 >= most:
    # elementwise: 4 neighbouring elements per work item, a vector where every value is a vector op, else four
    # scalar copies in a big kernel (more loads in flight per item: relu(sqrt(exp(x)*2+1)*x) over 2^28 on an H100,
    # 0.99 -> 0.73 ms, 2.2 -> 2.9 TB/s)
    kv = _in_vectors(k, g, 4, caps)
    if kv is not None:
      k = kv
      opts.append(kv.opts[-1])
    elif k.groups >= ELEMENTWISE_UPCAST_MIN and _reads_along(k, g): do(OptOp.UPCAST, g, 4)
    g = last_global()
  n = _pow2_divisor(g.hi + 1, most, 32)
  if n: do(OptOp.LOCAL, g, n)
  return opts


# ---- tensor cores (caps.tensor_cores) ---------------------------------------------------------------------------
# the multiplicands the heuristic puts on a tensor core: 16-bit floats, which it multiplies exactly (a tf32 core
# would round float32 inputs to 10 mantissa bits: only where asked, as PyTorch's float32 matmuls do not by default)
TC_INPUTS = frozenset({"float16", "bfloat16"})


def tensor_core(k: Kernel, caps: Caps) -> list:
  """PADTO where an axis is no multiple of the tile (PADTO refuses to more than double one), then TC on the first
  tensor core of caps that multiplies the kernel's 16-bit matmul, K the innermost of its reduction's axes that fits;
  [] when none applies; then each warp a block of tiles (_warp_tile). Several warps per work-group sharing operands
  through local memory are not done yet."""
  reds = _reduces(k)
  if len(reds) != 1: return []
  for j, tc in enumerate(caps.tensor_cores):
    if tc.dtype_in.name not in TC_INPUTS: continue
    for kvar in reversed(reds[0].loops):
      mn = tc_axes(k, k.axes[k.axis_index(kvar)], tc)
      if isinstance(mn, str): continue
      kk, opts, ki = k, [], k.axis_index(kvar)
      try:
        for x, size in zip(mn + (k.axes[ki],), tc.dims):   # a PADTO keeps its axis's place
          if x.size % size:
            opts.append(Opt(OptOp.PADTO, kk.axis_index(x.var), size))
            kk = apply_opt(kk, opts[-1], caps)
        opts.append(Opt(OptOp.TC, ki, j))
        kk = apply_opt(kk, opts[-1], caps)
      except OptError:
        continue
      return opts + _warp_tile(kk, caps)
  return []


# a warp's tile of tensor-core tiles (N tiles, M tiles), most first: a 4 x 8 tile of m16n8k16 (64 x 64 outputs) reads
# each A fragment for 8 multiplies and each B fragment for 4 (bf16 4096^3 on an H100 through OPENCL: 12 TFLOP/s with
# one tile per warp, 56 with 2 x 8, 62 with 4 x 8; no local-memory staging yet)
WARP_TILES = ((8, 4), (8, 2), (4, 2), (4, 1), (2, 1))
# ...keeping at least this many warps (a GPU's multiprocessors times a few)
TC_MIN_WARPS = 512


def _warp_tile(k: Kernel, caps: Caps) -> list:
  """UPCASTs of the outer parts of a tensor core's N and M axes (each the GLOBAL axis just before its TC_N / TC_M
  part), the largest of WARP_TILES that divides them and leaves TC_MIN_WARPS warps."""
  def outer(kind) -> int:
    i = next(i for i, a in enumerate(k.axes) if a.kind is kind)
    return i - 1 if i and k.axes[i - 1].kind is K.GLOBAL else -1
  mi, ni = outer(K.TC_M), outer(K.TC_N)
  if mi < 0 or ni < 0: return []
  for un, um in WARP_TILES:
    if k.axes[ni].size % un or k.axes[mi].size % um or k.groups // (un * um) < TC_MIN_WARPS: continue
    opts, kk = [Opt(OptOp.UPCAST, ni, un)], k
    if um > 1: opts.append(Opt(OptOp.UPCAST, mi + (ni < mi), um))   # (an upcast before it moves it one place)
    try:
      for o in opts: kk = apply_opt(kk, o, caps)
    except OptError:
      continue
    return opts
  return []
