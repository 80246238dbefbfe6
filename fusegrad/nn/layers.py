"""Layers with PyTorch's constructor arguments, parameter names, shapes and default initialisation."""
from __future__ import annotations
import math
import warnings
import fusegrad as fg
from fusegrad.tensor import Tensor
from fusegrad.nn import functional as F, init
from fusegrad.nn.module import Module, Parameter
from fusegrad.nn.losses import _Loss, _WeightedLoss
from fusegrad.engine.realize import later as realize_later


def _empty(*shape, device=None, dtype=None) -> Parameter:
  return Parameter(fg.zeros(*shape, device=device, dtype=dtype))


def _default_uniform(weight: Tensor, bias: Tensor | None) -> None:
  """PyTorch's Linear/Conv default: kaiming_uniform(a=sqrt(5)) weights, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) bias."""
  init.kaiming_uniform_(weight, a=math.sqrt(5))
  if bias is not None:
    fan_in, _ = init._calculate_fan_in_and_fan_out(weight)
    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
    init.uniform_(bias, -bound, bound)


class Identity(Module):
  def __init__(self, *args, **kwargs): super().__init__()
  def forward(self, input): return input


class Linear(Module):
  def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
    super().__init__()
    self.in_features, self.out_features = in_features, out_features
    self.weight = _empty(out_features, in_features, device=device, dtype=dtype)
    self.bias = _empty(out_features, device=device, dtype=dtype) if bias else None
    if not bias: self.register_parameter("bias", None)
    self.reset_parameters()

  def reset_parameters(self) -> None: _default_uniform(self.weight, self.bias)
  def forward(self, input: Tensor) -> Tensor: return F.linear(input, self.weight, self.bias)
  def extra_repr(self) -> str:
    return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Bilinear(Module):
  """y = x1^T A x2 + b with weight A [out, in1, in2]; torch's U(-1/sqrt(in1), 1/sqrt(in1)) init for both."""
  def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True, device=None,
               dtype=None):
    super().__init__()
    self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
    self.weight = _empty(out_features, in1_features, in2_features, device=device, dtype=dtype)
    if bias: self.bias = _empty(out_features, device=device, dtype=dtype)
    else: self.register_parameter("bias", None)
    self.reset_parameters()

  def reset_parameters(self) -> None:
    if self.in1_features <= 0:
      raise ValueError(f"in1_features must be > 0, but got (in1_features={self.in1_features})")
    bound = 1 / math.sqrt(self.weight.shape[1])
    init.uniform_(self.weight, -bound, bound)
    if self.bias is not None: init.uniform_(self.bias, -bound, bound)

  def forward(self, input1: Tensor, input2: Tensor) -> Tensor: return F.bilinear(input1, input2, self.weight, self.bias)
  def extra_repr(self) -> str:
    return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}")


