"""File layout rules (LC6xx): shards, the index, pickles."""

from __future__ import annotations

from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
FIL = "files"
rule("LC601", "pickle-files", "warning", FIL, "Pickle weight files (*.bin, *.pt, ...) next to the safetensors; never unpickled here.",
     "Publish safetensors only.")
rule("LC602", "index-missing-shard", "error", FIL, "The index names a shard file that does not exist.",
     "Upload the shard or regenerate the index.")
rule("LC603", "index-tensor-not-in-shard", "error", FIL, "The index places a tensor in a shard that does not hold it.",
     "Regenerate the index from the shards.")
rule("LC604", "shard-tensor-not-in-index", "error", FIL, "A shard holds a tensor the index does not list.",
     "Regenerate the index from the shards.")
rule("LC605", "duplicate-tensor", "error", FIL, "The same tensor is stored in more than one file.",
     "Keep one copy.")
rule("LC606", "index-total-size", "warning", FIL, "The index's total_size differs from the bytes the shards hold.",
     "Regenerate the index.")
rule("LC607", "unreferenced-shard", "warning", FIL, "A safetensors file the index does not reference.",
     "Delete it; loaders that glob *.safetensors may load it.")
rule("LC608", "no-weights", "error", FIL, "No safetensors weights found.", "Export model.safetensors.")
rule("LC609", "header-duplicate-key", "error", FIL,
     "A safetensors header names the same tensor twice; every loader keeps one entry silently, not the same one.",
     "Re-export the file: each tensor name once per header.")



# ---------------------------------------------------------------- checks


@check
def files(ctx: Context) -> None:
    s, src = ctx.table.shards, ctx.source
    if src.pickles:
        ctx.emit("LC601", f"pickle files present (not opened): {shorten([src.rel(p) for p in src.pickles])}",
                 subjects=[src.rel(p) for p in src.pickles])
    if not src.safetensors and not s.has_index:
        ctx.emit("LC608", "no *.safetensors file in the checkpoint")
    elif not ctx.table.tensors:
        ctx.emit("LC608", "the checkpoint holds no tensors")
    for shard, names in s.missing_shards.items():
        ctx.emit("LC602", f"the index places {len(names)} tensors in `{shard}`, which does not exist",
                 file="model.safetensors.index.json", pointer=shard, subjects=names)
    if s.index_only:
        names = sorted(s.index_only)
        ctx.emit("LC603", f"{len(names)} tensors listed in the index are not in their shard: "
                 + ", ".join(f"`{n}` ({s.index_only[n]})" for n in names[:5]), file="model.safetensors.index.json",
                 subjects=names)
    for name, (listed, real) in sorted(s.misplaced.items()):
        ctx.emit("LC603", f"the index places `{name}` in `{listed}` but it is in `{real}`",
                 file="model.safetensors.index.json", pointer=name, subjects=[name])
    if s.shard_only:
        names = sorted(s.shard_only)
        ctx.emit("LC604", f"{len(names)} tensors in the shards are missing from the index (a loader that trusts "
                 f"the index skips them): {shorten(names)}", file="model.safetensors.index.json", subjects=names)
    for name, holders in sorted(s.duplicates.items()):
        ctx.emit("LC605", f"`{name}` is stored in {', '.join(holders)}", pointer=name, subjects=[name])
    if s.total_size_declared is not None and s.total_size_declared != s.total_size_actual:
        ctx.emit("LC606", f"index total_size is {s.total_size_declared} but the shards hold {s.total_size_actual} "
                 "tensor bytes", file="model.safetensors.index.json", pointer="$.metadata.total_size",
                 expected=s.total_size_actual, actual=s.total_size_declared)
    for rel in s.unreferenced:
        ctx.emit("LC607", f"`{rel}` is not referenced by the index", file=rel)
    for rel, names in ctx.table.duplicate_keys.items():
        ctx.emit("LC609", f"the header of `{rel}` names {shorten(names)} more than once", file=rel, subjects=names)
