#!/usr/bin/env bash
# Pack what a GPU call of examples/train_smollm2/v3.sh carries, under .cache/dev/ (gitignored, never committed):
# the SmolLM2 target as two raw halves (.cache/dev/g/p00, p01: 49.2 MB each; the Q4_1 GGUF barely compresses) and
# the wheels the GPU image lacks (msgspec, gguf; jsonschema and its needs, which the smoke and report tests import).
#
# A call carries at most 64 MiB, the working tree included. The tree is 24 MB, 14 MB of it the bundled drafter's
# weights, which a data call does not need: `scripts/light_tree.sh hide` moves them out of the tree (to
# .cache/hide/) so that a call carries 10 MB of tree beside one 49.2 MB half, and `light_tree.sh restore` puts
# them back. So the target takes two calls (`v3.sh setup part` with p00, then `part target` with p01); with the
# weights in the tree it takes three (`split -n 3`, LIGHT=0 below). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch_smollm2.sh
GGUF=.cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
pieces=$([ "${LIGHT:-1}" = 0 ] && echo 3 || echo 2)
mkdir -p .cache/dev/whl .cache/dev/g
if [ "$(ls .cache/dev/g | wc -l)" != "$pieces" ]; then
  rm -f .cache/dev/g/p0*
  split -n "$pieces" -d "$GGUF" .cache/dev/g/p
fi
cat .cache/dev/g/p0* | sha256sum
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .cache/dev/whl msgspec==0.23.0 gguf==0.19.0 \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
ls -l .cache/dev/g .cache/dev/whl
