"""Capture a step once, replay its kernels: `fusegrad.jit`.

A training step builds the same graph every iteration: the Python that records it, schedules it and
looks up its kernels costs more than the kernels of a small model. `fusegrad.jit(step)` runs the
step eagerly twice — the first call creates what later calls update (optimizer moments, running
statistics), the second records every kernel launched, every buffer it read and wrote, and every
host-side value written into a buffer — and from the third call on only launches those kernels.

What a replay reads and writes:
  * the tensor arguments: each call's tensors are bound in place of the captured ones (shapes,
    dtypes and devices are part of the cache key, with the non-tensor arguments and the grad mode;
    a new key is warmed up and captured on its own);
  * the returned tensors: computed into fresh buffers each call (a kept result stays valid);
  * state: a tensor that existed before the step and that the step updated in place (`p._assign`,
    `+=`, `copy_`, an optimizer's step, BatchNorm's running statistics; a write through a view updates
    its base, and the base is the state: its views follow it at each replay). Each state tensor owns
    two buffers and a replay reads the current one and writes the other, never a buffer that a
    live tensor still holds, so a value read before a step stays what it was;
  * host values registered with `host()` (an optimizer's step count and learning rate, random
    number keys) are recomputed and written at their place in the replay; Python state that the step
    changes through `host()` is changed again by every replay, exactly as the eager step changes it
    (a learning-rate scheduler stepped inside the step, `Module.train()/eval()`, `manual_seed`), and
    `host_read()` hands host code a value the replay computed (ReduceLROnPlateau's metric).
Everything else the step computed is an internal buffer of the capture: `.grad` and other tensors
the step left behind are not updated by replays. Python control flow is frozen at the capture (the
code does not run again), and a registered `guard()` that fails drops the capture (an optimizer
whose hyperparameters change structure); `invalidate()` drops every capture (an optimizer loaded
from a state dict).
"""
from __future__ import annotations
import functools
import threading
import weakref
from collections import OrderedDict
from fusegrad.engine import track

_local = threading.local()
_generation = [0]
MAX_CAPTURES = 8


def invalidate() -> None:
  """Forget every capture: the next call of each jitted function warms up and captures again."""
  _generation[0] += 1


def recorder() -> "_Recorder | None":
  return getattr(_local, "rec", None)


_watched: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def watch(obj) -> None:
  """obj._jit_state() -> {name: value} is Python state that only host code run through `host()` may change
  inside a captured step (an optimizer's hyperparameters: a scheduler changes them through host(), and its
  change is repeated by replays); a change made by the step's own Python is refused at the capture."""
  _watched[id(obj)] = obj


def _snapshot() -> dict:
  return {k: (o, o._jit_state()) for k, o in list(_watched.items())}


def _same(a, b) -> bool:
  try:
    return a is b or (type(a) is type(b) and bool(a == b))
  except Exception:   # a value without a plain equality (an array): only the same object is the same
    return False


# host reads and host code run so far in this process (graph templates, graph/template.py, refuse code that does
# either: a template makes nodes, it runs no host code)
host_reads = [0]


def host(fn) -> None:
  """Run fn (host code that writes values into device buffers, or that changes Python state the step's
  later host code reads) now, and again at this point of every replay of a step being captured. Host code
  that fn runs through host() itself is repeated by fn, not recorded twice (a scheduler stepping others)."""
  host_reads[0] += 1   # (as a read: graph templates refuse code that runs host code)
  rec = getattr(_local, "rec", None)
  if rec is None or not rec.recording or rec.depth:
    fn()
    return
  rec.check_python()
  rec.depth += 1
  try:
    fn()
  finally:
    rec.depth -= 1
  rec.items.append(("host", fn))
  rec.snap = _snapshot()


def host_read(t, fn) -> None:
  """fn(value of tensor t as a numpy array) now, and at this point of every replay with the value that replay
  computed: host code that decides on a value of the step (ReduceLROnPlateau's metric)."""
  import numpy as np
  rec = getattr(_local, "rec", None)
  t.realize()
  n = t.node
  buf = n.buffer
  if buf is None:   # a constant: the same value at every replay
    value = np.full(t.shape, n.arg, dtype=t.dtype.np)
    host(lambda: fn(value))
    return
  if rec is None or not rec.recording or rec.depth:
    fn(buf.numpy().reshape(t.shape))
    return
  rec.check_python()
  rec.depth += 1
  try:
    fn(buf.numpy().reshape(t.shape))
  finally:
    rec.depth -= 1
  rec.items.append(("read", buf, t.shape, fn))
  rec.snap = _snapshot()




