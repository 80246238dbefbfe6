"""Realize: schedule the graph behind some nodes, then compile and run each kernel in order.

Several threads may realize at once, the same nodes too: scheduling and setting a node's result hold
schedule.lock (so a schedule sees the graph in one state), compiling and launching do not. A node two
threads compute at once is computed twice; the first result stored is kept (the values are equal).

Eager steps repeat: a training loop builds a graph of the same structure every iteration (same ops, shapes,
dtypes, constants, views, and the same inputs realized — only the buffers differ). The schedule cache finds
such a graph by its structure; the first run of a cached schedule also records a `Plan` (each kernel's compiled
program and where its buffers come from), and every later realize of that structure replays the plan: fresh
output buffers, the kernels launched in device batches as fusegrad.jit's replay does, the results stored on the
nodes. Whatever differs (a shape, a constant, an input realized or not) is a different structure, scheduled
afresh. The slow path still runs while a jit capture records or a tracker times kernels.
"""
from __future__ import annotations
import contextlib
import time
import weakref
from fusegrad import config
from fusegrad.graph import node as gn
from fusegrad.graph.node import Node
from fusegrad.graph.dims import storage_numel
from fusegrad.runtime import device as rd
from fusegrad.schedule import schedule as sched
from fusegrad.codegen.lower import Fixed
from fusegrad.engine import track, jit, trace

# replay cached schedules' plans (FUSEGRAD_EAGER_REPLAY=0 turns it off; `no_replay()` for a block)
REPLAY = config.EAGER_REPLAY


@contextlib.contextmanager
def no_replay():
  """Realize through the step-by-step path inside the block (benchmarks and tests compare the two)."""
  global REPLAY
  old, REPLAY = REPLAY, False
  try:
    yield
  finally:
    REPLAY = old


# tensors to realize with the next realize (`later`): id -> weak reference
_later: dict = {}


def later(*tensors) -> None:
  """Compute these tensors' pending values with the next realize, whatever it realizes: a module's buffers that a
  forward pass writes lazily (BatchNorm's running statistics) are computed in the training step's one schedule
  (the optimizer's realize), with the kernels that compute what they read, instead of at the next forward in a
  realize of their own, which would keep the last step's graph alive until then."""
  for t in tensors: _later[id(t)] = weakref.ref(t)


def _pending() -> list[Node]:
  """The unrealized nodes of the tensors `later` was given (then forgotten)."""
  out = []
  for r in list(_later.values()):
    t = r()
    if t is not None and t.node.buffer is None and t.node.op not in ("BUFFER", "CONST"): out.append(t.node)
  _later.clear()
  return out


def realize(*nodes: Node) -> None:
  if trace._seg[0] is not None and trace.on_realize(nodes=nodes): return
  realize_nodes(nodes)


def realize_nodes(nodes) -> tuple:
  """Realize nodes (and realize.later's); (the schedule's cache entry or None, the walk's nodes)."""
  fast = REPLAY and jit.recorder() is None and not track.wants_timing()
  if _later: nodes = tuple(nodes) + tuple(n for n in _pending() if not any(n is m for m in nodes))
  with sched.lock:
    items, entry, walked = sched.schedule(list(nodes))
    plan = entry.plan if entry is not None else None
    if items is None and not fast: items = entry.items(walked)
  if items is None:
    plan.run(walked)
    return entry, walked
  compiled = []
  for item in items:
    out = item.outputs[0]
    dev = rd.get(out.device)
    if item.kind == "KERNEL":
      compiled.append((dev, _run_kernel(item, dev)))
      continue
    compiled.append((dev, None))
    if item.kind == "EMPTY":
      buf = rd.Buffer(dev, 0, out.dtype)
    elif item.kind == "COPY":
      src = item.inputs[0].buffer
      buf = rd.Buffer(dev, storage_numel(out.shape), out.dtype)
      if out.numel: buf.copyin(src.numpy())
      track.record_copy()
      if (rec := jit.recorder()) is not None: rec.copy(src, buf)
    _set_result(out, buf)
  if entry is not None and plan is None and all(it.kind != "COPY" for it in items):
    with sched.lock:
      if entry.plan is None: entry.plan = Plan(entry.entries, compiled, walked)
  return entry, walked


