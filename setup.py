from setuptools import find_packages, setup

setup(
    name="sglang",
    version="0.1.0",
    description="An SGLang-compatible LLM serving engine with per-step dynamic EAGLE-3 speculation",
    package_dir={"": "python", "sgl_kernel": "sgl-kernel/python/sgl_kernel"},
    packages=find_packages(where="python") + ["sgl_kernel"],
    # The demo model pair ships inside the package (python/sglang/demo, < 32 MB).
    package_data={"sglang.demo": ["*.md", "*.json", "target/*", "draft/*"]},
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
        "httptools>=0.6",  # uvicorn parses HTTP with it instead of h11: 20-30% less front-end CPU per request
        "pydantic>=2",
        "orjson>=3.6",
        "prometheus-client>=0.20",
        "xgrammar>=0.2",  # structured outputs; imported only when a request asks for a constraint
        "jsonschema>=4",  # tool parameters are checked as JSON schemas (Draft 2020-12), as upstream
    ],
    extras_require={
        # The tests start replicas behind the real router, so they need it too.
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",  # the README's test command runs the suite over the machine's cores
            "ruff==0.17.6",  # .ci/run checks the formatting and lint with this version
            "scipy>=1.11",
            "httpx",
            "openai>=1.0",
            "aiohttp",
            "matplotlib",
            "tqdm",
            "sglang-router==0.3.2",
            "requests",
            "jsonschema",
        ],
        "bench": ["matplotlib", "aiohttp", "tqdm"],
        # --dp-size N: replicas behind upstream's load balancer (docs/scaling_out.md); the version tested.
        # Its launcher, python -m sglang_router.launch_server, imports requests without declaring it.
        "router": ["sglang-router==0.3.2", "requests"],
    },
)
