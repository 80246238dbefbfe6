"""Module, Parameter and the containers: PyTorch's registration rules and state-dict protocol."""
from __future__ import annotations
import operator
from collections import OrderedDict, abc, namedtuple
from itertools import chain, islice
from typing import Iterator
import fusegrad as fg
from fusegrad import alias, autograd
from fusegrad import dtype as dt
from fusegrad.tensor import Tensor
from fusegrad.engine import jit as _jit


class Parameter(Tensor):
  """A Tensor that a Module registers as a parameter (requires grad by default)."""
  __slots__ = ()

  def __init__(self, data: Tensor | None = None, requires_grad: bool = True):
    if data is None: data = fg.empty(0)
    if not isinstance(data, Tensor): data = fg.tensor(data)
    super().__init__(_node=data.node)
    if requires_grad: self.requires_grad_()

  def __repr__(self) -> str: return "Parameter containing:\n" + super().__repr__()

  def __deepcopy__(self, memo) -> "Parameter":
    t = Tensor.__deepcopy__(self, memo)
    out = Parameter(t.detach(), self.requires_grad)
    out.grad = t.grad
    return out


def _set_value(t: Tensor, value: Tensor, same_storage: bool = True) -> None:
  """Give a leaf tensor (parameter, buffer) a new value in place, keeping its identity (optimizers hold it).
  same_storage: a copy into its storage, which the tensors sharing it (state_dict() entries, views) see, as
  load_state_dict's; else new storage, as Module.to's (what shared the old storage keeps the old value)."""
  if not same_storage: alias.leave(t)
  alias.set_node(t, value.node)


_IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
               "_forward_hooks_always_called", "_backward_hooks")


def _identity(t: Tensor) -> Tensor:
  """t as a new tensor whose recipe is the identity: a module's input or output whose gradient a full backward hook
  sees apart from the tensor's other uses (torch's BackwardHookFunction)."""
  r = Tensor(_node=t.node)
  autograd.record(r, "CONTIGUOUS", None, (t,))
  return r


class _BackwardHook:
  """One call's full backward hooks (torch's utils.hooks.BackwardHook): the module's positional tensor inputs and
  its outputs pass through identity recipes; autograd hands each side's gradients over together once they are
  complete (`autograd._group_hook`), the outputs' first (kept as grad_output), then the inputs', where the user
  hooks run and may replace them (grad_input: None for an argument that is no tensor, zeros for a tensor that needs
  no gradient, as torch's). No input needing a gradient: the hooks run with the outputs' gradients."""

  def __init__(self, module, hooks: list):
    self.module, self.hooks = module, hooks
    self.grad_outputs = None
    self.n_inputs, self.input_index, self.no_grad_inputs = 0, None, ()
    self.n_outputs, self.output_index = 0, None

  @staticmethod
  def _wrap(args: tuple):
    """(args with each tensor that needs a gradient passed through an identity, their positions) or (args, None)."""
    idx = [i for i, a in enumerate(args) if isinstance(a, Tensor) and a.requires_grad]
    if not idx: return args, None
    out = list(args)
    for i in idx: out[i] = _identity(args[i])
    return tuple(out), idx

  @staticmethod
  def _pack(idx, values, n: int) -> tuple:
    out = [None] * n
    for i, v in zip(idx or (), values): out[i] = v
    return tuple(out)

  def setup_input_hook(self, args: tuple) -> tuple:
    self.n_inputs = len(args)
    # (torch's grad_input holds zeros for a tensor input that needs no gradient, beside one that does)
    self.no_grad_inputs = tuple((i, a) for i, a in enumerate(args) if isinstance(a, Tensor) and not a.requires_grad)
    args, self.input_index = self._wrap(args)
    if self.input_index is not None:
      autograd._group_hook([args[i] for i in self.input_index], self._on_inputs)
    return args

  def setup_output_hook(self, result):
    single = not isinstance(result, tuple)
    outs = (result,) if single else result
    self.n_outputs = len(outs)
    outs, self.output_index = self._wrap(outs)
    if self.output_index is not None:
      autograd._group_hook([outs[i] for i in self.output_index], self._on_outputs)
    return outs[0] if single else outs

  def _on_outputs(self, grads: tuple):
    self.grad_outputs = self._pack(self.output_index, grads, self.n_outputs)
    if self.input_index is None:   # no input needs a gradient: the hooks are called here (torch's special case)
      grad_inputs = (None,) * self.n_inputs
      for hook in self.hooks:
        r = hook(self.module, grad_inputs, self.grad_outputs)
        if r is not None and not (isinstance(r, tuple) and all(x is None for x in r)):
          raise RuntimeError("Backward hook for Modules where no input requires gradient should always return None "
                             "or None for all gradients.")
      self.grad_outputs = None
    return None

  def _on_inputs(self, grads: tuple):
    if self.grad_outputs is None: return None   # the gradient reached the inputs without passing the outputs
    res = list(self._pack(self.input_index, grads, self.n_inputs))
    for i, a in self.no_grad_inputs: res[i] = fg.zeros_like(a)
    res = tuple(res)
    for hook in self.hooks:
      out = hook(self.module, res, self.grad_outputs)
      if out is None: continue
      out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
      if len(out) != len(res):
        raise RuntimeError(f"Backward hook returned an invalid number of grad_input, got {len(out)}, but expected "
                           f"{len(res)}")
      res = out
    self.grad_outputs = None
    return tuple(res[i] for i in self.input_index)


