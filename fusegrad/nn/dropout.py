"""Channel-wise and alpha dropout: dropout1d/2d/3d, alpha_dropout, feature_alpha_dropout and their modules.

As torch's _dropout_impl: one Bernoulli draw per element (alpha) or per (sample, channel) (feature), kept values
scaled, and alpha dropout's dropped values set to SELU's saturation value with an affine correction that keeps a
zero-mean unit-variance input so. Identity when not training or p == 0. Re-exported by nn.functional and nn.
"""
from __future__ import annotations
import math
import warnings
import fusegrad as fg
from fusegrad.tensor import Tensor, where
from fusegrad.nn.module import Module
from fusegrad.nn import functional as F   # (the modules call F's traced functions; F imports this module last)

__all__ = ["dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]

_SELU_ALPHA = 1.7580993408473766   # -SELU(-inf): what alpha dropout sets dropped values to before the correction


def _check_p(p: float) -> None:
  if p < 0.0 or p > 1.0: raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _dropout_impl(input: Tensor, p: float, training: bool, feature: bool, alpha: bool) -> Tensor:
  if p == 0 or not training or input.numel() == 0: return input
  if feature and input.ndim < 2: raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
  if p == 1: return input * 0
  shape = input.shape[:2] + (1,) * (input.ndim - 2) if feature else input.shape
  keep = fg.rand(*shape, device=input.device) >= p          # broadcasts over the spatial dims when feature
  if not alpha: return where(keep, input * (1.0 / (1.0 - p)), 0)._cast(input.dtype)
  a = 1.0 / math.sqrt((_SELU_ALPHA ** 2 * p + 1) * (1 - p))
  # kept: a * x + alpha * a * p; dropped: alpha * a * (p - 1)
  return where(keep, input * a + _SELU_ALPHA * a * p, _SELU_ALPHA * a * (p - 1))._cast(input.dtype)


def _feature_dropout(input: Tensor, p: float, training: bool, unbatched_ndim: int | None) -> Tensor:
  unbatched = input.ndim == unbatched_ndim
  x = input.unsqueeze(0) if unbatched else input
  out = _dropout_impl(x, p, training, feature=True, alpha=False)
  return out.squeeze(0) if unbatched else out


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
  """Zeroes whole channels of [N, C, L] or [C, L] inputs."""
  _check_p(p)
  if input.ndim not in (2, 3):
    raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D input. Note that dropout1d "
                       f"exists to provide channel-wise dropout on inputs with 1 spatial dimension, a channel "
                       f"dimension, and an optional batch dimension (i.e. 2D or 3D inputs).")
  return _feature_dropout(input, p, training, 2)


def _deprecated_ndim(name: str, nd: int, spatial: str, dims: str) -> None:
  warnings.warn(f"{name}: Received a {nd}-D input to {name}, which is deprecated and will result in an error in a "
                f"future release. To retain the behavior and silence this warning, please use dropout instead. Note "
                f"that {name} exists to provide channel-wise dropout on inputs with {spatial} spatial dimensions, a "
                f"channel dimension, and an optional batch dimension (i.e. {dims} inputs).", stacklevel=3)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
  """Zeroes whole channels of [N, C, H, W] inputs (a 3-D input is taken as [N, C, L], as torch still does)."""
  _check_p(p)
  if input.ndim not in (3, 4): _deprecated_ndim("dropout2d", input.ndim, "2", "3D or 4D")
  if input.ndim == 3:
    warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout behavior is "
                  "desired - input is interpreted as shape (N, C, L), where C is the channel dim. This behavior will "
                  "change in a future release to interpret the input as one without a batch dimension, i.e. shape "
                  "(C, H, W). To maintain the 1D channel-wise dropout behavior, please switch to using dropout1d "
                  "instead.", stacklevel=2)
  return _feature_dropout(input, p, training, None)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
  """Zeroes whole channels of [N, C, D, H, W] or [C, D, H, W] inputs."""
  _check_p(p)
  if input.ndim not in (4, 5): _deprecated_ndim("dropout3d", input.ndim, "3", "4D or 5D")
  return _feature_dropout(input, p, training, None if input.ndim == 5 else input.ndim)


def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
  _check_p(p)
  return _dropout_impl(input, p, training, feature=False, alpha=True)


def feature_alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
  _check_p(p)
  return _dropout_impl(input, p, training, feature=True, alpha=True)


# ---- modules ------------------------------------------------------------------------------------------------------

class _DropoutNd(Module):
  def __init__(self, p: float = 0.5, inplace: bool = False):
    super().__init__()
    _check_p(p)
    self.p, self.inplace = p, inplace
  def extra_repr(self) -> str: return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(_DropoutNd):
  def forward(self, input: Tensor) -> Tensor: return F.dropout1d(input, self.p, self.training)


class Dropout2d(_DropoutNd):
  def forward(self, input: Tensor) -> Tensor: return F.dropout2d(input, self.p, self.training)


class Dropout3d(_DropoutNd):
  def forward(self, input: Tensor) -> Tensor: return F.dropout3d(input, self.p, self.training)


class AlphaDropout(_DropoutNd):
  def forward(self, input: Tensor) -> Tensor: return F.alpha_dropout(input, self.p, self.training)


class FeatureAlphaDropout(_DropoutNd):
  def forward(self, input: Tensor) -> Tensor: return F.feature_alpha_dropout(input, self.p, self.training)