class _ConvNd(Module):
  _nd = 0
  _transposed = False

  def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1, groups: int = 1,
               bias: bool = True, padding_mode: str = "zeros", output_padding=0, device=None, dtype=None):
    super().__init__()
    nd = self._nd
    if groups <= 0: raise ValueError("groups must be a positive integer")
    if in_channels % groups: raise ValueError("in_channels must be divisible by groups")
    if out_channels % groups: raise ValueError("out_channels must be divisible by groups")
    if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
      raise ValueError(f"padding_mode must be one of 'zeros', 'reflect', 'replicate' or 'circular', got {padding_mode!r}")
    if isinstance(padding, str):
      if padding not in ("same", "valid"): raise ValueError(f"Invalid padding string {padding!r}")
      if padding == "same" and any(s != 1 for s in F._tuple(stride, nd, "stride")):
        raise ValueError("padding='same' is not supported for strided convolutions")
    self.in_channels, self.out_channels, self.groups, self.padding_mode = in_channels, out_channels, groups, padding_mode
    self.kernel_size = F._tuple(kernel_size, nd, "kernel_size")
    self.stride, self.dilation = F._tuple(stride, nd, "stride"), F._tuple(dilation, nd, "dilation")
    self.padding = padding if isinstance(padding, str) else F._tuple(padding, nd, "padding")
    self.output_padding = F._tuple(output_padding, nd, "output_padding")
    shape = (in_channels, out_channels // groups) if self._transposed else (out_channels, in_channels // groups)
    self.weight = _empty(*shape, *self.kernel_size, device=device, dtype=dtype)
    if bias: self.bias = _empty(out_channels, device=device, dtype=dtype)
    else: self.register_parameter("bias", None)
    self.reset_parameters()

  def reset_parameters(self) -> None: _default_uniform(self.weight, self.bias)

  def _output_padding(self, input: Tensor, output_size) -> tuple:
    """ConvTranspose's output_size argument: the output_padding that gives it (PyTorch's rule and errors)"""
    if output_size is None: return self.output_padding
    nd = self._nd
    lead = 2 if input.ndim == nd + 2 else 1
    output_size = tuple(output_size)
    if len(output_size) == lead + nd: output_size = output_size[lead:]
    if len(output_size) != nd:
      raise ValueError(f"ConvTranspose{nd}D: for {input.ndim}D input, output_size must have {nd} or {lead + nd} "
                       f"elements (got {len(output_size)})")
    lo = [(input.shape[lead + d] - 1) * self.stride[d] - 2 * self.padding[d]
          + self.dilation[d] * (self.kernel_size[d] - 1) + 1 for d in range(nd)]
    hi = [m + s - 1 for m, s in zip(lo, self.stride)]
    if any(not a <= o <= b for o, a, b in zip(output_size, lo, hi)):
      raise ValueError(f"requested an output size of {list(output_size)}, but valid sizes range from {lo} to {hi} "
                       f"(for an input of {list(input.shape[lead:])})")
    return tuple(o - m for o, m in zip(output_size, lo))

  def _padded(self, input: Tensor) -> tuple[Tensor, object]:
    if self.padding_mode == "zeros": return input, self.padding
    pads = F._conv_padding(self.padding, self.kernel_size, self.dilation, self.stride, self._nd)
    return input.pad(tuple(v for lo_hi in reversed(pads) for v in lo_hi), mode=self.padding_mode), 0

  def extra_repr(self) -> str:
    s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
    if self.padding != (0,) * self._nd: s += f", padding={self.padding}"
    if self.dilation != (1,) * self._nd: s += f", dilation={self.dilation}"
    if self.output_padding != (0,) * self._nd: s += f", output_padding={self.output_padding}"
    if self.groups != 1: s += f", groups={self.groups}"
    if self.bias is None: s += ", bias=False"
    if self.padding_mode != "zeros": s += f", padding_mode={self.padding_mode}"
    return s


class _Conv(_ConvNd):
  """Conv1d/2d/3d: PyTorch's constructor order (padding_mode before device)."""
  def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
               padding_mode="zeros", device=None, dtype=None):
    super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
                     device=device, dtype=dtype)
  def forward(self, input):
    x, p = self._padded(input)
    return F._convnd(x, self.weight, self.bias, self.stride, p, self.dilation, self.groups, self._nd,
                     f"conv{self._nd}d")


class _ConvTranspose(_ConvNd):
  """ConvTranspose1d/2d/3d: PyTorch's constructor order (output_padding after padding, dilation after bias)."""
  _transposed = True
  def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1, bias=True,
               dilation=1, padding_mode="zeros", device=None, dtype=None):
    if padding_mode != "zeros": raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
    super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
                     output_padding, device, dtype)
  def forward(self, input, output_size=None):
    return F._conv_transposend(input, self.weight, self.bias, self.stride, self.padding,
                               self._output_padding(input, output_size), self.groups, self.dilation, self._nd,
                               f"conv_transpose{self._nd}d")


class Conv1d(_Conv): _nd = 1
class Conv2d(_Conv): _nd = 2
class Conv3d(_Conv): _nd = 3
class ConvTranspose1d(_ConvTranspose): _nd = 1
class ConvTranspose2d(_ConvTranspose): _nd = 2
class ConvTranspose3d(_ConvTranspose): _nd = 3


class _MaxPoolNd(Module):
  _nd = 0
  def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
    super().__init__()
    self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride or kernel_size, padding, dilation
    self.return_indices, self.ceil_mode = return_indices, ceil_mode
  def forward(self, input):
    return F._max_poolnd(input, self._nd, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                         self.return_indices, type(self).__name__)
  def extra_repr(self) -> str:
    return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"ceil_mode={self.ceil_mode}")


class MaxPool1d(_MaxPoolNd): _nd = 1
class MaxPool2d(_MaxPoolNd): _nd = 2
class MaxPool3d(_MaxPoolNd): _nd = 3