def _run_kernel(item, dev):
  k = item.kernel
  for b in k.bufs:
    if b.dtype not in dev.supported:
      raise RuntimeError(f"device {dev.name} cannot run dtype {b.dtype.name}")
  bufs = [rd.Buffer(dev, storage_numel(o.shape), o.dtype) for o in item.outputs]
  c = None
  if item.outputs[0].numel:
    c = dev.compiled(k)
    everything = bufs + [i.buffer for i in item.inputs]
    params = dev.param_handles(k, item.param_values()) if k.params else []
    launch(dev, c.program, c.kernel, c.source, [b.handle for b in everything] + params)
    if (rec := jit.recorder()) is not None:
      if any(a.end is not None for a in k.axes): rec.runtime_size(k.name)
      rec.kernel(dev, c.program, c.kernel, c.source, everything, len(bufs), params)
  for o, b in zip(item.outputs, bufs): _set_result(o, b)
  return c


def _set_result(n: Node, buf) -> None:
  """n is computed into buf: it stands for n now (unless another thread stored n's value first)."""
  with sched.lock:
    if n.buffer is None: n.buffer = buf
    gn.forget(n)


class Plan:
  """A cached schedule made ready to replay: per item its device, kernel (None: nothing to launch),
  the outputs to allocate (walk position, elements, dtype), its inputs, each a walk position (a node realized
  before this realize) or ~i (the i-th buffer this plan allocates, made by an earlier item), and how to find the
  values of its Params: a walk position (a constant's value, a view's offset), (position, axis) (a runtime size),
  or a Fixed value (the kernel's own, or one a rewrite made). Each step also keeps the compiled kernel it launched
  last, used while the device still keeps that program (Device.current)."""
  __slots__ = ("steps",)

  def __init__(self, entries: list, compiled: list, nodes: list[Node]):
    made: dict[int, int] = {}
    self.steps = []
    for (kind, outs, ins, k, _why, params), (dev, c) in zip(entries, compiled):
      refs = tuple(~made[i] if i in made else i for i in ins)
      specs = []
      for i in outs:
        made[i] = len(made)
        specs.append((i, storage_numel(nodes[i].shape), nodes[i].dtype))
      vals = tuple(Fixed(k.example[j]) if p is None else p if type(p) is Fixed else (p[1], p[2]) if type(p) is tuple
                   else p for j, p in enumerate(params))
      # the schedule's kernel, not its compiled program: the device's LRU of programs stays the one bound on
      # compiled code, and an evicted program is compiled again
      self.steps.append((dev, None if c is None else k, tuple(specs), refs, vals, [None, None]))

  def run(self, nodes: list[Node]) -> None:
    made = self.launch(nodes)
    with sched.lock:
      j = 0
      for _dev, _prog, outs, _refs, _vals, _last in self.steps:
        for i, _size, _dtype in outs:
          n = nodes[i]
          if n.buffer is None: n.buffer = made[j]
          n.src = ()
          j += 1

  def launch(self, nodes: list) -> list:
    """Launch the plan with its inputs (and the nodes its Params read) at their walk positions in nodes; the
    buffers it made, in the order of the steps' outputs."""
    made: list = []
    batch: list = []
    blocks: list = []     # (handles, Param dtypes, values) whose argument block is still to make
    bdev = None
    new = rd.Buffer
    width = config.BEAM

    def flush():
      if blocks:
        for (handles, _d, _v), blk in zip(blocks, rd.param_blocks([(d, v) for _h, d, v in blocks])):
          handles.append(blk)
        blocks.clear()
      bdev.launch_batch(batch)

    for dev, k, outs, refs, vals, last in self.steps:
      bufs = [new(dev, size, dtype) for _i, size, dtype in outs]
      made.extend(bufs)
      if k is None: continue
      c = last[0]
      if c is None or last[1] != width or not dev.current(c):
        c = last[0] = dev.compiled(k)
        last[1] = width
      handles = [b.handle for b in bufs]
      handles += [(made[~i] if i < 0 else nodes[i].buffer).handle for i in refs]
      if dev is not bdev:
        if batch: flush()
        batch, bdev = [], dev
      if vals:
        values = []
        for p in vals:
          t = type(p)
          if t is int:
            n = nodes[p]
            values.append(n.arg.offset if n.op == "VIEW" else n.arg)
          elif t is tuple: values.append(int(nodes[p[0]].shape[p[1]]))
          else: values.append(p.value)
        if dev.block_params: blocks.append((handles, k.params, values))
        else: handles += dev.param_handles(k, values)
      batch.append((c.program, c.kernel, handles))
    if batch: flush()
    sched.stats["replays"] += 1
    return made


  def prepare(self, nodes: list, inputs: list, handed: set) -> "Prepared":
    """This plan made ready for replays that read their inputs at the walk positions `inputs` and find the
    values its Params read in nodes, fixed (a checked trace's stands); handed: the outputs (indices in the steps'
    order) a replay hands out."""
    return Prepared(self, nodes, inputs, handed)


