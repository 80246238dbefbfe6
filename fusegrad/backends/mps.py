"""torch.backends.mps: fusegrad has no Metal (MPS) device."""


def is_available() -> bool: return False
def is_built() -> bool: return False