def check_read(t) -> None:
  """Tensor.numpy() inside a step being captured: a value the step computed (or state it reads) is frozen on
  the host at the capture, and whatever the step's Python did with it is not repeated by replays."""
  host_reads[0] += 1
  rec = getattr(_local, "rec", None)
  if rec is None or not rec.recording or rec.depth: return
  b = t.node.buffer
  if b is not None and id(b) in rec.inputs: return   # an argument's own values (a target's class range check)
  raise RuntimeError(f"fusegrad.jit: the step reads the value of a tensor of shape {tuple(t.shape)} on the host "
                     "(.item(), .numpy(), .tolist(), float(), bool(), print...); a replay does not run the step's "
                     "Python, so that value and what the step does with it would stay those of the capture. Return "
                     "the tensor from the step and read it outside")


def note_module(m) -> None:
  """Module.__call__: the module's training mode selects the step's kernels (dropout, batch statistics); a
  replay is valid only while it is the mode the capture ran the module in (unless the step itself set it), and
  while its Python settings (a dropout's p, an eps) and which of its parameters need a gradient are the capture's."""
  rec = getattr(_local, "rec", None)
  if rec is None or not rec.recording: return
  if id(m) not in rec.mode_set and id(m) not in rec.modes: rec.modes[id(m)] = (weakref.ref(m), m.training)
  if id(m) not in rec.module_states: rec.module_states[id(m)] = (weakref.ref(m), _module_state(m))


def _module_state(m) -> tuple:
  """What of a module the step's graph was built from besides its tensors and mode: its Python numbers and
  strings, and which of its own parameters require a gradient."""
  d = m.__dict__
  return (tuple((k, v) for k, v in d.items() if k != "training" and isinstance(v, _SCALARS)),
          tuple((k, p is not None and p.requires_grad) for k, p in d.get("_parameters", {}).items()))


def note_mode_set(modules) -> None:
  """Module.train() inside a step being captured: the step sets these modules' mode itself (a host item)."""
  rec = getattr(_local, "rec", None)
  if rec is not None and rec.recording: rec.mode_set.update(id(m) for m in modules)


def guard(fn) -> None:
  """While a step is being captured: fn() must stay true for a replay to be valid; checked before
  every replay, and a capture whose guard fails is dropped (the call runs eagerly and captures again)."""
  rec = getattr(_local, "rec", None)
  if rec is not None and rec.recording: rec.guards.append(fn)


def note_rebind(t) -> None:
  """alias.write tells the recorder about each in-place update (the candidates for state: the base tensor of
  the storage written, whichever view the write went through)."""
  rec = getattr(_local, "rec", None)
  if rec is not None and id(t) not in rec.rebound: rec.rebound[id(t)] = (weakref.ref(t), t.node)


class _Recorder:
  def __init__(self, recording: bool):
    self.recording = recording
    self.items: list = []        # ("kernel", dev, program, kernel, src, [Buffer], [param handle]) | ("copy", src, dst)
                                 # | ("host", fn)
                                 # | ("read", Buffer, shape, fn)
    self.written: dict = {}      # id(Buffer) -> Buffer, for buffers a recorded item wrote
    self.rebound: dict = {}      # id(tensor) -> (weakref to it, its node before the first in-place update)
    self.guards: list = []
    self.inputs: set = set()     # id(Buffer) of the arguments
    self.depth = 0               # > 0 while host code registered with host() runs
    self.snap = _snapshot() if recording else {}
    self.error: "str | None" = None
    self.modes: dict = {}        # id(module) -> (weakref, training) for modules called in a mode the step did not set
    self.module_states: dict = {}   # id(module) -> (weakref, _module_state at its first call) for modules called
    self.mode_set: set = set()

  def check_python(self) -> None:
    """Record the first watched value that the step's Python changed since the last host item (not through one)."""
    now = _snapshot()
    if self.error is None:
      for k, (obj, state) in now.items():
        if k not in self.snap or self.snap[k][0] is not obj: continue
        old = self.snap[k][1]
        for name, v in state.items():
          if name in old and not _same(old[name], v):
            self.error = (f"fusegrad.jit: the step changed {type(obj).__name__}.{name} from {old[name]!r} to {v!r} in "
                          "Python; a replay does not run the step's Python, so the value would stay the capture's. "
                          "Change it with a learning-rate scheduler stepped inside the step (replays step it again) "
                          "or outside the jitted function")
            break
        if self.error is not None: break
    self.snap = now

  def kernel(self, dev, program, kernel, src, bufs: list, n_out: int, params: list = ()) -> None:
    """A launch: its buffers (outputs first) and its Params' handles (the values of the capture)."""
    if not self.recording: return
    self.items.append(("kernel", dev, program, kernel, src, list(bufs), list(params)))
    for b in bufs[:n_out]: self.written[id(b)] = b

  def runtime_size(self, name: str) -> None:
    """A kernel of the step loops over a dimension sized at run time (graph/dims.Variable): its value is the
    capture's, which a replay cannot follow -- refused rather than replayed stale."""
    if self.recording and self.error is None:
      self.error = (f"fusegrad.jit: the step sizes a dimension by a Variable (kernel {name}); a replay would keep "
                    f"the captured size. Call the step without fusegrad.jit")

  def copy(self, src, dst) -> None:
    if not self.recording: return
    self.items.append(("copy", src, dst))
    self.written[id(dst)] = dst