class Module:
  """Base class of layers: attributes that are Parameters, buffers or Modules are registered in assignment
  order, and `parameters()`, `state_dict()`, `to()`, `train()` walk them."""
  training: bool

  def __init__(self):
    object.__setattr__(self, "_parameters", OrderedDict())
    object.__setattr__(self, "_buffers", OrderedDict())
    object.__setattr__(self, "_non_persistent", set())
    object.__setattr__(self, "_modules", OrderedDict())
    object.__setattr__(self, "training", True)
    for name in _HOOK_DICTS: object.__setattr__(self, name, OrderedDict())

  # ---- registration ----
  def _registry(self) -> tuple:
    try:
      return self.__dict__["_parameters"], self.__dict__["_buffers"], self.__dict__["_modules"]
    except KeyError:
      raise AttributeError(f"cannot assign to a {type(self).__name__} before Module.__init__() call") from None

  def __setattr__(self, name: str, value) -> None:
    params, buffers, modules = self._registry()
    if isinstance(value, Parameter):
      self.__dict__.pop(name, None); buffers.pop(name, None); modules.pop(name, None)
      params[name] = value
    elif isinstance(value, Module):
      self.__dict__.pop(name, None); params.pop(name, None); buffers.pop(name, None)
      modules[name] = value
    elif name in params:
      if value is not None:
        raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' (fusegrad.nn.Parameter or None "
                        f"expected)")
      params[name] = None
    elif name in buffers:
      if value is not None and not isinstance(value, Tensor):
        raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' (Tensor or None expected)")
      buffers[name] = value
    elif name in modules:
      if value is not None: raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}'")
      modules[name] = None
    else:
      object.__setattr__(self, name, value)

  def __getattr__(self, name: str):
    d = self.__dict__
    for reg in ("_parameters", "_buffers", "_modules"):
      if reg in d and name in d[reg]: return d[reg][name]
    raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

  def __delattr__(self, name: str) -> None:
    for reg in self._registry():
      if name in reg:
        del reg[name]
        return
    object.__delattr__(self, name)

  def register_parameter(self, name: str, param: Parameter | None) -> None:
    if "." in name or not name: raise KeyError(f"parameter name can't contain \".\" or be empty, got {name!r}")
    if param is not None and not isinstance(param, Parameter):
      raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' (Parameter or None required)")
    self._registry()[0][name] = param

  def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
    if "." in name or not name: raise KeyError(f"buffer name can't contain \".\" or be empty, got {name!r}")
    if tensor is not None and not isinstance(tensor, Tensor):
      raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' (Tensor or None required)")
    self.__dict__.pop(name, None)
    self._registry()[1][name] = tensor
    if persistent: self._non_persistent.discard(name)
    else: self._non_persistent.add(name)

  def add_module(self, name: str, module: Module | None) -> None:
    if module is not None and not isinstance(module, Module):
      raise TypeError(f"{type(module).__name__} is not a Module subclass")
    if "." in name or not name: raise KeyError(f"module name can't contain \".\" or be empty, got {name!r}")
    self._registry()[2][name] = module
  register_module = add_module

  def get_submodule(self, target: str) -> Module:
    """The submodule at a dotted path ("" is self), with torch's errors."""
    if target == "": return self
    mod = self
    for item in target.split("."):
      if not hasattr(mod, item): raise AttributeError(type(mod).__name__ + " has no attribute `" + item + "`")
      mod = getattr(mod, item)
      if not isinstance(mod, Module): raise AttributeError("`" + item + "` is not an nn.Module")
    return mod

  def get_parameter(self, target: str) -> Parameter:
    mod, name, param = self._get_attr(target)
    if not isinstance(param, Parameter): raise AttributeError("`" + name + "` is not an nn.Parameter")
    return param

  def get_buffer(self, target: str) -> Tensor:
    mod, name, buf = self._get_attr(target)
    if name not in mod._buffers: raise AttributeError("`" + name + "` is not a buffer")
    return buf

  def _get_attr(self, target: str) -> tuple:
    """(the submodule, the attribute's name, its value) of a dotted path, with torch's errors."""
    module_path, _, name = target.rpartition(".")
    mod = self.get_submodule(module_path)
    if not hasattr(mod, name): raise AttributeError(type(mod).__name__ + " has no attribute `" + name + "`")
    return mod, name, getattr(mod, name)

  # ---- walking ----
  def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
    memo = set() if memo is None else memo
    if remove_duplicate:
      if id(self) in memo: return
      memo.add(id(self))
    yield prefix, self
    for name, m in self._modules.items():
      if m is None: continue
      yield from m.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

  def modules(self) -> Iterator[Module]:
    for _, m in self.named_modules(): yield m

  def named_children(self):
    seen = set()
    for name, m in self._modules.items():
      if m is not None and id(m) not in seen:
        seen.add(id(m))
        yield name, m

  def children(self) -> Iterator[Module]:
    for _, m in self.named_children(): yield m

  def _named(self, reg: str, prefix: str, recurse: bool, remove_duplicate: bool = True):
    seen = set()
    mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
    for mp, m in mods:
      for name, t in getattr(m, reg).items():
        if t is None or (remove_duplicate and id(t) in seen): continue
        seen.add(id(t))
        yield mp + ("." if mp else "") + name, t

  def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
    yield from self._named("_parameters", prefix, recurse, remove_duplicate)

  def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
    for _, p in self.named_parameters(recurse=recurse): yield p

  def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
    yield from self._named("_buffers", prefix, recurse, remove_duplicate)

  def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
    for _, b in self.named_buffers(recurse=recurse): yield b

  def apply(self, fn) -> Module:
    for m in self.children(): m.apply(fn)
    fn(self)
    return self

  # ---- state ----
  def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False) -> OrderedDict:
    """Parameters and persistent buffers by dotted name (values detached unless keep_vars)."""
    out = OrderedDict() if destination is None else destination
    for name, p in self._parameters.items():
      if p is not None: out[prefix + name] = p if keep_vars else p.detach()
    for name, b in self._buffers.items():
      if b is not None and name not in self._non_persistent: out[prefix + name] = b if keep_vars else b.detach()
    for name, m in self._modules.items():
      if m is not None: m.state_dict(out, prefix + name + ".", keep_vars)
    return out

  def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
    """Copy values into the parameters and buffers, in place. Every key, shape and dtype is checked
    first; on any error nothing is changed and the message lists all problems."""
    hooks = [(prefix, h) for prefix, m in self.named_modules()
             for h in m.__dict__.get("_load_state_dict_pre_hooks", {}).values()]
    hook_errors: list = []
    if hooks:   # (they may rename keys: on a copy, as torch's)
      state_dict = OrderedDict(state_dict)
      for prefix, h in hooks: h(state_dict, prefix + "." if prefix else "", {}, strict, [], [], hook_errors)
    own = self.state_dict(keep_vars=True)
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    errors = list(hook_errors)
    for k, t in own.items():
      if k not in state_dict: continue
      v = state_dict[k]
      if not isinstance(v, Tensor):
        errors.append(f'While copying the parameter named "{k}", expected a Tensor from checkpoint but received '
                      f'{type(v).__name__}')
      elif v.shape != t.shape:
        errors.append(f"size mismatch for {k}: copying a param with shape {list(v.shape)} from checkpoint, the shape "
                      f"in current model is {list(t.shape)}.")
      elif v.dtype.is_float != t.dtype.is_float and not (v.dtype.is_bool and t.dtype.is_bool):
        errors.append(f"dtype mismatch for {k}: copying a {v.dtype.name} from checkpoint into a {t.dtype.name}.")
    if strict:
      if unexpected: errors.insert(0, "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
      if missing: errors.insert(0, "Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ")
    if errors:
      raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
    for k, t in own.items():
      if k in state_dict: _set_value(t, state_dict[k].to(t.device).to(t.dtype))
    fg.realize(*[t for k, t in own.items() if k in state_dict])
    return _IncompatibleKeys(missing, unexpected)

  def _register_load_state_dict_pre_hook(self, hook, with_module: bool = False):
    """hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) before
    load_state_dict reads the dict (it may rename keys in it; its error_msgs are reported); with_module: the module
    is passed first."""
    hooks = self._hooks("_load_state_dict_pre_hooks")
    h = autograd.RemovableHandle(hooks)
    hooks[h.id] = (lambda *a: hook(self, *a)) if with_module else hook
    return h

  # ---- modes and placement ----
  def train(self, mode: bool = True) -> Module:
    if not isinstance(mode, bool): raise ValueError("training mode is expected to be boolean")
    def apply():
      for m in self.modules(): object.__setattr__(m, "training", mode)
    _jit.note_mode_set(self.modules())
    _jit.host(apply)   # inside a captured step (fusegrad.jit), every replay sets the mode again
    return self

  def eval(self) -> Module: return self.train(False)

  def requires_grad_(self, requires_grad: bool = True) -> Module:
    for p in self.parameters(): p.requires_grad_(requires_grad)
    return self

  def zero_grad(self, set_to_none: bool = True) -> None:
    for p in self.parameters():
      p.grad = None if set_to_none or p.grad is None else fg.zeros_like(p.grad)

  def to(self, *args, **kwargs) -> Module:
    """Move (and/or cast floating) parameters, their grads and buffers in place, like torch.nn.Module.to."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for a in args:
      if isinstance(a, dt.DType): dtype = a
      elif isinstance(a, Tensor): device, dtype = a.device, a.dtype
      else: device = a
    if dtype is not None and not dt.to_dtype(dtype).is_float:
      raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got desired dtype={dtype}")
    def move(t: Tensor) -> Tensor:
      out = t.to(device) if device is not None else t
      return out.to(dtype) if dtype is not None and t.dtype.is_float else out
    moved = []
    for m in self.modules():
      for reg in (m._parameters, m._buffers):
        for t in reg.values():
          if t is None: continue
          moved_t = move(t)
          if moved_t is not t: _set_value(t, moved_t, same_storage=False)
          if t.grad is not None: t.grad = move(t.grad)
          moved.append(t)
    if moved: fg.realize(*moved)
    return self

  def cpu(self) -> Module: return self.to("CPU")
  def float(self) -> Module: return self.to(fg.float32)
  def double(self) -> Module: return self.to(fg.float64)
  def half(self) -> Module: return self.to(fg.float16)
  def bfloat16(self) -> Module: return self.to(fg.bfloat16)

  # ---- calling and printing ----
  def forward(self, *args, **kwargs):
    raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

  def __call__(self, *args, **kwargs):
    _jit.note_module(self)   # a captured step (fusegrad.jit) is replayed only while the module is in this mode
    d = self.__dict__
    if d.get("_forward_pre_hooks") or d.get("_forward_hooks") or d.get("_backward_hooks"):
      return self._call_with_hooks(args, kwargs)
    return self.forward(*args, **kwargs)

  # ---- hooks (torch's Module._call_impl order: pre-hooks, forward, forward hooks; full backward hooks watch the
  # inputs and the final output). They are Python each call runs: the eager trace records the tensor calls they
  # make like any other code between events; fusegrad.jit, whose replays run no Python, refuses to capture them.
  def _hooks(self, name: str) -> OrderedDict:
    d = self.__dict__.get(name)
    if d is None: object.__setattr__(self, name, d := OrderedDict())
    return d

  def register_forward_pre_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False):
    """hook(module, args) -> None or new args (a non-tuple is wrapped in one), run before forward; with_kwargs:
    hook(module, args, kwargs) -> None or (new args, new kwargs). Returns a handle whose remove() undoes it."""
    hooks = self._hooks("_forward_pre_hooks")
    h = autograd.RemovableHandle(hooks, extra_dict=self._hooks("_forward_pre_hooks_with_kwargs"))
    hooks[h.id] = hook
    if with_kwargs: self._forward_pre_hooks_with_kwargs[h.id] = True
    if prepend: hooks.move_to_end(h.id, last=False)
    return h

  def register_forward_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False,
                            always_call: bool = False):
    """hook(module, args, output) -> None or a new output, run after forward (with_kwargs: hook(module, args,
    kwargs, output)); always_call: also when forward raises (output None then), as torch's."""
    hooks = self._hooks("_forward_hooks")
    h = autograd.RemovableHandle(hooks, extra_dict=[self._hooks("_forward_hooks_with_kwargs"),
                                                    self._hooks("_forward_hooks_always_called")])
    hooks[h.id] = hook
    if with_kwargs: self._forward_hooks_with_kwargs[h.id] = True
    if always_call: self._forward_hooks_always_called[h.id] = True
    if prepend: hooks.move_to_end(h.id, last=False)
    return h

  def register_full_backward_hook(self, hook, prepend: bool = False):
    """hook(module, grad_input, grad_output) -> None or a new grad_input, called when the gradients with respect
    to the module's positional tensor inputs are computed (grad_input: one entry per positional argument, None for
    one that is no tensor needing a gradient; grad_output: one per output). As torch's, also when no input needs a
    gradient (grad_input all None; it must return None then)."""
    hooks = self._hooks("_backward_hooks")
    h = autograd.RemovableHandle(hooks)
    hooks[h.id] = hook
    if prepend: hooks.move_to_end(h.id, last=False)
    autograd._unfollowable(f"a full backward hook was registered on a {type(self).__name__}")
    return h

  def _call_with_hooks(self, args: tuple, kwargs: dict):
    d = self.__dict__
    autograd._refuse_capture(f"fusegrad.jit: the step calls a {type(self).__name__} that has hooks (forward, "
                             "forward pre- or full backward hooks): Python that a replay does not run. Remove the "
                             "hooks or call the step without fusegrad.jit")
    with_kw = d.get("_forward_pre_hooks_with_kwargs", {})
    for hid, hook in list(d.get("_forward_pre_hooks", {}).items()):
      if hid in with_kw:
        r = hook(self, args, kwargs)
        if r is not None:
          if not (isinstance(r, tuple) and len(r) == 2):
            raise RuntimeError(f"forward pre-hook must return None or a tuple of (new_args, new_kwargs), but got {r}.")
          args, kwargs = r
      else:
        r = hook(self, args)
        if r is not None: args = r if isinstance(r, tuple) else (r,)
    bw = None
    if d.get("_backward_hooks") and autograd.grad_enabled():
      bw = _BackwardHook(self, list(d["_backward_hooks"].values()))
      args = bw.setup_input_hook(args)
    hooks = list(d.get("_forward_hooks", {}).items())
    with_kw, always = d.get("_forward_hooks_with_kwargs", {}), d.get("_forward_hooks_always_called", {})
    try:
      result = self.forward(*args, **kwargs)
    except BaseException:
      for hid, hook in hooks:
        if hid in always:
          try: hook(self, args, kwargs, None) if hid in with_kw else hook(self, args, None)
          except Exception: pass   # (torch warns and re-raises forward's error)
      raise
    for hid, hook in hooks:
      r = hook(self, args, kwargs, result) if hid in with_kw else hook(self, args, result)
      if r is not None: result = r
    if bw is not None: result = bw.setup_output_hook(result)
    return result

  def extra_repr(self) -> str: return ""

  def __repr__(self) -> str:
    # torch's layout: a one-line extra_repr without children stays inline, else one line per extra line and child
    extra = self.extra_repr()
    extra_lines = extra.split("\n") if extra else []
    child_lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()]
    lines = extra_lines + child_lines
    head = type(self).__name__ + "("
    if not lines: return head + ")"
    if len(extra_lines) == 1 and not child_lines: return head + extra_lines[0] + ")"
    return head + "\n  " + "\n  ".join(lines) + "\n)"

  def __dir__(self):
    return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))


