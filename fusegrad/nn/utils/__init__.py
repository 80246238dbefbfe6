"""fusegrad.nn.utils: gradient clipping (implemented in fusegrad.optim, re-exported under PyTorch's path),
parameters_to_vector / vector_to_parameters, weight_norm / spectral_norm (hook forms) and the parametrize and
parametrizations modules."""


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
  from fusegrad.optim import clip_grad_norm_ as f
  return f(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters, clip_value, foreach=None):
  from fusegrad.optim import clip_grad_value_ as f
  return f(parameters, clip_value, foreach)


def _check_param_device(param, old_device):
  if old_device is None: return param.device
  if param.device != old_device:
    raise TypeError("Found two parameters on different devices, this is currently not supported.")
  return old_device


def parameters_to_vector(parameters):
  """The parameters flattened and concatenated into one vector (differentiable, as torch's)."""
  import fusegrad as fg
  device, vec = None, []
  for p in parameters:
    device = _check_param_device(p, device)
    vec.append(p.reshape(-1))
  return fg.cat(vec)


def vector_to_parameters(vec, parameters) -> None:
  """Each parameter's `.data` becomes its slice of vec (in parameters' order), as torch's."""
  from fusegrad.tensor import Tensor
  if not isinstance(vec, Tensor): raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
  device, pointer = None, 0
  for p in parameters:
    device = _check_param_device(p, device)
    n = p.numel()
    p.data = vec[pointer:pointer + n].reshape(p.shape).data
    pointer += n


from fusegrad.nn.utils import parametrize, parametrizations  # noqa: E402,F401
from fusegrad.nn.utils.weight_norm import weight_norm, remove_weight_norm  # noqa: E402,F401
from fusegrad.nn.utils.spectral_norm import spectral_norm, remove_spectral_norm  # noqa: E402,F401
