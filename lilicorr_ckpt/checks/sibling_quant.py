"""The quantization of a sibling head's linears (LC305, LC307): the ones a loader builds through the draft's quant
config, which the manifest lists as plain tensors (so the per-module rules in quantization.py never see them).

Each family's QUANT_LINEARS (lilicorr_ckpt/families) names, per engine, the head linears its loader builds through
the quant config and the config layout that selects that class: vLLM builds DSpark's `markov_head.markov_w2` as a
ParallelLMHead with the draft's quant config (served as `model.markov_head.markov_w2`), SGLang only in the
Nemotron-3.5 layout (Nemotron35VanillaMarkov's ReplicatedLinear; VanillaMarkov's nn.Linear otherwise). Stored in
float and matched by no exclusion as that release matches it (runtimes.excluded_by), such a linear is built
quantized and the float weight meets a packed NVFP4 or FP8 parameter (LC307). Built NVFP4, its in_features (the
Markov rank) must be a multiple of the group size, whatever it is stored as: the build refuses it otherwise
(LC305)."""

from __future__ import annotations

from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.context import names as _names
from lilicorr_ckpt.checks.quantization import copy_read_by
from lilicorr_ckpt.families import FAMILIES
from lilicorr_ckpt.runtimes import RuntimeProfile, excluded_by

FLOAT_DTYPES = ("F32", "BF16", "F16")


@check
def sibling_quantization(ctx: Context) -> None:
    family = ctx.geometry.family
    table = FAMILIES[family].QUANT_LINEARS if family is not None and family in FAMILIES else {}
    if family is None or not table:
        return
    archs = ctx.parsed.raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    # (rule, module, served name, the loader's statement, detail, the config read) -> the releases it holds for
    found: dict[tuple[str, str, str, str, str, str], list[RuntimeProfile]] = {}
    for p in ctx.profiles:
        if p.sibling_route(family, arch)[0] == "refuses":  # LC014 says so; its linears are never built
            continue
        qc = copy_read_by(ctx, p)
        if qc is None or qc.quant_algo is None:
            continue
        read = qc.read_by(p)
        for module, selects, where in table.get(p.engine_id, ()):
            if selects is not None and not selects(ctx.parsed.raw):
                continue
            stored = ctx.names.by_canonical.get(f"{module}.weight")
            expected = ctx.manifest.tensors.get(f"{module}.weight")
            scheme = read.scheme_for(module)
            if stored is None or expected is None or scheme is None:
                continue
            exclusion = excluded_by(p, module, read.exclude, ctx.geometry.num_target_layers)
            if exclusion.excluded:
                continue
            if stored.dtype in FLOAT_DTYPES:
                consequence = (
                    "the float weight meets its packed NVFP4 parameter and the load fails"
                    if scheme.nvfp4
                    else "the float weight is cast into its FP8 parameter and served with scales at their "
                    "initial values"
                )
                found.setdefault(
                    ("LC307", module, exclusion.prefix, where, consequence, qc.source), []
                ).append(p)
            in_features = expected.shape[-1]
            if scheme.nvfp4 and in_features % scheme.group_size:
                detail = f"in_features {in_features} % {scheme.group_size} != 0"
                found.setdefault(("LC305", module, exclusion.prefix, where, detail, qc.source), []).append(p)
    for (rule_id, module, served, where, detail, source), profiles in found.items():
        if rule_id == "LC307":
            text = (
                f"`{module}` is stored in float but {_names(profiles, 'builds|build')} it quantized and no "
                f"exclusion matches it as `{served}` ({where}): {detail}"
            )
        else:
            text = (
                f"`{module}` is built NVFP4 by {_names(profiles)} ({where}) but its {detail}: no NVFP4 "
                "layer can be built for it (the model build refuses it); exclude it"
            )
        ctx.emit_for(
            rule_id,
            profiles,
            text,
            pointer=module,
            subjects=[f"{module}.weight"],
            file=source if rule_id == "LC307" else None,
        )