def _renumber(modules: OrderedDict) -> None:
  """Keys 0..n-1 for the modules in their order (after a deletion, as torch's containers renumber), in place."""
  values = list(modules.values())
  modules.clear()
  for i, m in enumerate(values): modules[str(i)] = m


class Sequential(Module):
  def __init__(self, *args):
    super().__init__()
    if len(args) == 1 and isinstance(args[0], OrderedDict):
      for name, m in args[0].items(): self.add_module(name, m)
    else:
      for i, m in enumerate(args): self.add_module(str(i), m)

  def forward(self, input):
    for m in self._modules.values(): input = m(input)
    return input

  def __len__(self) -> int: return len(self._modules)
  def __iter__(self): return iter(self._modules.values())

  def _get_item_by_idx(self, iterator, idx):
    size = len(self)
    idx = operator.index(idx)
    if not -size <= idx < size: raise IndexError(f"index {idx} is out of range")
    return next(islice(iterator, idx % size, None))

  def __getitem__(self, idx):
    if isinstance(idx, slice): return self.__class__(OrderedDict(list(self._modules.items())[idx]))
    return self._get_item_by_idx(self._modules.values(), idx)

  def __setitem__(self, idx: int, module: Module) -> None:
    setattr(self, self._get_item_by_idx(self._modules.keys(), idx), module)

  def __delitem__(self, idx) -> None:
    if isinstance(idx, slice):
      for key in list(self._modules.keys())[idx]: delattr(self, key)
    else:
      delattr(self, self._get_item_by_idx(self._modules.keys(), idx))
    _renumber(self._modules)

  def __add__(self, other) -> Sequential:
    if not isinstance(other, Sequential):
      raise ValueError(f"add operator supports only objects of Sequential class, but {type(other)} is given.")
    ret = Sequential()
    for layer in self: ret.append(layer)
    for layer in other: ret.append(layer)
    return ret

  def __iadd__(self, other) -> Sequential:
    if not isinstance(other, Sequential):
      raise ValueError(f"add operator supports only objects of Sequential class, but {type(other)} is given.")
    offset = len(self)
    for i, m in enumerate(other): self.add_module(str(i + offset), m)
    return self

  def _check_factor(self, other) -> None:
    if not isinstance(other, int): raise TypeError(f"unsupported operand type(s) for *: {type(self)} and {type(other)}")
    if other <= 0: raise ValueError(f"Non-positive multiplication factor {other} for {type(self)}")

  def __mul__(self, other: int) -> Sequential:
    self._check_factor(other)
    combined = Sequential()
    for i, m in enumerate([m for _ in range(other) for m in self]): combined.add_module(str(i), m)
    return combined

  def __rmul__(self, other: int) -> Sequential: return self.__mul__(other)

  def __imul__(self, other: int) -> Sequential:
    self._check_factor(other)
    n = len(self)
    for k in range(1, other):
      for i in range(n): self.add_module(str(i + k * n), self._modules[str(i)])
    return self

  def pop(self, key) -> Module:
    v = self[key]
    del self[key]
    return v

  def append(self, module: Module) -> Sequential:
    self.add_module(str(len(self)), module)
    return self

  def insert(self, index: int, module: Module) -> Sequential:
    if not isinstance(module, Module): raise AssertionError(f"module should be of type: {Module}")
    n = len(self._modules)
    if not -n <= index <= n: raise IndexError(f"Index out of range: {index}")
    if index < 0: index += n
    for i in range(n, index, -1): self._modules[str(i)] = self._modules[str(i - 1)]
    self._modules[str(index)] = module
    return self

  def extend(self, sequential) -> Sequential:
    for layer in sequential: self.append(layer)
    return self

  def __dir__(self):
    return [k for k in super().__dir__() if not k.isdigit()]


