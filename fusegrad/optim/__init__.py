"""Optimizers: PyTorch's update rules on the lazy graph.

`step()` builds every parameter's update (gradient, weight decay, moments) as lazy tensors and
realizes all parameters and optimizer states in one schedule, so each parameter's whole update —
its backward included — fuses into as few kernels as the graph allows (an Adam step of one
parameter is one kernel). Hyperparameters (learning rate, momentum, betas, weight decay, bias
corrections) live in a small device buffer that is rewritten each step, so a schedule never bakes
them into kernel source and nothing recompiles when a scheduler changes them. Only structural
choices (momentum or not, amsgrad, centered...) select a different kernel.

State follows PyTorch's layout and names (`momentum_buffer`, `exp_avg`, `exp_avg_sq`, `square_avg`,
`sum`, `step`...); `state_dict()` / `load_state_dict()` use torch's format, indices for parameters.
"""
from __future__ import annotations
import abc
import collections
import copy
import itertools
import numpy as np
import fusegrad as fg
from fusegrad.engine import jit as _jit, trace as _trace
from fusegrad.graph import node as gn
from fusegrad.runtime import device as rd
from fusegrad.tensor import Tensor
from fusegrad.optim import _updates


def _check(ok: bool, msg: str) -> None:
  if not ok: raise ValueError(msg)


def _lerp(a: Tensor, b: Tensor, w: Tensor) -> Tensor:
  """torch.lerp's form for weights below 0.5: a + w * (b - a)."""
  return a + w * (b - a)


