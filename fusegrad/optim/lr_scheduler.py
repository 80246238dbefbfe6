"""Learning-rate schedulers: torch.optim.lr_scheduler's classes, arguments and values.

A scheduler rewrites `group['lr']` (and momentum / beta1 for OneCycleLR) on the host; optimizers copy their
hyperparameters into a per-step device buffer, so a schedule never recompiles a kernel. A scheduler stepped inside
a captured step (fusegrad.jit) steps through `jit.host`: every replay steps it again, its Python state (last_epoch,
the lrs it sets) advancing as in eager mode; ReduceLROnPlateau reads its metric from each replay (`jit.host_read`). The chainable (recursive)
forms are PyTorch's, operation for operation, so the learning rates are the same floats as torch's.
"""
from __future__ import annotations
import functools
import math
import types
import warnings
from bisect import bisect_right
from collections import Counter
from fusegrad.engine import jit as _jit
from fusegrad.optim import Optimizer
from fusegrad.tensor import Tensor

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
           "ExponentialLR", "PolynomialLR", "CosineAnnealingLR", "SequentialLR", "ChainedScheduler", "OneCycleLR",
           "ReduceLROnPlateau", "CosineAnnealingWarmRestarts", "CyclicLR"]

EPOCH_DEPRECATION_WARNING = (
  "The epoch parameter in `scheduler.step()` was not necessary and is being deprecated where possible. Please use "
  "`scheduler.step()` to step the scheduler. During the deprecation, if epoch is different from None, the closed form "
  "is used instead of the new chainable form, where available.")


def _format_param(name: str, optimizer: Optimizer, param) -> list:
  """One value per param group: a list of that length, or one value for all."""
  if isinstance(param, (list, tuple)):
    if len(param) != len(optimizer.param_groups):
      raise ValueError(f"{name} must have the same length as optimizer.param_groups. {name} has {len(param)} values, "
                       f"param_groups has {len(optimizer.param_groups)}.")
    return list(param)
  return [param] * len(optimizer.param_groups)


def _lrs(optimizer: Optimizer) -> list: return [g["lr"] for g in optimizer.param_groups]


def _lambdas_state(self, key: str = "lr_lambdas") -> dict:
  # lambdas and functions are not saved; callable objects save their __dict__ (PyTorch's rule)
  sd = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", key)}
  sd[key] = [None if isinstance(fn, types.FunctionType) else fn.__dict__.copy() for fn in self.lr_lambdas]
  return sd


def _load_lambdas(self, state_dict: dict, key: str = "lr_lambdas") -> None:
  state_dict = dict(state_dict)
  fns = state_dict.pop(key)
  self.__dict__.update(state_dict)
  for fn, saved in zip(self.lr_lambdas, fns):
    if saved is not None: fn.__dict__.update(saved)


def _check_schedulers(name: str, optimizer: Optimizer, schedulers) -> None:
  for i, s in enumerate(schedulers):
    if not hasattr(s, "optimizer"): raise TypeError(f"{name} at index {i} should have `optimizer` as its attribute.")
    if isinstance(s, ReduceLROnPlateau):
      raise ValueError(f"{name} does not support `ReduceLROnPlateau` scheduler as it requires additional kwargs to be "
                       f"specified when calling `step`, but got one at index {i} in the given schedulers sequence.")
    if s.optimizer is not optimizer:
      raise ValueError(f"{name} expects all schedulers to belong to the same optimizer, but got scheduler "
                       f"{type(s).__name__} at index {i} has {s.optimizer}, which is different from "
                       f"{type(optimizer).__name__}.")


def _nested_state(self) -> dict:
  sd = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
  sd["_schedulers"] = [s.state_dict() for s in self._schedulers]
  return sd


def _load_nested(self, state_dict: dict) -> None:
  state_dict = dict(state_dict)
  subs = state_dict.pop("_schedulers")
  self.__dict__.update(state_dict)
  for s, sd in zip(self._schedulers, subs): s.load_state_dict(sd)