class _AvgPoolNd(Module):
  _nd = 0
  def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    super().__init__()
    self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
    self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override
  def forward(self, input):
    return F._avg_poolnd(input, self._nd, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                         self.count_include_pad, self.divisor_override, type(self).__name__)
  def extra_repr(self) -> str: return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd): _nd = 1
class AvgPool2d(_AvgPoolNd): _nd = 2


class AdaptiveAvgPool1d(Module):
  def __init__(self, output_size):
    super().__init__()
    self.output_size = output_size
  def forward(self, input): return F.adaptive_avg_pool1d(input, self.output_size)
  def extra_repr(self) -> str: return f"output_size={self.output_size}"


class AdaptiveAvgPool2d(AdaptiveAvgPool1d):
  def forward(self, input): return F.adaptive_avg_pool2d(input, self.output_size)


class AdaptiveMaxPool1d(Module):
  def __init__(self, output_size, return_indices: bool = False):
    super().__init__()
    self.output_size, self.return_indices = output_size, return_indices
  def forward(self, input): return F.adaptive_max_pool1d(input, self.output_size, self.return_indices)
  def extra_repr(self) -> str: return f"output_size={self.output_size}"


class AdaptiveMaxPool2d(AdaptiveMaxPool1d):
  def forward(self, input): return F.adaptive_max_pool2d(input, self.output_size, self.return_indices)


class _BatchNorm(Module):
  _dims: tuple = ()
  def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
               track_running_stats: bool = True, device=None, dtype=None, *, bias: bool = True):
    super().__init__()
    self.num_features, self.eps, self.momentum = num_features, eps, momentum
    self.affine, self.track_running_stats = affine, track_running_stats
    if affine: self.weight = Parameter(fg.ones(num_features, device=device, dtype=dtype))
    else: self.register_parameter("weight", None)
    if affine and bias: self.bias = Parameter(fg.zeros(num_features, device=device, dtype=dtype))
    else: self.register_parameter("bias", None)
    if track_running_stats:
      self.register_buffer("running_mean", fg.zeros(num_features, device=device, dtype=dtype))
      self.register_buffer("running_var", fg.ones(num_features, device=device, dtype=dtype))
      self.register_buffer("num_batches_tracked", fg.tensor(0, dtype=fg.int64, device=device))
    else:
      self.register_buffer("running_mean", None)
      self.register_buffer("running_var", None)
      self.register_buffer("num_batches_tracked", None)

  def reset_running_stats(self) -> None:
    if self.track_running_stats:
      self.running_mean.zero_(); self.running_var.fill_(1); self.num_batches_tracked.zero_()

  def forward(self, input: Tensor) -> Tensor:
    if input.ndim not in self._dims:
      raise ValueError(f"expected {' or '.join(f'{d}D' for d in self._dims)} input (got {input.ndim}D input)")
    use_batch = self.training or not self.track_running_stats
    track = self.training and self.track_running_stats
    momentum = self.momentum if self.momentum is not None else 0.0
    if track:
      # the running stats are lazy values: realize the last step's before chaining another one onto them
      pending = [t for t in (self.running_mean, self.running_var, self.num_batches_tracked)
                 if not t.node.realized and t.node.op not in ("BUFFER", "CONST")]
      if pending: fg.realize(*pending)
      with fg.no_grad():
        self.num_batches_tracked += 1
        if self.momentum is None: momentum = 1.0 / self.num_batches_tracked.float()   # cumulative average, lazily
    stats = track or not use_batch
    y = F.batch_norm(input, self.running_mean if stats else None, self.running_var if stats else None,
                     self.weight, self.bias, use_batch, momentum, self.eps)
    # the new statistics are computed with whatever is realized next (the training step), not at the next forward
    if track: realize_later(self.running_mean, self.running_var, self.num_batches_tracked)
    return y

  def extra_repr(self) -> str:
    return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm): _dims = (2, 3)
class BatchNorm2d(_BatchNorm): _dims = (4,)


