"""Gradient clipping with torch.nn.utils' semantics, lazily: the total norm and the scaled gradients stay lazy
tensors (nothing runs, nothing syncs) until the optimizer step realizes them with the update, unless
error_if_nonfinite has to look at the norm."""
from __future__ import annotations
import math
import types
import warnings
import fusegrad as fg
from fusegrad.tensor import Tensor

_FANIN = 32   # norms combined per stack, so no kernel reads more than this many per-gradient norms


def _params(parameters) -> list:
  return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def _vector_norm(x: Tensor, p: float) -> Tensor:
  """torch.linalg.vector_norm(x, p) over all elements (low-precision floats accumulate in float32)."""
  a = x.float() if x.dtype in (fg.float16, fg.bfloat16) else x
  if a.numel() == 0: r = fg.zeros((), dtype=a.dtype, device=a.device)
  elif p == math.inf: r = a.abs().max()
  elif p == -math.inf: r = a.abs().min()
  elif p == 0: r = (a != 0).sum().to(a.dtype)
  elif p == 1: r = a.abs().sum()
  elif p == 2: r = (a * a).sum().sqrt()
  else: r = (a.abs() ** p).sum() ** (1.0 / p)
  return r.to(x.dtype)


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False, foreach=None) -> Tensor:
  """The p-norm of all tensors viewed as one vector: the norm of their norms, as PyTorch computes it."""
  tensors = _params(tensors)
  norm_type = float(norm_type)
  if not tensors: return fg.tensor(0.0)
  dev = tensors[0].device
  with fg.no_grad():
    norms = [_vector_norm(t.detach(), norm_type).to(dev) for t in tensors]
    p = norm_type
    while True:   # the norm of the stacked norms, in groups; later levels combine partial norms (counts for p=0)
      norms = [_vector_norm(fg.stack(norms[i:i + _FANIN]), p) for i in range(0, len(norms), _FANIN)]
      if len(norms) == 1: break
      if p == 0: p = 1.0
    total = norms[0]
  if error_if_nonfinite and not bool(total.isfinite()):
    raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so "
                       "it cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
                       "anyway, set `error_if_nonfinite=False`")
  return total


def clip_grads_with_norm_(parameters, max_norm: float, total_norm: Tensor, foreach=None) -> None:
  """Scale the gradients in place by min(max_norm / (total_norm + 1e-6), 1)."""
  grads = [p.grad for p in _params(parameters) if p.grad is not None]
  if not grads: return
  with fg.no_grad():
    coef = (float(max_norm) / (total_norm + 1e-6)).clamp(max=1.0)
    for g in grads: g.mul_(coef.to(g.device))


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None) -> Tensor:
  """Clip the gradients' total norm (all gradients viewed as one vector) to max_norm, in place; returns the total
  norm before clipping. norm_type may be inf. Parameters without a gradient are skipped."""
  if not isinstance(parameters, Tensor):
    gen = isinstance(parameters, types.GeneratorType)
    parameters = list(parameters)
    if gen and not parameters:
      warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=2)
  grads = [p.grad for p in _params(parameters) if p.grad is not None]
  total = get_total_norm(grads, norm_type, error_if_nonfinite)
  clip_grads_with_norm_(parameters, max_norm, total)
  return total


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
  """Clamp every gradient to [-clip_value, clip_value], in place."""
  v = float(clip_value)
  with fg.no_grad():
    for p in _params(parameters):
      if p.grad is not None: p.grad.clamp_(min=-v, max=v)
