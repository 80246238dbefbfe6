"""Checked traces: an eager step's frontend calls, recorded once, replayed without building their graph.

An eager training step rebuilds its lazy graph in Python every iteration: each frontend call checks its arguments,
broadcasts, makes Tensors, autograd recipes and nodes (5-10 us a node), the backward builds the gradient graph, and
the realize walks the whole graph to find its cached schedule. `fusegrad.jit` removes all of that for a function
captured explicitly; this module removes most of it for plain eager code, automatically and checked call by call.

A *segment* is the work between two realizes (a training step: forward, backward, the optimizer's update, ended by
the optimizer's realize). While recording, each top-level frontend call (a Tensor method on a segment's result, a
`nn.functional` function, `backward`, an optimizer's per-parameter update) runs for real and is appended to the
segment as an event: its key (the function, every plain argument by value, each tensor argument as a result of an
earlier event or as an external input by structure: a realized buffer's dtype/shape/device, a lazy graph the caller
built by its structure and realized leaves; which externals are the same tensor or node; the grad mode and default
dtype), and what it made. At the realize that ends the segment, the segment's targets (what the realize was asked
for, `realize.later`'s tensors, the tensors the step wrote: parameters, optimizer state, batch norm's statistics)
are realized together, and the realize's cached plan (engine/realize.Plan) is kept with where each of its inputs
comes from (an external's leaf by place, a random draw's keys by event, or a buffer a call read on its own).

When a later segment's first call has the key of a recorded trace, the segment *replays*: each call is compared
with the next recorded event and, when equal, returns placeholders (Tensors of class `_Traced` carrying their shape,
dtype and device but no node) without running the frontend; `backward` sets the leaves' `.grad` to placeholders;
writes are held pending (a written module buffer is hidden until the realize); random draws draw new keys; in-place
ops on results rebind them. The realize then checks its targets against the
recorded ones, launches the plan on the externals' current buffers, and gives each target its result. The first
thing that differs — another call, another argument, a value read on the host, an op the trace does not follow,
anything that needs a placeholder's node — goes on along another trace of the same first call with the same events
so far (a family's branch), or else *deviates*: the segment's events so far are run again for real, in order, each
placeholder adopting the real tensor it stands for, and the segment records on from there as a new branch (or
continues eagerly where it cannot: nothing is lost but time). A placeholder still alive after its segment (an
activation the caller kept) is its value as the step's plan kept it, or is made by running the calls again. A check of an input's values (`@check`: class indices in range) runs again in a replay; any other call that
reads values on the host runs for real in a replay too, and the graph it made is compared with the recorded one.

What keeps it safe: only calls the trace knows are pure are replayed; writes are followed only without grad mode,
into tensors nobody views (an optimizer's step, a module's buffer written in its forward); a realize inside a call,
an argument that is not a tensor or plain value, a lazy input of over 64 nodes built outside the trace, writes
through views, runtime sizes, captures (`fusegrad.jit`), other threads and timing
(`fusegrad.track`) leave the segment eager. docs/architecture.md "Checked traces"; FUSEGRAD_TRACE=0 turns it off.
"""
from __future__ import annotations
import collections
import threading
import weakref
from fusegrad import config
from fusegrad.graph import template


ENABLED = config.TRACE
_MAX = 16                    # trace families kept (least recently used out)
_BRANCHES = 4                # traces kept per family (least recently replayed out)
_DROPS = 3                   # traces of one start dropped so before that start is left eager
_dropped: dict = {}          # the first event's key -> traces of it dropped
_traces: "collections.OrderedDict[tuple, _Family]" = collections.OrderedDict()   # the first event's key -> family
stats = {"replays": 0, "records": 0, "deviations": 0, "events": 0, "late": 0}   # late: placeholders made after a step
why: "collections.deque[str]" = collections.deque(maxlen=32)   # the latest reasons a segment was not replayed
_seg: list = [None]          # the segment in progress (the main thread's)
_depth = [0]                 # > 0 inside a traced call (its own calls are not events)
in_step = [0]                # > 0 inside Optimizer.step (where writes are followed)
_main = threading.main_thread().ident
REC, REP, OFF = 0, 1, 2
_m: dict = {}                # modules the hot checks read (set by install: no import in a hot path)


class Untraceable(template.Untemplatable):
  """A call or a write the trace cannot follow (the message says why; an argument templates cannot key either)."""


def enabled() -> bool:
  """Are calls events now? (not inside a call, on the main thread, without a capture, tracker or runtime sizes, and
  with eager replays on: realize.no_replay() asks for the step-by-step path)"""
  return ENABLED and not _depth[0] and threading.get_ident() == _main and _m["jit"].recorder() is None and \
    not _m["dims"].bound_any[0] and not _m["track"].wants_timing() and _m["realize"].REPLAY


def _modes() -> tuple:
  return (getattr(_m["grad_state"], "enabled", True), _m["dt"].default_float)


def _why(msg: str) -> None:
  why.append(msg)
  if config.DEBUG >= 2: print(f"trace: {msg}")


class _Stand:
  """A plan reads a constant's value or a view's offset at a walk position: the recorded node's."""
  __slots__ = ("op", "arg")

  def __init__(self, n):
    self.op, self.arg = n.op, n.arg


class Trace:
  """A recorded segment: its events, the realize's plan, where the plan's inputs come from, its targets."""
  __slots__ = ("events", "plan", "size", "inputs", "stands", "targets", "outs", "prepared", "slot_out", "ext_out")

  def __init__(self, events, plan, size, inputs, stands, targets, outs, slot_out, ext_out):
    self.events, self.plan, self.size = events, plan, size
    self.inputs, self.stands = inputs, stands   # [(pos, source: see _source)] (a pos once), [(pos, stand or node)]
    self.targets = targets                      # sorted idents: ("S", slot) a result, ("W", write) a written tensor
    self.outs = outs                            # ident -> ("out", buffer index, shape, dtype, device) / ("in", source) / ("node", n)
    self.prepared = None                        # the plan made ready for these replays (realize.Prepared)
    self.slot_out = slot_out                    # slot -> the plan's output (buffer index) that holds its value
    self.ext_out = ext_out                      # (external place, output): a lazy external the plan computes


class _Family:
  """The traces of one first event, most recently replayed first: branches that share their first events and then
  differ (a GAN's two steps, both starting with the generator's forward; a step that reads a value every k steps).
  A replay that meets a call its trace did not record goes on along a branch with the same events so far; where
  none has it, the step goes on recording a new branch (`deviate`)."""
  __slots__ = ("traces",)

  def __init__(self): self.traces: list = []

  def add(self, key, tr: Trace) -> None:
    """A new recording: it replaces a branch of the same events, or is added (the least recently replayed branch
    beyond _BRANCHES is dropped, and counted: a start that keeps changing is left eager)."""
    sig = [e.key for e in tr.events]
    self.traces = [t for t in self.traces if [e.key for e in t.events] != sig]
    self.traces.insert(0, tr)
    if len(self.traces) > _BRANCHES:
      self.traces.pop()
      _dropped[key] = _dropped.get(key, 0) + 1


def _same_events(a: tuple, b: tuple) -> bool:
  """Are events a and b (of two branches) the same? (the key, and what a replay checks beside it)"""
  return a is b or (a.key == b.key and a.check == b.check and a.leaves == b.leaves)


def _branch(seg, pred) -> bool:
  """Another trace of the segment's family with the same events so far whose continuation pred accepts: the replay
  goes on along it (True). pred is asked last: it may key externals, which stay only where it accepts."""
  fam, tr, pos = seg.fam, seg.trace, seg.pos
  if fam is None: return False
  for t2 in fam.traces:
    if t2 is not tr and len(t2.events) >= pos and \
       all(_same_events(a, b) for a, b in zip(tr.events[:pos], t2.events[:pos])) and pred(t2):
      seg.trace = t2
      return True
  return False


class _Event:
  """One recorded call: key (compared), kind ("method", "fn", "update", "write", "backward"), its arguments' spec, the result's form and new slots, the writes it made, whether it reads the host."""
  __slots__ = ("key", "kind", "spec", "form", "news", "writes", "host", "check", "leaves", "checks", "draws", "freed")

  def __init__(self, key, kind, spec):
    self.key, self.kind, self.spec = key, kind, spec
    self.form = self.check = None
    self.news = self.writes = self.leaves = self.checks = self.draws = ()
    self.host = False
    self.freed = frozenset()   # a backward's: the slots whose graph it freed (a detached one's stays whole)


class _PH:
  """A placeholder's record (Tensor._trace): its segment, slot and metadata."""
  __slots__ = ("seg", "slot", "shape", "dtype", "device", "leaf")

  def __init__(self, seg, slot, meta):
    self.seg, self.slot = seg, slot
    self.shape, self.dtype, self.device, self.leaf = meta[:4]