class _InstanceNorm(_BatchNorm):
  """torch's InstanceNorm: _BatchNorm's parameters and buffers (num_batches_tracked too, never counted), without
  affine parameters or running statistics by default; an unbatched input ([C, *spatial]) is normalized as a batch of
  one."""
  def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
               track_running_stats: bool = False, device=None, dtype=None, *, bias: bool = True):
    super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)

  def forward(self, input: Tensor) -> Tensor:
    if input.ndim not in self._dims:
      raise ValueError(f"expected {self._dims[0]}D or {self._dims[1]}D input (got {input.ndim}D input)")
    fdim = input.ndim - self._dims[0]
    if input.shape[fdim] != self.num_features:
      if self.affine:
        raise ValueError(f"expected input's size at dim={fdim} to match num_features ({self.num_features}), but got: "
                         f"{input.shape[fdim]}.")
      warnings.warn(f"input's size at dim={fdim} does not match num_features. You can silence this warning by not "
                    f"passing in num_features, which is not used because affine=False", stacklevel=2)
    unbatched = input.ndim == self._dims[0]
    x = input.unsqueeze(0) if unbatched else input
    use_input = self.training or not self.track_running_stats
    track = use_input and self.track_running_stats
    if track:   # the last step's lazy statistics realized before another update chains onto them (as _BatchNorm)
      pending = [t for t in (self.running_mean, self.running_var)
                 if not t.node.realized and t.node.op not in ("BUFFER", "CONST")]
      if pending: fg.realize(*pending)
    y = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias, use_input,
                        self.momentum if self.momentum is not None else 0.0, self.eps)
    if track: realize_later(self.running_mean, self.running_var)
    return y.squeeze(0) if unbatched else y


class InstanceNorm1d(_InstanceNorm): _dims = (2, 3)
class InstanceNorm2d(_InstanceNorm): _dims = (3, 4)
class InstanceNorm3d(_InstanceNorm): _dims = (4, 5)


class LayerNorm(Module):
  def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
               device=None, dtype=None):
    super().__init__()
    self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    self.eps, self.elementwise_affine = eps, elementwise_affine
    if elementwise_affine:
      self.weight = Parameter(fg.ones(*self.normalized_shape, device=device, dtype=dtype))
      if bias: self.bias = Parameter(fg.zeros(*self.normalized_shape, device=device, dtype=dtype))
      else: self.register_parameter("bias", None)
    else:
      self.register_parameter("weight", None)
      self.register_parameter("bias", None)
  def forward(self, input): return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
  def extra_repr(self) -> str:
    return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}")


class RMSNorm(Module):
  def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, device=None,
               dtype=None):
    super().__init__()
    self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    self.eps, self.elementwise_affine = eps, elementwise_affine
    if elementwise_affine: self.weight = Parameter(fg.ones(*self.normalized_shape, device=device, dtype=dtype))
    else: self.register_parameter("weight", None)
  def forward(self, input): return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)
  def extra_repr(self) -> str:
    return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device=None,
               dtype=None, *, bias: bool = True):
    super().__init__()
    if num_channels % num_groups: raise ValueError("num_channels must be divisible by num_groups")
    self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
    if affine: self.weight = Parameter(fg.ones(num_channels, device=device, dtype=dtype))
    else: self.register_parameter("weight", None)
    if affine and bias: self.bias = Parameter(fg.zeros(num_channels, device=device, dtype=dtype))
    else: self.register_parameter("bias", None)
  def forward(self, input): return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)
  def extra_repr(self) -> str:
    return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, bias={self.bias is not None}"


class LocalResponseNorm(Module):
  def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
    super().__init__()
    self.size, self.alpha, self.beta, self.k = size, alpha, beta, k
  def forward(self, input: Tensor) -> Tensor:
    return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)
  def extra_repr(self) -> str: return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class CrossMapLRN2d(Module):
  """Lua Torch's LRN of 4-D inputs, kept in torch for old models. Its window is torch's: for channel c the squares of
  channels c - p + 1 .. c + p - 1 (p = (size - 1) // 2 + 1), where from channel p + 1 on channel 0's square stays in
  the sum (torch's running-sum loop never subtracts it). The gradient is autograd's of that forward (torch's
  hand-written backward uses another window)."""
  def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1):
    super().__init__()
    self.size, self.alpha, self.beta, self.k = size, alpha, beta, k
  extra_repr = LocalResponseNorm.extra_repr

  def forward(self, input: Tensor) -> Tensor:
    if input.ndim != 4: raise ValueError(f"CrossMapLRN2d: Expected input to be 4D, got {input.ndim}D instead.")
    C = input.shape[1]
    pre = int((self.size - 1) / 2 + 1)
    c = fg.arange(C, device=input.device).reshape(C, 1)
    j = fg.arange(C, device=input.device).reshape(1, C)
    window = ((j <= c + pre - 1) & ((j >= c - pre + 1) | (j == 0)))._cast(input.dtype)          # [c, j]
    sums = (input.square().permute(0, 2, 3, 1) @ window.T).permute(0, 3, 1, 2)
    scale = sums * (self.alpha / self.size) + self.k
    return scale.pow(-self.beta) * input


