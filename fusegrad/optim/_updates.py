"""Update templates: an optimizer's per-parameter update graph made from a template (graph/template.py).

`Optimizer._update` builds about a dozen frontend ops per parameter each step (a GPT's 28 parameters: ~3 ms of
Python). The graph depends on the parameter's, gradient's, states' and hyperparameter views' structure and on the
group and state entries `_update` reads (`g["weight_decay"]`, `g["initial_accumulator_value"]`, ...: the values
that reach the graph through `_hyper`'s device buffer are not read there, so a scheduler's new learning rate is no
new key). The first update of a key runs `_update` with the group and state watched (which entries it reads) and
`_set_state` recorded (which state it sets, to what); later ones make the nodes from the template and set the
same states through `_set_state` (its in-place writes, version counters and aliasing unchanged). An update that
reads a value on the host, runs host code, or reaches a node made before it (other than a constant) is not
recorded; neither is any update while a `fusegrad.jit` capture records. FUSEGRAD_TEMPLATES=0 turns this off.
"""
from __future__ import annotations
import collections
import functools
import threading
from fusegrad import config, dtype as dt
from fusegrad.engine import jit as _jit, trace as _trace
from fusegrad.graph import dims, node as gn, template
from fusegrad.templates import _inputs_key, _spec

_MAX = 1024
_templates: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()
_reads: dict = {}          # structure key -> the group and state entries updates of that structure read (sorted)
_reads_any: dict = {}      # (optimizer class, state names) -> the entries any update of theirs read (a trace's key)
_lock = threading.Lock()
stats = {"hits": 0, "records": 0}
_NEVER = object()


class _Watch:
  """A dict seen through: which keys were read (get, [], in); writes go to the dict."""
  __slots__ = ("d", "read")

  def __init__(self, d: dict):
    self.d, self.read = d, set()
  def get(self, k, default=None):
    self.read.add(k)
    return self.d.get(k, default)
  def __getitem__(self, k):
    self.read.add(k)
    return self.d[k]
  def __contains__(self, k):
    self.read.add(k)
    return k in self.d
  def __setitem__(self, k, v): self.d[k] = v
  def setdefault(self, k, v):
    self.read.add(k)
    return self.d.setdefault(k, v)
  def _all(self) -> dict:   # a walk over the entries reads every one
    self.read.update(self.d)
    return self.d
  def __iter__(self): return iter(self._all())
  def __len__(self): return len(self._all())
  def keys(self): return self._all().keys()
  def values(self): return self._all().values()
  def items(self): return self._all().items()


def _values(d: dict, keys) -> tuple | None:
  """The entries keys of d by value (a tensor by its place only: its structure is keyed with the inputs)."""
  try:
    return tuple((k, _spec(d[k], []) if k in d else ("missing",)) for k in keys)
  except template.Untemplatable:
    return None


def step_all(opt, work: list) -> list:
  """Optimizer.step's updates, work = [(p, group, state, hyperparameter views)]: each p takes its new value in
  place; the tensors to realize (each p, then its states). A replayed step (engine/trace.py) replays the updates
  whose keys match their recorded events here, in one loop (trace._replay_event); the first that does not, and
  every update of a step not replayed, goes through `step`."""
  out: list = []
  seg = _trace.replaying()
  i = 0
  if seg is not None:
    events, modes, gvs, svs = seg.trace.events, _trace._modes(), {}, {}
    for p, g, state, s in work:
      if seg.pos >= len(events) or seg.mode != _trace.REP: break
      ev = events[seg.pos]
      names = _names(state)
      fk = ev.key[1]
      if ev.kind != "update" or fk[0] is not type(opt) or fk[1] != names or ev.key[4] != modes: break
      reads = _reads_any.get((type(opt), names))
      if reads is None: break
      gv = gvs.get(id(g))
      if gv is None or gv[0] is not reads: gv = gvs[id(g)] = (reads, _values(g, reads[0]))
      hyper = state.get("_scalars", (None, ()))
      sv = svs.get((reads, names))
      if sv is None:   # (entries of the state that are its tensors are keyed by place only: the same for every one)
        sv = _values(state, reads[1])
        if all(k in names for k in reads[1]): svs[(reads, names)] = sv
      if fk[2] != gv[1] or fk[3] != sv or hyper[1] is not s: break
      args = (p, p.grad, hyper[0], tuple(state[k] for k in names))
      tensors = [p, p.grad, hyper[0], *args[3]]
      if not _trace.refs_match(seg, tensors, ev.key[3]): break
      out.append(p)
      out.extend(_trace._replay_event(seg, ev, _real(opt, g, state, s, names), args, {}, tensors))
      i += 1
  for p, g, state, s in work[i:]:
    out.append(p)
    out.extend(step(opt, p, g, state, s))
  return out


def _names(state: dict) -> tuple:
  from fusegrad.tensor import Tensor
  return tuple(sorted(k for k, v in state.items() if isinstance(v, Tensor)))


def _real(opt, g: dict, state: dict, s: tuple, names: tuple):
  """One update as an event's function of its tensor arguments (parameter, gradient, hyperparameters, states): a
  partial, not a closure (a replayed step keeps one per parameter until its end: two objects for the collector to
  scan, not six)."""
  return functools.partial(_apply, opt, g, state, s, names)


def _apply(opt, g: dict, state: dict, s: tuple, names: tuple, p, grad, _hyper, _states) -> list:
  new, states = _run(opt, p, grad.detach(), g, state, s)
  p._assign(new.to(p.dtype))
  if _trace._seg[0] is not None and _names(state) != names:
    _trace.off("an optimizer update that made new state")   # (a replay would not make it)
  return states