class Segment:
  """The calls since the last realize: recording (REC), replaying a trace (REP) or eager (OFF)."""
  __slots__ = ("mode", "trace", "fam", "pos", "events", "done", "slots", "nslot", "ext", "ext_first", "t_first",
               "written", "snodes", "views", "later", "hleaves", "hidden", "made", "viewers", "base_of", "launched",
               "__weakref__")

  def __init__(self):
    self.mode, self.trace, self.fam, self.pos = REC, None, None, 0
    self.events: list = []     # (recording) the events
    self.done: list = []       # (replaying) per event reached: [event, its tensors, extra (a host call's results)]
    self.slots: dict = {}      # id(tensor) -> (slot, weakref): results of this segment's events
    self.nslot = 0
    self.ext: list = []        # per external occurrence: (tensor, node, the realized nodes its graph reads)
    self.ext_first: dict = {}  # id(node) -> its first place among the externals (the same node twice is one input)
    self.t_first: dict = {}    # id(tensor) -> its first place
    self.written: dict = {}    # id(tensor) -> (write index, tensor, value slot, value tensor or None: a replay's call's)
    self.snodes: dict = {}     # (recording) slot -> its node
    self.views: list = []      # (replaying) weakrefs to placeholders that view an external's storage
    self.later: list = []      # (replaying) weakrefs to results a backward asked to realize with the next realize
    self.hleaves: list = []    # (recording) (event index, buffers a call reading the host read that are no argument)
    self.hidden: dict = {}     # (replaying) id(tensor) -> (tensor, its node): written tensors hidden until the realize
    self.made: dict = {}       # (replaying) slot -> weakref to the placeholder made for it
    self.viewers: dict = {}    # (replaying) slot -> weakrefs to placeholders that view its storage
    self.base_of: dict = {}    # (replaying) slot -> the slot whose storage it views
    self.launched = None       # (replayed) (trace, its Prepared, the launch's count there, a backward freed the graph)


# ---- keys ----------------------------------------------------------------------------------------------------------

def _current() -> Segment:
  s = _seg[0]
  if s is None: s = _seg[0] = Segment()
  return s


def _slot_of(seg: Segment, t):
  e = seg.slots.get(id(t))
  return e[0] if e is not None and e[1]() is t else None


def _external(seg: Segment, t) -> tuple:
  """The key of an external input (appended to seg.ext): a realized buffer by dtype, shape and device, a constant
  by value, a view over one of those; which other externals are the same tensor and the same nodes."""
  n = t.node
  if n.buffer is not None and n.op != "CONST" and n.op != "IOTA":   # a realized tensor (the usual external)
    i = len(seg.ext)
    seg.ext.append((t, n, (n,)))
    nf = seg.ext_first.setdefault(id(n), (i, -1))
    return ("X", ("IN", n.dtype, n.shape, n.device), t.requires_grad, seg.t_first.setdefault(id(t), i), nf, (nf,))
  # a lazy graph the caller built outside the trace (x.view(-1), mask == 0, a random draw): its structure
  m = _ext_memo.get(id(n))
  leaves = None
  if m is not None and m[0]() is n:     # (the graph below n is alive while n is; a realized node changes it)
    inner = [w() for w in m[3]]
    if not any(x is None or x.buffer is not None for x in inner):
      entries, leaves = m[1], tuple(w() for w in m[2])
      m[4] = _ends[0]
  if leaves is None:
    entries, _roots, leaves, inner = _canon([n], {}, _EXT_NODES)
    _ext_memo[id(n)] = [weakref.ref(n), entries, tuple(weakref.ref(b) for b in leaves),
                        [weakref.ref(x) for x in inner], _ends[0]]
  k = ("G", entries)
  i = len(seg.ext)
  seg.ext.append((t, n, leaves))
  first = seg.ext_first
  return ("X", k, t.requires_grad, seg.t_first.setdefault(id(t), i), first.setdefault(id(n), (i, -1)),
          tuple(first.setdefault(id(b), (i, j)) for j, b in enumerate(leaves)))


_EXT_NODES = 64    # the most nodes of an external lazy graph keyed by its structure
# id(node) -> [node, entries, leaves, its unrealized nodes (weak references all), the segment count when last used]:
# the structure of an external lazy graph that every step passes again, kept while steps use it (nothing kept alive)
_ext_memo: dict = {}
_ends = [0]           # segments ended so far


def _canon(roots: list, place: dict, limit: int = 1 << 30) -> tuple:
  """A graph's structure independent of the order its nodes were made in (hash-consing varies it): each node in
  the order a walk from the roots along the sources meets it, as its op, dtype, argument, shape, device and
  sources; a node in `place` (a call's argument) as its place; a realized node as a leaf of its dtype, shape and
  device. (entries, the roots' indices, the leaves in walk order)."""
  node_key = _m["node_key"]
  index: dict = {}
  out: list = []
  leaves: list = []
  inner: list = []
  for root in roots:
    stack = [(root, False)]
    while stack:
      n, ready = stack.pop()
      if id(n) in index: continue
      if id(n) in place: e = ("ARG", place[id(n)])
      elif n.buffer is not None and n.op != "CONST" and n.op != "IOTA":
        e = ("LEAF", n.dtype, n.shape, n.device)
        leaves.append(n)
      elif not ready:
        stack.append((n, True))
        stack.extend((s, False) for s in reversed(n.src))
        continue
      else:
        e = node_key(n) + tuple(index[id(s)] for s in n.src)
        inner.append(n)
      index[id(n)] = len(out)
      out.append(e)
      if len(out) > limit: raise Untraceable(f"an input is a lazy graph of over {limit} nodes built outside the trace")
  return tuple(out), tuple(index[id(r)] for r in roots), tuple(leaves), inner


def _ref(seg: Segment, t) -> tuple:
  e = seg.slots.get(id(t))
  if e is not None and e[1]() is t: return ("S", e[0])
  w = seg.written.get(id(t))
  if w is not None and w[1] is t: return ("W", w[0])
  if t._trace is not None and not _has_node(t) and not _exact(t):   # (an earlier step's value, as it computed it)
    raise Untraceable("a placeholder of an earlier segment")
  return _external(seg, t)


def _has_node(t) -> bool:
  """Is t's node set (a placeholder's is not; reading it would make the tensor)?"""
  try:
    _m["node_slot"].__get__(t, _m["Tensor"])
    return True
  except AttributeError:
    return False


_PLAIN = (type(None), str, bool, int)


def _spec_call(args: tuple, kwargs: dict, tensors: list) -> tuple:
  """templates._spec((args, kwargs)) without its recursion for the usual flat arguments (tensors, plain values)."""
  Tensor = _m["Tensor"]
  out = ["tuple"]
  for a in args:
    t = type(a)
    if t in _PLAIN: out.append((t, a))
    elif isinstance(a, Tensor):
      tensors.append(a)
      out.append(("tensor", len(tensors) - 1))
    else: out.append(_m["spec"](a, tensors))
  if not kwargs: return ("tuple", tuple(out), ("dict",))
  kw = ["dict"]
  for k, v in kwargs.items():
    t = type(v)
    kw.append((k, (t, v) if t in _PLAIN else _m["spec"](v, tensors)))
  return ("tuple", tuple(out), tuple(kw))


def _form(x, outs: list):
  """A result as a hashable form, tensors as ("T", place in outs)."""
  if isinstance(x, _m["Tensor"]):
    outs.append(x)
    return ("T", len(outs) - 1)
  t = type(x)
  if t is tuple or t is list: return (t.__name__,) + tuple(_form(v, outs) for v in x)
  if isinstance(x, tuple) and hasattr(x, "_fields"): return ("nt", t) + tuple(_form(v, outs) for v in x)
  raise Untraceable(f"a result of type {t.__name__}")


def _unform(form, outs: list):
  t = form[0]
  if t == "T": return outs[form[1]]
  if t == "nt": return form[1](*(_unform(v, outs) for v in form[2:]))
  vals = [_unform(v, outs) for v in form[1:]]
  return tuple(vals) if t == "tuple" else vals


def _meta(t) -> tuple:
  return (t.shape, t.dtype, t.device, t._ctx is None, t.requires_grad)


def _new_slot(seg: Segment, t) -> int:
  k = seg.nslot
  seg.nslot += 1
  seg.slots[id(t)] = (k, weakref.ref(t))
  return k


def _recorded_slot(seg: Segment, o) -> int:
  """A recording's new result: its slot and node; its methods become events."""
  k = _new_slot(seg, o)
  seg.snodes[k] = o.node
  o.__class__ = _Traced
  return k


def _adopt_slot(seg: Segment, o, k: int) -> None:
  """A real result of the segment: its slot, and its methods become events."""
  seg.slots[id(o)] = (k, weakref.ref(o))
  o.__class__ = _Traced


# ---- calls ---------------------------------------------------------------------------------------------------------

