"""sglang: an SGLang-compatible LLM serving engine."""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so `import sglang` stays cheap for tools that only need a submodule.
    if name == "Engine":
        from sglang.srt.entrypoints.engine import Engine

        return Engine
    raise AttributeError(f"module 'sglang' has no attribute {name!r}")
