"""File layout rules (LC6xx): shards, the index, pickles."""

from __future__ import annotations

from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
FIL = "files"
rule(
    "LC601",
    "pickle-files",
    "warning",
    FIL,
    "Pickle weight files (*.bin, *.pt, ...) next to the safetensors; never unpickled here.",
    "Publish safetensors only.",
    doc="Fires when the checkpoint directory holds pickle weight files (`*.bin`, `*.pt`, `*.pth`, `*.ckpt`, "
    "...) beside the safetensors. They are listed, never opened.",
    why="Loading a pickle runs arbitrary code. Some loaders prefer or fall back to these files, so the "
    "weights served may not be the safetensors that were validated.",
    example="    model.safetensors\n    pytorch_model.bin",
)
rule(
    "LC602",
    "index-missing-shard",
    "error",
    FIL,
    "The index names a shard file that does not exist.",
    "Upload the shard or regenerate the index.",
    doc="Fires for each shard file that model.safetensors.index.json names in its weight_map but that does "
    "not exist.",
    why="Every loader that follows the index opens each shard it names; a missing shard stops the load, and "
    "the tensors it was to hold are missing either way.",
    example='    "weight_map": {"fc.weight": "model-00002-of-00003.safetensors", ...}\n\n'
    "with no model-00002-of-00003.safetensors in the directory.",
)
rule(
    "LC603",
    "index-tensor-not-in-shard",
    "error",
    FIL,
    "The index places a tensor in a shard that does not hold it.",
    "Regenerate the index from the shards.",
    doc="Fires when the index places a tensor in a shard that does not hold it: the tensor is in no shard, or "
    "in another shard than the one listed.",
    why="A loader that trusts the index looks for the tensor in the listed shard and fails, or loads a "
    "checkpoint missing that tensor.",
    example='    "weight_map": {"lilicorr.ghost.weight": "model-00001-of-00003.safetensors"}\n\n'
    "and no shard holds lilicorr.ghost.weight.",
)
rule(
    "LC604",
    "shard-tensor-not-in-index",
    "error",
    FIL,
    "A shard holds a tensor the index does not list.",
    "Regenerate the index from the shards.",
    doc="Fires for tensors that a shard holds but the index's weight_map does not list.",
    why="A loader that iterates over the index never reads these tensors: they are skipped silently, and the "
    "modules they belong to keep their initialisation or fail coverage.",
    example="    model-00003-of-00003.safetensors holds lilicorr.out_head.weight\n\n"
    "but the weight_map has no entry for it.",
)
rule(
    "LC605",
    "duplicate-tensor",
    "error",
    FIL,
    "The same tensor is stored in more than one file.",
    "Keep one copy.",
    doc="Fires for a tensor name stored in more than one safetensors file.",
    why="Which copy a loader keeps depends on the order it reads the files in; if the copies differ, two "
    "runtimes can serve different weights.",
    example="    fc.weight in model-00001-of-00003.safetensors and in model-00002-of-00003.safetensors",
)
rule(
    "LC606",
    "index-total-size",
    "warning",
    FIL,
    "The index's total_size differs from the bytes the shards hold.",
    "Regenerate the index.",
    doc="Fires when the index's `metadata.total_size` differs from the tensor bytes the shards hold.",
    why="The tensors load regardless of it. A wrong value means the index was not written for these shards, "
    "so the other index rules (LC602-LC604) are worth a look.",
    example='    "metadata": {"total_size": 4035425288}\n\nwhile the shards hold 4035425280 tensor bytes.',
)
rule(
    "LC607",
    "unreferenced-shard",
    "warning",
    FIL,
    "A safetensors file the index does not reference.",
    "Delete it; loaders that glob *.safetensors may load it.",
    doc="Fires for a `*.safetensors` file in a sharded checkpoint that the index does not reference.",
    why="Loaders that follow the index ignore it; loaders that glob `*.safetensors` load it too, and its "
    "tensors then collide with or add to the indexed ones.",
    example="    model-00004-of-00003.safetensors\n\nbeside an index that references three shards.",
)
rule(
    "LC608",
    "no-weights",
    "error",
    FIL,
    "No safetensors weights found.",
    "Export model.safetensors.",
    doc="Fires when the checkpoint has no `*.safetensors` file and no index, or when its safetensors files "
    "hold no tensor at all.",
    why="There are no weights to load: every runtime refuses, and none of the coverage rules can say anything "
    "useful.",
    example="    drafter/config.json\n\nand nothing else (or only pytorch_model.bin: LC601).",
)
rule(
    "LC609",
    "header-duplicate-key",
    "error",
    FIL,
    "A safetensors header names the same tensor twice; every loader keeps one entry silently, not the same one.",
    "Re-export the file: each tensor name once per header.",
    doc="Fires when a safetensors header names the same tensor more than once.",
    why="A header is a JSON object; a repeated key is kept once by every parser, but not the same entry by "
    "each, so two loaders can read different offsets, shapes or dtypes for the tensor.",
    example='    {"fc.weight": {"dtype": "BF16", "shape": [2048, 10240], ...},\n     "fc.weight": '
    '{"dtype": "BF16", "shape": [2048, 8192], ...}}',
)


