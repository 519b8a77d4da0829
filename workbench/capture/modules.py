"""Module paths in profiles: ``with module_scopes(model): ...`` marks each submodule's forward with a
``torch.profiler.record_function`` range named ``module: <path>`` (``blocks.3.mlp``, as
``model.named_modules()`` names it), so a trace recorded meanwhile shows which module ran, and memory
events of a ``profile_memory=True`` profile (``load_profiler_memory``) carry the module in their stack:
``analysis.memory.user_frame_labels(snap)["module"]`` and ``group_live(..., by="module")`` group by it.

    from workbench.capture.modules import module_scopes
    with module_scopes(model):
        result = profile_steps(step, steps=2, detail="full")

Forward only: the backward pass runs in autograd's engine, outside the hooks. The hooks are removed and
any range left open by an exception is closed when the block ends. CUDA allocator history
(``record_memory_history``) records Python and C++ frames, not profiler ranges, so its snapshots carry no
module path.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

__all__ = ["module_scopes", "MODULE_PREFIX"]

MODULE_PREFIX = "module: "


@contextmanager
def module_scopes(model, prefix: str = ""):
    """Open a ``record_function("module: <path>")`` range around every submodule's forward while the
    block runs (the root module too when ``prefix`` names it); yields the number of modules hooked."""
    import torch

    local = threading.local()

    def stack():
        if not hasattr(local, "open"):
            local.open = []
        return local.open

    def pre(path):
        def hook(_module, _inputs):
            rf = torch.profiler.record_function(MODULE_PREFIX + path)
            rf.__enter__()
            stack().append(rf)
        return hook

    def post(_module, _inputs, _output):
        st = stack()
        if st:
            st.pop().__exit__(None, None, None)

    handles = []
    for name, module in model.named_modules():
        path = ".".join(p for p in (prefix, name) if p)
        if not path:
            continue  # the root without a prefix: its range would only repeat the step
        handles.append(module.register_forward_pre_hook(pre(path)))
        handles.append(module.register_forward_hook(post))
    try:
        yield len(handles) // 2
    finally:
        for h in handles:
            h.remove()
        st = stack()
        while st:  # a forward that raised left its range open
            st.pop().__exit__(None, None, None)