class jit:
  """Decorator: `step = fusegrad.jit(step)`; see the module docstring for what a replay updates."""

  def __init__(self, fn):
    self.fn = fn
    self._captures: "OrderedDict[tuple, object]" = OrderedDict()
    # one call at a time: a replay writes the capture's internal buffers, and a warm-up or capture changes
    # _captures (re-entrant only so that a nested call reaches the recorder check below and its error)
    self._lock = threading.RLock()
    functools.update_wrapper(self, fn)

  def __get__(self, obj, objtype=None):   # decorating a method: bind like a function would
    return self if obj is None else functools.partial(self.__call__, obj)

  def reset(self) -> None:
    """Forget this function's captures."""
    with self._lock: self._captures.clear()

  def __call__(self, *args, **kwargs):
    with self._lock: return self._call(*args, **kwargs)

  def _call(self, *args, **kwargs):
    from fusegrad.tensor import Tensor
    from fusegrad import autograd
    if recorder() is not None:
      raise RuntimeError("fusegrad.jit: a jitted function was called while another one is being captured")
    args, kwargs, tensors, key = _flatten_args(args, kwargs, Tensor)
    key = (key, autograd.grad_enabled(), _generation[0])
    entry = self._captures.get(key)
    if isinstance(entry, _Capture) and not all(g() for g in entry.guards):
      entry = None      # warm up again: the changed step may create state (a momentum buffer) on its first call
      del self._captures[key]
    if isinstance(entry, _Capture):
      self._captures.move_to_end(key)
      return entry.replay(tensors)
    for t in tensors: t.realize()
    if entry is None:   # first call: eager, and whatever it updated in place is realized (state)
      self._captures[key] = "warm"
      if len(self._captures) > MAX_CAPTURES: self._captures.popitem(last=False)
      return _run(self.fn, args, kwargs, _Recorder(recording=False))[0]
    rec = _Recorder(recording=True)
    inputs = [t.node.buffer for t in tensors]    # before the step runs: it may rebind an argument
    rec.inputs = {id(b) for b in inputs}
    out, outs, states = _run(self.fn, args, kwargs, rec)
    try:
      self._captures[key] = _Capture(rec, inputs, out, outs, states)
    except _Shared:
      if entry != "warm": raise NotImplementedError("fusegrad.jit: two tensors updated in place by the step share "
                                                    "storage") from None
      _unshare(states)    # state created by the first call can alias (amsgrad's first maximum is the variance)
      self._captures[key] = "unshared"
    return out


