"""Keeps the kernels runnable under Triton's CPU interpreter (TRITON_INTERPRET=1), which the
CPU tests use. Nothing here runs on a GPU.

Triton 3.6's interpreter turns a tensor into a Python int (as `range` needs for a loop bound
read from memory) with int(array), which numpy >= 2.4 refuses for the 1-element arrays it
holds; triton-lang/triton#9171, fixed upstream after 3.6. We wrap its tensor patching so the
conversion goes through a 0-d view.
"""

from __future__ import annotations

import os

_applied = False


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def fix_interpreter() -> None:
    global _applied
    if _applied or not interpreting():
        return
    import triton.runtime.interpreter as interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_with_scalar_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(())))

    interpreter._patch_lang_tensor = patch_tensor_with_scalar_index
    _applied = True
