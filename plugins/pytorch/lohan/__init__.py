"""lohan: fine-tune models larger than your GPU through the lohand daemon."""

from lohan.client import (Client, DataPlane, Job, LohanError, Model,
                          StatusCode)

__all__ = ["Client", "DataPlane", "Job", "LohanError", "Model", "StatusCode"]
__version__ = "0.1.0"

# The training engine needs torch; `import lohan` alone does not.
_ENGINE_NAMES = ("init", "Engine", "StepResult", "load_state", "find_blocks",
                 "linear_cross_entropy")
__all__ += list(_ENGINE_NAMES)


def __getattr__(name):
    if name in ("init", "Engine", "StepResult"):
        from lohan import engine
        return getattr(engine, name)
    if name == "load_state":
        from lohan.checkpoint import load_state
        return load_state
    if name == "find_blocks":
        from lohan.blocks import find_blocks
        return find_blocks
    if name == "linear_cross_entropy":
        from lohan.chunked_loss import linear_cross_entropy
        return linear_cross_entropy
    raise AttributeError(f"module 'lohan' has no attribute {name!r}")
