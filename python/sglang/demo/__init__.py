"""The demo model pair shipped with the project: a ~12M-parameter Python code model (`target/`)
and its EAGLE-3 draft (`draft/`), made by `scripts/demo_models/pipeline.py`; see README.md here.
`python -m sglang.launch_server` serves the target when no --model-path is given."""

import os

DEMO_DIR = os.path.dirname(os.path.abspath(__file__))
TARGET_PATH = os.path.join(DEMO_DIR, "target")
DRAFT_PATH = os.path.join(DEMO_DIR, "draft")
SERVED_MODEL_NAME = "sglang-demo-code"
