"""torch.backends.cuda's flags, accepted and kept; fusegrad has no CUDA device, so they change nothing."""


class _Matmul:
  """backends.cuda.matmul: allow_tf32 and the reduced-precision reduction flags."""
  def __init__(self):
    self.allow_tf32 = False
    self.allow_fp16_reduced_precision_reduction = True
    self.allow_bf16_reduced_precision_reduction = True


matmul = _Matmul()


def is_built() -> bool: return False
def flash_sdp_enabled() -> bool: return False
def enable_flash_sdp(enabled: bool) -> None: pass
def enable_mem_efficient_sdp(enabled: bool) -> None: pass
def enable_math_sdp(enabled: bool) -> None: pass