class Embedding(Module):
  def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, max_norm=None,
               norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False, _weight=None,
               _freeze: bool = False, device=None, dtype=None):
    super().__init__()
    if max_norm is not None or scale_grad_by_freq or sparse:
      raise NotImplementedError("Embedding: max_norm, scale_grad_by_freq and sparse are not supported")
    if padding_idx is not None:
      if not -num_embeddings <= padding_idx < num_embeddings:
        raise AssertionError("Padding_idx must be within num_embeddings")
      if padding_idx < 0: padding_idx += num_embeddings
    self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
    if _weight is not None:
      if tuple(_weight.shape) != (num_embeddings, embedding_dim):
        raise AssertionError("Shape of weight does not match num_embeddings and embedding_dim")
      self.weight = Parameter(_weight, requires_grad=not _freeze)
    else:
      self.weight = _empty(num_embeddings, embedding_dim, device=device, dtype=dtype)
      self.reset_parameters()

  def reset_parameters(self) -> None:
    init.normal_(self.weight)
    if self.padding_idx is not None:
      with fg.no_grad(): self.weight[self.padding_idx] = 0.0

  def forward(self, input): return F.embedding(input, self.weight, self.padding_idx)
  def extra_repr(self) -> str:
    return f"{self.num_embeddings}, {self.embedding_dim}" + (f", padding_idx={self.padding_idx}"
                                                             if self.padding_idx is not None else "")


class EmbeddingBag(Module):
  """Sums, means or maxima of bags of embeddings (F.embedding_bag): torch's arguments, N(0, 1) init and padding row."""
  def __init__(self, num_embeddings: int, embedding_dim: int, max_norm=None, norm_type: float = 2.0,
               scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False, _weight=None,
               include_last_offset: bool = False, padding_idx: int | None = None, device=None, dtype=None):
    super().__init__()
    if max_norm is not None or scale_grad_by_freq or sparse:
      raise NotImplementedError("EmbeddingBag: max_norm, scale_grad_by_freq and sparse are not supported")
    self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
    self.max_norm, self.norm_type, self.scale_grad_by_freq = max_norm, norm_type, scale_grad_by_freq
    if padding_idx is not None:
      if not -num_embeddings <= padding_idx < num_embeddings:
        raise AssertionError("padding_idx must be within num_embeddings")
      if padding_idx < 0: padding_idx += num_embeddings
    self.padding_idx = padding_idx
    if _weight is None:
      self.weight = _empty(num_embeddings, embedding_dim, device=device, dtype=dtype)
      self.reset_parameters()
    else:
      if list(_weight.shape) != [num_embeddings, embedding_dim]:
        raise AssertionError("Shape of weight does not match num_embeddings and embedding_dim")
      self.weight = Parameter(_weight)
    self.mode, self.sparse, self.include_last_offset = mode, sparse, include_last_offset

  def reset_parameters(self) -> None:
    init.normal_(self.weight)
    if self.padding_idx is not None:
      with fg.no_grad(): self.weight[self.padding_idx] = 0.0

  def forward(self, input: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None) -> Tensor:
    return F.embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type, self.scale_grad_by_freq,
                           self.mode, self.sparse, per_sample_weights, self.include_last_offset, self.padding_idx)

  def extra_repr(self) -> str:
    s = f"{self.num_embeddings}, {self.embedding_dim}"
    if self.max_norm is not None: s += f", max_norm={self.max_norm!r}"
    if self.norm_type != 2: s += f", norm_type={self.norm_type!r}"
    if self.scale_grad_by_freq is not False: s += f", scale_grad_by_freq={self.scale_grad_by_freq!r}"
    s += f", mode={self.mode!r}"
    if self.padding_idx is not None: s += f", padding_idx={self.padding_idx!r}"
    return s

  @classmethod
  def from_pretrained(cls, embeddings: Tensor, freeze: bool = True, max_norm=None, norm_type: float = 2.0,
                      scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                      include_last_offset: bool = False, padding_idx: int | None = None) -> "EmbeddingBag":
    if embeddings.ndim != 2: raise AssertionError("Embeddings parameter is expected to be 2-dimensional")
    rows, cols = embeddings.shape
    bag = cls(rows, cols, max_norm, norm_type, scale_grad_by_freq, mode, sparse, embeddings, include_last_offset,
              padding_idx)
    bag.weight.requires_grad_(not freeze)
    return bag