def call(kind: str, fn, real, args: tuple, kwargs: dict):
  """A top-level frontend call real(*args, **kwargs), recorded, replayed or run eagerly; fn names it in the key
  (with every argument: real must be a function of them, the grad mode and the default dtype alone)."""
  seg = _seg[0] or _current()
  if seg.mode == OFF: return _run(real, args, kwargs)
  tensors: list = []
  try:
    spec = _spec_call(args, kwargs, tensors)
    key = (kind, fn, spec, tuple([_ref(seg, t) for t in tensors]),
           (getattr(_m["grad_state"], "enabled", True), _m["dt"].default_float))   # (_modes())
  except template.Untemplatable as e:
    # a call on none of the segment's tensors is no concern of the trace (fusegrad.tensor(an array)): it runs as
    # eager code between events does; one on them leaves the segment eager
    if any(_slot_of(seg, t) is not None or t._trace is not None or id(t) in seg.written for t in tensors):
      _leave(seg, str(e))
    return _run(real, args, kwargs)
  if seg.mode == REC and not seg.events:
    fam = seg.fam = _traces.get(key)
    if fam is not None:
      _traces.move_to_end(key)
      if fam.traces: seg.mode, seg.trace = REP, fam.traces[0]
  if seg.mode == REP: return _replay(seg, key, kind, spec, real, args, kwargs, tensors)
  stats["events"] += 1
  return _record(seg, key, kind, real, args, kwargs, tensors, spec)


def _run(real, args, kwargs):
  _depth[0] += 1
  try:
    return real(*args, **kwargs)
  finally:
    _depth[0] -= 1


def off(msg: str) -> None:
  """The segment in progress goes on eagerly (something it cannot follow happened)."""
  seg = _seg[0]
  if seg is not None: _leave(seg, msg)


def _leave(seg: Segment, msg: str) -> None:
  if seg.mode == REP: deviate(seg, msg, record=False)
  elif seg.mode == REC:
    _why(f"not recorded: {msg}")
    seg.mode = OFF


_writes_in_call: list = []    # per recording call in progress: the writes made inside it (tensor, value, node before)
_checks_in_call: list = []    # per recording call in progress: the checks made inside it (fn, tensor, args, host reads)


_draws_in_call: list = []     # per recording call in progress: its random draws (holder, n, device, keys)
_given_keys: list = []        # keys a call made again is handed (the draws its replay made), in draw order


def note_draw(g, n: int, device: str, keys) -> None:
  """A random draw (tensor._draw_keys) was made: a recorded call that drew is replayed by drawing again."""
  if _draws_in_call and _seg[0] is not None: _draws_in_call[-1].append((g, n, device, keys))


def drawn(g, n: int, device: str):
  """The keys to use for this draw when a call is made again from a replay's draws (None: draw now)."""
  if not _given_keys: return None
  gg, nn_, dev, keys = _given_keys.pop(0)
  if gg is not g or nn_ != n or dev != device: raise AssertionError("trace: a call made again drew differently")
  Tensor = _m["Tensor"]
  return keys if isinstance(keys, Tensor) else Tensor(_node=keys)   # (a replay keeps the keys' nodes)


def check(fn):
  """A check of an input's values on the host that raises or does nothing (class indices in range): a recorded call
  that made it is still replayed, running the check again on the replay's input."""
  import functools

  @functools.wraps(fn)
  def f(t, *args):
    if not _checks_in_call or _seg[0] is None: return fn(t, *args)
    reads = _m["jit"].host_reads[0]
    out = fn(t, *args)
    _checks_in_call[-1].append((fn, t, args, _m["jit"].host_reads[0] - reads))
    return out
  return f


def _record(seg, key, kind, real, args, kwargs, tensors, spec):
  jit, Tensor = _m["jit"], _m["Tensor"]
  before = [t.node for t in tensors]
  reads, start = jit.host_reads[0], next(_m["gn"]._seq)
  writes: list = []
  checks: list = []
  draws: list = []
  _writes_in_call.append(writes)
  _checks_in_call.append(checks)
  _draws_in_call.append(draws)
  _depth[0] += 1
  try:
    out = real(*args, **kwargs)
  finally:
    _depth[0] -= 1
    _writes_in_call.pop()
    _checks_in_call.pop()
    _draws_in_call.pop()
  if seg.mode != REC: return out
  try:
    ev = _Event(key, kind, spec)
    checked = []
    for fn, t, cargs, n in checks:   # a check of an argument's values runs again in a replay
      j = next((j for j, x in enumerate(tensors) if x is t or x.node is t.node), None)
      if j is None: break
      checked.append((fn, j, cargs))
      reads += n
    ev.checks = tuple(checked)
    ev.draws = tuple((g, n, dev) for g, n, dev, _k in draws)   # a replay draws the same way, into new buffers
    reads += len(draws)
    if draws: seg.hleaves.append((len(seg.events), tuple(k.node for *_x, k in draws)))
    ev.host = jit.host_reads[0] != reads
    outs: list = []
    form = _form(out, outs)
    if any(g for t, r, n, g in writes if n.seq < start): raise Untraceable("a call wrote a tensor with grad mode on")
    writes = [(t, r) for t, r, n, g in writes if n.seq < start]    # (a tensor the call made and wrote is its own affair)
    wrote = {id(t) for t, _r in writes}
    for t, b in zip(tensors, before):
      if t.node is not b and id(t) not in wrote: raise Untraceable("a call changed an input other than by a write")
    news, refs = [], []
    for o in outs:
      j = next((j for j, t in enumerate(tensors) if t is o), None)
      if j is not None:
        refs.append(("arg", j))
        continue
      if type(o) is not Tensor: raise Untraceable(f"a result of type {type(o).__name__}")
      if _slot_of(seg, o) is not None or any(o is x for x in news):
        raise Untraceable("a call returned a result of an earlier call")
      refs.append(("new", len(news)))
      news.append(o)
    ev_writes = []
    for t, r in writes:
      j = next((j for j, x in enumerate(tensors) if x is t), None)
      if j is None or type(r) is not Tensor or not _pending_ok(seg, t, True):
        raise Untraceable("a call wrote a tensor the trace does not follow")
      ev_writes.append((j, r))
    if ev.host:
      if ev_writes: raise Untraceable("a call that reads the host also wrote")
      ev.check, leaves = _structure(news, tensors)
      seg.hleaves.append((len(seg.events), leaves))
    slots = []
    for o in news:
      slots.append((_recorded_slot(seg, o), _meta(o), _views_external(seg, o), _viewed_slot(seg, o)))
    ev.news = tuple(slots)
    ev.form = (form, tuple(refs))
    ws = []
    for j, r in ev_writes:
      k = _new_slot(seg, r)
      seg.snodes[k] = r.node
      _note_write(seg, tensors[j], k, r)
      ws.append((j, k, _meta(r)))
    ev.writes = tuple(ws)
    seg.events.append(ev)
  except Untraceable as e:
    _leave(seg, str(e))
  return out


def _viewed_slot(seg: Segment, o):
  """The slot of the segment's result whose storage o views, or None."""
  a = o._alias
  if a is None or type(a[1]) is not tuple or not a[1]: return None
  base = a[0].ref()
  return None if base is None else _slot_of(seg, base)


def _views_external(seg: Segment, o) -> bool:
  """Is o a view of an external tensor's storage (a write into that tensor would change o)?"""
  a = o._alias
  if a is None or type(a[1]) is not tuple or not a[1]: return False
  base = a[0].ref()
  i = seg.t_first.get(id(base))
  return base is not None and i is not None and seg.ext[i][0] is base


def _structure(news: list, tensors: list) -> tuple:
  """The graph a call that reads the host made (compared in a replay, which runs such a call for real), and the
  buffers it reads that are no argument (a random draw's keys): ((entries, roots), leaves)."""
  place: dict = {}
  for i, t in enumerate(tensors): place.setdefault(id(t.node), i)
  entries, roots, leaves, _inner = _canon([o.node for o in news], place)
  return (entries, roots), leaves


def _note_write(seg: Segment, t, k: int, value) -> None:
  seg.written[id(t)] = (len(seg.written), t, k, value)


def _replay(seg, key, kind, spec, real, args, kwargs, tensors):
  tr, pos = seg.trace, seg.pos
  if (pos >= len(tr.events) or tr.events[pos].key != key) and \
     not _branch(seg, lambda t2: pos < len(t2.events) and t2.events[pos].key == key):
    deviate(seg, "another call than the recorded one" if pos < len(tr.events) else "more calls than recorded")
    if seg.mode != REC: return _run(real, args, kwargs)
    stats["events"] += 1
    return _record(seg, key, kind, real, args, kwargs, tensors, spec)
  ev = seg.trace.events[pos]
  if ev.host:   # it checks values on the host: it runs for real, and the graph it made is compared
    out = _run(real, args, kwargs)
    outs: list = []
    try:
      _form(out, outs)
      news = [outs[i] for i, r in enumerate(ev.form[1]) if r[0] == "new"]
      if len(news) != len(ev.news) or any(type(o) is not _m["Tensor"] for o in news):
        raise Untraceable("a call reading the host made another graph")
      check, leaves = _structure(news, tensors)
      if check != ev.check: raise Untraceable("a call reading the host made another graph")
    except Untraceable as e:
      deviate(seg, str(e), record=False)   # (it ran: too late to record it)
      return out
    seg.pos += 1
    stats["events"] += 1
    seg.done.append([ev, _externals(ev, tensors), news, leaves])
    for o, (k, *_x) in zip(news, ev.news): _adopt_slot(seg, o, k)
    return out
  return _replay_event(seg, ev, real, args, kwargs, tensors)


