#!/usr/bin/env bash
# How examples/smollm2-lilicorr was made: the recipe in pieces of at most ten minutes of GPU time each.
#
#   TARGET=path/to/SmolLM2 WORK=scratch OUT=results examples/train_smollm2/pieces.sh STEP [STEP...]
#
# STEP: hf (a bf16 copy of a GGUF target as an HF directory, so later steps load it in seconds), data
# (the target answers PROMPTS prompts greedily, once per seed in SEEDS, from the sources in MIX), fit (train
# or resume for BUDGET seconds on every $WORK/data-*.npz; a new run plans its length to PLAN seconds and
# starts from INIT_FROM's weights when set, else from target layer INIT_LAYER), export (ModelOpt layout ->
# convert -> validate --strict), smoke (the bundled probes on the GPU). Every step can be rerun; fit resumes
# from $WORK/run/state.safetensors.
set -euo pipefail
: "${TARGET:?set TARGET}" "${WORK:?set WORK}" "${OUT:=$WORK/out}"
mkdir -p "$WORK" "$OUT"
LC="python -m lilicorr_ckpt.cli"
T=$TARGET
[ -d "$WORK/target" ] && T=$WORK/target
for step in "$@"; do
  echo "== $step ($(date -u +%H:%M:%S))"
  case $step in
    hf)
      python - "$TARGET" "$WORK/target" <<'PY'
import sys, torch
from lilicorr_runtime import load_target
t = load_target(sys.argv[1], dtype=torch.bfloat16, fast=False)
m = t.model
m.hf_quantizer = None
m.is_quantized = False
if hasattr(m.config, "quantization_config"):
    del m.config.quantization_config
m.save_pretrained(sys.argv[2])
t.tokenizer.save_pretrained(sys.argv[2])
PY
      T=$WORK/target ;;
    data)
      for seed in ${SEEDS:-0}; do
        python -m lilicorr_train generate --target "$T" --out "$WORK/data-$seed.npz" --prompts "${PROMPTS:-16384}" \
          --max-new-tokens "${NEW_TOKENS:-256}" --batch-size 512 --seed "$seed" --mix "${MIX:-templates}"
      done ;;
    fit)
      start=(--init-layer "${INIT_LAYER:-29}")
      [ -n "${INIT_FROM:-}" ] && start=(--init-from "$INIT_FROM")
      data=(); for f in "$WORK"/data-*.npz; do data+=(--data "$f"); done
      python -m lilicorr_train train "$WORK/run" --target "$T" "${data[@]}" --mask-token-id "${MASK:-16}" \
        "${start[@]}" --batch-size "${BATCH:-32}" --anchors 48 --plan-seconds "${PLAN:-720}" --time-budget "${BUDGET:-400}" \
        --lr-drafter "${LR_DRAFTER:-6e-4}" --lr-head "${LR_HEAD:-3e-4}"
      cp "$WORK/run/log.jsonl" "$OUT/" ;;
    export)
      python -m lilicorr_train export "$WORK/run" --out "$WORK/export"
      $LC convert "$WORK/export" "$WORK/drafter" --force
      cp "$WORK/drafter/model.safetensors" "$WORK/drafter/config.json" "$OUT/"
      $LC validate "$WORK/drafter" --target "$T" --strict | tee "$OUT/validate.txt" || echo "validate: exit $?" ;;
    smoke)
      $LC smoke "$WORK/drafter" --target "$T" --gpu --limit "${LIMIT:-0}" --max-new-tokens "${SMOKE_TOKENS:-128}" \
        --temperature "${TEMPERATURE:-0}" --out "$OUT/smoke-t${TEMPERATURE:-0}.json" | tee "$OUT/smoke-t${TEMPERATURE:-0}.txt" \
        || echo "smoke: exit $?" ;;
    *) echo "unknown step $step" >&2; exit 4 ;;
  esac
done