class LRScheduler:
  """Base: `step()` advances `last_epoch` and sets each group's lr to `get_lr()`; `base_lrs` are the groups'
  `initial_lr` (set from lr when last_epoch == -1). Call it after `optimizer.step()`."""
  _is_initial = False
  _get_lr_called_within_step = False

  def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
    if not isinstance(optimizer, Optimizer): raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
    self.optimizer = optimizer
    if last_epoch == -1:
      for g in optimizer.param_groups: g.setdefault("initial_lr", g["lr"])
    else:
      for i, g in enumerate(optimizer.param_groups):
        if "initial_lr" not in g:
          raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when resuming scheduler with "
                         "last_epoch >= 0.")
    self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
    self.last_epoch = last_epoch
    self._initial_step()

  def _initial_step(self) -> None:
    self._step_count = 0
    self._is_initial = True
    try: self.step()
    finally: self._is_initial = False

  def state_dict(self) -> dict:
    return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

  def load_state_dict(self, state_dict: dict) -> None:
    self.__dict__.update(state_dict)

  def get_last_lr(self) -> list:
    """The learning rates the last step set, one per param group."""
    return self._last_lr

  def get_lr(self) -> list:
    raise NotImplementedError

  def _warn_get_lr(self) -> None:
    if not self._get_lr_called_within_step:
      warnings.warn("To get the last learning rate computed by the scheduler, please use `get_last_lr()`.",
                    UserWarning, stacklevel=3)

  def step(self, epoch: int | None = None) -> None:
    if self._step_count == 1 and not getattr(self.optimizer, "_opt_called", False):
      warnings.warn("Detected call of `lr_scheduler.step()` before `optimizer.step()`. You should call them in the "
                    "opposite order: `optimizer.step()` before `lr_scheduler.step()`. Failure to do this will "
                    "result in skipping the first value of the learning rate schedule.", UserWarning, stacklevel=2)
    if epoch is not None:
      _refuse_epoch(self)
      warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
    _jit.host(functools.partial(self._step, epoch))   # a captured step's replays step the scheduler again

  def _step(self, epoch: int | None = None) -> None:
    self._step_count += 1
    self._update_lr(epoch)

  def _update_lr(self, epoch: int | None = None) -> None:
    self._get_lr_called_within_step = True
    try:
      if epoch is None:
        self.last_epoch += 1
        values = self.get_lr()
      else:
        self.last_epoch = epoch
        values = self._get_closed_form_lr() if hasattr(self, "_get_closed_form_lr") else self.get_lr()
    finally:
      self._get_lr_called_within_step = False
    for g, lr in zip(self.optimizer.param_groups, values): g["lr"] = lr
    self._last_lr = _lrs(self.optimizer)


def _refuse_epoch(s) -> None:
  if _jit.recorder() is not None:
    raise RuntimeError(f"fusegrad.jit: {type(s).__name__}.step(epoch) inside a jitted function: the epoch is a Python "
                       "value the replays would repeat unchanged; call step() without an epoch (it counts the steps), "
                       "or step the scheduler outside the jitted function")


def _per_group(optimizer: Optimizer, lr_lambda) -> list:
  """One lr_lambda for every group, or a list with one per group."""
  if not isinstance(lr_lambda, (list, tuple)): return [lr_lambda] * len(optimizer.param_groups)
  if len(lr_lambda) != len(optimizer.param_groups):
    raise ValueError(f"Expected {len(optimizer.param_groups)} lr_lambdas, but got {len(lr_lambda)}")
  return list(lr_lambda)


class LambdaLR(LRScheduler):
  """lr = initial_lr * lr_lambda(epoch); one function, or one per group."""

  def __init__(self, optimizer: Optimizer, lr_lambda, last_epoch: int = -1):
    self.optimizer = optimizer
    self.lr_lambdas = _per_group(optimizer, lr_lambda)
    super().__init__(optimizer, last_epoch)

  state_dict = _lambdas_state
  load_state_dict = _load_lambdas

  def get_lr(self):
    self._warn_get_lr()
    return [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs)]


