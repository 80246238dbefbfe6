"""BEAM search: choose a kernel's actions by timing them on the device instead of by rule.

    FUSEGRAD_BEAM=4 python train.py            # every new kernel is searched (or its result read from disk)
    with fusegrad.beam(4): y = (a @ b).numpy()  # the same for the kernels first compiled inside the block
    opts = beam_search(kernel, fusegrad.runtime.device.get("CPU"), 4)   # one canonical Kernel, directly

The search starts from two candidates, no actions and the heuristic's (codegen/opt/heuristic.py). Each round
extends every entry of the beam by every single action that applies (`candidate_actions`), drops duplicates
(the same rendered source), compiles what is left (CPU: on all cores at once) and times each on random inputs
(min of a few runs, the device synchronized). The `width` fastest form the next beam; the search stops when a
round beats the best so far by less than 1%, after MAX_ROUNDS rounds, MAX_CANDIDATES candidates, or when the
time budget (FUSEGRAD_BEAM_BUDGET seconds per kernel) is spent, and returns the fastest actions it timed.

Every candidate's first run is checked against the unoptimized kernel (opts=()) on the same inputs: equal
integers, floats within reassociation tolerance. One that differs, or fails to compile or run, is dropped and
never chosen, so a wrong action costs time, not results.

Results are kept on disk (runtime/cache.py, Store "beam": authenticated like compiled programs) under the
canonical kernel's rendered source, the device's identity (for CPU the C compiler, its version, flags and the
host CPU; for OPENCL the platform, device and driver), its caps, the heuristic's actions and the width; the value
is the actions as JSON. An entry that does not parse, or whose actions no longer apply (OptError), is ignored and
the kernel searched again.
"""
from __future__ import annotations
import contextlib
import json
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FuturesTimeout
import numpy as np
from fusegrad import config, dtype as dt
from fusegrad.codegen.ir import Kernel, AxisKind
from fusegrad.codegen.opt.actions import Opt, OptOp, OptError, apply_opt, apply_opts
from fusegrad.codegen.opt import heuristic
from fusegrad.runtime import cache

K = AxisKind
SEARCH_VERSION = "beam-1"   # part of every disk key: a change of what a result means starts afresh
MAX_ROUNDS = 8              # actions added at most (one per round)
MAX_CANDIDATES = 1000       # candidates timed per kernel at most
RUNS = 3                    # timed runs per candidate (the minimum counts); a slow one stops after the first
IMPROVE = 0.99              # a round that is not 1% faster than the best so far ends the search
UPCAST_AMOUNTS = (2, 3, 4, 8, 16)
UNROLL_AMOUNTS = (2, 3, 4, 8)
LOCAL_AMOUNTS = (2, 4, 8, 16, 32, 64, 128, 256)
GROUP_AMOUNTS = (8, 16, 32, 64, 128, 256)
STAGE_AMOUNTS = (8, 16, 32)
PAD_MULTIPLES = (4, 8, 16, 32)
# devices whose compiler runs outside the interpreter (a subprocess): candidates compile on all cores at once
PARALLEL_COMPILE = frozenset({"CPU"})
# float outputs may differ by reassociation: |x - ref| <= rtol * (|ref| + max|ref|)
RTOL = {dt.float64: 1e-8, dt.float32: 1e-4, dt.float16: 1e-2, dt.bfloat16: 3e-2}

store = cache.Store("beam")
stats = {"searches": 0, "timed": 0, "disk_hits": 0, "rejected": 0}   # counters the tests read
_memo: dict = {}                 # disk key -> opts found in this process
_search_lock = threading.Lock()  # one search at a time: two would disturb each other's timings


# ---- the switch: FUSEGRAD_BEAM or fusegrad.beam(n) ----

def width() -> int:
  """The beam width Device.compiled searches with now (0: the heuristic)."""
  return config.BEAM


@contextlib.contextmanager
def beam(n: int):
  """Search the kernels first compiled inside the block with beam width n (0: the heuristic). Process-wide, like
  FUSEGRAD_BEAM: another thread compiling meanwhile searches too."""
  if not isinstance(n, int) or isinstance(n, bool) or n < 0:
    raise ValueError(f"fusegrad.beam: the width must be an integer >= 0, got {n!r}")
  old, config.BEAM = config.BEAM, n
  try:
    yield
  finally:
    config.BEAM = old


# ---- candidates ----

