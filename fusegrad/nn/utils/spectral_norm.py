"""torch.nn.utils.spectral_norm / remove_spectral_norm (the hook form; parametrizations.spectral_norm is the newer):
the weight is kept as `<name>_orig`, power iteration's vectors as buffers `<name>_u`, `<name>_v`, and a forward
pre-hook sets `module.<name>` = weight / sigma before each forward, one power-iteration step per training forward
(the buffers updated in place, without gradient), as torch's."""
from __future__ import annotations
import fusegrad as fg
from fusegrad.tensor import Tensor
from fusegrad.nn import functional as F
from fusegrad.nn.module import Module, Parameter
from fusegrad.engine.realize import later as realize_later
from fusegrad.nn.utils.weight_norm import _remove_hook

__all__ = ["SpectralNorm", "spectral_norm", "remove_spectral_norm"]


class SpectralNorm:
  _version = 1

  def __init__(self, name: str = "weight", n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12):
    self.name, self.dim = name, dim
    if n_power_iterations <= 0:
      raise ValueError(f"Expected n_power_iterations to be positive, but got n_power_iterations={n_power_iterations}")
    self.n_power_iterations, self.eps = n_power_iterations, eps

  def reshape_weight_to_matrix(self, weight: Tensor) -> Tensor:
    if self.dim != 0: weight = weight.permute(self.dim, *[d for d in range(weight.ndim) if d != self.dim])
    return weight.reshape(weight.shape[0], -1)

  def compute_weight(self, module: Module, do_power_iteration: bool) -> Tensor:
    weight = getattr(module, self.name + "_orig")
    u, v = getattr(module, self.name + "_u"), getattr(module, self.name + "_v")
    weight_mat = self.reshape_weight_to_matrix(weight)
    if do_power_iteration:
      # the last step's lazy u, v realized before another iteration chains onto them (as BatchNorm's statistics)
      pending = [t for t in (u, v) if not t.node.realized and t.node.op not in ("BUFFER", "CONST")]
      if pending: fg.realize(*pending)
      with fg.no_grad():
        w, nu, nv = weight_mat.detach(), u, v
        for _ in range(self.n_power_iterations):
          nv = F.normalize(w.T @ nu, dim=0, eps=self.eps)
          nu = F.normalize(w @ nv, dim=0, eps=self.eps)
        u.copy_(nu)
        v.copy_(nv)
      realize_later(u, v)
    sigma = (u.detach() * (weight_mat @ v.detach())).sum()
    return weight / sigma

  def remove(self, module: Module) -> None:
    with fg.no_grad(): weight = self.compute_weight(module, do_power_iteration=False)
    for suffix in ("", "_u", "_v", "_orig"): delattr(module, self.name + suffix)
    module.register_parameter(self.name, Parameter(weight.detach()))

  def __call__(self, module: Module, inputs) -> None:
    setattr(module, self.name, self.compute_weight(module, do_power_iteration=module.training))

  @staticmethod
  def apply(module: Module, name: str, n_power_iterations: int, dim: int, eps: float) -> "SpectralNorm":
    for hook in module._forward_pre_hooks.values():
      if isinstance(hook, SpectralNorm) and hook.name == name:
        raise RuntimeError(f"Cannot register two spectral_norm hooks on the same parameter {name}")
    fn = SpectralNorm(name, n_power_iterations, dim, eps)
    weight = module._parameters[name]
    if weight is None:
      raise ValueError(f"`SpectralNorm` cannot be applied as parameter `{name}` is None")
    with fg.no_grad():
      h, w = fn.reshape_weight_to_matrix(weight).shape
      u = F.normalize(fg.randn(h, dtype=weight.dtype, device=weight.device), dim=0, eps=fn.eps).realize()
      v = F.normalize(fg.randn(w, dtype=weight.dtype, device=weight.device), dim=0, eps=fn.eps).realize()
    delattr(module, fn.name)
    module.register_parameter(fn.name + "_orig", weight)
    setattr(module, fn.name, weight.detach())
    module.register_buffer(fn.name + "_u", u)
    module.register_buffer(fn.name + "_v", v)
    module.register_forward_pre_hook(fn)
    return fn


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> Module:
  if dim is None:
    from fusegrad.nn.layers import _ConvTranspose
    dim = 1 if isinstance(module, _ConvTranspose) else 0
  SpectralNorm.apply(module, name, n_power_iterations, dim, eps)
  return module


def remove_spectral_norm(module: Module, name: str = "weight") -> Module:
  return _remove_hook(module, SpectralNorm, name, "spectral_norm")