def step(opt, p, g: dict, state: dict, s: tuple) -> list:
  """One parameter's update: p takes its new value in place; the state tensors to realize with it. In a step the
  trace follows (engine/trace.py), one event keyed by the update template's key."""
  names = _names(state)
  real = _real(opt, g, state, s, names)
  if not _trace.enabled(): return real(p, p.grad, None, ())
  reads = _reads_any.get((type(opt), names))     # (the inputs' structure is in the event's key already)
  gv = sv = None
  if reads is not None: gv, sv = _values(g, reads[0]), _values(state, reads[1])
  if gv is None or sv is None:
    _trace.off("an optimizer update whose template is not recorded yet")
    return real(p, p.grad, None, ())
  # the hyperparameters' views s are made once over one buffer (Optimizer._scalars): the event is keyed by it
  hyper = state["_scalars"][0] if state.get("_scalars", (None, ()))[1] is s else tuple(s)
  return _trace.call("update", (type(opt), names, gv, sv), real, (p, p.grad, hyper, tuple(state[k] for k in names)), {})


def _key(opt, p, grad, g: dict, state: dict, s: tuple) -> tuple:
  """(the template key, or None while the entries the update reads are unknown; the state names, externals, base)."""
  from fusegrad.tensor import Tensor
  names = tuple(sorted(k for k, v in state.items() if isinstance(v, Tensor)))
  tensors = [p, grad, *s, *(state[k] for k in names)]
  ins, ext = _inputs_key(tensors)
  base = (type(opt), names, ins, dt.default_float)
  reads = _reads.get(base)
  key = None
  if reads is not None:
    gv, sv = _values(g, reads[0]), _values(state, reads[1])
    if gv is not None and sv is not None: key = (base, gv, sv)
  return key, names, ext, base


def _run(opt, p, grad, g: dict, state: dict, s: tuple):
  """opt._update(p, grad, g, state, s), from a template where one fits."""
  from fusegrad.tensor import Tensor
  if not config.TEMPLATES or dims.bound_any[0] or _jit.recorder() is not None: return opt._update(p, grad, g, state, s)
  key, _names, ext, base = _key(opt, p, grad, g, state, s)
  if key is not None:
    tpl = _templates.get(key)
    if tpl is _NEVER: return opt._update(p, grad, g, state, s)
    if tpl is not None:
      stats["hits"] += 1
      entries, new_ref, set_refs, out_states = tpl
      made = template.instantiate(entries, ext, shared=False)   # (nothing builds an update again)
      done = [opt._set_state(state, name, Tensor(_node=template.node_of(r, made, ext))) for name, r in set_refs]
      return Tensor(_node=template.node_of(new_ref, made, ext)), [done[i] for i in out_states]
  return _record(opt, p, grad, g, state, s, base, ext)


def _record(opt, p, grad, g, state, s, base, ext_nodes):
  start, reads = next(gn._seq), _jit.host_reads[0]
  before = dict(state)     # the key holds the state the update read, not the one it leaves
  gw, sw = _Watch(g), _Watch(state)
  sets: list = []
  real = opt._set_state
  def set_state(st, name, value):
    out = real(st.d if isinstance(st, _Watch) else st, name, value)
    sets.append((name, value.node, out))
    return out
  opt._set_state = set_state
  try:
    new, states = opt._update(p, grad, gw, sw, s)
  finally:
    del opt._set_state
  try:
    if _jit.host_reads[0] != reads: raise template.Untemplatable("the update read or wrote values on the host")
    named = {n for n, _v, _o in sets}
    if any(k not in named and (k not in before or v is not before[k]) for k, v in state.items()) or \
       any(k not in state for k in before):
      raise template.Untemplatable("the update changed its state other than through _set_state")
    out_states = []
    for t in states:
      i = next((i for i, (_n, _v, o) in enumerate(sets) if o is t), None)
      if i is None: raise template.Untemplatable("a state the update returns was not set through _set_state")
      out_states.append(i)
    entries, refs = template.record([new.node] + [v for _n, v, _o in sets], ext_nodes, template.made_since(start))
    # the entries read before the update (an entry it sets, read after, is its own value)
    reads_g, reads_s = frozenset(gw.read), frozenset(sw.read)
    with _lock:
      old = _reads.get(base)
      if old is None and len(_reads) >= _MAX: _reads.clear()   # (bounded: the templates it led to stay valid)
      if old: reads_g, reads_s = reads_g | set(old[0]), reads_s | set(old[1])
      _reads[base] = (tuple(sorted(reads_g, key=repr)), tuple(sorted(reads_s, key=repr)))   # sorted once, here
      anyk = (base[0], base[1])
      a = _reads_any.get(anyk, ((), ()))
      _reads_any[anyk] = (tuple(sorted(set(a[0]) | reads_g, key=repr)), tuple(sorted(set(a[1]) | reads_s, key=repr)))
    gv, sv = _values(g, _reads[base][0]), _values(before, _reads[base][1])
    if gv is None or sv is None: raise template.Untemplatable("a group or state entry is no plain value")
    value = (entries, refs[0], tuple((n, r) for (n, _v, _o), r in zip(sets, refs[1:])), tuple(out_states))
    stats["records"] += 1
  except template.Untemplatable:
    gv = sv = None
    value = _NEVER
  if gv is not None:
    with _lock:
      _templates[(base, gv, sv)] = value
      if len(_templates) > _MAX: _templates.popitem(last=False)
  return new, states