class MultiplicativeLR(LRScheduler):
  """lr *= lr_lambda(epoch) every step after the first."""

  def __init__(self, optimizer: Optimizer, lr_lambda, last_epoch: int = -1):
    self.optimizer = optimizer
    self.lr_lambdas = _per_group(optimizer, lr_lambda)
    for fn in self.lr_lambdas:
      if not callable(fn): raise TypeError(f"lr_lambda should be a function, but got {type(fn).__name__}")
    super().__init__(optimizer, last_epoch)

  state_dict = _lambdas_state
  load_state_dict = _load_lambdas

  def get_lr(self):
    self._warn_get_lr()
    if self._is_initial: return _lrs(self.optimizer)
    return [g["lr"] * fn(self.last_epoch) for fn, g in zip(self.lr_lambdas, self.optimizer.param_groups)]


class StepLR(LRScheduler):
  """lr *= gamma every step_size epochs."""

  def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
    self.step_size, self.gamma = step_size, gamma
    super().__init__(optimizer, last_epoch)

  def get_lr(self):
    self._warn_get_lr()
    if self.last_epoch == 0 or self.last_epoch % self.step_size != 0: return _lrs(self.optimizer)
    return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

  def _get_closed_form_lr(self):
    return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
  """lr *= gamma at each milestone (a repeated milestone decays once per occurrence)."""

  def __init__(self, optimizer: Optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1):
    self.milestones, self.gamma = Counter(milestones), gamma
    super().__init__(optimizer, last_epoch)

  def get_lr(self):
    self._warn_get_lr()
    if self.last_epoch not in self.milestones: return _lrs(self.optimizer)
    return [g["lr"] * self.gamma ** self.milestones[self.last_epoch] for g in self.optimizer.param_groups]

  def _get_closed_form_lr(self):
    ms = sorted(self.milestones.elements())
    return [base * self.gamma ** bisect_right(ms, self.last_epoch) for base in self.base_lrs]


class ConstantLR(LRScheduler):
  """lr * factor until total_iters, then lr."""

  def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1):
    if factor > 1.0 or factor < 0: raise ValueError("Constant multiplicative factor expected to be between 0 and 1.")
    self.factor, self.total_iters = factor, total_iters
    super().__init__(optimizer, last_epoch)

  def get_lr(self):
    self._warn_get_lr()
    if self.last_epoch == 0: return [g["lr"] * self.factor for g in self.optimizer.param_groups]
    if self.last_epoch != self.total_iters: return _lrs(self.optimizer)
    return [g["lr"] * (1.0 / self.factor) for g in self.optimizer.param_groups]

  def _get_closed_form_lr(self):
    return [base * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor)) for base in self.base_lrs]


class LinearLR(LRScheduler):
  """The lr factor goes linearly from start_factor to end_factor over total_iters steps."""

  def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5,
               last_epoch: int = -1):
    if start_factor > 1.0 or start_factor <= 0:
      raise ValueError("Starting multiplicative factor expected to be greater than 0 and less or equal to 1.")
    if end_factor > 1.0 or end_factor < 0:
      raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
    self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
    super().__init__(optimizer, last_epoch)

  def get_lr(self):
    self._warn_get_lr()
    if self.last_epoch == 0: return [g["lr"] * self.start_factor for g in self.optimizer.param_groups]
    if self._is_initial or self.last_epoch > self.total_iters: return _lrs(self.optimizer)
    sf, ef = self.start_factor, self.end_factor
    f = 1.0 + (ef - sf) / (self.total_iters * sf + (self.last_epoch - 1) * (ef - sf))
    return [g["lr"] * f for g in self.optimizer.param_groups]

  def _get_closed_form_lr(self):
    sf, ef = self.start_factor, self.end_factor
    n = min(self.total_iters, self.last_epoch)
    return [base * (sf + (ef - sf) * n / self.total_iters) for base in self.base_lrs]