class ModuleList(Module):
  def __init__(self, modules=None):
    super().__init__()
    if modules is not None: self.extend(modules)

  def __len__(self) -> int: return len(self._modules)
  def __iter__(self): return iter(self._modules.values())

  def _get_abs_string_index(self, idx) -> str:
    idx = operator.index(idx)
    if not -len(self) <= idx < len(self): raise IndexError(f"index {idx} is out of range")
    return str(idx + len(self) if idx < 0 else idx)

  def __getitem__(self, idx):
    if isinstance(idx, slice): return self.__class__(list(self._modules.values())[idx])
    return self._modules[self._get_abs_string_index(idx)]

  def __setitem__(self, idx: int, module: Module) -> None:
    setattr(self, self._get_abs_string_index(idx), module)

  def __delitem__(self, idx) -> None:
    if isinstance(idx, slice):
      for k in range(len(self._modules))[idx]: delattr(self, str(k))
    else:
      delattr(self, self._get_abs_string_index(idx))
    _renumber(self._modules)

  def __iadd__(self, modules) -> ModuleList: return self.extend(modules)

  def __add__(self, other) -> ModuleList:
    combined = ModuleList()
    for i, m in enumerate(chain(self, other)): combined.add_module(str(i), m)
    return combined

  def append(self, module: Module) -> ModuleList:
    self.add_module(str(len(self)), module)
    return self

  def extend(self, modules) -> ModuleList:
    if not isinstance(modules, abc.Iterable):
      raise TypeError("ModuleList.extend should be called with an iterable, but got " + type(modules).__name__)
    offset = len(self)
    for i, m in enumerate(modules): self.add_module(str(offset + i), m)
    return self

  def insert(self, index: int, module: Module) -> None:
    # torch's: entries from index on move up one (a negative index counts as torch's does: no entry moves)
    for i in range(len(self._modules), index, -1): self._modules[str(i)] = self._modules[str(i - 1)]
    self._modules[str(index)] = module

  def pop(self, key) -> Module:
    v = self[key]
    del self[key]
    return v

  def __dir__(self):
    return [k for k in super().__dir__() if not k.isdigit()]

  def forward(self, *args, **kwargs):
    raise NotImplementedError("ModuleList has no forward; iterate over it")