def _run(fn, args, kwargs, rec: _Recorder):
  """Call fn with rec active; realize its tensor results and the live tensors it updated in place."""
  from fusegrad.tensor import Tensor
  from fusegrad.engine.realize import realize
  scalars = _python_scalars(fn, args) if rec.recording else None
  _local.rec = rec
  try:
    out = fn(*args, **kwargs)
    outs = _flatten_out(out, Tensor)
    states = [t for t in (r() for r, _ in rec.rebound.values()) if t is not None]
    realize(*[t.node for t in outs + states])
    if rec.recording: rec.check_python()
  finally:
    _local.rec = None
  if rec.recording:
    if rec.error is not None: raise RuntimeError(rec.error)
    for name, v in _python_scalars(fn, args).items():
      if name in scalars and not _same(scalars[name], v):
        raise RuntimeError(f"fusegrad.jit: the step changed {name} from {scalars[name]!r} to {v!r}; a replay does not "
                           "run the step's Python, so it would not change it again (nor any value computed from it). "
                           "Keep such counters outside the jitted function, or in a tensor the step updates in place")
    if _has_scalars(out):
      raise RuntimeError("fusegrad.jit: the step returns a Python value that is not a tensor; a replay does not run "
                         "the step's Python and would return the capture's value again. Return tensors")
    if rec.modes:
      modes = list(rec.modes.values())
      rec.guards.append(lambda: all(m() is None or m().training == t for m, t in modes))
    # the Python numbers the step names and the modules' settings: a replay runs none of the Python that read them,
    # so a value changed between calls (a global temperature, a dropout's p, a layer frozen by requires_grad_)
    # drops the capture, and the call runs eagerly and captures again
    selfarg = args[:1] if args and not isinstance(args[0], Tensor) else ()
    names = _python_scalars(fn, selfarg)
    rec.guards.append(lambda: _same_scalars(names, _python_scalars(fn, selfarg)))
    mods = list(rec.module_states.values())
    for ref, st in mods:
      m = ref()
      if m is not None and _module_state(m) != st:
        raise RuntimeError(f"fusegrad.jit: the step changed the settings of a {type(m).__name__} it called "
                           f"({st} -> {_module_state(m)}); a replay does not run the step's Python, so it would not "
                           "change them again. Change them outside the jitted function")
    rec.guards.append(lambda: all(r() is None or _module_state(r()) == st for r, st in mods))
  from fusegrad.graph import node as gn
  from fusegrad import alias
  for t in states:   # a realized constant would still fold into the next step's graph as a literal: make it data
    if t.node.op == "CONST": alias.set_node(t, gn.buffer_node(t.node.buffer, t.dtype, t.shape, t.device))
  return out, outs, states


_SCALARS = (bool, int, float, complex, str, bytes)


def _same_scalars(a: dict, b: dict) -> bool:
  return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


def _has_scalars(out) -> bool:
  """A Python number (or string) among the step's results: the capture's value would be returned by every replay."""
  if isinstance(out, _SCALARS): return True
  if isinstance(out, (list, tuple)): return any(_has_scalars(v) for v in out)
  if isinstance(out, dict): return any(_has_scalars(v) for v in out.values())
  return False


def _python_scalars(fn, args) -> dict:
  """The Python numbers (and strings) the step's code refers to: globals it names, its closure's cells, and the
  attributes of `self` for a method; a step that changes one (a counter) cannot be replayed."""
  out: dict = {}
  f = getattr(fn, "__func__", fn)
  code = getattr(f, "__code__", None)
  if code is None: return out
  g = getattr(f, "__globals__", {})
  for name in code.co_names:
    v = g.get(name)
    if isinstance(v, _SCALARS): out[f"the global {name!r}"] = v
  for name, cell in zip(code.co_freevars, getattr(f, "__closure__", None) or ()):
    try:
      v = cell.cell_contents
    except ValueError:
      continue
    if isinstance(v, _SCALARS): out[f"the variable {name!r}"] = v
  self_obj = getattr(fn, "__self__", None)
  if self_obj is None and code.co_argcount and code.co_varnames[0] == "self" and args: self_obj = args[0]
  for name, v in (getattr(self_obj, "__dict__", None) or {}).items():
    if isinstance(v, _SCALARS): out[f"self.{name}"] = v
  return out


class _Shared(Exception):
  """Two state tensors read one buffer: a capture cannot tell their reads apart."""


def _unshare(states: list) -> None:
  """Give state tensors that share a buffer copies of their own, so that a capture can tell what each reads."""
  from fusegrad.graph import node as gn
  from fusegrad.runtime import device as rd
  seen: set = set()
  for t in states:
    b = t.node.buffer
    if b is None: continue
    if id(b) in seen:
      nb = rd.Buffer(b.device, b.size, b.dtype)
      if b.size: nb.copyin(b.numpy())
      from fusegrad import alias
      alias.set_node(t, gn.buffer_node(nb, t.dtype, t.shape, t.device))
    seen.add(id(b))


