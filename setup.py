from setuptools import setup

setup(
    name="sglang",
    version="0.1.0",
    description="An SGLang-compatible LLM serving engine with per-step dynamic EAGLE-3 speculation",
    package_dir={"sglang": "python/sglang", "sgl_kernel": "sgl-kernel/python/sgl_kernel"},
    packages=[
        "sglang", "sglang.srt", "sglang.srt.configs", "sglang.srt.entrypoints", "sglang.srt.layers",
        "sglang.srt.layers.attention", "sglang.srt.managers", "sglang.srt.mem_cache",
        "sglang.srt.model_executor", "sglang.srt.model_loader", "sglang.srt.models",
        "sglang.srt.sampling", "sglang.srt.entrypoints.openai", "sglang.srt.metrics", "sglang.test",
        "sgl_kernel",
    ],
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.9",
        "transformers>=4.51",
        "tokenizers>=0.21",
        "safetensors>=0.4",
        "numpy",
        "pyzmq>=25",
        "fastapi>=0.110",
        "uvicorn>=0.29",
        "uvloop; sys_platform != 'win32'",
        "pydantic>=2",
        "prometheus-client>=0.20",
    ],
    extras_require={
        "test": ["pytest>=8", "scipy>=1.11", "httpx", "openai>=1.0"],
        "bench": ["matplotlib", "aiohttp", "tqdm"],
    },
)
