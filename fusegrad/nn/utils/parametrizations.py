"""torch.nn.utils.parametrizations: weight_norm and spectral_norm as parametrizations (parametrize.py), with torch's
names: `parametrizations.weight.original0` (g) / `original1` (v) for weight_norm; `parametrizations.weight.original`
and the power iteration's `parametrizations.weight.0._u` / `_v` buffers for spectral_norm."""
from __future__ import annotations
import fusegrad as fg
from fusegrad.tensor import Tensor
from fusegrad.nn import functional as F
from fusegrad.nn.module import Module
from fusegrad.nn.utils import parametrize
from fusegrad.engine.realize import later as realize_later

__all__ = ["weight_norm", "spectral_norm"]


def norm_except_dim(v: Tensor, pow: float = 2, dim: int = 0) -> Tensor:
  """torch.norm_except_dim: the p-norm over every dim but `dim`, keeping v's rank (dim -1: the whole tensor's norm,
  a 0-d tensor, as torch's)."""
  def pnorm(x: Tensor, d: int) -> Tensor:
    return x.square().sum(d).sqrt() if pow == 2 else x.abs().pow(pow).sum(d).pow(1.0 / pow)
  if dim == -1: return pnorm(v.reshape(-1), 0)
  if dim == 0: return pnorm(v.reshape(v.shape[0], -1), 1).reshape(v.shape[0], *[1] * (v.ndim - 1))
  if dim == v.ndim - 1: return pnorm(v.reshape(-1, v.shape[-1]), 0).reshape(*[1] * (v.ndim - 1), v.shape[-1])
  return norm_except_dim(v.transpose(0, dim), pow, 0).transpose(0, dim)


def _weight_norm(v: Tensor, g: Tensor, dim: int) -> Tensor: return v * (g / norm_except_dim(v, 2, dim))


class _WeightNorm(Module):
  def __init__(self, dim: int | None = 0):
    super().__init__()
    self.dim = -1 if dim is None else dim
  def forward(self, weight_g: Tensor, weight_v: Tensor) -> Tensor: return _weight_norm(weight_v, weight_g, self.dim)
  def right_inverse(self, weight: Tensor) -> tuple: return norm_except_dim(weight, 2, self.dim), weight


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
  """module.<name> = g * v / ||v|| (norm over every dim but `dim`; dim=None: over all), recomputed on each access;
  g is `parametrizations.<name>.original0`, v `original1`. A state dict of the old weight_norm (`<name>_g`,
  `<name>_v`) loads too, as torch's."""
  parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)

  def compat(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
    g_key, v_key = f"{prefix}{name}_g", f"{prefix}{name}_v"
    if g_key in state_dict and v_key in state_dict:
      state_dict[f"{prefix}parametrizations.{name}.original0"] = state_dict.pop(g_key)
      state_dict[f"{prefix}parametrizations.{name}.original1"] = state_dict.pop(v_key)
  module._register_load_state_dict_pre_hook(compat)
  return module


class _SpectralNorm(Module):
  """weight / sigma, sigma the largest singular value of the weight (as a [dim, rest] matrix) estimated by power
  iteration: one step per training forward (u and v buffers updated in place, without gradient), none in eval."""

  def __init__(self, weight: Tensor, n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12):
    super().__init__()
    ndim = weight.ndim
    if dim >= ndim or dim < -ndim:
      raise IndexError(f"Dimension out of range (expected to be in range of [-{ndim}, {ndim - 1}] but got {dim})")
    if n_power_iterations <= 0:
      raise ValueError(f"Expected n_power_iterations to be positive, but got n_power_iterations={n_power_iterations}")
    self.dim = dim if dim >= 0 else dim + ndim
    self.eps = eps
    if ndim > 1:
      self.n_power_iterations = n_power_iterations
      weight_mat = self._reshape_weight_to_matrix(weight.detach())
      h, w = weight_mat.shape
      self.register_buffer("_u", F.normalize(fg.randn(h, dtype=weight.dtype, device=weight.device), dim=0, eps=eps))
      self.register_buffer("_v", F.normalize(fg.randn(w, dtype=weight.dtype, device=weight.device), dim=0, eps=eps))
      self._power_method(weight_mat, 15)
      fg.realize(self._u, self._v)

  def _reshape_weight_to_matrix(self, weight: Tensor) -> Tensor:
    if self.dim != 0: weight = weight.permute(self.dim, *(d for d in range(weight.ndim) if d != self.dim))
    return weight.flatten(1)

  def _power_method(self, weight_mat: Tensor, n_power_iterations: int) -> None:
    with fg.no_grad():
      weight_mat = weight_mat.detach()
      u, v = self._u, self._v
      for _ in range(n_power_iterations):
        u = F.normalize(weight_mat @ v, dim=0, eps=self.eps)
        v = F.normalize(weight_mat.T @ u, dim=0, eps=self.eps)
      self._u.copy_(u)
      self._v.copy_(v)

  def forward(self, weight: Tensor) -> Tensor:
    if weight.ndim == 1: return F.normalize(weight, dim=0, eps=self.eps)
    weight_mat = self._reshape_weight_to_matrix(weight)
    if self.training:
      # the last step's lazy u, v realized before another iteration chains onto them (as BatchNorm's statistics)
      pending = [t for t in (self._u, self._v) if not t.node.realized and t.node.op not in ("BUFFER", "CONST")]
      if pending: fg.realize(*pending)
      self._power_method(weight_mat, self.n_power_iterations)
      realize_later(self._u, self._v)
    u, v = self._u.detach(), self._v.detach()
    sigma = (u * (weight_mat @ v)).sum()
    return weight / sigma

  def right_inverse(self, value: Tensor) -> Tensor: return value


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> Module:
  """module.<name> = weight / sigma(weight) (torch.nn.utils.parametrizations.spectral_norm)."""
  weight = getattr(module, name, None)
  if not isinstance(weight, Tensor):
    raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
  if dim is None:
    from fusegrad.nn.layers import _ConvTranspose
    dim = 1 if isinstance(module, _ConvTranspose) else 0
  parametrize.register_parametrization(module, name, _SpectralNorm(weight, n_power_iterations, dim, eps))
  return module