def _flatten_args(args, kwargs, Tensor):
  """numpy arrays become tensors; returns (args, kwargs, tensor leaves in order, hashable key)."""
  import numpy as np
  tensors: list = []
  def walk(x):
    if isinstance(x, np.ndarray): x = Tensor(x)
    if isinstance(x, Tensor):
      tensors.append(x)
      return x, ("T", x.shape, x.dtype, x.device)
    if isinstance(x, (list, tuple)):
      pairs = [walk(v) for v in x]
      return type(x)(p[0] for p in pairs), (type(x).__name__, tuple(p[1] for p in pairs))
    if isinstance(x, dict):
      pairs = {k: walk(v) for k, v in x.items()}
      return {k: p[0] for k, p in pairs.items()}, ("dict", tuple((k, p[1]) for k, p in pairs.items()))
    try:
      hash(x)
    except TypeError:
      raise TypeError(f"fusegrad.jit: arguments must be tensors, arrays or hashable values (they key the capture); "
                      f"got {type(x).__name__}") from None
    return x, ("V", type(x), x)
  args2, akey = walk(tuple(args))
  kw = {k: walk(v) for k, v in kwargs.items()}
  return args2, {k: p[0] for k, p in kw.items()}, tensors, (akey, tuple((k, p[1]) for k, p in sorted(kw.items())))


def _flatten_out(out, Tensor) -> list:
  if isinstance(out, Tensor): return [out]
  if isinstance(out, (list, tuple)): return [t for v in out for t in _flatten_out(v, Tensor)]
  if isinstance(out, dict): return [t for v in out.values() for t in _flatten_out(v, Tensor)]
  return []


def _rebuild_out(out, fresh: list, Tensor):
  """out's structure with its tensors replaced, in order, by the tensors in fresh."""
  if isinstance(out, Tensor): return fresh.pop(0)
  if isinstance(out, (list, tuple)):
    vals = [_rebuild_out(v, fresh, Tensor) for v in out]
    return type(out)(*vals) if hasattr(out, "_fields") else type(out)(vals)
  if isinstance(out, dict): return {k: _rebuild_out(v, fresh, Tensor) for k, v in out.items()}
  return out


class _State:
  """A tensor the step updates in place: the captured buffers it was read from and written to, and the
  two buffers it alternates between in replays."""
  __slots__ = ("tensor", "before", "after", "owned", "handed")

  def __init__(self, tensor, before, after):
    self.tensor, self.before, self.after = tensor, before, after
    self.owned = [after, None]                 # the captured output buffer and a twin made on first need
    self.handed: list = [[], []]               # weakrefs to the nodes that hold each owned buffer

  def target(self, cur):
    """A buffer to write this replay's value to: an owned one that is not cur and that nothing still reads."""
    from fusegrad.runtime import device as rd
    for i in (0, 1):
      b = self.owned[i]
      if b is cur: continue
      if b is not None and all(r() is None for r in self.handed[i]):
        self.handed[i] = []
        return i, b
    i = 1 if self.owned[0] is cur else 0
    self.owned[i] = rd.Buffer(self.after.device, self.after.size, self.after.dtype)
    self.handed[i] = []
    return i, self.owned[i]


