"""python -m sglang.launch_server --model-path DIR [flags]: the HTTP server (see --help)."""

import sys

if __name__ == "__main__":
    # Imported here, not at the top: the scheduler and detokenizer processes are spawned, and each
    # re-imports this module; the detokenizer needs none of the server's imports (torch among them).
    from sglang.srt.entrypoints.http_server import main

    main(sys.argv[1:])