def refs_match(seg: Segment, tensors: list, want: tuple) -> bool:
  """Are these tensors' refs `want` (an event's key's)? When not, the externals they added are taken back."""
  n = len(seg.ext)
  try:
    if tuple(_ref(seg, t) for t in tensors) == want: return True
  except template.Untemplatable:
    pass
  del seg.ext[n:]
  for d in (seg.t_first, seg.ext_first):
    for key in [key for key, v in d.items() if (v if type(v) is int else v[0]) >= n]: del d[key]
  return False


def replaying():
  """The segment, while a replay follows its trace and calls are events (Optimizer.step's updates replay through
  `_replay_event` directly when their keys match: _updates.step_all)."""
  seg = _seg[0]
  return seg if seg is not None and seg.mode == REP and enabled() else None


def _replay_event(seg, ev, real, args, kwargs, tensors):
  """The event at seg.pos, whose key matched this call's: its results as placeholders, its writes held."""
  for j, _k, _meta_ in ev.writes:
    if not _pending_ok(seg, tensors[j], True):
      deviate(seg, "a write the trace does not follow")
      if seg.mode != REC: return _run(real, args, kwargs)
      return _record(seg, ev.key, ev.kind, real, args, kwargs, tensors, ev.spec)   # (its key is this call's)
  for fn, j, cargs in ev.checks:
    try:
      _run(fn, (tensors[j],) + cargs, {})
    except Exception:
      deviate(seg, "a check of an input's values failed", record=False)
      raise
  leaves = ()
  if ev.draws:
    draw = _m["draw_keys"]
    _depth[0] += 1
    try:
      leaves = tuple(draw(g, n, dev) for g, n, dev in ev.draws)
    finally:
      _depth[0] -= 1
  seg.pos += 1
  seg.done.append([ev, _externals(ev, tensors), real, leaves])
  stats["events"] += 1
  news = [_placeholder(seg, k, meta, view, base) for k, meta, view, base in ev.news]
  form, refs = ev.form
  outs = [tensors[r[1]] if r[0] == "arg" else news[r[1]] for r in refs]
  for j, k, _meta in ev.writes:
    t = tensors[j]
    _note_write(seg, t, k, None)   # (its value is no one's but t's: a placeholder for it is made only if needed)
    if not in_step[0]: _hide(seg, t, t)
  return _unform(form, outs)


def _externals(ev, tensors: list) -> list:
  """An event's tensors as a replay keeps them: the externals (a result is found by its slot when the events are
  made again; holding it would keep it alive, and liveness is what the checks of views and writes read)."""
  return [t if r[0] != "S" else None for r, t in zip(ev.key[3], tensors)]


def _placeholder(seg: Segment, k: int, meta, view: bool, base=None):
  t = _Traced.__new__(_Traced)    # node, _ctx and _alias unset: whatever reads them makes the tensor (materialize)
  t.grad = None
  t.requires_grad = meta[4]
  t._trace = _PH(seg, k, meta)
  w = weakref.ref(t)
  seg.slots[id(t)] = (k, w)
  seg.made[k] = w
  if view: seg.views.append(w)
  if base is not None:
    seg.viewers.setdefault(base, []).append(w)
    seg.base_of[k] = base
  return t


def _dead(): return None


# ---- writes (alias.write asks first) -------------------------------------------------------------------------------

def on_write(t, r) -> bool:
  """alias.write(t, r) is about to run: True when the trace holds it pending (a replay) instead, or drops it (a call
  made again after its step, whose writes were made then)."""
  if _late[0]: return True
  seg = _seg[0]
  if seg is None or threading.get_ident() != _main: return False
  if _depth[0]:
    if _writes_in_call: _writes_in_call[-1].append((t, r, t.node, _m["autograd"].grad_enabled()))
    elif seg.mode == REC: _leave(seg, "a write inside a call")
    return False
  if seg.mode == OFF: return False
  if not enabled():    # (a capture or a tracker began inside the segment)
    _leave(seg, "a write while traces are off")
    return False
  kt = _slot_of(seg, t)
  if kt is not None: return _rebind(seg, t, r, kt)
  n = r.node if r._trace is None else None
  if n is not None and n.op == "CONST" and not n.src and n.buffer is None and type(t) is _m["Tensor"] and \
     id(t) not in seg.written and not _m["autograd"].grad_enabled():
    return _const_write(seg, t, r)
  if not _pending_ok(seg, t, False, r):
    _leave(seg, "a write the trace does not follow")
    return False
  try:   # the value: a result of the segment, or a graph the caller built (`n += 1` on a module's counter)
    key = ("write", _ref(seg, t), _ref(seg, r), _modes())
  except Untraceable as e:
    _leave(seg, str(e))
    return False
  k = key[2][1] if key[2][0] == "S" else None
  if seg.mode == REP and not _at(seg, key): deviate(seg, "another write than the recorded one")
  if seg.mode == REC:
    seg.events.append(_Event(key, "write", None))
    _note_write(seg, t, k, r)
    return False
  if seg.mode != REP: return False
  seg.done.append([seg.trace.events[seg.pos], [t, None if k is not None else r], None, ()])
  seg.pos += 1
  _note_write(seg, t, k, r)
  if not in_step[0]: _hide(seg, t, r)
  return True


def _at(seg: Segment, key) -> bool:
  """Is the replay's next event one of this key (on its trace, or on a branch it goes on along)?"""
  tr, pos = seg.trace, seg.pos
  return pos < len(tr.events) and tr.events[pos].key == key or \
    _branch(seg, lambda t2: pos < len(t2.events) and t2.events[pos].key == key)


def _const_write(seg: Segment, t, r) -> bool:
  """A constant written into a plain tensor (a batch norm's `num_batches_tracked += 1`, folded on the host): made now,
  in a replay too, whatever the value; a later call that reads the tensor keys it by its new value."""
  key = ("cwrite", t.dtype, t.shape, r.dtype, r.shape, _modes())
  if seg.mode == REP and not _at(seg, key): deviate(seg, "another write than the recorded one")
  if seg.mode == REC:
    seg.events.append(_Event(key, "cwrite", None))
    return False
  if seg.mode != REP: return False
  seg.done.append([seg.trace.events[seg.pos], [t, r], None, ()])
  seg.pos += 1
  return False


def _rebind(seg: Segment, t, r, kt: int) -> bool:
  """An in-place op on a result of the segment (`out += identity`): t stands for the op's result from now on."""
  k = _slot_of(seg, r)
  if k is None:
    _leave(seg, "an in-place op with a value from outside the segment")
    return False
  key = ("rebind", kt, k, _modes())
  if seg.mode == REP:
    b = seg.base_of.get(kt)
    if not _at(seg, key) or any(w() is not None for w in seg.viewers.get(kt, ())) or \
       (b is not None and seg.made.get(b, _dead)() is not None):
      deviate(seg, "another in-place op than the recorded one")
  if seg.mode == REC:
    # t must stand alone: no live view of it, and if it is itself a view (a gradient reshaped from another), its base
    # gone and no element repeated (an expanded view's write raises, as eager's does)
    a = t._alias
    if a is not None and (type(a[1]) is not tuple or (a[1] and (a[0].ref() is not None or
                          any(op == "EXPAND" for op, _ in a[1]))) or _m["alias"]._members(a[0], t)):
      _leave(seg, "an in-place op on a result that is viewed")
      return False
    seg.events.append(_Event(key, "rebind", None))
    seg.slots[id(t)] = (k, weakref.ref(t))
    return False      # (the write is made: t's value and recipe are r's)
  if seg.mode != REP: return False
  seg.done.append([seg.trace.events[seg.pos], [None, None], None, ()])
  seg.pos += 1
  ph = r._trace
  t._trace = _PH(seg, k, (ph.shape, ph.dtype, ph.device, ph.leaf) if ph is not None else _meta(r))
  t.requires_grad = r.requires_grad
  seg.slots[id(t)] = (k, weakref.ref(t))
  return True


def data_alias(d) -> None:
  """`p.data` taken in a segment: its methods are events (d is no result: an external, keyed by its node, which is
  p's), so `p.data.add_(p.grad, alpha=-lr)` (pytorch/examples' word language model's update by hand) is a recorded
  call and a write the trace follows (into p, through its detached alias: _pending_ok, _hide) instead of a value
  built outside the trace from the step's gradient, which a replay could not build without making the gradient."""
  seg = _seg[0]
  if seg is not None and seg.mode != OFF and type(d) is _m["Tensor"] and enabled(): d.__class__ = _Traced