# the most bytes of intermediates a Prepared plan keeps in buffers of its own (more: each replay allocates them)
OWN_BYTES = 64 << 20


class Prepared:
  """A Plan made ready for a checked trace's replays (engine/trace.py): each device batch's launch arrays are
  made once (Device.prepare_batch), with its Params' values, which a trace fixes; the outputs no replay hands out
  (the step's intermediates) are buffers of its own, allocated once (up to OWN_BYTES in all), as a fusegrad.jit
  capture's are; a replay allocates the outputs it hands out and patches their and its inputs' addresses in."""
  __slots__ = ("width", "batches", "outs", "n_in", "gen")

  def __init__(self, plan: Plan, nodes: list, inputs: list, handed: set):
    self.width = config.BEAM
    self.gen = 0           # launches so far (whose intermediates the own buffers hold: the last one's)
    self.n_in = len(inputs)
    at = {p: k for k, p in enumerate(inputs)}
    specs = [(dev, size, dtype) for dev, _k, outs, _r, _v, _l in plan.steps for _i, size, dtype in outs]
    own = sum(size * dtype.itemsize for j, (_d, size, dtype) in enumerate(specs) if j not in handed) <= OWN_BYTES
    self.outs: list = []   # per output: its own Buffer, or (device, size, dtype) to allocate each replay
    src: dict = {}         # output index -> its place among a replay's handles
    for j, (dev, size, dtype) in enumerate(specs):
      if own and j not in handed:
        b = rd.Buffer(dev, size, dtype)
        b.handle   # (allocated now: its address is in the launch arrays)
        self.outs.append(b)
      else:
        src[j] = self.n_in + len(src)
        self.outs.append((dev, size, dtype))
    def out(i):   # output i: its own buffer, or a replay's
      b = self.outs[i]
      return b.handle if type(b) is rd.Buffer else rd.Slot(src[i])

    batches = rd.Batches()
    j = 0
    for dev, k, outs, refs, vals, _last in plan.steps:
      first, j = j, j + len(outs)
      if k is None: continue
      c = dev.compiled(k)
      # (an input that is no input of the replay: a buffer the recording read on its own, a cached mask)
      args = [out(i) for i in range(first, j)] + \
             [out(~i) if i < 0 else rd.Slot(at[i]) if i in at else nodes[i].buffer.handle for i in refs]
      if vals:
        values = [p.value if type(p) is Fixed else (nodes[p].arg.offset if nodes[p].op == "VIEW" else nodes[p].arg)
                  for p in vals]
        args += dev.param_handles(k, values)
      batches.add(dev, c.program, c.kernel, args)
    self.batches = batches.end()

  def launch(self, ins: list) -> list:
    """Launch with these input buffers (in the order of Plan.prepare's inputs); the output buffers, in the
    order of the steps' outputs."""
    new = rd.Buffer
    made = [b if type(b) is new else new(*b) for b in self.outs]
    handles = [b.handle for b in ins]
    handles += [b.handle for b, o in zip(made, self.outs) if b is not o]
    for dev, batch in self.batches: dev.run_prepared(batch, handles)
    self.gen += 1
    sched.stats["replays"] += 1
    return made


def launch(dev, program, k, src: str, handles: list) -> None:
  """Run one compiled kernel (k: the optimized kernel of Device.compiled) on its buffers' handles (outputs first,
  then Device.param_handles of its Params' values), timed when someone tracks kernels."""
  if not track.wants_timing():
    dev.launch(program, k, handles)
    return
  t0 = time.perf_counter()
  dev.launch(program, k, handles)
  dev.synchronize()
  nbytes = sum(b.size * b.dtype.itemsize for b in k.bufs)
  track.record(track.KernelRecord(k.name, dev.name, src, (k.global_size,), k.local_size,
                                  time.perf_counter() - t0, k.flops, nbytes, k.opts))
