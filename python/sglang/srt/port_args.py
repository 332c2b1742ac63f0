"""PortArgs: where one server's processes reach each other (IPC sockets, the TP rendezvous)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PortArgs:
    """IPC endpoints between the processes of one server, in a private temp directory."""

    ipc_dir: str
    scheduler_input_ipc: str  # tokenizer manager -> scheduler
    detokenizer_ipc: str  # scheduler -> detokenizer
    tokenizer_ipc: str  # detokenizer and scheduler -> tokenizer manager
    tp_init_address: str = ""  # host:port where the tensor-parallel ranks meet (tp_size > 1)

    @classmethod
    def create(cls, tp_size: int = 1) -> "PortArgs":
        import tempfile

        from sglang.srt.utils import free_port

        ipc_dir = tempfile.mkdtemp(prefix="sglang-ipc-")
        return cls(
            ipc_dir=ipc_dir,
            scheduler_input_ipc=f"ipc://{ipc_dir}/scheduler",
            detokenizer_ipc=f"ipc://{ipc_dir}/detokenizer",
            tokenizer_ipc=f"ipc://{ipc_dir}/tokenizer",
            tp_init_address=f"127.0.0.1:{free_port()}" if tp_size > 1 else "",
        )