class Dropout(Module):
  def __init__(self, p: float = 0.5, inplace: bool = False):
    super().__init__()
    if not 0.0 <= p <= 1.0: raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    self.p, self.inplace = p, inplace
  def forward(self, input): return F.dropout(input, self.p, self.training)
  def extra_repr(self) -> str: return f"p={self.p}, inplace={self.inplace}"


class Flatten(Module):
  def __init__(self, start_dim: int = 1, end_dim: int = -1):
    super().__init__()
    self.start_dim, self.end_dim = start_dim, end_dim
  def forward(self, input): return input.flatten(self.start_dim, self.end_dim)
  def extra_repr(self) -> str: return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
  def __init__(self, dim: int, unflattened_size):
    super().__init__()
    self.dim, self.unflattened_size = dim, tuple(unflattened_size)
  def forward(self, input): return input.unflatten(self.dim, self.unflattened_size)
  def extra_repr(self) -> str: return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class MultiheadAttention(Module):
  """PyTorch's layout: in_proj_weight [3E, E] (or q/k/v_proj_weight when kdim/vdim differ), in_proj_bias,
  out_proj (a Linear); batch_first selects [N, L, E] over [L, N, E]."""

  def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, add_bias_kv: bool = False,
               add_zero_attn: bool = False, kdim: int | None = None, vdim: int | None = None, batch_first: bool = False,
               device=None, dtype=None):
    super().__init__()
    if embed_dim <= 0 or num_heads <= 0:
      raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and "
                       f"num_heads={num_heads} instead")
    if embed_dim % num_heads:
      raise AssertionError(f"embed_dim must be divisible by num_heads (got embed_dim={embed_dim}, num_heads={num_heads})")
    if add_bias_kv or add_zero_attn: raise NotImplementedError("add_bias_kv and add_zero_attn are not supported")
    self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
    self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
    self.head_dim = embed_dim // num_heads
    self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
    E = embed_dim
    if self._qkv_same_embed_dim:
      self.in_proj_weight = _empty(3 * E, E, device=device, dtype=dtype)
      for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"): self.register_parameter(n, None)
    else:
      self.q_proj_weight = _empty(E, E, device=device, dtype=dtype)
      self.k_proj_weight = _empty(E, self.kdim, device=device, dtype=dtype)
      self.v_proj_weight = _empty(E, self.vdim, device=device, dtype=dtype)
      self.register_parameter("in_proj_weight", None)
    if bias: self.in_proj_bias = _empty(3 * E, device=device, dtype=dtype)
    else: self.register_parameter("in_proj_bias", None)
    self.out_proj = Linear(E, E, bias=bias, device=device, dtype=dtype)
    self._reset_parameters()

  def _reset_parameters(self) -> None:
    if self._qkv_same_embed_dim: init.xavier_uniform_(self.in_proj_weight)
    else:
      for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight): init.xavier_uniform_(w)
    if self.in_proj_bias is not None:
      init.zeros_(self.in_proj_bias)
      init.zeros_(self.out_proj.bias)

  def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
              need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
              is_causal: bool = False):
    packed = query is key and key is value and self._qkv_same_embed_dim   # self-attention: one projection
    unbatched = query.ndim == 2
    if unbatched:
      if key.ndim != 2 or value.ndim != 2:
        raise AssertionError(f"For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found "
                             f"{key.ndim}-D and {value.ndim}-D tensors respectively")
      query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    elif query.ndim == 3 and (key.ndim != 3 or value.ndim != 3):
      raise AssertionError(f"For batched (3-D) `query`, expected `key` and `value` to be 3-D but found "
                           f"{key.ndim}-D and {value.ndim}-D tensors respectively")
    elif self.batch_first: query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    if query.ndim != 3 or query.shape[-1] != self.embed_dim:
      raise AssertionError(f"was expecting embedding dimension of {self.embed_dim}, but got query of shape "
                           f"{list(query.shape)}")
    L, N, E = query.shape
    S = key.shape[0]
    if key.shape[1] != N or value.shape[:2] != key.shape[:2]:
      raise AssertionError(f"key's sequence and batch dims {list(key.shape[:2])} must match value's "
                           f"{list(value.shape[:2])} and the query's batch size {N} (sequence-first shapes)")
    if key.shape[-1] != self.kdim or value.shape[-1] != self.vdim:
      raise AssertionError(f"was expecting key and value of embedding dimension {self.kdim} and {self.vdim}, but got "
                           f"key of shape {list(key.shape)} and value of shape {list(value.shape)} (sequence-first)")
    H, D = self.num_heads, self.head_dim
    b = self.in_proj_bias
    bq, bk, bv = (b[:E], b[E:2 * E], b[2 * E:]) if b is not None else (None, None, None)
    if self._qkv_same_embed_dim:
      wq, wk, wv = self.in_proj_weight[:E], self.in_proj_weight[E:2 * E], self.in_proj_weight[2 * E:]
    else:
      wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
    if packed:   # one [3E, E] matmul (one kernel) rather than three
      qkv = F.linear(query, self.in_proj_weight, b).reshape(L, N, 3, H, D)
      q, k, v = (qkv[:, :, i].reshape(L, N * H, D).transpose(0, 1) for i in range(3))
    else:
      q = F.linear(query, wq, bq).reshape(L, N * H, D).transpose(0, 1)     # [N*H, L, D]
      k = F.linear(key, wk, bk).reshape(S, N * H, D).transpose(0, 1)
      v = F.linear(value, wv, bv).reshape(S, N * H, D).transpose(0, 1)
    # masks as PyTorch's _canonical_mask: bool True is "not allowed" (-inf), float masks are added
    mask = None
    if attn_mask is not None:
      _check_mask_dtype(attn_mask, "attn_mask")
      if attn_mask.ndim == 2:
        if tuple(attn_mask.shape) != (L, S):
          raise RuntimeError(f"The shape of the 2D attn_mask is {list(attn_mask.shape)}, but should be {[L, S]}.")
        mask = attn_mask.reshape(1, 1, L, S)
      elif attn_mask.ndim == 3:
        if tuple(attn_mask.shape) != (N * H, L, S):
          raise RuntimeError(f"The shape of the 3D attn_mask is {list(attn_mask.shape)}, but should be "
                             f"{[N * H, L, S]}.")
        mask = attn_mask.reshape(N, H, L, S)
      else:
        raise RuntimeError(f"attn_mask's dimension {attn_mask.ndim} is not supported (shape {list(attn_mask.shape)})")
      if mask.dtype.is_bool: mask = fg.zeros(*mask.shape, device=q.device, dtype=q.dtype).masked_fill(mask, -math.inf)
    elif is_causal:
      mask = fg.zeros(L, S, device=q.device, dtype=q.dtype).masked_fill(
        F._causal_mask(L, S, q.device).logical_not(), -math.inf).reshape(1, 1, L, S)
    if key_padding_mask is not None:
      _check_mask_dtype(key_padding_mask, "key_padding_mask")
      want = (S,) if unbatched else (N, S)
      if tuple(key_padding_mask.shape) != want:
        raise AssertionError(f"expecting key_padding_mask shape of {list(want)}, but got "
                             f"{list(key_padding_mask.shape)}")
      kpm = key_padding_mask.reshape(N, 1, 1, S)
      if kpm.dtype.is_bool: kpm = fg.zeros(N, 1, 1, S, device=q.device, dtype=q.dtype).masked_fill(kpm, -math.inf)
      mask = kpm if mask is None else mask + kpm
    scores = (q @ k.transpose(1, 2)).reshape(N, H, L, S) * (1.0 / math.sqrt(D))
    if mask is not None: scores = scores + mask
    attn = scores.softmax(-1)
    p = F.dropout(attn, self.dropout, self.training) if self.dropout > 0 else attn
    out = (p.reshape(N * H, L, S) @ v).transpose(0, 1).reshape(L, N, E)
    out = self.out_proj(out)
    if unbatched: out = out.squeeze(1)
    elif self.batch_first: out = out.transpose(0, 1)
    if not need_weights: return out, None
    w = p.mean(1) if average_attn_weights else p      # the weights the values were averaged with (dropout included)
    return out, (w.squeeze(0) if unbatched else w)


