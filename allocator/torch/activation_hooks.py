"""The hooks ``paged_activations`` hands autograd, as torch.compile must see them.

Owns: :func:`eager_only`, which makes a saved-tensor hook run as plain Python whatever calls it.
Under ``torch.compile`` the pack hook is called from operations Dynamo runs eagerly (the
recorded iteration's, under the recorder's dispatch mode) and from the runtime of compiled
graphs; Dynamo must not trace it: it takes locks, calls into the space and keeps state across
calls, which a graph cannot hold (Dynamo failed on it: ``'NoneType' object has no attribute
'is_leaf'`` under aot_eager and inductor, and traced ``posix.getpid`` under eager). torch's own
hooks with side effects are kept out of graphs the same way (``torch.utils.checkpoint``'s
recomputation hook is ``torch._dynamo.disable``d); allow-listing them in the graph
(``allow_in_graph``) would be wrong: they must run once per saved tensor at run time, not be
captured.
Invariants: never imports torch._dynamo (a second of import time) when nothing else did: then
no frame can be traced, and the hook runs as it is.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["eager_only"]


def eager_only(hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``hook`` run as Python, never traced: under ``torch.compile`` Dynamo would otherwise trace
    the pack hook (called from an operation it runs eagerly, the recorded iteration's) and fail on
    what it does (locks, the space's calls); torch's own hooks with side effects are excluded the
    same way (``torch.utils.checkpoint``). Dynamo not imported: nothing can trace it, no cost."""
    disabled: Any = None

    def run(arg: Any) -> Any:
        nonlocal disabled
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None:
            return hook(arg)
        if disabled is None:
            disabled = dynamo.disable(hook, recursive=True)
        return disabled(arg)

    return run
