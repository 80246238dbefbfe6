"""fusegrad.nn.utils: gradient clipping (implemented in fusegrad.optim, re-exported under PyTorch's path)."""


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
  from fusegrad.optim import clip_grad_norm_ as f
  return f(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters, clip_value, foreach=None):
  from fusegrad.optim import clip_grad_value_ as f
  return f(parameters, clip_value, foreach)