class Optimizer(abc.ABC):
  """Parameter groups (dicts with 'params' and per-group hyperparameters), zero_grad, step, state_dict.
  Subclasses take PyTorch's arguments; `foreach` is accepted and ignored (every step is fused anyway)."""

  def __init__(self, params, defaults: dict):
    if isinstance(params, Tensor):
      raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, but got "
                      "fusegrad.Tensor")
    params = list(params)
    if not params: raise ValueError("optimizer got an empty parameter list")
    groups = params if isinstance(params[0], dict) else [{"params": params}]
    self.defaults = defaults
    self.param_groups: list[dict] = []
    self.state = _ParamState()   # param -> {name: Tensor or number}; keys starting with _ are internal
    for g in groups: self.add_param_group(g)
    _jit.watch(self)   # a captured step may change hyperparameters only through a scheduler (see _jit_state)

  def _jit_state(self) -> dict:
    """The hyperparameters a captured step (fusegrad.jit) reads on the host at every replay: the step's own Python
    must not change them (a replay would not), a scheduler stepped inside it may (replays step it again)."""
    return {f"param_groups[{i}][{k!r}]": v for i, g in enumerate(self.param_groups) for k, v in g.items()
            if k != "params"}

  def add_param_group(self, group: dict) -> None:
    if not isinstance(group, dict): raise TypeError(f"param_group must be a dict, but got {type(group)}")
    ps = group["params"]
    if isinstance(ps, set):
      raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering of tensors "
                      "in sets will change between runs. Please use a list instead.")
    g = {**self.defaults, **group, "params": [ps] if isinstance(ps, Tensor) else list(ps)}
    for p in g["params"]:
      if not isinstance(p, Tensor): raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
      if not p.is_leaf: raise ValueError("can't optimize a non-leaf Tensor")
    for k, name in (("lr", "learning rate"), ("eps", "epsilon value"), ("weight_decay", "weight_decay value")):
      v = g.get(k)
      if isinstance(v, (int, float)) and v < 0: raise ValueError(f"Invalid {name}: {v}")
    seen = {id(p) for og in self.param_groups for p in og["params"]}
    if any(id(p) in seen for p in g["params"]):
      raise ValueError("some parameters appear in more than one parameter group")
    self.param_groups.append(g)
    self.state.know(g["params"])

  def zero_grad(self, set_to_none: bool = True) -> None:
    for g in self.param_groups:
      for p in g["params"]:
        p.grad = None if set_to_none or p.grad is None else fg.zeros_like(p.grad)

  def _scalars(self, p: Tensor, group: dict, state: dict) -> tuple[Tensor, ...]:
    """This step's hyperparameters for p (`_hyper`) as tensors of p's shape: broadcast views, made once, of a
    device buffer rewritten each step, so nothing recompiles when a scheduler changes them. A captured step
    (fusegrad.jit) recomputes and rewrites them at every replay."""
    def write():
      vals = self._hyper(group, state)
      buf, views, host = state.get("_scalars", (None, (), None))
      if buf is None or len(views) != len(vals):
        d = fg.float64 if p.dtype == fg.float64 else fg.float32
        mem = rd.Buffer(rd.get(p.device), len(vals), d)
        buf = Tensor(_node=gn.buffer_node(mem, d, (len(vals),), p.device))
        # broadcast to p's shape once, here: every update op then meets operands of one shape
        views = tuple(buf[i].reshape((1,) * p.ndim).expand(p.shape) for i in range(len(vals)))
        # a device whose buffers are host arrays (the CPU's, whose kernels have finished when a launch returns) is
        # written in place through a view of them; another through copyin
        h = mem.handle
        host = h.view(d.np)[:len(vals)] if isinstance(h, np.ndarray) and rd.get(p.device).name == "CPU" else None
        state["_scalars"] = (buf, views, host)
      if host is not None: host[:] = vals
      else: buf.node.buffer.copyin(np.array(vals, dtype=buf.dtype.np))
    _jit.host(write)
    return state["_scalars"][1]

  def step(self, closure=None):
    """One update of every parameter with a gradient; closure (re-evaluating the loss) as in PyTorch."""
    loss = None
    if closure is not None:
      with fg.enable_grad(): loss = closure()
    self._opt_called = True   # lets a learning-rate scheduler warn when it is stepped first, as PyTorch's does
    structure = self._structure()
    _jit.guard(lambda: self._structure() == structure)
    _trace.in_step[0] += 1    # a replayed step follows the writes into parameters and state made here
    try:
      with fg.no_grad():
        work = [(p, g, self.state[p]) for g in self.param_groups for p in g["params"]
                if p.grad is not None]
        updates = _updates.step_all(self, [(p, g, st, self._scalars(p, g, st)) for p, g, st in work])
      if updates: fg.realize(*updates)
    finally:
      _trace.in_step[0] -= 1
    return loss

  # state entries kept on the host as numbers (torch's 0-d tensors): they feed `_hyper`
  _HOST_STATE: tuple = ("step",)

  # group entries that select a different update graph rather than a value in it: a captured step
  # (fusegrad.jit) is replayed only while they are unchanged
  _STRUCTURAL = ("momentum", "nesterov", "weight_decay", "amsgrad", "maximize", "decoupled_weight_decay",
                 "centered")

  def _structure(self) -> tuple:
    return tuple((len(g["params"]),) + tuple(bool(g[k]) for k in self._STRUCTURAL if k in g) for g in self.param_groups)

  @staticmethod
  def _set_state(state: dict, name: str, value: Tensor) -> Tensor:
    """state[name] = value, updating an existing state tensor in place (a captured step's state is updated in place)."""
    old = state.get(name)
    if isinstance(old, Tensor) and old.shape == value.shape and old.dtype == value.dtype:
      old._assign(value)
      return old
    state[name] = value = Tensor(_node=value.node)   # a storage of its own: two states never alias (amsgrad's first max is v)
    return value

  @abc.abstractmethod
  def _hyper(self, group: dict, state: dict) -> list:
    """This step's hyperparameter values for one parameter (advancing its step count)."""

  @abc.abstractmethod
  def _update(self, p: Tensor, grad: Tensor, group: dict, state: dict, s: tuple) -> tuple[Tensor, list[Tensor]]:
    """The new value of p and the state tensors to realize with it; s are the `_hyper` values as tensors."""

  # ---- checkpoints, in PyTorch's layout ----
  def state_dict(self) -> dict:
    """{'state': {index: {name: Tensor or number}}, 'param_groups': [{hyperparameters..., 'params': [indices]}]},
    indices counting all groups' parameters in order. State tensors are shared, not copied (as in PyTorch)."""
    index: dict[int, int] = {}
    groups = []
    for g in self.param_groups:
      for p in g["params"]: index.setdefault(id(p), len(index))
      groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": [index[id(p)] for p in g["params"]]})
    state = {}
    for g in self.param_groups:
      for p in g["params"]:
        st = {k: v for k, v in self.state.get(p, {}).items() if not k.startswith("_")}
        if st: state[index[id(p)]] = st
    return {"state": state, "param_groups": groups}

  def load_state_dict(self, state_dict: dict) -> None:
    """Load a state_dict() of an optimizer over parameters of the same groups and sizes. State tensors (fusegrad
    Tensors, or arrays such as torch's CPU tensors) move to each parameter's device and dtype; 'step' stays a number."""
    saved = copy.deepcopy([{k: v for k, v in g.items()} for g in state_dict["param_groups"]])
    if len(saved) != len(self.param_groups):
      raise ValueError("loaded state dict has a different number of parameter groups")
    if any(len(g["params"]) != len(s["params"]) for g, s in zip(self.param_groups, saved)):
      raise ValueError("loaded state dict contains a parameter group that doesn't match the size of optimizer's group")
    params = dict(zip(itertools.chain.from_iterable(s["params"] for s in saved),
                      itertools.chain.from_iterable(g["params"] for g in self.param_groups)))
    state = _ParamState()
    state.know(params.values())
    for k, st in state_dict["state"].items():
      if k not in params: continue
      p = params[k]
      state[p] = {name: _load_value(p, name, v, k, self._HOST_STATE) for name, v in st.items()}
    self.param_groups = [{**s, "params": g["params"]} for g, s in zip(self.param_groups, saved)]
    self.state = state
    _jit.invalidate()   # a captured step holds the old groups and state tensors


