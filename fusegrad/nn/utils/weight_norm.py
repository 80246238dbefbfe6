"""torch.nn.utils.weight_norm / remove_weight_norm (deprecated in torch for parametrizations.weight_norm, still in
use): the weight becomes parameters `<name>_g` and `<name>_v`, and a forward pre-hook (a WeightNorm) sets
`module.<name>` = g * v / ||v|| before each forward, as torch's. (A hook is Python that a fusegrad.jit replay does
not run: fusegrad.jit refuses such a module; parametrizations.weight_norm has no hook.)"""
from __future__ import annotations
import warnings
from fusegrad.nn.module import Module, Parameter
from fusegrad.nn.utils.parametrizations import norm_except_dim, _weight_norm

__all__ = ["WeightNorm", "weight_norm", "remove_weight_norm"]


class WeightNorm:
  def __init__(self, name: str, dim: int | None):
    self.name, self.dim = name, -1 if dim is None else dim

  def compute_weight(self, module: Module):
    return _weight_norm(getattr(module, self.name + "_v"), getattr(module, self.name + "_g"), self.dim)

  @staticmethod
  def apply(module: Module, name: str, dim: int | None) -> "WeightNorm":
    warnings.warn("`torch.nn.utils.weight_norm` is deprecated in favor of `torch.nn.utils.parametrizations."
                  "weight_norm`.", FutureWarning, stacklevel=3)
    for hook in module._forward_pre_hooks.values():
      if isinstance(hook, WeightNorm) and hook.name == name:
        raise RuntimeError(f"Cannot register two weight_norm hooks on the same parameter {name}")
    fn = WeightNorm(name, dim)
    weight = getattr(module, name)
    del module._parameters[name]
    module.register_parameter(name + "_g", Parameter(norm_except_dim(weight.detach(), 2, fn.dim)))
    module.register_parameter(name + "_v", Parameter(weight.detach()))
    setattr(module, name, fn.compute_weight(module))
    module.register_forward_pre_hook(fn)
    return fn

  def remove(self, module: Module) -> None:
    weight = self.compute_weight(module)
    delattr(module, self.name)
    del module._parameters[self.name + "_g"]
    del module._parameters[self.name + "_v"]
    setattr(module, self.name, Parameter(weight.detach()))

  def __call__(self, module: Module, inputs) -> None: setattr(module, self.name, self.compute_weight(module))


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
  WeightNorm.apply(module, name, dim)
  return module


def remove_weight_norm(module: Module, name: str = "weight") -> Module:
  return _remove_hook(module, WeightNorm, name, "weight_norm")


def _remove_hook(module: Module, cls: type, name: str, what: str) -> Module:
  """Undo a reparametrization hook of class cls on module's `name` (remove_weight_norm, remove_spectral_norm)."""
  for k, hook in module._forward_pre_hooks.items():
    if isinstance(hook, cls) and hook.name == name:
      hook.remove(module)
      del module._forward_pre_hooks[k]
      return module
  raise ValueError(f"{what} of '{name}' not found in {module}")