def _detached_base(t):
  """The base tensor t is a whole detached alias of (`p.data`: an alias chain of DETACH alone), where it is alive;
  a write into t is the base's (alias.write), else None."""
  a = t._alias
  if a is None or type(a[1]) is not tuple or not a[1] or any(op != "DETACH" for op, _ in a[1]): return None
  return a[0].ref()


def _hide(seg: Segment, t, value) -> None:
  """A plain tensor a replay wrote outside an optimizer step (a module's buffer; a parameter through `p.data`: the
  alias and its base): it has no node until the realize gives it its new value, so that reading it in between makes
  the segment's tensors first (`materialize`)."""
  meta = (value.shape, value.dtype, value.device, True, False)
  base = _detached_base(t)
  for x in (t,) if base is None else (t, base):
    seg.hidden[id(x)] = (x, x.node)
    _m["node_slot"].__delete__(x)
    x._trace = _PH(seg, -1, meta)
    x.__class__ = _Traced


def _pending_ok(seg: Segment, t, in_call: bool, r=None) -> bool:
  """Writes the trace follows, into a tensor not written yet in the segment that is neither a view (its own views are
  updated when the write is made) nor a result of the segment: an optimizer's (in its step, without grad mode), a
  call's into a plain tensor it was given (batch norm's running statistics: without grad mode, checked where it is
  recorded), and one outside autograd (neither the tensor nor the value requires grad: a parameter updated by hand
  through `.data`, as pytorch/examples' word language model does, grad mode on), which a replay hides until its
  realize."""
  if id(t) in seg.written or _slot_of(seg, t) is not None or t._trace is not None: return False
  if not in_call and _m["autograd"].grad_enabled() and (r is None or t.requires_grad or r.requires_grad): return False
  base = _detached_base(t)
  if not in_step[0] and type(t) is not _m["Tensor"] and not (type(t) is _Traced and base is not None): return False
  a = t._alias
  if base is not None:   # `p.data`: the write is its base's, which a replay hides too (_hide); no other live view
    if id(base) in seg.written or _slot_of(seg, base) is not None or base._trace is not None or \
       _m["alias"]._members(a[0], t): return False
  elif a is not None and (type(a[1]) is not tuple or a[1] or _m["alias"]._members(a[0], t)):
    return False   # (a view of it alive, a state_dict() entry of a batch norm's statistics: it sees the write now)
  if seg.mode == REP:
    for w in seg.views:   # a placeholder viewing an external would not see the write
      if w() is not None: return False
  return True


# ---- backward ------------------------------------------------------------------------------------------------------

def backward(t, retain_graph) -> bool:
  """Tensor.backward() of a segment's result (no arguments but retain_graph): True when done here."""
  seg = _current()
  if seg.mode == OFF: return False
  k = _slot_of(seg, t)
  key = ("backward", k, retain_graph, _modes())
  if k is None:
    _leave(seg, "a backward from a tensor outside the segment")
    return False
  if seg.mode == REP:
    def fits(t2) -> bool:
      ev = t2.events[seg.pos] if seg.pos < len(t2.events) else None
      return ev is not None and ev.key == key and \
        _olds_match(seg, [seg.ext[i][0].grad for i, _k, _m_, _o in ev.leaves], ev.leaves)
    if not fits(seg.trace) and not _branch(seg, fits): deviate(seg, "another backward than the recorded one")
  if seg.mode == REP:
    ev = seg.trace.events[seg.pos]
    olds = [seg.ext[i][0].grad for i, _k, _m_, _o in ev.leaves]
    seg.pos += 1
    seg.done.append([ev, olds, None, ()])
    for i, k2, meta, _o in ev.leaves: seg.ext[i][0].grad = _placeholder(seg, k2, meta, False)
    if t._trace is not None and t._trace.shape == (): seg.later.append(weakref.ref(t))
    return True
  written: list = []
  _depth[0] += 1
  try:
    _m["autograd"].backward(t, retain_graph=retain_graph, written=written)
  finally:
    _depth[0] -= 1
  if seg.mode != REC: return True
  try:
    ev = _Event(key, "backward", None)
    leaves = []
    for leaf, old in written:   # (old: the .grad accumulated into, an earlier backward's or one from before)
      i = seg.t_first.get(id(leaf))
      if i is None or seg.ext[i][0] is not leaf: raise Untraceable("a backward reaching a leaf no call was given")
      g = leaf.grad
      if type(g) is not _m["Tensor"] or _slot_of(seg, g) is not None: raise Untraceable("a gradient of another kind")
      leaves.append((i, _recorded_slot(seg, g), _meta(g), None if old is None else _ref(seg, old)))
    ev.leaves = tuple(leaves)
    ev.freed = _freed_slots(seg)
    seg.events.append(ev)
  except Untraceable as e:
    _leave(seg, str(e))
  return True


def _freed_slots(seg: Segment) -> frozenset:
  """The slots (recording a step) whose autograd graph reaches a recipe a backward freed: a backward through them
  raises, as torch's does (an LSTM's last hidden state, whose recipes the loss's backward went through); a graph
  the backward did not reach stays whole (a GAN's generated batch, detached for the discriminator's backward, then
  differentiated for the generator's)."""
  autograd = _m["autograd"]
  live = [(k, p) for k, w in seg.slots.values() if (p := w()) is not None and p._ctx is not None]
  ins_of: dict = {}
  hit: dict = {}
  for t in autograd._toposort([p for _k, p in live], ins_of):   # (inputs first)
    ctx = t._ctx
    hit[id(t)] = ctx is not None and (ctx[3] is autograd._FREED or any(hit.get(id(i), False) for i in ins_of.get(id(t), ())))
  return frozenset(k for k, p in live if hit.get(id(p), False))


def _olds_match(seg: Segment, olds: list, leaves: tuple) -> bool:
  """Are the leaves' .grad before a replayed backward those of the recording (none, or the same earlier result or
  external: gradient accumulation)? (the externals it keys are taken back when not)"""
  if any((g is None) != (o is None) for g, (_i, _k, _m_, o) in zip(olds, leaves)): return False
  return refs_match(seg, [g for g in olds if g is not None], tuple(o for *_x, o in leaves if o is not None))


# ---- deviating: the events so far run for real --------------------------------------------------------------------

def deviate(seg: Segment, msg: str, record: bool = True) -> None:
  """Leave the replay: the segment's events so far run for real, each placeholder adopting its real tensor; then,
  where the call, write, backward or realize that differed can be (record), the segment goes on recording a new
  branch of its family from there (`_resume`), else eagerly."""
  if seg.mode != REP: return
  stats["deviations"] += 1
  _why(f"deviated at event {seg.pos}: {msg}")
  seg.mode = OFF
  _unhide(seg)
  real = _materialize(seg, live=True)
  key = seg.trace.events[0].key if seg.trace.events else None
  if record and _dropped.get(key, 0) < _DROPS: _resume(seg, real)


def _resume(seg: Segment, real: dict) -> None:
  """After a deviation at event seg.pos, with the events so far made for real (real: slot -> tensor), the segment
  records on, in the state a recording of those events would have left: a new branch sharing them."""
  tr, pos = seg.trace, seg.pos
  seg.events = list(tr.events[:pos])
  seg.nslot = 1 + max((k for ev in seg.events for k in _new_slots(ev)), default=-1)
  seg.snodes = {k: t.node for k, t in real.items() if t is not None and _has_node(t)}
  seg.hleaves = [(i, d[3]) for i, d in enumerate(seg.done) if d[3]]
  seg.written.clear()
  for ev, tensors, _extra, _leaves in seg.done:   # the writes made, in order, as a recording notes them
    if ev.kind == "write":
      k = ev.key[2][1] if ev.key[2][0] == "S" else None
      _note_write(seg, tensors[0], k, real[k] if k is not None else tensors[1])
    for j, k, _m_ in ev.writes: _note_write(seg, tensors[j], k, real[k])
  for k, t in real.items():   # every result made (a gradient whose placeholder was gone too) is its slot's again
    if t is not None and t._trace is None and _slot_of(seg, t) is None: seg.slots[id(t)] = (k, weakref.ref(t))
  for _key, (_k, w) in list(seg.slots.items()):   # the results' methods are events again
    t = w()
    if t is not None and t._trace is None and type(t) is _m["Tensor"]: t.__class__ = _Traced
  seg.done, seg.trace, seg.mode = [], None, REC
  seg.made.clear()
  seg.viewers.clear()
  seg.base_of.clear()


def _new_slots(ev) -> list:
  """The slots an event made (its results, its writes' values, a backward's gradients)."""
  return [s[0] for s in ev.news] + [w[1] for w in ev.writes] + [l[1] for l in ev.leaves]


def _unhide(seg: Segment) -> None:
  """The written tensors a replay hid get their nodes back (the write is then made for real, or by the realize)."""
  for t, n in seg.hidden.values():
    t.node = n
    t._trace = None
    t.__class__ = _m["Tensor"]
  seg.hidden.clear()