class ModuleDict(Module):
  def __init__(self, modules=None):
    super().__init__()
    if modules is not None: self.update(modules)

  def __getitem__(self, key: str) -> Module: return self._modules[key]
  def __setitem__(self, key: str, module: Module) -> None: self.add_module(key, module)
  def __delitem__(self, key: str) -> None: del self._modules[key]
  def __len__(self) -> int: return len(self._modules)
  def __iter__(self): return iter(self._modules)
  def __contains__(self, key) -> bool: return key in self._modules
  def keys(self): return self._modules.keys()
  def values(self): return self._modules.values()
  def items(self): return self._modules.items()
  def clear(self) -> None: self._modules.clear()

  def pop(self, key: str) -> Module:
    v = self[key]
    del self[key]
    return v

  def update(self, modules) -> None:
    if not isinstance(modules, abc.Iterable):
      raise TypeError("ModuleDict.update should be called with an iterable of key/value pairs, but got "
                      + type(modules).__name__)
    if isinstance(modules, (OrderedDict, ModuleDict, abc.Mapping)):
      for key, m in modules.items(): self[key] = m
    else:
      for j, m in enumerate(modules):
        if not isinstance(m, abc.Iterable):
          raise TypeError("ModuleDict update sequence element #" + str(j) + " should be Iterable; is" + type(m).__name__)
        if not len(m) == 2:
          raise ValueError("ModuleDict update sequence element #" + str(j) + " has length " + str(len(m))
                           + "; 2 is required")
        self[m[0]] = m[1]


