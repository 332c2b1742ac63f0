#!/bin/bash
# one-off: FP8 after group pre-quantization: precision (flag on), floors, block floor and precision with the flag off
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
tests() { timeout 60 python -m pytest test/gpu/test_fp8_cuda.py -k "llama_8b_shapes or ragged" -q -rf --tb=line -p no:cacheprovider > $R/tests_$1.txt 2>&1; el "tests $1 rc=$?"; grep -E "^/|Error|passed|failed" $R/tests_$1.txt | cut -c1-220 | tail -14; }
floor() { timeout 55 python -m sglang.bench_one_batch --model-path /tmp/m/$1 --load-format dummy --mem-fraction-static 0.7 --batch-size 1 64 256 --input-len 512 --output-len 32 --memory-floor --result-filename $R/floor_$1$2.jsonl > $R/floor_$1$2.log 2>&1; el "floor $1$2 rc=$?"; grep -E "x its memory floor|Error" $R/floor_$1$2.log | cut -c1-150 | tail -4; }
for v in block chan bf16; do
  f=""; [ $v = block ] && f="--fp8 block"; [ $v = chan ] && f="--fp8 channel"
  python -m sglang.tools.make_random_model /tmp/m/$v --config llama-3.1-8b --no-weights $f > /dev/null 2>&1
done
tests on
floor block; floor chan; floor bf16
sed -i 's/max_num_imprecise_acc=FP8_MMA_K/max_num_imprecise_acc=None/' sgl-kernel/python/sgl_kernel/*.py
floor block _off
tests off
tar czf $OUT/r.tgz -C $OUT r
