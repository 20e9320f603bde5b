"""Our Relax graph passes, one per file, and the PassContext that runs them.

The order they run in is the pipeline list in ``compiler/pipeline.py``.
"""

from .context import GraphPass, PassConfigError, PassContext, PassReport
from .eliminate_dead_code import EliminateDeadCode
from .fold_constants import FoldConstants

__all__ = ["PassContext", "PassReport", "GraphPass", "PassConfigError", "FoldConstants",
           "EliminateDeadCode"]