def _param_line(k, p) -> str:
  if isinstance(p, Tensor):
    size = "x".join(str(n) for n in p.shape)
    return f"  ({k}): {'Parameter' if isinstance(p, Parameter) else 'Tensor'} containing: [{p.dtype} of size {size}]"
  return f"  ({k}): Object of type: {type(p).__name__}"


class ParameterList(Module):
  """Parameters held as attributes "0", "1", ... (so named_parameters() and state_dict() name them as torch's);
  a tensor stored is made a Parameter, any other object kept as is."""
  def __init__(self, values=None):
    super().__init__()
    self._size = 0
    if values is not None: self += values

  def _get_abs_string_index(self, idx) -> str:
    idx = operator.index(idx)
    if not -len(self) <= idx < len(self): raise IndexError(f"index {idx} is out of range")
    return str(idx + len(self) if idx < 0 else idx)

  def __getitem__(self, idx):
    if isinstance(idx, slice):
      out = self.__class__()
      for i in range(*idx.indices(len(self))): out.append(self[i])
      return out
    return getattr(self, self._get_abs_string_index(idx))

  def __setitem__(self, idx: int, param) -> None:
    idx = self._get_abs_string_index(idx)
    if isinstance(param, Tensor) and not isinstance(param, Parameter): param = Parameter(param)
    setattr(self, idx, param)

  def __len__(self) -> int: return self._size
  def __iter__(self): return iter(self[i] for i in range(len(self)))
  def __iadd__(self, parameters) -> ParameterList: return self.extend(parameters)
  def __dir__(self): return [k for k in super().__dir__() if not k.isdigit()]

  def append(self, value) -> ParameterList:
    new_idx = len(self)
    self._size += 1
    self[new_idx] = value
    return self

  def extend(self, values) -> ParameterList:
    if not isinstance(values, abc.Iterable) or isinstance(values, Tensor):
      raise TypeError("ParameterList.extend should be called with an iterable, but got " + type(values).__name__)
    for v in values: self.append(v)
    return self

  def extra_repr(self) -> str: return "\n".join(_param_line(k, p) for k, p in enumerate(self))
  def __call__(self, *args, **kwargs): raise RuntimeError("ParameterList should not be called.")


