#!/usr/bin/env bash
# Pack what a GPU call of examples/train_smollm2/v3.sh carries, under .cache/dev/ (gitignored, never committed):
# the SmolLM2 target as three pieces of its xz (a call carries at most 64 MiB, the working tree included, so the
# 98 MB GGUF, 90.4 MB as xz, travels in three calls of ~30 MB) and the wheels the GPU image lacks (msgspec, gguf).
# Idempotent; xz -9e takes a few minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch_smollm2.sh
GGUF=.cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p .cache/dev/whl
if [ ! -f .cache/dev/gguf.xz.part02 ]; then
  xz -T0 -9e -k -c "$GGUF" > .cache/dev/gguf.xz
  (cd .cache/dev && split -n 3 -d gguf.xz gguf.xz.part && rm gguf.xz)
fi
cat .cache/dev/gguf.xz.part* | xz -dc | sha256sum
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .cache/dev/whl msgspec==0.23.0 gguf==0.19.0
ls -l .cache/dev .cache/dev/whl
