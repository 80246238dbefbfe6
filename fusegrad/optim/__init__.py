"""Optimizers: PyTorch's update rules on the lazy graph.

`step()` builds every parameter's update (gradient, weight decay, moments) as lazy tensors and
realizes all parameters and optimizer states in one schedule, so each parameter's whole update —
its backward included — fuses into as few kernels as the graph allows (an Adam step of one
parameter is one kernel). Hyperparameters that change between steps (learning rate, bias
corrections) live in a small device buffer that is rewritten each step, so a schedule never
bakes them into kernel source and nothing recompiles.
"""
from __future__ import annotations
import abc
import numpy as np
import fusegrad as fg
from fusegrad.graph import node as gn
from fusegrad.runtime import device as rd
from fusegrad.tensor import Tensor


class Optimizer(abc.ABC):
  """Parameter groups (dicts with 'params' and per-group hyperparameters), zero_grad, step."""

  def __init__(self, params, defaults: dict):
    params = list(params)
    if not params: raise ValueError("optimizer got an empty parameter list")
    groups = params if isinstance(params[0], dict) else [{"params": params}]
    self.defaults = defaults
    self.param_groups: list[dict] = []
    self.state: dict[int, dict] = {}
    for g in groups: self.add_param_group(g)

  def add_param_group(self, group: dict) -> None:
    g = {**self.defaults, **group, "params": list(group["params"])}
    for p in g["params"]:
      if not isinstance(p, Tensor): raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
      if not p.requires_grad: raise ValueError("optimizing a tensor that does not require grad")
    for k, v in g.items():
      if k != "params" and isinstance(v, (int, float)) and v < 0 and k in ("lr", "weight_decay", "eps"):
        raise ValueError(f"Invalid {k} value: {v}")
    self.param_groups.append(g)

  def zero_grad(self, set_to_none: bool = True) -> None:
    for g in self.param_groups:
      for p in g["params"]:
        p.grad = None if set_to_none or p.grad is None else fg.zeros_like(p.grad)

  def _scalars(self, p: Tensor, values: list[float]) -> Tensor:
    """A device buffer holding this step's hyperparameters for p's device (rewritten, not recompiled)."""
    st = self.state.setdefault(id(p), {})
    buf = st.get("_scalars")
    arr = np.array(values, dtype=np.float32 if p.dtype != fg.float64 else np.float64)
    if buf is None or buf.shape != arr.shape:
      d = fg.float64 if arr.dtype == np.float64 else fg.float32
      mem = rd.Buffer(rd.get(p.device), arr.size, d)
      buf = st["_scalars"] = Tensor(_node=gn.buffer_node(mem, d, arr.shape, p.device))
    buf.node.buffer.copyin(arr)
    return buf

  def step(self) -> None:
    updates = []
    with fg.no_grad():
      for g in self.param_groups:
        for p in g["params"]:
          if p.grad is None: continue
          new, states = self._update(p, p.grad.detach(), g, self.state.setdefault(id(p), {}))
          p._assign(new.to(p.dtype))
          updates.append(p)
          updates.extend(states)
    if updates: fg.realize(*updates)

  @abc.abstractmethod
  def _update(self, p: Tensor, grad: Tensor, group: dict, state: dict) -> tuple[Tensor, list[Tensor]]:
    """The new value of p and the state tensors to realize with it."""


class SGD(Optimizer):
  def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
               weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False):
    if nesterov and (momentum <= 0 or dampening != 0):
      raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                  nesterov=nesterov, maximize=maximize))

  def _update(self, p, grad, g, state):
    s = self._scalars(p, [g["lr"]])
    lr = s[0]
    if g["maximize"]: grad = -grad
    if g["weight_decay"]: grad = grad + g["weight_decay"] * p
    states = []
    if g["momentum"]:
      buf = state.get("momentum_buffer")
      buf = grad if buf is None else buf * g["momentum"] + (1 - g["dampening"]) * grad
      state["momentum_buffer"] = buf
      states.append(buf)
      grad = grad + g["momentum"] * buf if g["nesterov"] else buf
    return p - lr * grad, states


class Adam(Optimizer):
  decoupled = False

  def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
               amsgrad: bool = False, maximize: bool = False):
    if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0): raise ValueError(f"Invalid beta parameters: {betas}")
    super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                  maximize=maximize))

  def _update(self, p, grad, g, state):
    b1, b2 = g["betas"]
    t = state["step"] = state.get("step", 0) + 1
    s = self._scalars(p, [g["lr"], 1 - b1 ** t, (1 - b2 ** t) ** 0.5])
    lr, bc1, bc2_sqrt = s[0], s[1], s[2]
    if g["maximize"]: grad = -grad
    if g["weight_decay"]:
      if self.decoupled: p = p * (1 - g["lr"] * g["weight_decay"])
      else: grad = grad + g["weight_decay"] * p
    m = state.get("exp_avg")
    v = state.get("exp_avg_sq")
    m = grad * (1 - b1) if m is None else m * b1 + grad * (1 - b1)
    v = grad * grad * (1 - b2) if v is None else v * b2 + grad * grad * (1 - b2)
    state["exp_avg"], state["exp_avg_sq"] = m, v
    states = [m, v]
    vv = v
    if g["amsgrad"]:
      vmax = state.get("max_exp_avg_sq")
      vv = v if vmax is None else vmax.maximum(v)
      state["max_exp_avg_sq"] = vv
      states.append(vv)
    # PyTorch's order of operations: p - lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
    return p - (lr / bc1) * m / (vv.sqrt() / bc2_sqrt + g["eps"]), states


class AdamW(Adam):
  decoupled = True

  def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
               amsgrad: bool = False, maximize: bool = False):
    super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