def _check_mask_dtype(mask: Tensor, name: str) -> None:
  if not (mask.dtype.is_bool or mask.dtype.is_float):
    raise AssertionError(f"only bool and floating types of {name} are supported (got {mask.dtype.name})")


# ---- activations as modules ---------------------------------------------------------------------------------------

def _activation(name: str, fn, params: tuple = (), defaults: tuple = ()):
  def __init__(self, *args, **kwargs):
    Module.__init__(self)
    vals = dict(zip(params, defaults))
    vals.update(zip(params, args))
    for k, v in kwargs.items():
      if k == "inplace": continue
      if k not in params: raise TypeError(f"{name}.__init__() got an unexpected keyword argument '{k}'")
      vals[k] = v
    for k, v in vals.items(): setattr(self, k, v)
  def forward(self, input): return fn(input, *[getattr(self, k) for k in params])
  def extra_repr(self):
    return ", ".join(f"{k}={getattr(self, k)!r}" if isinstance(getattr(self, k), str) else f"{k}={getattr(self, k)}"
                     for k in params)
  return type(name, (Module,), {"__init__": __init__, "forward": forward, "extra_repr": extra_repr})


ReLU = _activation("ReLU", F.relu)
ReLU6 = _activation("ReLU6", F.relu6)
LeakyReLU = _activation("LeakyReLU", F.leaky_relu, ("negative_slope",), (0.01,))
ELU = _activation("ELU", F.elu, ("alpha",), (1.0,))
GELU = _activation("GELU", F.gelu, ("approximate",), ("none",))
SiLU = _activation("SiLU", F.silu)
Mish = _activation("Mish", F.mish)
Softplus = _activation("Softplus", F.softplus, ("beta", "threshold"), (1.0, 20.0))
Sigmoid = _activation("Sigmoid", F.sigmoid)
Tanh = _activation("Tanh", F.tanh)
Hardtanh = _activation("Hardtanh", F.hardtanh, ("min_val", "max_val"), (-1.0, 1.0))
Hardsigmoid = _activation("Hardsigmoid", F.hardsigmoid)
Hardswish = _activation("Hardswish", F.hardswish)
GLU = _activation("GLU", F.glu, ("dim",), (-1,))
LogSigmoid = _activation("LogSigmoid", F.logsigmoid)
def _softmax_dim(x: Tensor, dim) -> int:   # PyTorch's legacy choice when no dim is given
  return dim if dim is not None else (0 if x.ndim in (0, 1, 3) else 1)
