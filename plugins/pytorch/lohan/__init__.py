"""lohan: fine-tune models larger than your GPU through the lohand daemon."""

from lohan.client import (Client, DataPlane, Job, LohanError, Model,
                          StatusCode)

__all__ = ["Client", "DataPlane", "Job", "LohanError", "Model", "StatusCode"]
__version__ = "0.1.0"