def candidate_actions(k: Kernel, caps) -> list:
  """Every single action the search tries on k (each legal: apply_opt accepted it)."""
  out = []
  def add(o):
    try: apply_opt(k, o, caps)
    except OptError: return
    out.append(o)
  for i, a in enumerate(k.axes):
    if a.kind in (K.GLOBAL, K.LOOP, K.REDUCE):
      for n in UPCAST_AMOUNTS: add(Opt(OptOp.UPCAST, i, n))
    if a.kind is K.REDUCE:
      for n in UNROLL_AMOUNTS: add(Opt(OptOp.UNROLL, i, n))
    if caps.has_local and a.kind in (K.GLOBAL, K.LOOP):
      for n in LOCAL_AMOUNTS: add(Opt(OptOp.LOCAL, i, n))
    if a.kind is K.REDUCE:   # each tensor core the device has (codegen/opt/tc.py), this axis its K
      for j in range(len(caps.tensor_cores)): add(Opt(OptOp.TC, i, j))
    if caps.has_local and a.kind is K.REDUCE:
      for n in GROUP_AMOUNTS: add(Opt(OptOp.GROUP, i, n))
      for n in STAGE_AMOUNTS: add(Opt(OptOp.STAGE, i, n))
    if a.kind is K.STAGE:   # the staged tiles prefetched through registers, into one local buffer or two
      for n in (1, 2): add(Opt(OptOp.PREFETCH, i, n))
    if a.kind is K.GLOBAL and not caps.has_local: add(Opt(OptOp.LOOP, i, a.size))
    for j in range(i + 1, len(k.axes)):
      if k.axes[j].kind is a.kind: add(Opt(OptOp.SWAP, i, j))
    # padding pays only where it lets an amount divide the axis
    if a.kind in (K.GLOBAL, K.LOOP, K.REDUCE):
      for m in PAD_MULTIPLES:
        if a.size % m and a.size > m: add(Opt(OptOp.PADTO, i, m))
  return out


# ---- inputs, runs, checks ----

def _random(rng: np.random.Generator, d: dt.DType, n: int) -> np.ndarray:
  if d.is_bool: return rng.random(n) < 0.5
  if d.is_int: return rng.integers(0 if d.is_unsigned else -100, 100, n).astype(d.np)
  x = rng.standard_normal(n).astype(np.float32)
  if d == dt.bfloat16:
    from fusegrad.runtime.python import _bf16_round
    return _bf16_round(x)
  return x.astype(d.np)


class _Bench:
  """Random inputs on the device, zeroed outputs, and the unoptimized kernel's outputs to check against."""
  def __init__(self, kernel: Kernel, dev, seed: int = 0):
    from fusegrad.runtime.device import Buffer
    rng = np.random.default_rng(seed)
    self.dev, self.kernel = dev, kernel
    self.bufs = [Buffer(dev, b.size, b.dtype) for b in kernel.bufs]
    for b, arg in zip(self.bufs, kernel.bufs):
      if not arg.output and b.size: b.copyin(_random(rng, arg.dtype, b.size))
    self.handles = [b.handle for b in self.bufs]
    if kernel.params:   # the values the kernel was lowered with (an index argument must keep reads in bounds)
      self.handles += dev.param_handles(kernel, list(kernel.example) or [1.5 if d.is_float else 17 for d in kernel.params])
    c = dev.compile_with(kernel, ())
    self.ref = self.outputs(c.program, c.kernel)

  def outputs(self, program, k) -> list:
    """The outputs of one run from zeroed buffers."""
    for b, arg in zip(self.bufs, self.kernel.bufs):
      if arg.output and b.size: b.copyin(np.zeros(b.size, dtype=b.dtype.np))
    self.dev.launch(program, k, self.handles)
    self.dev.synchronize()
    return [b.numpy() for b, arg in zip(self.bufs, self.kernel.bufs) if arg.output]

  def time(self, program, k, runs: int, best: float) -> float:
    t = math.inf
    for i in range(runs):
      t0 = time.perf_counter()
      self.dev.launch(program, k, self.handles)
      self.dev.synchronize()
      t = min(t, time.perf_counter() - t0)
      if t > 3 * best: break   # far slower than the best: more runs cannot make it win
    stats["timed"] += 1
    return t


