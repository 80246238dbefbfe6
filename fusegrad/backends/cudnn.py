"""torch.backends.cudnn's flags, accepted and kept; fusegrad has no cuDNN, so they change nothing."""
enabled = True
benchmark = False
deterministic = False
allow_tf32 = True


def is_available() -> bool: return False
def version(): return None
