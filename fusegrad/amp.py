"""fusegrad.amp: PyTorch's autocast and GradScaler names, for programs that pass enabled=False or run in float32.

fusegrad has no automatic mixed precision: every op computes in the dtypes of its tensors (cast a model with
`model.to(fusegrad.bfloat16)` for low precision). So autocast is accepted where it changes nothing (enabled=False,
or dtype float32) and raises otherwise, rather than silently computing in float32 what the program asked to
compute in float16/bfloat16; GradScaler(enabled=False) is the pass-through PyTorch's is, enabled=True raises.
"""
from __future__ import annotations
import contextlib
from fusegrad import dtype as _dt
from fusegrad.devices import device as _device


class autocast(contextlib.ContextDecorator):
  """with fusegrad.autocast("cpu", enabled=False): ...  (see the module docstring for what is refused)."""

  def __init__(self, device_type: str = "cuda", dtype=None, enabled: bool = True, cache_enabled=None):
    if not isinstance(device_type, str):
      raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    _device(device_type)   # a known device type, as PyTorch checks
    self.device_type, self.enabled = device_type, bool(enabled)
    self.fast_dtype = _dt.to_dtype(dtype) if dtype is not None else (_dt.bfloat16 if device_type == "cpu" else _dt.float16)
    if self.enabled and self.fast_dtype != _dt.float32:
      raise RuntimeError(f"fusegrad.autocast(device_type={device_type!r}, dtype={self.fast_dtype.name}): automatic mixed "
                         f"precision is not supported; fusegrad computes in the dtypes of the tensors. Cast the model "
                         f"and inputs instead (model.to(fusegrad.{self.fast_dtype.name})), or pass enabled=False")

  def __enter__(self): return self
  def __exit__(self, *exc): return False


class GradScaler:
  """GradScaler(enabled=False): scale() returns the loss, step() calls optimizer.step(), as PyTorch's disabled
  scaler does. enabled=True raises: fusegrad has no float16 autocast whose gradients would need scaling."""

  def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
               backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
    if enabled:
      raise RuntimeError("fusegrad.amp.GradScaler(enabled=True): loss scaling is not supported (fusegrad has no "
                         "float16 autocast); pass enabled=False, or train in float32/bfloat16 without a scaler")
    self._enabled = False

  def is_enabled(self) -> bool: return self._enabled
  def scale(self, outputs): return outputs
  def unscale_(self, optimizer) -> None: pass
  def step(self, optimizer, *args, **kwargs): return optimizer.step(*args, **kwargs)
  def update(self, new_scale=None) -> None: pass
  def get_scale(self) -> float: return 1.0
  def state_dict(self) -> dict: return {}
  def load_state_dict(self, state_dict: dict) -> None: pass
