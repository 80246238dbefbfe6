"""More of nn.functional's losses and distances (PyTorch's formulas, as lazy Tensor compositions); the classic
ones (mse, l1, smooth_l1, huber, cross_entropy, nll, bce, kl_div) live in nn.functional. Re-exported by it.
"""
from __future__ import annotations
import math
from fusegrad.tensor import Tensor, where, broadcast_shapes

__all__ = ["poisson_nll_loss", "gaussian_nll_loss", "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss",
           "multilabel_soft_margin_loss", "cosine_embedding_loss", "triplet_margin_loss", "multi_margin_loss",
           "pairwise_distance", "cosine_similarity"]


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
  if input1.ndim != input2.ndim or input1.ndim != target.ndim:
    raise RuntimeError(f"margin_ranking_loss : All input tensors should have same dimension but got sizes: input1: "
                       f"{list(input1.shape)}, input2: {list(input2.shape)}, target: {list(target.shape)} ")
  return _reduce((-target * (input1 - input2) + margin).clamp_min(0), reduction)


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0, size_average=None, reduce=None,
                         reduction: str = "mean") -> Tensor:
  broadcast_shapes(input.shape, target.shape)
  loss = where(target != 1, (margin - input).clamp_min(0), 0) + where(target != -1, input, 0)
  return _reduce(loss, reduction)


def soft_margin_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
  broadcast_shapes(input.shape, target.shape)
  return _reduce(_softplus_neg(target * input), reduction)


def multilabel_soft_margin_loss(input: Tensor, target: Tensor, weight=None, size_average=None, reduce=None,
                                reduction: str = "mean") -> Tensor:
  loss = target * _softplus_neg(input) + (1 - target) * _softplus_neg(-input)
  if weight is not None: loss = loss * weight
  loss = loss.sum(-1) / input.shape[-1] if input.ndim else loss
  return _reduce(loss, reduction)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0, size_average=None,
                          reduce=None, reduction: str = "mean") -> Tensor:
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
  if not (anchor.ndim == positive.ndim == negative.ndim):
    raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the same number of dimensions, "
                       f"but got: anchor {anchor.ndim}D, positive {positive.ndim}D, and negative {negative.ndim}D inputs")
  d_ap = pairwise_distance(anchor, positive, p, eps)
  d_an = pairwise_distance(anchor, negative, p, eps)
  if swap: d_an = d_an.minimum(pairwise_distance(positive, negative, p, eps))
  return _reduce((margin + d_ap - d_an).clamp_min(0), reduction)


def multi_margin_loss(input: Tensor, target: Tensor, p: int = 1, margin: float = 1.0, weight=None, size_average=None,
                      reduce=None, reduction: str = "mean") -> Tensor:
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