class ExponentialLR(LRScheduler):
  """lr *= gamma every step."""

  def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
    self.gamma = gamma
    super().__init__(optimizer, last_epoch)

  def get_lr(self):
    self._warn_get_lr()
    if self._is_initial: return _lrs(self.optimizer)
    return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

  def _get_closed_form_lr(self):
    return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class PolynomialLR(LRScheduler):
  """lr = initial_lr * (1 - epoch / total_iters) ** power, then constant."""

  def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1):
    self.total_iters, self.power = total_iters, power
    super().__init__(optimizer, last_epoch)

  def get_lr(self):
    self._warn_get_lr()
    if self._is_initial or self.last_epoch > self.total_iters: return _lrs(self.optimizer)
    f = ((1.0 - self.last_epoch / self.total_iters) / (1.0 - (self.last_epoch - 1) / self.total_iters)) ** self.power
    return [g["lr"] * f for g in self.optimizer.param_groups]

  def _get_closed_form_lr(self):
    return [base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
            for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
  """Cosine from initial_lr down to eta_min over T_max steps (and back up, periodically): PyTorch's recursive form,
  which composes with other changes to the lr (ChainedScheduler); step(epoch) uses the closed form."""

  def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
    self.T_max, self.eta_min = T_max, eta_min
    super().__init__(optimizer, last_epoch)

  def get_lr(self):
    self._warn_get_lr()
    T, lo = self.T_max, self.eta_min
    groups = self.optimizer.param_groups
    if self._is_initial: return _lrs(self.optimizer)
    if self._step_count == 1 and self.last_epoch > 0:
      return [lo + (base - lo) * (1 + math.cos(self.last_epoch * math.pi / T)) / 2 for base in self.base_lrs]
    if (self.last_epoch - 1 - T) % (2 * T) == 0:
      return [g["lr"] + (base - lo) * (1 - math.cos(math.pi / T)) / 2 for base, g in zip(self.base_lrs, groups)]
    return [(1 + math.cos(math.pi * self.last_epoch / T)) / (1 + math.cos(math.pi * (self.last_epoch - 1) / T))
            * (g["lr"] - lo) + lo for g in groups]

  def _get_closed_form_lr(self):
    T, lo = self.T_max, self.eta_min
    return [lo + (base - lo) * (1 + math.cos(math.pi * self.last_epoch / T)) / 2 for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
  """SGDR: cosine from initial_lr down to eta_min over T_i epochs, then a restart, T_i growing by T_mult each time.
  step(epoch) takes fractional epochs (e.g. epoch + batch / batches), as PyTorch's."""

  def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0, last_epoch: int = -1):
    if T_0 <= 0 or not isinstance(T_0, int): raise ValueError(f"Expected positive integer T_0, but got {T_0}")
    if T_mult < 1 or not isinstance(T_mult, int): raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
    if not isinstance(eta_min, (float, int)):
      raise ValueError(f"Expected float or int eta_min, but got {eta_min} of type {type(eta_min)}")
    self.T_0, self.T_i, self.T_mult, self.eta_min = T_0, T_0, T_mult, eta_min
    self.T_cur = last_epoch
    super().__init__(optimizer, last_epoch)

  def get_lr(self):
    self._warn_get_lr()
    return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
            for base in self.base_lrs]

  def step(self, epoch=None) -> None:
    if epoch is not None: _refuse_epoch(self)
    _jit.host(functools.partial(self._step, epoch))   # a captured step's replays step it again

  def _step(self, epoch=None) -> None:   # PyTorch's step (it counts no _step_count)
    if epoch is None and self.last_epoch < 0: epoch = 0
    if epoch is None:
      epoch = self.last_epoch + 1
      self.T_cur = self.T_cur + 1
      if self.T_cur >= self.T_i:
        self.T_cur = self.T_cur % self.T_i
        self.T_i = self.T_i * self.T_mult
    else:
      if epoch < 0: raise ValueError(f"Expected non-negative epoch, but got {epoch}")
      if epoch >= self.T_0:
        if self.T_mult == 1:
          self.T_cur = epoch % self.T_0
        else:
          n = int(math.log((epoch / self.T_0 * (self.T_mult - 1) + 1), self.T_mult))
          self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
          self.T_i = self.T_0 * self.T_mult ** n
      else:
        self.T_i = self.T_0
        self.T_cur = epoch
    self.last_epoch = math.floor(epoch)
    self._get_lr_called_within_step = True
    try: values = self.get_lr()
    finally: self._get_lr_called_within_step = False
    for g, lr in zip(self.optimizer.param_groups, values): g["lr"] = lr
    self._last_lr = _lrs(self.optimizer)


