#!/usr/bin/env bash
# Move the bundled drafter's weights (14 MB) out of the working tree for a GPU call that does not need them, and
# back. A call of the lent GPU machine carries the whole tree and at most 64 MiB: without them a 49.2 MB half of
# the SmolLM2 target fits beside it (scripts/v3_pack.sh).
#
#   scripts/light_tree.sh hide       move examples/smollm2-lilicorr/model.safetensors to .cache/hide/
#   scripts/light_tree.sh restore    move it back (or, if the moved copy is lost, check it out from git)
#   scripts/light_tree.sh status     say where it is
#
# Never commit while it is hidden: `git status` shows the file as deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
FILE=examples/smollm2-lilicorr/model.safetensors
HIDDEN=.cache/hide/model.safetensors
case ${1:-status} in
  hide)
    if [ -f "$FILE" ]; then
      mkdir -p .cache/hide
      mv "$FILE" "$HIDDEN"
    fi
    echo "hidden: $HIDDEN" ;;
  restore)
    if [ ! -f "$FILE" ]; then
      if [ -f "$HIDDEN" ]; then mv "$HIDDEN" "$FILE"; else git checkout -- "$FILE"; fi
    fi
    if git diff --quiet -- "$FILE"; then echo "restored: $FILE"; else echo "restored: $FILE (changed since HEAD)"; fi ;;
  status)
    if [ -f "$FILE" ]; then echo "in the tree: $FILE"; else echo "hidden: $HIDDEN"; fi ;;
  *) echo "usage: $0 hide|restore|status" >&2; exit 2 ;;
esac
