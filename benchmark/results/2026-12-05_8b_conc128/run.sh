#!/usr/bin/env bash
# Steady loads at concurrency 64 and 128 on 8B shapes (128-token prompts, 512 output tokens), one H200.
# Three 8B servers with KV for 128 requests (84K tokens each) fit one H200, four do not, so each
# accept length gets the three servers that can be best there: at 1.5 no draft, k = 1 and dynamic
# (k = 3 was 0.79 x k = 1 at concurrency 64), at 2.5 always (k = 3), k = 1 and dynamic (no draft was
# 0.67 x always at 64). Both halves run the matrix script (../2026-12-04_matrix/run.sh) with cost logs.
# Usage (GPU machine, repository root): bash benchmark/results/2026-12-05_8b_conc128/run.sh OUT
set -u -o pipefail
OUT=${1:?usage: run.sh OUT}
MATRIX=benchmark/results/2026-12-04_matrix/run.sh
export KV_TOKENS=${KV_TOKENS:-84000} COST_LOG=1 ROUNDS=${ROUNDS:-3} LOAD_FORMAT=${LOAD_FORMAT:-dummy}
NAMES="no_draft k1 dynamic" LOADS="in128_out512_acc1.5:128:512:1.5:${LEVELS:-64,128}" PORT=30400 \
  timeout "${HALF_TIMEOUT_S:-280}" bash $MATRIX "$OUT/acc1.5"
NAMES="always k1 dynamic" LOADS="in128_out512_acc2.5:128:512:2.5:${LEVELS:-64,128}" PORT=30410 \
  timeout "${HALF_TIMEOUT_S:-280}" bash $MATRIX "$OUT/acc2.5"