class CyclicLR(LRScheduler):
  """Cyclical learning rates between base_lr and max_lr (triangular, triangular2, exp_range or a scale_fn), stepped
  every batch; with cycle_momentum, momentum (SGD) or beta1 (Adam) cycles the other way between max_momentum and
  base_momentum."""

  def __init__(self, optimizer: Optimizer, base_lr, max_lr, step_size_up: int = 2000, step_size_down: int | None = None,
               mode: str = "triangular", gamma: float = 1.0, scale_fn=None, scale_mode: str = "cycle",
               cycle_momentum: bool = True, base_momentum=0.8, max_momentum=0.9, last_epoch: int = -1):
    if not isinstance(optimizer, Optimizer): raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
    self.optimizer = optimizer
    base_lrs = _format_param("base_lr", optimizer, base_lr)
    if last_epoch == -1:
      for lr, g in zip(base_lrs, optimizer.param_groups): g["lr"] = lr
    self.max_lrs = _format_param("max_lr", optimizer, max_lr)
    step_size_up = float(step_size_up)
    step_size_down = float(step_size_down) if step_size_down is not None else step_size_up
    self.total_size = step_size_up + step_size_down
    self.step_ratio = step_size_up / self.total_size
    if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
      raise ValueError("mode is invalid and scale_fn is None")
    self.mode, self.gamma = mode, gamma
    self._scale_fn_custom = scale_fn
    self.scale_mode = scale_mode
    self._init_scale_fn()
    self.cycle_momentum = cycle_momentum
    if cycle_momentum:
      if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
        raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
      self.use_beta1 = "betas" in self.optimizer.defaults
      self.base_momentums = _format_param("base_momentum", optimizer, base_momentum)
      self.max_momentums = _format_param("max_momentum", optimizer, max_momentum)
      if last_epoch == -1:
        for m, b, g in zip(self.max_momentums, self.base_momentums, optimizer.param_groups):
          if self.use_beta1: g["betas"] = (m, *g["betas"][1:])
          else: g["momentum"] = m
          g["max_momentum"], g["base_momentum"] = m, b
    super().__init__(optimizer, last_epoch)
    self.base_lrs = base_lrs

  def _init_scale_fn(self) -> None:
    if self._scale_fn_custom is not None: return
    if self.mode == "triangular":
      self._scale_fn_ref, self.scale_mode = self._triangular_scale_fn, "cycle"
    elif self.mode == "triangular2":
      self._scale_fn_ref, self.scale_mode = self._triangular2_scale_fn, "cycle"
    elif self.mode == "exp_range":
      self._scale_fn_ref, self.scale_mode = functools.partial(self._exp_range_scale_fn, self.gamma), "iterations"

  def scale_fn(self, x) -> float:
    return self._scale_fn_custom(x) if self._scale_fn_custom is not None else self._scale_fn_ref(x)

  @staticmethod
  def _triangular_scale_fn(x: float) -> float: return 1.0

  @staticmethod
  def _triangular2_scale_fn(x: float) -> float: return 1 / (2.0 ** (x - 1))

  @staticmethod
  def _exp_range_scale_fn(gamma: float, x: float) -> float: return gamma ** x

  def get_lr(self):
    self._warn_get_lr()
    cycle = math.floor(1 + self.last_epoch / self.total_size)
    x = 1.0 + self.last_epoch / self.total_size - cycle
    scale_factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
    at = cycle if self.scale_mode == "cycle" else self.last_epoch
    lrs = [base + (mx - base) * scale_factor * self.scale_fn(at) for base, mx in zip(self.base_lrs, self.max_lrs)]
    if self.cycle_momentum:
      moms = [mx - (mx - base) * scale_factor * self.scale_fn(at)
              for base, mx in zip(self.base_momentums, self.max_momentums)]
      for g, m in zip(self.optimizer.param_groups, moms):
        if self.use_beta1: g["betas"] = (m, *g["betas"][1:])
        else: g["momentum"] = m
    return lrs

  def state_dict(self) -> dict:
    state = super().state_dict()
    state.pop("_scale_fn_ref", None)   # a bound function or partial: rebuilt from mode by load_state_dict
    fn = state.pop("_scale_fn_custom")
    state["_scale_fn_custom"] = None
    if fn is not None and not isinstance(fn, types.FunctionType):
      state["_scale_fn_custom"] = fn.__dict__.copy()   # callable objects save their __dict__ (PyTorch's rule)
    return state

  def load_state_dict(self, state_dict: dict) -> None:
    state_dict = dict(state_dict)
    fn = state_dict.pop("_scale_fn_custom")
    super().load_state_dict(state_dict)
    if fn is not None: self._scale_fn_custom.__dict__.update(fn)
    self._init_scale_fn()


