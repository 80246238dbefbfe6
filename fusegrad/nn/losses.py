"""More of nn.functional's losses and distances (PyTorch's formulas, as lazy Tensor compositions); the classic
ones (mse, l1, smooth_l1, huber, cross_entropy, nll, bce, kl_div) live in nn.functional. Re-exported by it.
"""
from __future__ import annotations
import math
from fusegrad.tensor import Tensor, where, broadcast_shapes

__all__ = ["poisson_nll_loss", "gaussian_nll_loss", "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss",
           "multilabel_soft_margin_loss", "cosine_embedding_loss", "triplet_margin_loss", "multi_margin_loss",
           "pairwise_distance", "cosine_similarity", "multilabel_margin_loss", "triplet_margin_with_distance_loss"]


def _legacy_reduction(size_average, reduce, reduction: str, warn: bool = True) -> str:
  """torch's _Reduction.legacy_get_string: the deprecated size_average / reduce flags, where given, pick the reduction."""
  if size_average is None and reduce is None: return reduction
  if warn:
    import warnings
    warnings.warn("size_average and reduce args will be deprecated, please use reduction='"
                  + _legacy_reduction(size_average, reduce, reduction, False) + "' instead.", stacklevel=3)
  size_average = True if size_average is None else size_average
  reduce = True if reduce is None else reduce
  return "mean" if size_average and reduce else "sum" if reduce else "none"


def _reduce(loss: Tensor, reduction: str) -> Tensor:
  if reduction == "mean": return loss.mean()
  if reduction == "sum": return loss.sum()
  if reduction == "none": return loss
  raise ValueError(f"{reduction} is not a valid value for reduction")


def _softplus_neg(x: Tensor) -> Tensor:
  """log(1 + exp(-x)) without overflow."""
  return (-x).relu() + (-x.abs()).exp().log1p()


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False, size_average=None,
                     eps: float = 1e-8, reduce=None, reduction: str = "mean") -> Tensor:
  reduction = _legacy_reduction(size_average, reduce, reduction)
  loss = input.exp() - target * input if log_input else input - target * (input + eps).log()
  if full:   # Stirling's term, where target > 1
    t = where(target > 1, target, 2)
    loss = loss + where(target > 1, t * t.log() - t + 0.5 * (2 * math.pi * t).log(), 0)
  return _reduce(loss, reduction)


def gaussian_nll_loss(input: Tensor, target: Tensor, var, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> Tensor:
  if not isinstance(var, Tensor): var = input._operand(float(var), input.dtype)
  if var.shape != input.shape:
    if input.shape[:-1] == var.shape: var = var.unsqueeze(-1)
    elif input.shape[:-1] == var.shape[:-1] and var.shape[-1] == 1: pass
    elif var.ndim == 0 or var.numel() == 1 and var.ndim <= input.ndim: pass
    else: raise ValueError(f"var is of incorrect size (var {list(var.shape)}, input {list(input.shape)})")
  if reduction not in ("none", "mean", "sum"): raise ValueError(f"{reduction} is not a valid value for reduction")
  if var.node.realized or var.node.op in ("BUFFER", "CONST"):
    if (var.numpy() < 0).any(): raise ValueError("var has negative entry/entries")
  # PyTorch clamps var under no_grad: the clamped value, with the gradient of var itself
  v = var + (var.clamp_min(eps) - var).detach()
  loss = 0.5 * (v.log() + (input - target).square() / v)
  if full: loss = loss + 0.5 * math.log(2 * math.pi)
  return _reduce(loss, reduction)


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0, size_average=None,
                        reduce=None, reduction: str = "mean") -> Tensor:
  reduction = _legacy_reduction(size_average, reduce, reduction)
  if input1.ndim != input2.ndim or input1.ndim != target.ndim:
    raise RuntimeError(f"margin_ranking_loss : All input tensors should have same dimension but got sizes: input1: "
                       f"{list(input1.shape)}, input2: {list(input2.shape)}, target: {list(target.shape)} ")
  return _reduce((-target * (input1 - input2) + margin).clamp_min(0), reduction)


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0, size_average=None, reduce=None,
                         reduction: str = "mean") -> Tensor:
  reduction = _legacy_reduction(size_average, reduce, reduction)
  broadcast_shapes(input.shape, target.shape)
  loss = where(target != 1, (margin - input).clamp_min(0), 0) + where(target != -1, input, 0)
  return _reduce(loss, reduction)


def soft_margin_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
  reduction = _legacy_reduction(size_average, reduce, reduction)
  broadcast_shapes(input.shape, target.shape)
  return _reduce(_softplus_neg(target * input), reduction)


