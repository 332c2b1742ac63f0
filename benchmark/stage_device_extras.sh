#!/usr/bin/env bash
# Adds to .device/wheels what the project installs, or its diagnosis scripts use, but ../shared/device/stage
# does not stage:
# httptools (uvicorn's fast HTTP parser; without it the GPU machine's servers run h11, and on a
# small model the HTTP process is what saturates first). Run from the project root after
# ../shared/device/stage (which empties .device/wheels):
#
#   ../shared/device/stage && bash benchmark/stage_device_extras.sh
#
# The GPU machine has Python 3.12 on x86-64 Linux and no internet, hence the explicit platform.
set -euo pipefail
[ -d .device/wheels ] || { echo "run ../shared/device/stage first (no .device/wheels here)"; exit 1; }
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .device/wheels "httptools>=0.6"
ls .device/wheels | grep -i httptools
# py-spy (a sampling profiler, for benchmark/sched_spy_gpu.sh; a static binary in a wheel).
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .device/wheels "py-spy>=0.4"
ls .device/wheels | grep -i py_spy