def matches(got: list, ref: list, kernel: Kernel) -> bool:
  """Do a candidate's outputs equal the reference's (integers and bools exactly, floats within reassociation)?"""
  outs = [b for b in kernel.bufs if b.output]
  for g, r, arg in zip(got, ref, outs):
    if g.shape != r.shape: return False
    if not arg.dtype.is_float:
      if not np.array_equal(g, r): return False
      continue
    if arg.dtype == dt.bfloat16:   # held as raw bits
      from fusegrad.runtime.python import _bf16_to_f32
      g, r = _bf16_to_f32(g), _bf16_to_f32(r)
    g64, r64 = g.astype(np.float64), r.astype(np.float64)
    if not np.array_equal(np.isnan(g64), np.isnan(r64)): return False
    fin = np.isfinite(r64)
    if not np.array_equal(g64[~fin & ~np.isnan(r64)], r64[~fin & ~np.isnan(r64)]): return False
    if not np.all(np.isfinite(g64[fin])): return False
    scale = float(np.max(np.abs(r64[fin]))) if fin.any() else 0.0
    tol = RTOL.get(arg.dtype, 1e-4)
    if np.any(np.abs(g64[fin] - r64[fin]) > tol * (np.abs(r64[fin]) + scale)): return False
  return True


# ---- the search ----

def beam_search(kernel: Kernel, dev, beam_width: int = 4, *, budget_s: float | None = None,
                max_rounds: int | None = None, max_candidates: int | None = None, runs: int = RUNS,
                progress: bool | None = None) -> tuple:
  """The fastest actions found for the canonical kernel on dev (see the module docstring). budget_s bounds the
  search's time (default FUSEGRAD_BEAM_BUDGET), max_rounds the actions added (MAX_ROUNDS), max_candidates the
  candidates timed (MAX_CANDIDATES); progress: a tqdm bar (None: when stderr is a terminal)."""
  if beam_width < 1: raise ValueError(f"beam_search: beam_width must be >= 1, got {beam_width}")
  from tqdm import tqdm
  budget = config.BEAM_BUDGET if budget_s is None else budget_s
  max_rounds = MAX_ROUNDS if max_rounds is None else max_rounds
  max_candidates = MAX_CANDIDATES if max_candidates is None else max_candidates
  deadline = time.perf_counter() + budget
  caps = dev.caps
  if any(b.size == 0 for b in kernel.bufs if b.output): return ()
  with _search_lock:
    stats["searches"] += 1
    try:
      bench = _Bench(kernel, dev)
    except Exception:   # the unoptimized kernel does not run here: keep the heuristic's (its compile says why)
      return tuple(heuristic.hand_coded(kernel, caps))
    seen: set = set()
    timed = 0
    workers = (os.cpu_count() or 1) if dev.name in PARALLEL_COMPILE else 1
    pool = ThreadPoolExecutor(workers, thread_name_prefix="fusegrad-beam")
    disable = (not sys.stderr.isatty()) if progress is None else not progress

    def evaluate(seqs: list, desc: str, best: float) -> list:
      """[(time, opts, optimized kernel)] of the sequences that compile, run and match, fastest first."""
      nonlocal timed
      todo = []
      for opts in seqs:
        if timed + len(todo) >= max_candidates or time.perf_counter() > deadline: break
        try:
          c = dev._prepare(kernel, opts)
        except OptError:
          continue
        except Exception:   # a pass or renderer that cannot handle this combination: not a candidate
          stats["rejected"] += 1
          continue
        if c.source in seen: continue
        seen.add(c.source)
        todo.append(c)
      timed += len(todo)
      def build(c):
        if c.program is not None or time.perf_counter() > deadline: return c.program
        try:
          return dev.compile(c.kernel.name, c.source)
        except Exception:
          return None
      out = []
      # compiled a chunk at a time (on all cores where the compiler is a subprocess), then timed with nothing
      # else running: a budget spent mid-round loses at most one chunk's compiles. A compile still running when
      # the budget is spent is left behind (its thread finishes it unseen): a compiler can take minutes on an
      # unlucky candidate (PoCL took 45 s on one heavily unrolled matmul)
      step = 2 * workers if workers > 1 else 1
      with tqdm(total=len(todo), desc=desc, leave=False, disable=disable) as bar:
        for lo in range(0, len(todo), step):
          chunk = todo[lo:lo + step]
          futures = [pool.submit(build, c) for c in chunk]
          programs = []
          for f in futures:
            try:
              programs.append(f.result(timeout=max(deadline - time.perf_counter(), 0.0)))
            except FuturesTimeout:
              programs.append(None)
          for c, program in zip(chunk, programs):
            bar.update(1)
            if program is None or time.perf_counter() > deadline: continue
            try:
              # a first run checks the result (and pays for a driver's lazy build), then the timed runs
              if not matches(bench.outputs(program, c.kernel), bench.ref, kernel):
                stats["rejected"] += 1
                continue
              t = bench.time(program, c.kernel, runs, min([best] + [x[0] for x in out]))
            except Exception:
              stats["rejected"] += 1
              continue
            out.append((t, c.opts, c.kernel))
      out.sort(key=lambda x: x[0])
      return out

    try:
      start = [()]
      hand = tuple(heuristic.hand_coded(kernel, caps))
      if hand: start.append(hand)
      beam_ = evaluate(start, f"beam {kernel.name} start", math.inf)
      if not beam_: return ()   # not even the unoptimized kernel runs here: nothing to choose
      best_t, best_opts = beam_[0][0], beam_[0][1]
      beam_ = beam_[:beam_width]
      for r in range(max_rounds):
        if timed >= max_candidates or time.perf_counter() > deadline: break
        seqs = [opts + (o,) for _t, opts, _k in beam_ for o in candidate_actions(apply_opts(kernel, opts, caps), caps)]
        found = evaluate(seqs, f"beam {kernel.name} round {r + 1}", best_t)
        if not found: break
        beam_ = found[:beam_width]
        if found[0][0] >= best_t * IMPROVE:
          if found[0][0] < best_t: best_t, best_opts = found[0][0], found[0][1]
          break
        best_t, best_opts = found[0][0], found[0][1]
    finally:
      pool.shutdown(wait=False, cancel_futures=True)
    if config.DEBUG >= 1:
      print(f"fusegrad: beam {kernel.name} on {dev.name}: {list(best_opts)} {best_t * 1e6:.1f} us ({timed} candidates)")
    return tuple(best_opts)