_late = [False]    # a segment's calls are being made again after it: their writes were made then


def _materialize(seg: Segment, live: bool) -> dict:
  """Run the replayed events again for real. live: inside the segment (writes and backward too, external inputs as
  they are); otherwise after it (calls only, external inputs as they were at the call). Returns slot -> tensor."""
  autograd, alias, Tensor = _m["autograd"], _m["alias"], _m["Tensor"]
  real: dict = {}        # slot -> its real tensor
  phs = seg.made
  at_call: dict = {}
  for t, n, _b in seg.ext: at_call.setdefault(id(t), n)

  def alive(k):   # (the placeholder made for slot k, unless an in-place op made it stand for another since)
    w = phs.get(k)
    p = w() if w is not None else None
    return p if p is not None and p._trace is not None and p._trace.slot == k else None

  def known(k, meta):
    """(after the step) slot k's value as the replay computed it: a placeholder it bound, or `_own_value`."""
    w = phs.get(k)
    p = w() if w is not None else None
    if p is not None:
      if _has_node(p) and p.node.buffer is not None: return p
      return p if p._trace is not None and _exact(p) else None
    n = _own_value(seg, k, meta)
    return None if n is None else Tensor(_node=n)

  def exact_node(k, meta):
    w = phs.get(k)
    p = w() if w is not None else None
    if p is not None and _has_node(p) and p.node.buffer is not None: return p.node
    return _own_value(seg, k, meta)

  def shortcut(slots: list) -> bool:
    """(after the step) the values of an event's results, none needing a gradient, as the replay computed them: the
    event is not run again (its values would be computed anew: float reassociation)."""
    if live or not slots or any(m[4] for _k, m in slots): return False
    vals = [known(k, m) for k, m in slots]
    if any(v is None for v in vals): return False
    for (k, _m_), v in zip(slots, vals): real[k] = v
    return True

  stand_in: dict = {}

  def arg(r, t):
    if r[0] == "S": return real[r[1]]
    if live or r[0] == "W": return t
    n = at_call[id(t)] if id(t) in at_call else t.node
    if t.node is n: return t
    w = stand_in.get(id(t))    # the value the calls read, once per tensor (a gradient reaches it)
    if w is None:
      w = stand_in[id(t)] = Tensor(_node=n)
      if t.requires_grad: w.requires_grad_()
    return w

  def _rerun(ev, tensors, extra):
    if ev.kind == "rebind":
      t, v = real.get(ev.key[1]), real.get(ev.key[2])
      if t is None or v is None: return
      if live: alias.write(t, v)
      else: t.node, t._ctx, t.requires_grad = v.node, v._ctx, v.requires_grad   # (after the step: its value)
      return
    if ev.kind == "cwrite": return   # (made when it was met)
    if ev.kind == "write":
      if live:
        t, r = tensors
        del seg.written[id(t)]
        alias.write(t, real[ev.key[2][1]] if ev.key[2][0] == "S" else r)
      return
    if ev.kind == "backward":
      if shortcut([(k, m) for _i, k, m, _o in ev.leaves]): return
      if not live:   # after the step: the gradients of the values the calls read, through the calls made again
        ins = [arg(("X",), seg.ext[i][0]) for i, _k, _m_, _o in ev.leaves]
        gs = autograd.grad([real[ev.key[1]]], ins, retain_graph=True, allow_unused=True)
        for g, (_i, k, _m_, o), old in zip(gs, ev.leaves, tensors):
          if o is not None:   # accumulated into
            if o[0] == "S" and o[1] not in real: return
            base = arg(o, old)
            g = base if g is None else base + g
          if g is None: continue   # (not reached: what reads it is not made either)
          p = alive(k)
          if p is not None: _adopt(p, g)
          real[k] = p if p is not None else g
        return
      leaves = [seg.ext[i][0] for i, _k, _m_, _o in ev.leaves]
      for leaf, (_i, _k, _m_, o), old in zip(leaves, ev.leaves, tensors):
        leaf.grad = None if o is None else real[o[1]] if o[0] == "S" else old
      autograd.backward(real[ev.key[1]], retain_graph=ev.key[2])
      for leaf, (_i, k, _m_, _o) in zip(leaves, ev.leaves):
        p = alive(k)
        if p is not None and leaf.grad is not None:
          _adopt(p, leaf.grad)
          leaf.grad = p
        real[k] = leaf.grad
      return
    if ev.host:          # it ran for real in the replay
      for o, (k, *_x) in zip(extra, ev.news): real[k] = o
      return
    if ev.kind == "update" and not live: return   # (an optimizer's update: its results are no one's after the step)
    if not ev.writes and shortcut([(k, m) for k, m, *_x in ev.news]): return
    if not live and any(r[0] == "S" and r[1] not in real for r in ev.key[3]): return   # (reads one of those)
    xs = [arg(r, t) for r, t in zip(ev.key[3], tensors)]
    spec = ev.spec
    args, kwargs = _m["rebuild"](spec, xs)
    out = (getattr(Tensor, ev.key[1]) if ev.kind == "method" else extra)(*args, **kwargs)
    outs: list = []
    _form(out, outs)
    form, refs = ev.form
    for r, o in zip(refs, outs):
      if r[0] != "new": continue
      k, meta = ev.news[r[1]][:2]
      if not live and o._alias is None:   # (after the step) its value as the step computed it, its recipe made anew
        n = exact_node(k, meta)
        if n is not None: o.node = n
      p = alive(k)
      if p is not None and p is not o: _adopt(p, o)
      real[k] = p if p is not None else o
    for j, k, _m_ in ev.writes:   # the call wrote its argument: the value's placeholder is the argument's new value
      t = xs[j]
      if id(t) in seg.written: del seg.written[id(t)]
      p = alive(k)
      if p is not None: _adopt(p, Tensor(_node=t.node))
      real[k] = p if p is not None else Tensor(_node=t.node)

  _depth[0] += 1
  _late[0] = not live
  try:
    for ev, tensors, extra, leaves in seg.done:
      _given_keys[:] = [(g, n, dev, keys) for (g, n, dev), keys in zip(ev.draws, leaves)] if ev.draws else []
      with (autograd.enable_grad() if ev.key[-1][0] else autograd.no_grad()):   # the grad mode it ran in
        _rerun(ev, tensors, extra)
  finally:
    _depth[0] -= 1
    _late[0] = False
    _given_keys.clear()
  for _key, (k, w) in list(seg.slots.items()):   # a tensor an in-place op made stand for a slot: its real tensor
    p = w()
    r = real.get(k)
    if p is not None and p._trace is not None and r is not None and r is not p and not _has_node(p): _adopt(p, r)
  seg.views.clear()
  if not live: _forget(seg)
  return real


def _adopt(p, r) -> None:
  """Placeholder p becomes the real tensor r (same value, recipe and aliasing; a value the replay computed stays)."""
  node = p.node if _has_node(p) and p.node.buffer is not None else r.node
  p.node, p.requires_grad, p.grad, p._ctx, p._alias = node, r.requires_grad, r.grad, r._ctx, None
  p._trace = None
  p.__class__ = _m["Tensor"]
  a = r._alias
  if a is not None and type(a[1]) is tuple:   # p takes r's place among its storage's members
    st = a[0]
    p._alias = a
    if st.ref() is r: st.ref = weakref.ref(p)
    st.members = [weakref.ref(p) if w() is r else w for w in st.members]


def materialize(p) -> None:
  """A placeholder's node is needed (Tensor.node of a _Traced): deviate its segment, or, after it, make it (its value
  as the step computed it where the trace's buffers still hold it: `_exact`; else by making the calls again)."""
  seg = p._trace.seg
  if _seg[0] is seg and seg.mode == REP: deviate(seg, "a placeholder's node was needed")
  else:
    if _exact(p): return
    stats["late"] += 1
    _materialize(seg, live=False)
  if p._trace is not None:
    raise RuntimeError("fusegrad: a result of a replayed step cannot be made again after the step (the optimizer "
                       "update that made it wrote its state); please report this")


def _own_value(seg: Segment, k: int, meta):
  """Slot k's value as the last replay of seg computed it into a buffer of the trace's own (an intermediate: a
  gradient the step's realize did not ask for), the trace not run since: a node of a copy of that buffer, or None."""
  if seg.launched is None: return None
  tr, run, gen, _freed = seg.launched
  j = tr.slot_out.get(k)
  if j is None or run.gen != gen or run is not tr.prepared: return None
  b = run.outs[j]
  if type(b) is not _m["rd"].Buffer: return None
  copy = _m["rd"].Buffer(b.device, b.size, b.dtype)
  if b.size: copy.copyin(b.numpy())
  return _m["gn"].buffer_node(copy, meta[1], meta[0], meta[2])