class SequentialLR(LRScheduler):
  """Runs schedulers one after another, switching at the milestones (e.g. LinearLR warmup, then CosineAnnealingLR)."""

  def __init__(self, optimizer: Optimizer, schedulers: list, milestones: list, last_epoch: int = -1):
    name = type(self).__name__
    if len(schedulers) < 1: raise ValueError(f"{name} expects at least one scheduler, but got no scheduler.")
    _check_schedulers(name, optimizer, schedulers)
    if len(milestones) != len(schedulers) - 1:
      raise ValueError("Sequential Schedulers expects number of schedulers provided to be one more than the number of "
                       f"milestone points, but got number of schedulers {len(schedulers)} and the number of milestones "
                       f"to be equal to {len(milestones)}")
    self._schedulers, self._milestones = schedulers, milestones
    self.last_epoch = last_epoch + 1
    self.optimizer = optimizer
    for g in optimizer.param_groups: g["lr"] = g["initial_lr"]   # undo the steps the schedulers' constructors took
    self.recursive_undo()
    idx = bisect_right(self._milestones, 0)
    self._schedulers[idx]._initial_step()
    self._last_lr = schedulers[idx].get_last_lr()

  def recursive_undo(self, sched=None) -> None:
    s = self if sched is None else sched
    if hasattr(s, "_schedulers"):
      for sub in s._schedulers: self.recursive_undo(sub)
    elif hasattr(s, "last_epoch"): s.last_epoch -= 1

  def step(self) -> None:  # type: ignore[override]
    _jit.host(self._step)   # a captured step's replays step it (and the scheduler it runs) again

  def _step(self, epoch=None) -> None:
    self.last_epoch += 1
    idx = bisect_right(self._milestones, self.last_epoch)
    s = self._schedulers[idx]
    if idx > 0 and self._milestones[idx - 1] == self.last_epoch: s._update_lr(0)
    else: s.step()
    self._last_lr = s.get_last_lr()

  state_dict = _nested_state
  load_state_dict = _load_nested


class ChainedScheduler(LRScheduler):
  """Steps every scheduler at every step (their effects compose)."""

  def __init__(self, schedulers, optimizer: Optimizer | None = None):
    name = type(self).__name__
    if len(schedulers) < 1:
      raise ValueError(f"{name} expects at least one scheduler to be chained, but got no scheduler.")
    optimizer = optimizer or schedulers[0].optimizer
    _check_schedulers(name, optimizer, schedulers)
    self._schedulers, self.optimizer = list(schedulers), optimizer
    self._last_lr = _lrs(self._schedulers[-1].optimizer)

  def step(self) -> None:  # type: ignore[override]
    _jit.host(self._step)

  def _step(self, epoch=None) -> None:
    for s in self._schedulers: s.step()
    self._last_lr = _lrs(self._schedulers[-1].optimizer)

  state_dict = _nested_state
  load_state_dict = _load_nested


