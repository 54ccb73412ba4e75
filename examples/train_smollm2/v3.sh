#!/usr/bin/env bash
# Issue 37's v3 drafter on a lent GPU machine, in calls of at most ten minutes (docs/training.md, "v3").
#
#   examples/train_smollm2/v3.sh STEP [STEP...]        (from the repository root, on the GPU machine)
#
# The machine starts bare and takes at most 64 MiB per call, so the 98 MB target travels in pieces that
# scripts/v3_pack.sh makes under .cache/dev/g/: two raw halves, each carried by one call with the bundled drafter's
# weights moved out of the tree (scripts/light_tree.sh hide; restore after), or three with them in it. `part`
# copies a carried piece to $V3/parts and `target` joins them once all are there. Everything else stays in $V3
# (/tmp/v3) while the machine is warm; what comes back goes to $OUT (at most 8 files of at most 16 MiB per call):
# `ship N` moves up to N files of $V3/outbox there.
#
# STEP:
#   setup      install the carried wheels (.cache/dev/whl: msgspec, gguf) into /tmp/site
#   part       copy the carried pieces to $V3/parts: .cache/dev/g/p0* (raw, from `split -n 2 -d GGUF .cache/dev/g/p`:
#              49.2 MB each; or -n 3) or .cache/dev/gguf.xz.part* (an older pack's xz pieces)
#   target     join the parts, check the GGUF's sha256
#   shards     copy carried shards into $V3/shards: .cache/v3/shards/shard-* and the tars .cache/v3/shards-*.tar
#              (`ship`'s bundles, kept as they came: a call carries what fits beside the tree and a target piece)
#              and .cache/v3/carry/*.tar (scripts/v3_carry.py: the same shards packed to ride with the target's
#              halves and the fit, so that they need no call of their own)
#   keepval    copy the carried .cache/v3/f/val.npz to $V3/keep-val.npz, for a later call's KEEP_VAL
#   gen        generate missing shards of the v3 plan (GEN_FIRST..GEN_LAST, default all) for GEN_BUDGET seconds;
#              bundle them into $V3/outbox
#   build      $V3/train.npz and $V3/val.npz from every shard there (build.json and val.npz to the outbox);
#              KEEP_VAL=file (carried): an earlier build's held-out set, kept as this one's
#   v2         the bundled drafter's held-out tau on val.npz (the reference)
#   cold       bench/smoke_cold.py on the bundled drafter: a cold smoke (fresh Triton cache, empty user tables) and a
#              warm one, all 252 probes, each run's phases beside its wall time, to the outbox
#   wide       bench/wide_gemm.py --rows 256,2048 --parallel-split 256 on the random Qwen3-8B shape, to the outbox
#   gputests   every GPU test (`pytest -m gpu tests`, GPU_TESTS_BUDGET seconds, default 300), its log to the outbox
#   benches    the fit step on the target (bench/train_step.py --profile: its phases and top kernels) and the
#              random Qwen3-8B decode at batch 1 and 32 (bench/decode.py --profile), their tables to the outbox
#   fit        RUN=name TAPS=1,8,15,22,28 FIT_BUDGET=s STEPS=n [INIT_FROM=drafter] [LAYERS=n]: one piece of
#              $V3/runs/$RUN (its log to the outbox); a new run starts from INIT_FROM's weights when set (LAYERS
#              more than its own: the extra layers grown from its last, their residual branches closed; with
#              FRESH_HEAD=1 its backbone only, the head new, of HEAD_WIDTH / HEAD_LAYERS; its taps unless TAPS names
#              them), else from layer INIT_LAYER
#   koracle    RUN=name: bench/k_oracle.py on the exported drafter and val.npz (the K ceiling, the per-slot
#              ranking), its table to the outbox
#   export     RUN=name: the run's drafter, converted, in $V3/drafter-$RUN; `validate --strict` for every runtime
#              and its weights (config.json, model.safetensors) to the outbox
#   smoke      RUN=name: all 252 probes, head and control side by side (smoke --gpu), its report to the outbox
#   smoke1     RUN=name: the same at batch 1 (the speed-up over target-only the card shows), its report to the outbox
#   pick       the run (RUNS="a b") whose last held-out tau (head; the decode walk's where logged) is highest: its state, split, to the outbox
#   ship       move up to SHIP files (default 8), at most 60 MiB, from the outbox to $OUT (small ones in one tar)
set -euo pipefail
export V3=${V3:-/tmp/v3}
OUT=${OUT:-$V3/out}
GGUF=$V3/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p "$V3/parts" "$V3/outbox" "$V3/runs" "$OUT"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
for step in "$@"; do
  echo "== $step ($(date -u +%H:%M:%S))"
  case $step in
    setup)
      [ -d /tmp/site/msgspec ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .cache/dev/whl/*.whl
      nvidia-smi --query-gpu=name,memory.total --format=csv,noheader ;;
    part)
      shopt -s nullglob
      for piece in .cache/dev/gguf.xz.part* .cache/dev/g/p0*; do cp -v "$piece" "$V3/parts/"; done ;;
    target)
      if [ ! -f "$GGUF" ]; then
        if [ -e "$V3/parts/gguf.xz.part00" ]; then
          cat "$V3"/parts/gguf.xz.part* | xz -d -T0 > "$GGUF.tmp"
        else  # raw pieces: split -n 3 -d GGUF .cache/dev/g/p
          cat "$V3"/parts/p0* > "$GGUF.tmp"
        fi
        echo "$SHA256  $GGUF.tmp" | sha256sum -c --quiet -
        mv "$GGUF.tmp" "$GGUF"
      fi
      ls -l "$GGUF" ;;
    shards)
      mkdir -p "$V3/shards"
      if compgen -G ".cache/v3/shards/shard-*.npz" > /dev/null; then
        cp -n .cache/v3/shards/shard-*.npz "$V3/shards/"  # each .json after its .npz: a .json marks a shard done
        cp -n .cache/v3/shards/shard-*.json "$V3/shards/"
      fi
      # `ship` tars (each .npz before its .json), carried a few per call, or scripts/v3_carry.py's repack of them
      for t in .cache/v3/shards-*.tar .cache/v3/carry/*.tar; do
        [ -f "$t" ] && tar -xkf "$t" -C "$V3/shards" 2>/dev/null || true
      done
      ls "$V3/shards" | wc -l ;;
    gen)
      python3 -m lilicorr_train.mixes generate --target "$GGUF" --dir "$V3/shards" --budget "${GEN_BUDGET:-500}" \
        --batch-size "${GEN_BATCH:-1024}" ${GEN_FIRST:+--first $GEN_FIRST} ${GEN_LAST:+--last $GEN_LAST} \
        --bundle "$V3/outbox" ;;
    keepval)
      cp .cache/v3/f/val.npz "$V3/keep-val.npz" && ls -l "$V3/keep-val.npz" ;;
    build)
      python3 -m lilicorr_train.mixes build --dir "$V3/shards" --train "$V3/train.npz" --val "$V3/val.npz" \
        ${KEEP_VAL:+--keep-val $KEEP_VAL} | tee "$V3/outbox/build.json"
      cp "$V3/val.npz" "$V3/outbox/" ;;
    gputests)
      timeout "${GPU_TESTS_BUDGET:-300}" python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 \
        | tail -40 | tee "$V3/outbox/gpu-tests.txt" || echo "gputests: exit $?" ;;
    benches)
      PYTHONPATH=$PYTHONPATH:$PWD timeout 150 python3 bench/train_step.py --target "$GGUF" --profile 2>&1 \
        | tail -45 | tee "$V3/outbox/train-step.txt" || echo "train_step: exit $?"
      PYTHONPATH=$PYTHONPATH:$PWD timeout 240 python3 bench/decode.py --random qwen3-8b --batches 1,32 \
        --max-new-tokens 32 --profile 2>&1 | tail -80 | tee "$V3/outbox/decode-8b.txt" || echo "decode: exit $?" ;;
    cold)
      PYTHONPATH=$PYTHONPATH:$PWD timeout 300 python3 bench/smoke_cold.py --skip-untuned -- examples/smollm2-lilicorr \
        -t "$GGUF" --gpu --limit 0 2>&1 | tail -20 | tee "$V3/outbox/smoke-cold.txt" || echo "cold: exit $?" ;;
    wide)
      PYTHONPATH=$PYTHONPATH:$PWD timeout 300 python3 bench/wide_gemm.py --rows 256,2048 --parallel-split 256 2>&1 \
        | tail -60 | tee "$V3/outbox/wide-gemm.txt" || echo "wide: exit $?" ;;
    v2)
      python3 -m lilicorr_train.pieces heldout examples/smollm2-lilicorr --target "$GGUF" --val "$V3/val.npz" \
        | tee "$V3/outbox/heldout-v2.json" ;;
    fit)
      : "${RUN:?set RUN}"
      python3 -m lilicorr_train.pieces fit "$V3/runs/$RUN" --target "$GGUF" --data "$V3/train.npz" \
        --val "$V3/val.npz" --budget "${FIT_BUDGET:-540}" ${TAPS:+--taps $TAPS} --init-layer "${INIT_LAYER:-29}" \
        ${STEPS:+--steps $STEPS} ${INIT_FROM:+--init-from $INIT_FROM} ${LAYERS:+--layers $LAYERS} \
        ${FRESH_HEAD:+--fresh-head} ${HEAD_WIDTH:+--head-width $HEAD_WIDTH} ${HEAD_LAYERS:+--head-layers $HEAD_LAYERS} \
        ${LR_DRAFTER:+--lr-drafter $LR_DRAFTER} ${LR_HEAD:+--lr-head $LR_HEAD} --batch-size "${BATCH:-32}" --anchors 48
      cp "$V3/runs/$RUN/log.jsonl" "$V3/outbox/log-$RUN.jsonl" ;;
    export)
      : "${RUN:?set RUN}"
      python3 -m lilicorr_train export "$V3/runs/$RUN" --out "$V3/export-$RUN"
      python3 -m lilicorr_ckpt convert "$V3/export-$RUN" "$V3/drafter-$RUN" --force
      cp "$V3/drafter-$RUN/config.json" "$V3/outbox/config-$RUN.json"
      cp "$V3/drafter-$RUN/model.safetensors" "$V3/outbox/model-$RUN.safetensors"
      python3 -m lilicorr_ckpt validate "$V3/drafter-$RUN" --target "$GGUF" --strict --runtime all \
        | tee "$V3/outbox/validate-$RUN.txt" || echo "validate: exit $?" ;;
    koracle)
      : "${RUN:?set RUN}"
      PYTHONPATH=$PYTHONPATH:$PWD python3 bench/k_oracle.py "$V3/drafter-$RUN" --target "$GGUF" --val "$V3/val.npz" \
        | tee "$V3/outbox/koracle-$RUN.txt" || echo "koracle: exit $?" ;;
    smoke)
      : "${RUN:?set RUN}"
      python3 -m lilicorr_ckpt smoke "$V3/drafter-$RUN" --target "$GGUF" --gpu --limit 0 \
        --out "$V3/outbox/smoke-$RUN.json" | tee "$V3/outbox/smoke-$RUN.txt" || echo "smoke: exit $?" ;;
    smoke1)
      : "${RUN:?set RUN}"
      python3 -m lilicorr_ckpt smoke "$V3/drafter-$RUN" --target "$GGUF" --gpu --limit 0 --batch 1 \
        --out "$V3/outbox/smoke-$RUN-b1.json" | tee "$V3/outbox/smoke-$RUN-b1.txt" || echo "smoke1: exit $?" ;;
    pick)
      best=$(python3 - $RUNS <<'PY'
import json, os, sys
last = {}
for run in sys.argv[1:]:
    lines = [json.loads(l) for l in open(os.path.join(os.environ["V3"], "runs", run, "log.jsonl")) if "heldout_step" in l]
    last[run] = lines[-1]
# the decode walk's tau (it predicts smoke's) when every run logged it, else the uniform one for all: never the two
# measures against each other (the uniform one reads about a fifth higher)
walk = all("val_walk_tau_head" in r for r in last.values())
keys = ("val_walk_tau_head", "val_walk_tau_control") if walk else ("val_tau_head", "val_tau_control")
best = None
for run, record in last.items():
    score = (record[keys[0]], record[keys[1]])
    print(run, keys[0], score, file=sys.stderr)
    if best is None or score > best[0]:
        best = (score, run)
print(best[1])
PY
)
      echo "best: $best"
      echo "$best" > "$V3/outbox/picked.txt"
      split -b 15M -d "$V3/runs/$best/state.safetensors" "$V3/outbox/state-$best.safetensors.part"
      sha256sum "$V3/runs/$best/state.safetensors" > "$V3/outbox/state-$best.sha256" ;;
    ship)
      python3 - "$V3/outbox" "$OUT" "${SHIP:-8}" <<'PY'
import os, shutil, sys, tarfile, time
src, dst, most = sys.argv[1], sys.argv[2], int(sys.argv[3])
small = [n for n in sorted(os.listdir(src)) if os.path.getsize(os.path.join(src, n)) < 1 << 20]
if len(small) > 1:  # the small files travel as one tar (a call brings back at most 8 files)
    with tarfile.open(os.path.join(src, time.strftime("small-%H%M%S.tar")), "w") as tar:
        for name in small:
            tar.add(os.path.join(src, name), arcname=name)
    for name in small:
        os.remove(os.path.join(src, name))
files = sorted(os.listdir(src), key=lambda n: (os.path.getsize(os.path.join(src, n)) > 1 << 20, n))
room, count = 60 << 20, 0
for name in files:
    size = os.path.getsize(os.path.join(src, name))
    if count < most and size <= room:
        shutil.move(os.path.join(src, name), os.path.join(dst, name))
        room, count = room - size, count + 1
        print("shipped", name, size)
print("left in outbox:", sorted(os.listdir(src)))
PY
      ;;
    *) echo "unknown step $step" >&2; exit 4 ;;
  esac
done