def multilabel_soft_margin_loss(input: Tensor, target: Tensor, weight=None, size_average=None, reduce=None,
                                reduction: str = "mean") -> Tensor:
  reduction = _legacy_reduction(size_average, reduce, reduction)
  loss = target * _softplus_neg(input) + (1 - target) * _softplus_neg(-input)
  if weight is not None: loss = loss * weight
  loss = loss.sum(-1) / input.shape[-1] if input.ndim else loss
  return _reduce(loss, reduction)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0, size_average=None,
                          reduce=None, reduction: str = "mean") -> Tensor:
  reduction = _legacy_reduction(size_average, reduce, reduction)
  if input1.shape != input2.shape:
    raise RuntimeError(f"cosine_embedding_loss: input1 {list(input1.shape)} and input2 {list(input2.shape)} must have "
                       f"the same shape")
  d = input1.ndim - 1
  if d < 0: raise RuntimeError("cosine_embedding_loss: 0-D inputs are not supported")
  eps = 1e-12
  prod = (input1 * input2).sum(d)
  m1, m2 = input1.square().sum(d) + eps, input2.square().sum(d) + eps
  cos = prod / (m1 * m2).sqrt()
  loss = where(target == 1, 1 - cos, 0) + where(target == -1, (cos - margin).clamp_min(0), 0)
  return _reduce(loss, reduction)


def _pnorm(x: Tensor, p: float, dim: int, keepdim: bool = False) -> Tensor:
  if p == 2: return x.square().sum(dim, keepdim=keepdim).sqrt()
  if p == 1: return x.abs().sum(dim, keepdim=keepdim)
  if p == math.inf: return x.abs().amax(dim, keepdim=keepdim)
  return x.abs().pow(p).sum(dim, keepdim=keepdim).pow(1 / p)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
  nd = max(x1.ndim, x2.ndim)
  d = x1 - x2 + eps
  if nd == 0: return d.abs()
  return _pnorm(d, p, -1, keepdim)


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
  shape = broadcast_shapes(x1.shape, x2.shape)
  a, b = x1._broadcast_to(shape), x2._broadcast_to(shape)
  # each input divided by its own norm (clamped at eps) first, as PyTorch 2.x computes it
  na = a.square().sum(dim, keepdim=True).sqrt().clamp_min(eps)
  nb = b.square().sum(dim, keepdim=True).sqrt().clamp_min(eps)
  return ((a / na) * (b / nb)).sum(dim)


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, size_average=None, reduce=None,
                        reduction: str = "mean") -> Tensor:
  reduction = _legacy_reduction(size_average, reduce, reduction)
  if not (anchor.ndim == positive.ndim == negative.ndim):
    raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the same number of dimensions, "
                       f"but got: anchor {anchor.ndim}D, positive {positive.ndim}D, and negative {negative.ndim}D inputs")
  d_ap = pairwise_distance(anchor, positive, p, eps)
  d_an = pairwise_distance(anchor, negative, p, eps)
  if swap: d_an = d_an.minimum(pairwise_distance(positive, negative, p, eps))
  return _reduce((margin + d_ap - d_an).clamp_min(0), reduction)


def multi_margin_loss(input: Tensor, target: Tensor, p: int = 1, margin: float = 1.0, weight=None, size_average=None,
                      reduce=None, reduction: str = "mean") -> Tensor:
  reduction = _legacy_reduction(size_average, reduce, reduction)
  if p not in (1, 2): raise ValueError("only p == 1 and p == 2 supported")
  x = input.reshape(1, -1) if input.ndim <= 1 else input
  if x.ndim != 2:
    raise RuntimeError(f"multi_margin_loss: Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
                       f"{list(input.shape)}")
  N, C = x.shape
  t = target.reshape(-1)
  if t.shape[0] != N:
    raise RuntimeError(f"inconsistent target size, expected {N} but got {list(target.shape)}")
  from fusegrad.tensor import arange
  onehot = t.reshape(N, 1) == arange(C, device=x.device)
  xy = where(onehot, x, 0).sum(1, keepdim=True)
  z = (margin - xy + x).clamp_min(0)
  if p == 2: z = z.square()
  if weight is not None: z = z * where(onehot, weight.reshape(1, C), 0).sum(1, keepdim=True)
  loss = where(onehot, 0, z).sum(1) / C
  if input.ndim <= 1: loss = loss.reshape(())
  return _reduce(loss, reduction)


def _dtype_name(d) -> str:
  names = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int32": "Int",
           "int64": "Long", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}
  s = str(d).split(".")[-1]
  return names.get(s, s)