class ParameterDict(Module):
  """Parameters by string key, held as attributes of those names (state_dict keys are the keys); torch's dict
  operations. A plain dict given to the constructor or update() is taken in sorted key order, as torch's."""
  def __init__(self, parameters=None):
    super().__init__()
    self._keys: dict = {}
    if parameters is not None: self.update(parameters)

  def _key_to_attr(self, key) -> str:
    if not isinstance(key, str):
      raise TypeError(f"Index given to ParameterDict cannot be used as a key as it is not a string (type is "
                      f"'{type(key).__name__}'). Open an issue on github if you need non-string keys.")
    return key

  def __getitem__(self, key: str): return getattr(self, self._key_to_attr(key))

  def __setitem__(self, key: str, value) -> None:
    self._keys[key] = None
    attr = self._key_to_attr(key)
    if isinstance(value, Tensor) and not isinstance(value, Parameter): value = Parameter(value)
    setattr(self, attr, value)

  def __delitem__(self, key: str) -> None:
    del self._keys[key]
    delattr(self, self._key_to_attr(key))

  def __len__(self) -> int: return len(self._keys)
  def __iter__(self): return iter(self._keys)
  def __reversed__(self): return reversed(self._keys)
  def __contains__(self, key) -> bool: return key in self._keys
  def copy(self) -> ParameterDict: return ParameterDict(OrderedDict((k, self[k]) for k in self._keys))

  def setdefault(self, key: str, default=None):
    if key not in self: self[key] = default
    return self[key]

  def clear(self) -> None:
    for k in self._keys.copy(): del self[k]

  def pop(self, key: str):
    v = self[key]
    del self[key]
    return v

  def popitem(self) -> tuple:
    k, _ = self._keys.popitem()
    self._keys[k] = None    # (so __delitem__ finds it)
    v = self[k]
    del self[k]
    return k, v

  def get(self, key: str, default=None): return self[key] if key in self else default
  def fromkeys(self, keys, default=None) -> ParameterDict: return ParameterDict((k, default) for k in keys)
  def keys(self): return self._keys.keys()
  def items(self): return ((k, self[k]) for k in self._keys)
  def values(self): return (self[k] for k in self._keys)

  def update(self, parameters) -> None:
    if not isinstance(parameters, abc.Iterable):
      raise TypeError("ParametersDict.update should be called with an iterable of key/value pairs, but got "
                      + type(parameters).__name__)
    if isinstance(parameters, (OrderedDict, ParameterDict)):
      for key, p in parameters.items(): self[key] = p
    elif isinstance(parameters, abc.Mapping):
      for key, p in sorted(parameters.items()): self[key] = p
    else:
      for j, p in enumerate(parameters):
        if not isinstance(p, abc.Iterable):
          raise TypeError("ParameterDict update sequence element #" + str(j) + " should be Iterable; is"
                          + type(p).__name__)
        if not len(p) == 2:
          raise ValueError("ParameterDict update sequence element #" + str(j) + " has length " + str(len(p))
                           + "; 2 is required")
        self[p[0]] = p[1]

  def extra_repr(self) -> str: return "\n".join(_param_line(k, p) for k, p in self.items())
  def __call__(self, input): raise RuntimeError("ParameterDict should not be called.")

  def __or__(self, other: ParameterDict) -> ParameterDict:
    out = self.copy()
    out.update(other)
    return out

  def __ror__(self, other: ParameterDict) -> ParameterDict:
    out = other.copy()
    out.update(self)
    return out

  def __ior__(self, other: ParameterDict) -> ParameterDict:
    self.update(other)
    return self