# ---- the disk cache ----

def device_identity(dev) -> str:
  """What a timing belongs to: the device and the compiler that builds its code."""
  if dev.name == "CPU":
    from fusegrad.runtime import cpu
    cc, ver = cpu.find_compiler()
    return "|".join(["CPU", cc, ver, " ".join(cpu.compiler_flags()), cpu._host_id(), str(getattr(dev, "threads", ""))])
  if hasattr(dev, "_id"): return f"{dev.name}|{dev._id}"
  return f"{dev.name}|{type(dev).__module__}.{type(dev).__qualname__}|numpy {np.__version__}"


def cache_key(kernel: Kernel, dev, beam_width: int) -> str:
  """The disk key of a search: also the device's caps and the heuristic's choice, which seeds the search (a result
  found before either changed could be slower than today's heuristic: a CPU's new tile caps left a 1024^3 matmul's
  BEAM result 8% slower than the default)."""
  return cache.key_of(SEARCH_VERSION, dev._prepare(kernel, ()).source, device_identity(dev), str(beam_width),
                      repr(dev.caps), encode(heuristic.hand_coded(kernel, dev.caps)).decode())


def encode(opts) -> bytes:
  return json.dumps({"opts": [[o.op.name, o.axis, o.arg] for o in opts]}).encode()


def decode(payload: bytes):
  """The actions of a cache entry, or None when it is not one."""
  try:
    d = json.loads(payload.decode())
    opts = tuple(Opt(OptOp[op], axis, arg) for op, axis, arg in d["opts"])
  except (ValueError, UnicodeDecodeError, RecursionError, KeyError, TypeError):
    return None
  if not all(type(o.axis) is int and type(o.arg) is int for o in opts): return None
  return opts


def searched_opts(kernel: Kernel, dev, beam_width: int) -> tuple:
  """kernel's actions for dev from this process's results, else the disk cache, else a search (then stored)."""
  key = cache_key(kernel, dev, beam_width)
  opts = _memo.get(key)
  if opts is not None: return opts
  payload = store.get(key)
  if payload is not None:
    opts = decode(payload)
    if opts is not None:
      try:
        apply_opts(kernel, opts, dev.caps)
        stats["disk_hits"] += 1
        _memo[key] = opts
        return opts
      except OptError:
        pass   # written by an older fusegrad whose actions meant something else: search again
  opts = beam_search(kernel, dev, beam_width)
  store.put(key, encode(opts))
  _memo[key] = opts
  return opts


def forget() -> None:
  """Drop this process's remembered results (tests: the next lookup goes to the disk cache)."""
  _memo.clear()