class _Capture:
  def __init__(self, rec: _Recorder, inputs: list, out, outs: list, states: list):
    self.items, self.guards, self.out = rec.items, rec.guards, out
    written = rec.written
    self.inputs = inputs
    input_ids = {id(b) for b in self.inputs}
    self.states: list[_State] = []
    claimed: set = set()
    for t in states:
      before = rec.rebound[id(t)][1]
      after = t.node.buffer
      if before.buffer is None or id(before.buffer) in written or after is before.buffer: continue   # made in the step
      if id(before.buffer) in input_ids:
        raise NotImplementedError("fusegrad.jit: the step updates one of its tensor arguments in place; pass it as "
                                  "state the step owns (a module buffer, a global) or return the new value")
      if id(after) not in written:
        raise NotImplementedError(f"fusegrad.jit: a tensor of shape {tuple(t.shape)} was set in place to a value the "
                                  "step did not compute (an argument or an existing tensor); copy it with .clone()")
      if id(after) in claimed or id(before.buffer) in claimed: raise _Shared()
      claimed.update((id(after), id(before.buffer)))
      st = _State(t, before.buffer, after)
      st.handed[0].append(weakref.ref(t.node))   # the step's own node holds the captured buffer too
      self.states.append(st)
    state_after = {id(s.after) for s in self.states}
    # results: written by a kernel of the step -> a fresh buffer each call; anything else is copied
    self.outs = []
    for t in outs:
      b = t.node.buffer
      fresh = id(b) in written and id(b) not in state_after
      self.outs.append((b, fresh, t.dtype, t.shape, t.device))
    self.prepared = None   # (the ids of the buffers a replay substitutes, the items with kernel runs prepared)

  def _prepare(self) -> tuple:
    subs = list(dict.fromkeys([id(b) for b in self.inputs] + [id(b) for s in self.states for b in (s.before, s.after)] +
                              [id(b) for b, fresh, *_x in self.outs if fresh]))
    return subs, _prepare_items(self.items, subs)

  def replay(self, tensors: list):
    from fusegrad.tensor import Tensor
    from fusegrad.graph import node as gn
    from fusegrad.runtime import device as rd
    from fusegrad.engine.realize import launch
    from fusegrad.alias import set_node
    sub: dict = {}
    for cap, t in zip(self.inputs, tensors):
      if not t.node.realized: t.realize()
      sub[id(cap)] = t.node.buffer
    targets = []
    for s in self.states:
      t = s.tensor
      if not t.node.realized: t.realize()
      cur = t.node.buffer
      if cur.size != s.before.size or cur.dtype != s.before.dtype:
        raise RuntimeError(f"fusegrad.jit: a state tensor changed size or dtype since the capture "
                           f"({s.before.size} {s.before.dtype.name} -> {cur.size} {cur.dtype.name})")
      i, b = s.target(cur)
      sub[id(s.before)] = cur
      sub[id(s.after)] = b
      targets.append(i)
    results = []
    for b, fresh, dtype, shape, device in self.outs:
      if fresh:
        nb = rd.Buffer(b.device, b.size, dtype)
        sub[id(b)] = nb
        results.append(nb)
      else:
        results.append(None)
    timed = track.wants_timing()
    if not timed:
      if self.prepared is None: self.prepared = self._prepare()
      subs, runs = self.prepared
      handles = [sub[i].handle for i in subs]
    for item in (self.items if timed else runs):
      kind = item[0]
      if kind == "run":
        item[1].run_prepared(item[2], handles)
        continue
      if kind == "kernel":
        _, dev, program, kernel, src, bufs, params = item
        launch(dev, program, kernel, src, [sub.get(id(b), b).handle for b in bufs] + params)
        continue
      if kind == "host":
        item[1]()
      elif kind == "read":
        _, b, shape, fn = item
        fn(sub.get(id(b), b).numpy().reshape(shape))
      else:
        _, src, dst = item
        sub.get(id(dst), dst).copyin(sub.get(id(src), src).numpy())
    for s, i in zip(self.states, targets): set_node(s.tensor, _owned_node(s, i, s.tensor))   # its views follow
    fresh_tensors = []
    for (b, fresh, dtype, shape, device), nb in zip(self.outs, results):
      if nb is None:   # not computed into a buffer of its own (an argument, a state, a constant): a copy
        src = sub.get(id(b), b)
        nb = rd.Buffer(src.device, src.size, dtype)
        if src.size: nb.copyin(src.numpy())
      fresh_tensors.append(Tensor(_node=gn.buffer_node(nb, dtype, shape, device)))
    return _rebuild_out(self.out, fresh_tensors, Tensor)


def _prepare_items(items: list, subs: list) -> list:
  """A capture's items with each run of consecutive kernels of one device made ready to launch at once
  (device.Batches): ("run", device, batch); a buffer in subs (id(buffer) of those a replay substitutes: arguments,
  states, fresh results) is patched in by its place there."""
  from fusegrad.runtime import device as rd
  at = {b: k for k, b in enumerate(subs)}
  out: list = []
  batches = rd.Batches()
  for item in items:
    if item[0] != "kernel":
      out += [("run", dev, b) for dev, b in batches.end()]
      out.append(item)
      continue
    _, dev, program, kernel, _src, bufs, params = item
    batches.add(dev, program, kernel, [rd.Slot(at[id(b)]) if id(b) in at else b.handle for b in bufs] + list(params))
  return out + [("run", dev, b) for dev, b in batches.end()]


def _owned_node(s: _State, i: int, t):
  from fusegrad.graph import node as gn
  n = gn.buffer_node(s.owned[i], t.dtype, t.shape, t.device)
  s.handed[i].append(weakref.ref(n))
  return n