class _ParamState(collections.defaultdict):
  """Optimizer.state as torch's: a defaultdict(dict) keyed by the parameter itself (tensors hash by identity, and a
  dict compares a key's identity before its elementwise ==), so `opt.state[p]["exp_avg"]` reads as in torch. An int
  key is still taken as a parameter's id (this mapping's earlier keys): the optimizer tells it its parameters."""

  def __init__(self):
    super().__init__(dict)
    self._ids: dict = {}   # id(param) -> param: the optimizer's parameters and every key

  def know(self, params) -> None:
    for p in params: self._ids[id(p)] = p

  def _key(self, k):
    if type(k) is int:
      p = self._ids.get(k)
      if p is None: raise KeyError(k)
      return p
    return k

  def __getitem__(self, k): return super().__getitem__(self._key(k))

  def __setitem__(self, k, v) -> None:
    k = self._key(k)
    if isinstance(k, Tensor): self._ids[id(k)] = k
    super().__setitem__(k, v)

  def __delitem__(self, k) -> None: super().__delitem__(self._key(k))

  def __contains__(self, k) -> bool:
    return (k in self._ids and super().__contains__(self._ids[k])) if type(k) is int else super().__contains__(k)

  def get(self, k, default=None):
    if type(k) is int:
      if k not in self._ids: return default
      k = self._ids[k]
    return super().get(k, default)

  def setdefault(self, k, default=None):
    k = self._key(k)
    if k not in self: self[k] = default
    return super().__getitem__(k)

  def pop(self, k, *default):
    try: k = self._key(k)
    except KeyError:
      if default: return default[0]
      raise
    return super().pop(k, *default)

  def __reduce__(self):   # (copy, deepcopy, pickle: rebuilt through __setitem__, which knows the keys' ids again)
    return type(self), (), None, None, iter(self.items())



