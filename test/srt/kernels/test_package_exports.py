"""`import sgl_kernel` exposes every wrapper, loading the kernel modules only on first use."""

import sgl_kernel


def test_every_exported_wrapper_resolves():
    for name in sgl_kernel.__all__:
        assert callable(getattr(sgl_kernel, name)), name