class OneCycleLR(LRScheduler):
  """The 1cycle policy: lr from max_lr/div_factor up to max_lr over pct_start of the steps, then down to
  initial_lr/final_div_factor (cos or linear); momentum (SGD) or beta1 (Adam) cycles the other way."""

  def __init__(self, optimizer: Optimizer, max_lr, total_steps: int | None = None, epochs: int | None = None,
               steps_per_epoch: int | None = None, pct_start: float = 0.3, anneal_strategy: str = "cos",
               cycle_momentum: bool = True, base_momentum=0.85, max_momentum=0.95, div_factor: float = 25.0,
               final_div_factor: float = 1e4, three_phase: bool = False, last_epoch: int = -1):
    if not isinstance(optimizer, Optimizer): raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
    self.optimizer = optimizer
    if total_steps is not None:
      if not isinstance(total_steps, int) or total_steps <= 0:
        raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
      self.total_steps = total_steps
    elif epochs is not None and steps_per_epoch is not None:
      if not isinstance(epochs, int) or epochs <= 0:
        raise ValueError(f"Expected positive integer epochs, but got {epochs}")
      if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
        raise ValueError(f"Expected positive integer steps_per_epoch, but got {steps_per_epoch}")
      self.total_steps = epochs * steps_per_epoch
    else:
      raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
    n = self.total_steps
    if three_phase:
      self._schedule_phases = [
        dict(end_step=float(pct_start * n) - 1, start_lr="initial_lr", end_lr="max_lr", start_momentum="max_momentum",
             end_momentum="base_momentum"),
        dict(end_step=float(2 * pct_start * n) - 2, start_lr="max_lr", end_lr="initial_lr",
             start_momentum="base_momentum", end_momentum="max_momentum"),
        dict(end_step=n - 1, start_lr="initial_lr", end_lr="min_lr", start_momentum="max_momentum",
             end_momentum="max_momentum")]
    else:
      self._schedule_phases = [
        dict(end_step=float(pct_start * n) - 1, start_lr="initial_lr", end_lr="max_lr", start_momentum="max_momentum",
             end_momentum="base_momentum"),
        dict(end_step=n - 1, start_lr="max_lr", end_lr="min_lr", start_momentum="base_momentum",
             end_momentum="max_momentum")]
    if pct_start < 0 or pct_start > 1 or not isinstance(pct_start, float):
      raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
    if anneal_strategy not in ("cos", "linear"):
      raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
    self._anneal_func_type = anneal_strategy
    max_lrs = _format_param("max_lr", optimizer, max_lr)
    if last_epoch == -1:
      for m, g in zip(max_lrs, optimizer.param_groups):
        g["initial_lr"] = m / div_factor
        g["max_lr"] = m
        g["min_lr"] = g["initial_lr"] / final_div_factor
    self.cycle_momentum = cycle_momentum
    if cycle_momentum:
      if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
        raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
      self.use_beta1 = "betas" in optimizer.defaults
      maxm = _format_param("max_momentum", optimizer, max_momentum)
      basem = _format_param("base_momentum", optimizer, base_momentum)
      if last_epoch == -1:
        for m, b, g in zip(maxm, basem, optimizer.param_groups):
          if self.use_beta1: g["betas"] = (m, *g["betas"][1:])
          else: g["momentum"] = m
          g["max_momentum"], g["base_momentum"] = m, b
    super().__init__(optimizer, last_epoch)

  @staticmethod
  def _annealing_cos(start, end, pct):
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

  @staticmethod
  def _annealing_linear(start, end, pct):
    return (end - start) * pct + start

  def _anneal_func(self, *args):
    return (self._annealing_cos if self._anneal_func_type == "cos" else self._annealing_linear)(*args)

  def get_lr(self):
    self._warn_get_lr()
    lrs = []
    step = self.last_epoch
    if step > self.total_steps:
      raise ValueError(f"Tried to step {step} times. The specified number of total steps is {self.total_steps}")
    for g in self.optimizer.param_groups:
      start = 0.0
      for i, ph in enumerate(self._schedule_phases):
        end = ph["end_step"]
        if step <= end or i == len(self._schedule_phases) - 1:
          pct = (step - start) / (end - start)
          lr = self._anneal_func(g[ph["start_lr"]], g[ph["end_lr"]], pct)
          if self.cycle_momentum: mom = self._anneal_func(g[ph["start_momentum"]], g[ph["end_momentum"]], pct)
          break
        start = ph["end_step"]
      lrs.append(lr)
      if self.cycle_momentum:
        if self.use_beta1: g["betas"] = (mom, *g["betas"][1:])
        else: g["momentum"] = mom
    return lrs