def _load_value(p: Tensor, name: str, v, key=None, host: tuple = ("step",)):
  if name in host:   # a value the host computes the step's hyperparameters from (torch keeps a 0-d tensor)
    v = v.item() if hasattr(v, "item") else v
    return int(v) if isinstance(v, float) and v.is_integer() else v
  if isinstance(v, Tensor):
    v = Tensor(_node=v.node)
    v = v.to(device=p.device, dtype=p.dtype) if p.is_floating_point() else v.to(device=p.device)
  elif hasattr(v, "__array__") and not isinstance(v, (int, float, bool)):
    v = fg.tensor(np.asarray(v), dtype=p.dtype if p.is_floating_point() else None, device=p.device)
  else:
    return v
  # per-parameter state (momentum, moments) has the parameter's shape: another shape would broadcast silently
  # in the update (a [1] buffer) or fail deep inside it
  if tuple(v.shape) != tuple(p.shape):
    raise ValueError(f"loaded state dict has state {name!r} of shape {list(v.shape)} for parameter {key} of shape "
                     f"{list(p.shape)}")
  return v


class SGD(Optimizer):
  def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
               weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False, foreach=None):
    _check(lr >= 0.0, f"Invalid learning rate: {lr}")
    _check(momentum >= 0.0, f"Invalid momentum value: {momentum}")
    _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
    if nesterov and (momentum <= 0 or dampening != 0):
      raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                  nesterov=nesterov, maximize=maximize))

  def _hyper(self, g, state):
    return [g["lr"], g["momentum"], 1 - g["dampening"], g["weight_decay"]]

  def _update(self, p, grad, g, state, s):
    lr, mom, damp1, wd = s[0], s[1], s[2], s[3]
    if g["maximize"]: grad = -grad
    if g["weight_decay"]: grad = grad + wd * p
    states = []
    if g["momentum"]:
      buf = state.get("momentum_buffer")
      buf = self._set_state(state, "momentum_buffer", grad if buf is None else buf * mom + damp1 * grad)
      states.append(buf)
      grad = grad + mom * buf if g["nesterov"] else buf
    return p - lr * grad, states


class Adam(Optimizer):
  def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
               amsgrad: bool = False, *, maximize: bool = False, decoupled_weight_decay: bool = False, foreach=None):
    _check(lr >= 0.0, f"Invalid learning rate: {lr}")
    _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
    _check(0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}")
    _check(0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}")
    _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
    super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                  maximize=maximize, decoupled_weight_decay=decoupled_weight_decay))

  def _hyper(self, g, state):
    b1, b2 = g["betas"]
    lr, wd = g["lr"], g["weight_decay"]
    t = state["step"] = state.get("step", 0) + 1
    # PyTorch's host-side scalars: step_size = lr / (1 - b1^t), sqrt(1 - b2^t), the decoupled decay 1 - lr * wd
    return [lr / (1 - b1 ** t), (1 - b2 ** t) ** 0.5, g["eps"], 1 - b1, b2, 1 - b2, wd, 1 - lr * wd]

  def _update(self, p, grad, g, state, s):
    wd = g["weight_decay"]
    step_size, bc2_sqrt, eps, w1, b2_, w2, wd_, decay = (s[i] for i in range(8))
    if g["maximize"]: grad = -grad
    if wd:
      if g["decoupled_weight_decay"]: p = p * decay
      else: grad = grad + wd_ * p
    m, v = state.get("exp_avg"), state.get("exp_avg_sq")
    m = self._set_state(state, "exp_avg", w1 * grad if m is None else _lerp(m, grad, w1))
    v = self._set_state(state, "exp_avg_sq", w2 * grad * grad if v is None else v * b2_ + w2 * grad * grad)
    states = [m, v]
    vv = v
    if g["amsgrad"]:
      vmax = state.get("max_exp_avg_sq")
      vv = self._set_state(state, "max_exp_avg_sq", v if vmax is None else vmax.maximum(v))
      states.append(vv)
    # PyTorch's order of operations: p - step_size * m / (sqrt(v) / sqrt(bc2) + eps)
    return p - step_size * m / (vv.sqrt() / bc2_sqrt + eps), states


class AdamW(Adam):
  def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
               amsgrad: bool = False, *, maximize: bool = False, foreach=None):
    super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, decoupled_weight_decay=True)