def multilabel_margin_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
                           reduction: str = "mean") -> Tensor:
  """Per sample sum over its targets j (target's leading entries up to the first -1) and the non-target classes i of
  max(0, 1 - (x[j] - x[i])), divided by the number of classes (torch's multilabel_margin_loss)."""
  reduction = _legacy_reduction(size_average, reduce, reduction)
  if reduction not in ("none", "mean", "sum"): raise ValueError(f"{reduction} is not a valid value for reduction")
  from fusegrad import dtype as dt
  from fusegrad.tensor import arange
  if target.dtype != dt.int64:
    raise RuntimeError(f"expected scalar type Long but found {_dtype_name(target.dtype)}")
  nd = input.ndim
  if not ((nd == 2 and input.shape[1] != 0) or (nd == 1 and input.shape[0] != 0) or nd == 0):
    raise RuntimeError(f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {list(input.shape)}")
  C = 1 if nd == 0 else input.shape[-1]
  ok = target.ndim <= 1 and target.numel() == C if nd <= 1 else target.ndim == 2 and tuple(target.shape) == tuple(input.shape)
  if not ok:
    raise RuntimeError(f"inconsistent target size: {list(target.shape)} for input of size: {list(input.shape)}")
  if target.node.realized or target.node.op in ("BUFFER", "CONST"):
    tv = target.numpy()
    if tv.size and (tv.min() < -1 or tv.max() >= C): raise RuntimeError("argument #2 'target' is out of range")
  x, t = input.reshape(-1, C), target.reshape(-1, C)
  valid = (t == -1).cumsum(1) == 0                                          # (N, K): the targets before the first -1
  onehot = (t.unsqueeze(-1) == arange(C, device=x.device)) & valid.unsqueeze(-1)   # (N, K, C)
  is_target = onehot.any(1)                                                   # (N, C)
  xy = where(onehot, x.unsqueeze(1), 0).sum(2)                                # (N, K): x at each target
  z = (1 - xy.unsqueeze(2) + x.unsqueeze(1)).clamp_min(0)                     # (N, K, C)
  loss = where(valid.unsqueeze(2) & (is_target == 0).unsqueeze(1), z, 0).sum(2).sum(1) / C
  if nd <= 1: loss = loss.reshape(())
  return _reduce(loss, reduction)


def triplet_margin_with_distance_loss(anchor: Tensor, positive: Tensor, negative: Tensor, *, distance_function=None,
                                      margin: float = 1.0, swap: bool = False, reduction: str = "mean") -> Tensor:
  if reduction not in ("mean", "sum", "none"): raise ValueError(f"{reduction} is not a valid value for reduction")
  if margin <= 0: raise ValueError(f"margin must be greater than 0, got {margin}")
  if not (anchor.ndim == positive.ndim == negative.ndim):
    raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the same number of dimensions, "
                       f"but got: anchor {anchor.ndim}D, positive {positive.ndim}D, and negative {negative.ndim}D inputs")
  if distance_function is None: distance_function = pairwise_distance
  d_pos = distance_function(anchor, positive)
  d_neg = distance_function(anchor, negative)
  if swap: d_neg = d_neg.minimum(distance_function(positive, negative))
  return _reduce((margin + d_pos - d_neg).clamp_min(0), reduction)


# ---- the losses above as modules (torch.nn.modules.loss's classes); nn re-exports them ------------------------------

from fusegrad.nn.module import Module  # noqa: E402


class _Loss(Module):
  """Every loss module's base (nn/layers.py's losses too): torch's (size_average, reduce, reduction) arguments."""
  def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
    super().__init__()
    if reduction not in ("mean", "sum", "none", "batchmean"): raise ValueError(f"{reduction} is not a valid value for reduction")
    self.reduction = _legacy_reduction(size_average, reduce, reduction)


class _WeightedLoss(_Loss):
  def __init__(self, weight: Tensor | None = None, size_average=None, reduce=None, reduction: str = "mean"):
    super().__init__(size_average, reduce, reduction)
    self.register_buffer("weight", weight)


class PairwiseDistance(Module):
  """torch.nn.PairwiseDistance (TripletMarginWithDistanceLoss's default distance)."""

  def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False):
    super().__init__()
    self.norm, self.eps, self.keepdim = p, eps, keepdim

  def forward(self, x1: Tensor, x2: Tensor) -> Tensor: return pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class CosineSimilarity(Module):
  def __init__(self, dim: int = 1, eps: float = 1e-8):
    super().__init__()
    self.dim, self.eps = dim, eps

  def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
    from fusegrad.nn import functional as F
    return F.cosine_similarity(x1, x2, self.dim, self.eps)