def _exact(p) -> bool:
  """A placeholder of a replayed step needed after it: bound to its value as the step computed it (`_own_value`),
  not to the calls made again (False where that value is gone)."""
  seg, ph = p._trace.seg, p._trace
  if _has_node(p): return False
  node = _own_value(seg, ph.slot, (ph.shape, ph.dtype, ph.device))
  if node is None: return False
  _bind(p, node, seg.launched[3])
  return True


# ---- the realize that ends a segment -------------------------------------------------------------------------------

def on_realize(tensors=None, nodes=None) -> bool:
  """A realize while a segment is open (fusegrad.realize, Tensor.realize/numpy, the engine's realize): True when it
  was done here (a replay's plan, or a recording's realize of the segment's targets)."""
  seg = _seg[0]
  if seg is None or threading.get_ident() != _main: return False
  if _depth[0]:
    _leave(seg, "a realize inside a call")
    return False
  if seg.mode == OFF or not enabled():
    _leave(seg, "a capture or a tracker")
    _end(seg)
    return False
  order = _targets_or_end(seg, tensors, nodes)
  if order is None: return False
  idents = tuple(sorted(order))
  if seg.mode == REP:
    tr, pos = seg.trace, seg.pos
    fits = lambda t2: len(t2.events) == pos and t2.targets == idents
    if fits(tr) or _branch(seg, fits):
      tr = seg.trace
      fam = seg.fam
      if fam.traces[0] is not tr: fam.traces.remove(tr); fam.traces.insert(0, tr)
      _m["realize"]._later.clear()
      seg.later.clear()
      _launch(seg, tr)
      _end(seg)
      return True
    deviate(seg, "another realize than the recorded one" if pos == len(tr.events) else "fewer calls than recorded")
    if seg.mode != REC:
      _end(seg)
      return False
    order = _targets_or_end(seg, tensors, nodes)   # (a recording's: the written tensors as it knows them)
    if order is None: return False
    idents = tuple(sorted(order))
  written = {v[0]: v[1] for v in seg.written.values()}
  nodes_all = [seg.snodes[i[1]] if i[0] == "S" else written[i[1]].node for i in order]
  entry, walked = _m["realize"].realize_nodes(nodes_all)
  try:
    if not seg.events: raise Untraceable("no calls")
    tr = _trace_of(seg, entry, walked, idents, order, nodes_all)
    key = seg.events[0].key
    if _dropped.get(key, 0) >= _DROPS: raise Untraceable("its steps changed again and again")
    fam = _traces.get(key)
    if fam is None: fam = _traces[key] = _Family()
    fam.add(key, tr)
    _traces.move_to_end(key)
    if len(_traces) > _MAX: _traces.popitem(last=False)
    stats["records"] += 1
  except Untraceable as e:
    _why(f"not recorded: {e}")
  _end(seg)
  return True


def _targets_or_end(seg: Segment, tensors, nodes):
  """`_targets`, or None when the segment cannot follow them: it is left to eager and ended."""
  try:
    return _targets(seg, tensors, nodes)
  except Untraceable as e:
    _leave(seg, str(e))
    _end(seg)
    return None


def _targets(seg: Segment, tensors, nodes) -> tuple:
  """The segment's targets: the realize's own, realize.later's and the tensors the segment wrote, as idents
  ("S", slot) / ("W", write), in the order an eager realize would take them (its schedule's key depends on it)."""
  rz = _m["realize"]
  order: list = []
  wnodes = {id(v[1].node): v[0] for v in seg.written.values()} if nodes is not None and seg.mode == REC else {}

  def done(n) -> bool: return n.buffer is not None or n.op in ("BUFFER", "CONST")
  # a parameter written through `p.data` (realize.later's): the write into its detached alias
  bases = {id(b): v[0] for v in seg.written.values() if (b := _detached_base(v[1])) is not None}

  def tensor(t, what: str) -> None:
    k = _slot_of(seg, t)
    if k is not None: order.append(("S", k))
    elif (w := seg.written.get(id(t))) is not None and w[1] is t: order.append(("W", w[0]))
    elif id(t) in bases: order.append(("W", bases[id(t)]))
    elif t._trace is not None or not done(t.node): raise Untraceable(f"a {what} of a tensor from outside the segment")

  for t in tensors or (): tensor(t, "realize")
  for n in nodes or ():
    if done(n): continue
    if id(n) in wnodes:
      order.append(("W", wnodes[id(n)]))
      continue
    k = next((k for k, m in seg.snodes.items() if m is n), None) if seg.mode == REC else None
    if k is None: raise Untraceable("a realize of a node from outside the segment")
    order.append(("S", k))
  for r in seg.later + list(rz._later.values()):   # (left there: a realize the replay leaves to eager takes them)
    t = r()
    if t is not None: tensor(t, "pending realize")
  order.extend(("W", w) for w, _t, _k, _v in seg.written.values())   # (a written tensor is always a target)
  seen: set = set()
  return [i for i in order if not (i in seen or seen.add(i))]


def _trace_of(seg: Segment, entry, walked: list, idents: tuple, order: list, nodes_all: list) -> Trace:
  plan = entry.plan if entry is not None else None
  if plan is None: raise Untraceable("the realize left no plan to replay (a copy between devices, or no kernel)")
  where: dict = {}      # id(realized node) -> where a replay finds it: ("X", external place, leaf) / ("H", event, leaf)
  for i, (_t, _n, leaves) in enumerate(seg.ext):
    for j, b in enumerate(leaves): where.setdefault(id(b), ("X", i, j))
  for e, leaves in seg.hleaves:
    for j, b in enumerate(leaves): where.setdefault(id(b), ("H", e, j))
  inputs, stands, outpos, seen = [], [], {}, set()
  j = 0
  for _dev, _k, outs, refs, vals, _last in plan.steps:
    for i, _size, _dtype in outs:
      outpos[i] = j
      j += 1
    for i in refs:
      if i < 0: continue
      if i in seen: continue
      seen.add(i)
      src = where.get(id(walked[i]))
      if src is None:     # a buffer a call read that is no argument (a cached causal mask): the same one, as a
        stands.append((i, walked[i]))   # fusegrad.jit replay reads it
        continue
      inputs.append((i, src))
    for p in vals:
      if type(p) is int: stands.append((p, _Stand(walked[p])))
      elif type(p) is tuple: raise Untraceable("a kernel with a runtime size")
  pos = {id(n): i for i, n in enumerate(walked)}
  outs = {}
  for ident, n in zip(order, nodes_all):
    if id(n) in where and n.buffer is not None and n.op not in ("CONST", "IOTA"): outs[ident] = ("in", where[id(n)])
    elif id(n) in pos and pos[id(n)] in outpos: outs[ident] = ("out", outpos[pos[id(n)]], n.shape, n.dtype, n.device)
    elif not n.src and n.op in ("CONST", "IOTA") and n.buffer is None: outs[ident] = ("node", n)
    else: raise Untraceable(f"a target ({n.op} {list(n.shape)}) that the plan does not compute")
  slot_out = {k: outpos[pos[id(n)]] for k, n in seg.snodes.items() if id(n) in pos and pos[id(n)] in outpos}
  # an external's lazy graph the plan computes (a fresh model's initial weights) is realized by an eager realize
  # (its node keeps the buffer, and later steps read it): a replay does the same
  ext_out, seen_n = [], set()
  for i, (_t, n, _l) in enumerate(seg.ext):
    if id(n) not in seen_n and id(n) in pos and pos[id(n)] in outpos:
      seen_n.add(id(n))
      ext_out.append((i, outpos[pos[id(n)]]))
  return Trace(tuple(seg.events), plan, len(walked), tuple(inputs), tuple(stands), idents, outs, slot_out,
               tuple(ext_out))


def _launch(seg: Segment, tr: Trace) -> None:
  """The replay's realize: the plan launched on the current inputs, its results bound to the targets."""
  run = tr.prepared
  if run is None or run.width != config.BEAM:
    nodes: list = [None] * tr.size
    for pos, s in tr.stands: nodes[pos] = s
    run = tr.prepared = tr.plan.prepare(nodes, [pos for pos, _src in tr.inputs],
                                        {how[1] for how in tr.outs.values() if how[0] == "out"} |
                                        {j for _i, j in tr.ext_out})
  made = run.launch([_source(seg, src).buffer for _pos, src in tr.inputs])
  for i, j in tr.ext_out: _m["realize"]._set_result(seg.ext[i][1], made[j])
  stats["replays"] += 1
  _unhide(seg)
  phs: dict = {}   # slot -> the tensors that stand for it now (an in-place op makes a tensor stand for its result)
  for k, w in seg.slots.values(): phs.setdefault(k, []).append(w)
  freed = frozenset().union(*(d[0].freed for d in seg.done if d[0].kind == "backward" and not d[0].key[2]))
  seg.launched = (tr, run, run.gen, freed)
  _depth[0] += 1     # (the writes below are the step's own, made now)
  try:
    _bind_all(seg, tr, made, phs, freed)
  finally:
    _depth[0] -= 1


