"""python -m sglang.launch_server --model-path DIR [flags]: the HTTP server (see --help)."""

import sys

from sglang.srt.entrypoints.http_server import main

if __name__ == "__main__":
    main(sys.argv[1:])