# ---------------------------------------------------------------- checks


@check
def files(ctx: Context) -> None:
    s, src = ctx.table.shards, ctx.source
    if src.pickles:
        ctx.emit(
            "LC601",
            f"pickle files present (not opened): {shorten([src.rel(p) for p in src.pickles])}",
            subjects=[src.rel(p) for p in src.pickles],
        )
    if not src.safetensors and not s.has_index:
        ctx.emit("LC608", "no *.safetensors file in the checkpoint")
    elif not ctx.table.tensors:
        ctx.emit("LC608", "the checkpoint holds no tensors")
    for shard, names in s.missing_shards.items():
        ctx.emit(
            "LC602",
            f"the index places {len(names)} tensors in `{shard}`, which does not exist",
            file="model.safetensors.index.json",
            pointer=shard,
            subjects=names,
        )
    if s.index_only:
        names = sorted(s.index_only)
        ctx.emit(
            "LC603",
            f"{len(names)} tensors listed in the index are not in their shard: "
            + ", ".join(f"`{n}` ({s.index_only[n]})" for n in names[:5]),
            file="model.safetensors.index.json",
            subjects=names,
        )
    for name, (listed, real) in sorted(s.misplaced.items()):
        ctx.emit(
            "LC603",
            f"the index places `{name}` in `{listed}` but it is in `{real}`",
            file="model.safetensors.index.json",
            pointer=name,
            subjects=[name],
        )
    if s.shard_only:
        names = sorted(s.shard_only)
        ctx.emit(
            "LC604",
            f"{len(names)} tensors in the shards are missing from the index (a loader that trusts "
            f"the index skips them): {shorten(names)}",
            file="model.safetensors.index.json",
            subjects=names,
        )
    for name, holders in sorted(s.duplicates.items()):
        ctx.emit("LC605", f"`{name}` is stored in {', '.join(holders)}", pointer=name, subjects=[name])
    if s.total_size_declared is not None and s.total_size_declared != s.total_size_actual:
        ctx.emit(
            "LC606",
            f"index total_size is {s.total_size_declared} but the shards hold {s.total_size_actual} "
            "tensor bytes",
            file="model.safetensors.index.json",
            pointer="$.metadata.total_size",
            expected=s.total_size_actual,
            actual=s.total_size_declared,
        )
    for rel in s.unreferenced:
        ctx.emit("LC607", f"`{rel}` is not referenced by the index", file=rel)
    for rel, names in ctx.table.duplicate_keys.items():
        ctx.emit(
            "LC609", f"the header of `{rel}` names {shorten(names)} more than once", file=rel, subjects=names
        )