class PoissonNLLLoss(_Loss):
  def __init__(self, log_input: bool = True, full: bool = False, size_average=None, eps: float = 1e-8, reduce=None,
               reduction: str = "mean"):
    super().__init__(size_average, reduce, reduction)
    self.log_input, self.full, self.eps = log_input, full, eps

  def forward(self, log_input: Tensor, target: Tensor) -> Tensor:
    return poisson_nll_loss(log_input, target, log_input=self.log_input, full=self.full, eps=self.eps,
                            reduction=self.reduction)


class GaussianNLLLoss(_Loss):
  def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean"):
    super().__init__(None, None, reduction)
    self.full, self.eps = full, eps

  def forward(self, input: Tensor, target: Tensor, var) -> Tensor:
    return gaussian_nll_loss(input, target, var, full=self.full, eps=self.eps, reduction=self.reduction)


class HingeEmbeddingLoss(_Loss):
  def __init__(self, margin: float = 1.0, size_average=None, reduce=None, reduction: str = "mean"):
    super().__init__(size_average, reduce, reduction)
    self.margin = margin

  def forward(self, input: Tensor, target: Tensor) -> Tensor:
    return hinge_embedding_loss(input, target, margin=self.margin, reduction=self.reduction)


class MultiLabelMarginLoss(_Loss):
  def forward(self, input: Tensor, target: Tensor) -> Tensor:
    return multilabel_margin_loss(input, target, reduction=self.reduction)


class SoftMarginLoss(_Loss):
  def forward(self, input: Tensor, target: Tensor) -> Tensor:
    return soft_margin_loss(input, target, reduction=self.reduction)


class MultiLabelSoftMarginLoss(_WeightedLoss):
  def forward(self, input: Tensor, target: Tensor) -> Tensor:
    return multilabel_soft_margin_loss(input, target, weight=self.weight, reduction=self.reduction)


class CosineEmbeddingLoss(_Loss):
  def __init__(self, margin: float = 0.0, size_average=None, reduce=None, reduction: str = "mean"):
    super().__init__(size_average, reduce, reduction)
    self.margin = margin

  def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
    return cosine_embedding_loss(input1, input2, target, margin=self.margin, reduction=self.reduction)


class MarginRankingLoss(_Loss):
  def __init__(self, margin: float = 0.0, size_average=None, reduce=None, reduction: str = "mean"):
    super().__init__(size_average, reduce, reduction)
    self.margin = margin

  def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
    return margin_ranking_loss(input1, input2, target, margin=self.margin, reduction=self.reduction)


class MultiMarginLoss(_WeightedLoss):
  def __init__(self, p: int = 1, margin: float = 1.0, weight: Tensor | None = None, size_average=None, reduce=None,
               reduction: str = "mean"):
    super().__init__(weight, size_average, reduce, reduction)
    if p != 1 and p != 2: raise ValueError("only p == 1 and p == 2 supported")
    if weight is not None and weight.ndim != 1:
      raise ValueError(f"MultiMarginLoss: expected weight to be None or 1D tensor, got {weight.ndim}D instead")
    self.p, self.margin = p, margin

  def forward(self, input: Tensor, target: Tensor) -> Tensor:
    return multi_margin_loss(input, target, p=self.p, margin=self.margin, weight=self.weight, reduction=self.reduction)


class TripletMarginLoss(_Loss):
  def __init__(self, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6, swap: bool = False, size_average=None,
               reduce=None, reduction: str = "mean"):
    super().__init__(size_average, reduce, reduction)
    if margin <= 0: raise ValueError(f"TripletMarginLoss: expected margin to be greater than 0, got {margin} instead")
    self.margin, self.p, self.eps, self.swap = margin, p, eps, swap

  def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
    return triplet_margin_loss(anchor, positive, negative, margin=self.margin, p=self.p, eps=self.eps, swap=self.swap,
                               reduction=self.reduction)


class TripletMarginWithDistanceLoss(_Loss):
  def __init__(self, *, distance_function=None, margin: float = 1.0, swap: bool = False, reduction: str = "mean"):
    super().__init__(None, None, reduction)
    if margin <= 0:
      raise ValueError(f"TripletMarginWithDistanceLoss: expected margin to be greater than 0, got {margin} instead")
    if distance_function is None:
      from fusegrad.nn import layers
      distance_function = getattr(layers, "PairwiseDistance", PairwiseDistance)()
    self.distance_function = distance_function
    self.margin, self.swap = margin, swap

  def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
    return triplet_margin_with_distance_loss(anchor, positive, negative, distance_function=self.distance_function,
                                             margin=self.margin, swap=self.swap, reduction=self.reduction)
