import pytest
import torch

if not torch.cuda.is_available():
    pytest.exit("test/gpu needs a CUDA device; run it on the GPU machine", returncode=4)
