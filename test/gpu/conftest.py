import pytest
import torch

if not torch.cuda.is_available():
    pytest.exit("test/gpu needs a CUDA device; run it on the GPU machine", returncode=4)


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    """Each test's engines and schedulers give their GPU memory back before the next test."""
    yield
    import gc

    gc.collect()
    torch.cuda.empty_cache()