Softmax = _activation("Softmax", lambda x, dim: x.softmax(_softmax_dim(x, dim)), ("dim",), (None,))
LogSoftmax = _activation("LogSoftmax", lambda x, dim: x.log_softmax(_softmax_dim(x, dim)), ("dim",), (None,))
Softmin = _activation("Softmin", lambda x, dim: F.softmin(x, _softmax_dim(x, dim)), ("dim",), (None,))
CELU = _activation("CELU", F.celu, ("alpha",), (1.0,))
SELU = _activation("SELU", F.selu)


# ---- losses as modules --------------------------------------------------------------------------------------------

class MSELoss(_Loss):
  def forward(self, input, target): return F.mse_loss(input, target, self.reduction)


class L1Loss(_Loss):
  def forward(self, input, target): return F.l1_loss(input, target, self.reduction)


class SmoothL1Loss(_Loss):
  def __init__(self, reduction: str = "mean", beta: float = 1.0):
    super().__init__(reduction=reduction)
    self.beta = beta
  def forward(self, input, target): return F.smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(_Loss):
  def __init__(self, reduction: str = "mean", delta: float = 1.0):
    super().__init__(reduction=reduction)
    self.delta = delta
  def forward(self, input, target): return F.huber_loss(input, target, self.reduction, self.delta)


class CrossEntropyLoss(_WeightedLoss):
  def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0):
    super().__init__(weight, reduction=reduction)
    self.ignore_index, self.label_smoothing = ignore_index, label_smoothing
  def forward(self, input, target):
    return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class NLLLoss(_WeightedLoss):
  def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean"):
    super().__init__(weight, reduction=reduction)
    self.ignore_index = ignore_index
  def forward(self, input, target): return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class BCELoss(_WeightedLoss):
  def forward(self, input, target): return F.binary_cross_entropy(input, target, self.weight, self.reduction)


class BCEWithLogitsLoss(_WeightedLoss):
  def __init__(self, weight=None, reduction: str = "mean", pos_weight=None):
    super().__init__(weight, reduction=reduction)
    self.register_buffer("pos_weight", pos_weight)
  def forward(self, input, target):
    return F.binary_cross_entropy_with_logits(input, target, self.weight, self.reduction, self.pos_weight)


class KLDivLoss(_Loss):
  def __init__(self, reduction: str = "mean", log_target: bool = False):
    super().__init__(reduction=reduction)
    self.log_target = log_target
  def forward(self, input, target): return F.kl_div(input, target, self.reduction, self.log_target)