def _source(seg: Segment, src: tuple):
  """The realized node a replay reads where the recording read one (Trace.inputs)."""
  if src[0] == "X": return seg.ext[src[1]][2][src[2]]
  return seg.done[src[1]][3][src[2]]


def _bind_all(seg: Segment, tr: Trace, made: list, phs: dict, freed: frozenset) -> None:
  alias, gn = _m["alias"], _m["gn"]
  written = {v[0]: v for v in seg.written.values()}
  for ident, how in tr.outs.items():
    if how[0] == "out": node = gn.buffer_node(made[how[1]], how[3], how[2], how[4])
    elif how[0] == "in": node = _source(seg, how[1])
    else: node = how[1]
    if ident[0] == "S":
      for w in phs.get(ident[1], ()):
        p = w()
        if p is not None and p._trace is not None: _bind(p, node, freed)
    else:
      _w, t, _k, value = written[ident[1]]
      alias.write_node(t, node)
      if value is not None and value._trace is not None: _bind(value, node, freed)


def _bind(p, node, freed: frozenset) -> None:
  """A placeholder the plan computed: its realized value. Its autograd graph, if it has one, is made when first
  needed (its _ctx stays unset: `materialize`), unless a backward of the step freed it (its slot is in `freed`: the
  recording's backward went through it; a GAN's generated batch, detached for the discriminator's backward, is
  not): a backward through it then raises, as torch's does."""
  autograd = _m["autograd"]
  p.node, p._alias = node, None
  if p.requires_grad and not p._trace.leaf:
    if p._trace.slot not in freed: return
    p._ctx = ("CONTIGUOUS", None, (), autograd._FREED, next(autograd._seq))
  else: p._ctx = None
  p._trace = None
  p.__class__ = _m["Tensor"]


def _end(seg: Segment) -> None:
  """The segment is over: its results are plain tensors again; placeholders still alive stay placeholders (made on
  first use: `materialize`), so the segment keeps what making them needs, and nothing else."""
  if _seg[0] is seg: _seg[0] = None
  _unhide(seg)
  _ends[0] += 1
  if _ext_memo:   # (a graph the last two steps did not pass is not kept)
    for key in [key for key, m in _ext_memo.items() if m[4] < _ends[0] - 2]: del _ext_memo[key]
  Tensor = _m["Tensor"]
  keep = {}
  for key, (k, w) in seg.slots.items():
    t = w()
    if t is None: continue
    if t._trace is None:
      if type(t) is _Traced: t.__class__ = Tensor
    else: keep[key] = (k, w)
  seg.slots = keep
  seg.written.clear()
  seg.snodes.clear()
  seg.hleaves = []
  seg.events = []
  seg.later.clear()
  if not keep: _forget(seg)   # (else seg.done, which holds only the events' externals, makes the placeholders)


def _forget(seg: Segment) -> None:
  seg.done = []
  seg.ext = []
  seg.ext_first.clear()
  seg.t_first.clear()


# ---- the placeholder class -----------------------------------------------------------------------------------------

_OPS = ("__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ __floordiv__ __rfloordiv__ "
        "__mod__ __rmod__ __pow__ __rpow__ __matmul__ __rmatmul__ __neg__ __pos__ __abs__ __invert__ __and__ "
        "__rand__ __or__ __ror__ __xor__ __rxor__ __lshift__ __rshift__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ "
        "__getitem__").split()
# methods that are not events: they are no pure function of their arguments, answer from metadata, or read values
_NOT_EVENTS = {"backward", "numpy", "realize", "item", "tolist", "size", "dim", "numel", "nelement", "element_size",
               "is_floating_point", "retain_grad", "register_hook", "register_post_accumulate_grad_hook",
               "data_ptr", "storage", "untyped_storage", "is_contiguous", "stride", "storage_offset", "type",
               "get_device", "is_complex", "is_signed", "record_stream", "pin_memory", "is_pinned", "is_shared",
               "new_tensor"}


_MADE_ON_USE = ("node", "_ctx", "_alias")   # a placeholder's unset slots: reading one makes it


def _make_traced():
  Tensor = _m["Tensor"]

  class _Traced(Tensor):
    """A segment's result: its methods are the trace's events; a placeholder (node not set) answers its shape,
    dtype and device and is made (`materialize`) when anything else needs its node."""
    __slots__ = ()

    def __getattr__(self, name):
      if name in _MADE_ON_USE and object.__getattribute__(self, "_trace") is not None:
        materialize(self)
        return object.__getattribute__(self, name)
      raise AttributeError(f"'Tensor' object has no attribute '{name}'")

    @property
    def shape(self):
      ph = self._trace
      return ph.shape if ph is not None else self.node.shape

    @property
    def dtype(self):
      ph = self._trace
      return ph.dtype if ph is not None else self.node.dtype

    @property
    def device(self):
      ph = self._trace
      return ph.device if ph is not None else self.node.device

    @property
    def ndim(self): return len(self.shape)

    @property
    def is_leaf(self):
      ph = self._trace
      return ph.leaf if ph is not None else self._ctx is None

    def _assign(self, r):
      ph = self._trace
      if ph is None or _seg[0] is not ph.seg: return Tensor._assign(self, r)
      if self.requires_grad and ph.leaf and _m["autograd"].grad_enabled():
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
      _m["alias"].write(self, r)    # (the trace follows it, or makes the segment's tensors first)
      return self

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
      if gradient is None and not create_graph and inputs is None and enabled() and \
         self.requires_grad and backward(self, retain_graph):
        return None
      return Tensor.backward(self, gradient, retain_graph, create_graph, inputs)

    def numpy(self):
      if self._trace is not None and _seg[0] is self._trace.seg and enabled(): on_realize(tensors=[self])
      return Tensor.numpy(self)

    def realize(self):
      if _seg[0] is not None and enabled() and on_realize(tensors=[self]): return self
      return Tensor.realize(self)

  def method(name, real):
    def m(self, *args, **kwargs):
      if not enabled(): return real(self, *args, **kwargs)
      return call("method", name, real, (self,) + args, kwargs)
    m.__name__, m.__qualname__, m.__doc__ = name, f"Tensor.{name}", real.__doc__
    return m

  for name, v in vars(Tensor).items():
    if not callable(v) or isinstance(v, (staticmethod, classmethod, type, property)): continue
    if name in _OPS or not (name.startswith("_") or name.endswith("_") or name in _NOT_EVENTS):
      setattr(_Traced, name, method(name, v))
  return _Traced


def traced_function(fn):
  """A module-level frontend function (nn.functional's) that is an event when called at the top level."""
  import functools

  @functools.wraps(fn)
  def f(*args, **kwargs):
    if not enabled(): return fn(*args, **kwargs)
    return call("fn", f, fn, args, kwargs)
  f.__traced__ = fn
  return f


_Traced = None
_FG_FUNCTIONS = ("cat", "stack", "concatenate", "concat", "einsum", "where", "zeros_like", "ones_like", "empty_like",
                 "full_like", "rand_like", "randn_like", "randint_like", "multinomial", "tensordot", "gather",
                 "index_select", "masked_fill", "scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy",
                 "index_fill", "index_put", "take", "take_along_dim", "masked_select", "masked_scatter", "nonzero",
                 "argwhere", "repeat_interleave", "roll", "tensor_split")
_PRIVATE_F = ("_convnd", "_conv_transposend", "_max_poolnd", "_avg_poolnd")   # what nn's layers call


def install() -> None:
  """The placeholder class, and nn.functional's functions as events (fusegrad/__init__.py calls this once)."""
  global _Traced
  import types
  from fusegrad import autograd, alias, dtype as dt
  from fusegrad.engine import jit, track, realize
  from fusegrad.graph import dims, node as gn
  from fusegrad.runtime import device as rd
  from fusegrad.tensor import Tensor, _draw_keys
  from fusegrad.templates import _node_key, _spec, rebuild
  _m.update(spec=_spec, rebuild=rebuild, grad_state=autograd._state, node_slot=Tensor.node, autograd=autograd,
            alias=alias, dt=dt, jit=jit, track=track, realize=realize, dims=dims, gn=gn, Tensor=Tensor,
            node_key=_node_key, draw_keys=lambda g, n, dev: _draw_keys(g, n, dev).node, rd=rd)
  _Traced = _make_traced()
  import fusegrad as fg
  for name in _FG_FUNCTIONS:   # fusegrad.cat, stack, where, the *_like factories, the indexing functions
    v = getattr(fg, name, None)
    if isinstance(v, types.FunctionType) and not hasattr(v, "__traced__"): setattr(fg, name, traced_function(v))
  from fusegrad.nn import functional as F
  for name, v in list(vars(F).items()):
    if not isinstance(v, types.FunctionType) or hasattr(v, "__traced__"): continue
    if not (v.__module__ or "").startswith("fusegrad"): continue
    if name.startswith("_") and name not in _PRIVATE_F: continue
    setattr(F, name, traced_function(v))