class ReduceLROnPlateau(LRScheduler):
  """lr *= factor when the metric passed to step() has not improved for patience epochs."""

  def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
               threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0, min_lr=0, eps: float = 1e-8):
    if factor >= 1.0: raise ValueError("Factor should be < 1.0.")
    self.factor = factor
    if not isinstance(optimizer, Optimizer): raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
    self.optimizer = optimizer
    if isinstance(min_lr, (list, tuple)):
      if len(min_lr) != len(optimizer.param_groups):
        raise ValueError(f"expected {len(optimizer.param_groups)} min_lrs, got {len(min_lr)}")
      self.default_min_lr, self.min_lrs = None, list(min_lr)
    else:
      self.default_min_lr, self.min_lrs = min_lr, [min_lr] * len(optimizer.param_groups)
    self.patience, self.cooldown, self.eps = patience, cooldown, eps
    self.last_epoch = 0
    self._last_lr = _lrs(optimizer)
    self._init_is_better(mode, threshold, threshold_mode)
    self._reset()

  def _reset(self) -> None:
    self.best, self.cooldown_counter, self.num_bad_epochs = self.mode_worse, 0, 0

  def step(self, metrics, epoch=None) -> None:  # type: ignore[override]
    if epoch is not None: warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
    if _jit.recorder() is None:
      self._step(float(metrics), epoch)   # a lazy loss is realized here: the decision is made on the host
      return
    if epoch is not None: _refuse_epoch(self)
    if not isinstance(metrics, Tensor):
      raise RuntimeError("fusegrad.jit: ReduceLROnPlateau.step(metrics) inside a jitted function needs the metric as a "
                         f"tensor the step computes (got {type(metrics).__name__}: a Python value would be the "
                         "capture's at every replay)")
    # every replay hands the scheduler the metric it computed, and the scheduler decides again on the host
    _jit.host_read(metrics, lambda v: self._step(float(v.reshape(-1)[0]) if v.size == 1 else float(v)))

  def _step(self, current: float, epoch=None) -> None:
    if epoch is None: epoch = self.last_epoch + 1
    self.last_epoch = epoch
    if self._is_better(current, self.best): self.best, self.num_bad_epochs = current, 0
    else: self.num_bad_epochs += 1
    if self.in_cooldown:
      self.cooldown_counter -= 1
      self.num_bad_epochs = 0
    if self.num_bad_epochs > self.patience:
      self._reduce_lr(epoch)
      self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
    self._last_lr = _lrs(self.optimizer)

  def _reduce_lr(self, epoch) -> None:
    if len(self.optimizer.param_groups) != len(self.min_lrs):
      if self.default_min_lr is None:
        raise RuntimeError(f"The number of param groups in the `optimizer` ({len(self.optimizer.param_groups)}) "
                           f"differs from when `ReduceLROnPlateau` was initialized ({len(self.min_lrs)}), usually due "
                           "to a new param group being added to the optimizer. Please modify the `min_lrs` field to "
                           "match the length of the `optimizer` param groups.")
      self.min_lrs = [self.default_min_lr] * len(self.optimizer.param_groups)
    for i, g in enumerate(self.optimizer.param_groups):
      old = float(g["lr"])
      new = max(old * self.factor, self.min_lrs[i])
      if old - new > self.eps: g["lr"] = new

  @property
  def in_cooldown(self) -> bool: return self.cooldown_counter > 0

  def _is_better(self, a, best) -> bool:
    if self.mode == "min" and self.threshold_mode == "rel": return a < best * (1.0 - self.threshold)
    if self.mode == "min" and self.threshold_mode == "abs": return a < best - self.threshold
    if self.mode == "max" and self.threshold_mode == "rel": return a > best * (self.threshold + 1.0)
    return a > best + self.threshold

  def _init_is_better(self, mode, threshold, threshold_mode) -> None:
    if mode not in ("min", "max"): raise ValueError("mode " + mode + " is unknown!")
    if threshold_mode not in ("rel", "abs"): raise ValueError("threshold mode " + threshold_mode + " is unknown!")
    self.mode_worse = math.inf if mode == "min" else -math.inf
    self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode

  def load_state_dict(self, state_dict: dict) -> None:
    self.__dict__.update(state_dict)
    self._init_is_better(self.mode, self.threshold, self.threshold_mode)