class RMSprop(Optimizer):
  def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
               momentum: float = 0.0, centered: bool = False, *, maximize: bool = False, foreach=None):
    _check(lr >= 0.0, f"Invalid learning rate: {lr}")
    _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
    _check(momentum >= 0.0, f"Invalid momentum value: {momentum}")
    _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
    _check(alpha >= 0.0, f"Invalid alpha value: {alpha}")
    super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                  centered=centered, maximize=maximize))

  def _hyper(self, g, state):
    state["step"] = state.get("step", 0) + 1
    return [g["lr"], g["alpha"], 1 - g["alpha"], g["eps"], g["weight_decay"], g["momentum"]]

  def _update(self, p, grad, g, state, s):
    lr, alpha, w, eps, wd, mom = (s[i] for i in range(6))
    if g["maximize"]: grad = -grad
    if g["weight_decay"]: grad = grad + wd * p
    sq = state.get("square_avg")
    sq = self._set_state(state, "square_avg", w * grad * grad if sq is None else sq * alpha + w * grad * grad)
    states = [sq]
    if g["centered"]:
      ga = state.get("grad_avg")
      ga = self._set_state(state, "grad_avg", w * grad if ga is None else _lerp(ga, grad, w))
      states.append(ga)
      avg = (sq - ga * ga).sqrt() + eps
    else:
      avg = sq.sqrt() + eps
    if g["momentum"] > 0:
      buf = state.get("momentum_buffer")
      buf = self._set_state(state, "momentum_buffer", grad / avg if buf is None else buf * mom + grad / avg)
      states.append(buf)
      return p - lr * buf, states
    return p - lr * grad / avg, states


class Adagrad(Optimizer):
  def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
               initial_accumulator_value: float = 0.0, eps: float = 1e-10, foreach=None, *,
               maximize: bool = False):
    _check(lr >= 0.0, f"Invalid learning rate: {lr}")
    _check(lr_decay >= 0.0, f"Invalid lr_decay value: {lr_decay}")
    _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
    _check(initial_accumulator_value >= 0.0, f"Invalid initial_accumulator_value value: {initial_accumulator_value}")
    _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
    self._constructing = True
    super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                  initial_accumulator_value=initial_accumulator_value, maximize=maximize))
    self._constructing = False

  def add_param_group(self, group: dict) -> None:
    super().add_param_group(group)
    g = self.param_groups[-1]
    # PyTorch creates Adagrad's state up front, the constructor's groups from the constructor's value (a group's own
    # initial_accumulator_value is not read there); a group added later from its own
    v = self.defaults["initial_accumulator_value"] if getattr(self, "_constructing", False) else \
        g["initial_accumulator_value"]
    for p in g["params"]: self.state[p].update(step=0, sum=fg.full_like(p, v))

  def _hyper(self, g, state):
    t = state["step"] = state.get("step", 0) + 1
    return [g["lr"] / (1 + (t - 1) * g["lr_decay"]), g["eps"], g["weight_decay"]]

  def _update(self, p, grad, g, state, s):
    clr, eps, wd = s[0], s[1], s[2]
    if g["maximize"]: grad = -grad
    if g["weight_decay"]: grad = grad + wd * p
    acc = state.get("sum")
    if acc is None: acc = fg.full_like(p, g["initial_accumulator_value"])
    acc = self._set_state(state, "sum", acc + grad * grad)
    return p - clr * grad / (acc.sqrt() + eps), [acc]


def _f32(x: float) -> float:
  """x rounded to float32: a value torch keeps in a float32 0-d tensor (NAdam's mu_product, ASGD's eta and mu)."""
  return float(np.float32(x))


