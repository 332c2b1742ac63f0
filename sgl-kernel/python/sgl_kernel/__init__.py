"""sgl_kernel: the engine's hot kernels (Triton, later CUDA C++), each beside a torch reference.

Empty until the GPU path lands: on the CPU every layer runs its torch implementation.
"""