class Adadelta(Optimizer):
  def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0.0,
               foreach=None, *, capturable: bool = False, maximize: bool = False, differentiable: bool = False):
    _check(lr >= 0.0, f"Invalid learning rate: {lr}")
    _check(0.0 <= rho <= 1.0, f"Invalid rho value: {rho}")
    _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
    _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
    super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize))

  def _hyper(self, g, state):
    state["step"] = state.get("step", 0) + 1
    return [g["lr"], g["rho"], 1 - g["rho"], g["eps"], g["weight_decay"]]

  def _update(self, p, grad, g, state, s):
    lr, rho, w, eps, wd = (s[i] for i in range(5))
    if g["maximize"]: grad = -grad
    if g["weight_decay"]: grad = grad + wd * p
    sq, acc = state.get("square_avg"), state.get("acc_delta")
    if acc is None: acc = fg.zeros_like(p)
    sq = self._set_state(state, "square_avg", w * (grad * grad) if sq is None else sq * rho + w * (grad * grad))
    delta = (acc + eps).sqrt() / (sq + eps).sqrt() * grad
    acc = self._set_state(state, "acc_delta", acc * rho + w * (delta * delta))
    return p - lr * delta, [sq, acc]


class Adamax(Optimizer):
  def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
               foreach=None, *, maximize: bool = False, differentiable: bool = False, capturable: bool = False):
    _check(lr >= 0.0, f"Invalid learning rate: {lr}")
    _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
    _check(0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}")
    _check(0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}")
    _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
    super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize))

  def _hyper(self, g, state):
    b1, b2 = g["betas"]
    t = state["step"] = state.get("step", 0) + 1
    return [g["lr"] / (1 - b1 ** t), g["eps"], 1 - b1, b2, g["weight_decay"]]

  def _update(self, p, grad, g, state, s):
    clr, eps, w1, b2, wd = (s[i] for i in range(5))
    if g["maximize"]: grad = -grad
    if g["weight_decay"]: grad = grad + wd * p
    m, u = state.get("exp_avg"), state.get("exp_inf")
    m = self._set_state(state, "exp_avg", w1 * grad if m is None else _lerp(m, grad, w1))
    norm = grad.abs() + eps
    u = self._set_state(state, "exp_inf", norm if u is None else (u * b2).maximum(norm))
    return p - clr * (m / u), [m, u]


class NAdam(Optimizer):
  _HOST_STATE = ("step", "mu_product")

  def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
               momentum_decay: float = 4e-3, decoupled_weight_decay: bool = False, *, foreach=None,
               maximize: bool = False, capturable: bool = False, differentiable: bool = False):
    _check(lr >= 0.0, f"Invalid learning rate: {lr}")
    _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
    _check(0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}")
    _check(0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}")
    _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
    _check(momentum_decay >= 0.0, f"Invalid momentum_decay value: {momentum_decay}")
    super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                  momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
                                  maximize=maximize))

  def _hyper(self, g, state):
    b1, b2 = g["betas"]
    lr, wd, md = g["lr"], g["weight_decay"], g["momentum_decay"]
    t = state["step"] = state.get("step", 0) + 1
    mu = b1 * (1.0 - 0.5 * 0.96 ** (t * md))
    mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * md))
    # torch keeps mu_product in a float32 0-d tensor: the product is taken (and rounded) in float32
    mp = state["mu_product"] = float(np.float32(state.get("mu_product", 1.0)) * np.float32(mu))
    return [-lr * (1.0 - mu) / (1.0 - mp), -lr * mu_next / (1.0 - mp * mu_next), 1 - b2 ** t, g["eps"], 1 - b1, b2,
            1 - b2, wd, 1 - lr * wd]

  def _update(self, p, grad, g, state, s):
    c_grad, c_avg, bc2, eps, w1, b2, w2, wd, decay = (s[i] for i in range(9))
    p, grad, m, v = _adam_family_moments(self, p, grad, g, state, w1, b2, w2, wd, decay)
    denom = (v / bc2).sqrt() + eps
    p = p + c_grad * (grad / denom)
    return p + c_avg * (m / denom), [m, v]


def _adam_family_moments(opt, p, grad, g, state, w1, b2, w2, wd, decay):
  """NAdam's and RAdam's common part: maximize, L2 or decoupled weight decay, and the two moment updates."""
  if g["maximize"]: grad = -grad
  if g["weight_decay"]:
    if g["decoupled_weight_decay"]: p = p * decay
    else: grad = grad + wd * p
  m, v = state.get("exp_avg"), state.get("exp_avg_sq")
  m = opt._set_state(state, "exp_avg", w1 * grad if m is None else _lerp(m, grad, w1))
  v = opt._set_state(state, "exp_avg_sq", w2 * (grad * grad) if v is None else v * b2 + w2 * (grad * grad))
  return p, grad, m, v


class RAdam(Optimizer):
  def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
               decoupled_weight_decay: bool = False, *, foreach=None, maximize: bool = False,
               capturable: bool = False, differentiable: bool = False):
    _check(lr >= 0.0, f"Invalid learning rate: {lr}")
    _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
    _check(0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}")
    _check(0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}")
    _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
    super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                  decoupled_weight_decay=decoupled_weight_decay, maximize=maximize))

  def _hyper(self, g, state):
    b1, b2 = g["betas"]
    lr, wd = g["lr"], g["weight_decay"]
    t = state["step"] = state.get("step", 0) + 1
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    rho_inf = 2 / (1 - b2) - 1
    rho_t = rho_inf - 2 * t * (b2 ** t) / bc2
    # the rectified (adaptive) update once the variance is tractable (rho_t > 5), a plain momentum step before:
    # a host-side switch selects inside one kernel, so the step compiles once
    adaptive = rho_t > 5.0
    rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5 if adaptive else 0.0
    return [lr, bc1, bc2 ** 0.5, rect, 1.0 if adaptive else 0.0, g["eps"], 1 - b1, b2, 1 - b2, wd, 1 - lr * wd]

  def _update(self, p, grad, g, state, s):
    lr, bc1, bc2_sqrt, rect, adaptive, eps, w1, b2, w2, wd, decay = (s[i] for i in range(11))
    p, grad, m, v = _adam_family_moments(self, p, grad, g, state, w1, b2, w2, wd, decay)
    step = m / bc1 * lr
    step = fg.where(adaptive > 0.5, step * (bc2_sqrt / (v.sqrt() + eps)) * rect, step)
    return p - step, [m, v]


class ASGD(Optimizer):
  _HOST_STATE = ("step", "eta", "mu")

  def __init__(self, params, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75, t0: float = 1e6,
               weight_decay: float = 0.0, foreach=None, maximize: bool = False, differentiable: bool = False,
               capturable: bool = False):
    _check(lr >= 0.0, f"Invalid learning rate: {lr}")
    _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
    super().__init__(params, dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                                  maximize=maximize))

  def _hyper(self, g, state):
    lr, lambd = g["lr"], g["lambd"]
    t = state["step"] = state.get("step", 0) + 1
    eta, mu = state.get("eta", _f32(lr)), state.get("mu", 1.0)   # this step uses the previous step's eta and mu
    state["eta"] = _f32(lr / ((1 + lambd * lr * t) ** g["alpha"]))
    state["mu"] = _f32(1 / max(1, t - g["t0"]))
    return [eta, 1 - lambd * eta, mu, 1.0 if mu == 1 else 0.0, g["weight_decay"]]

  def _update(self, p, grad, g, state, s):
    eta, decay, mu, mu_is_one, wd = (s[i] for i in range(5))
    if g["maximize"]: grad = -grad
    if g["weight_decay"]: grad = grad + wd * p
    p = p * decay - eta * grad
    ax = state.get("ax")
    if ax is None: ax = fg.zeros_like(p)
    # torch copies the parameter while mu is 1 (an exact copy, not ax + (p - ax))
    ax = self._set_state(state, "ax", fg.where(mu_is_one > 0.5, p, ax + (p - ax) * mu))
    return p, [ax]


from fusegrad.optim.lbfgs import LBFGS  # noqa: E402
from fusegrad.optim import lr_scheduler  # noqa: E402  (schedulers subclass nothing here but check Optimizer)
from fusegrad.optim.clip import clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm  # noqa: E402
