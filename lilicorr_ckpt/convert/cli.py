"""The `lilicorr-ckpt convert` command (registered by lilicorr_ckpt.cli)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from lilicorr_ckpt.convert.options import (
    DEFAULT_RUNTIME,
    LAYOUT_CHOICES,
    NAMING_CHOICES,
    SPECULATORS_RUNTIME,
    UNRELEASED,
    ConvertOptions,
    parse_set,
    parse_size,
)
from lilicorr_ckpt.errors import ConversionRefused, InputError, UsageError
from lilicorr_ckpt.runtime_option import RUNTIME
from lilicorr_ckpt.runtimes import RELEASES, supported_releases


def runtime_help() -> str:
    """convert's --runtime help: its default is the released engines, not `all`."""
    chain = RELEASES["vllm"]
    one, since = chain[0].version, chain[min(1, len(chain) - 1)].version
    unreleased = ", ".join(p.display for p in UNRELEASED)
    return (
        "The engine releases whose loaders the output must satisfy (decides what must stay float, and what "
        f"validate judges). Default `{DEFAULT_RUNTIME}`: the newest release of each released engine"
        + (
            f"; an unreleased loader ({unreleased}) changes the output only when named: `trtllm`, `all` (the "
            "newest of each engine) or `every`"
            if unreleased
            else ""
        )
        + f"; with --to speculators, `{SPECULATORS_RUNTIME}` (the released engines that read that layout)"
        + f". `vllm=={one}`: one release; `vllm>={since}`: every release in the range; comma-separated to "
        f"combine. Supported: {supported_releases()}."
    )


HELP = """Convert a DFlash-family drafter (a ModelOpt export, or a drafter in the z-lab or speculators
layout) into the layout SGLang, vLLM and TensorRT-LLM load, or into the speculators layout vLLM reads.

SRC is the drafter directory (config.json with dflash_config, or a speculators config.json;
model.safetensors or a sharded index; optionally hf_quant_config.json). DST must not exist (or, with
--force, be empty or an earlier convert output, whose files that convert did not write are kept); it
appears only once the output has been written completely and `validate` accepts it. SRC is only ever
read.

\b
What it fixes:
  - tensor names: strips dflash_module. / eagle_module. / model., writes named (or Sequential) head MLPs
  - config.json: architectures from the head, lilicorr_* and conv keys inside dflash_config,
    block_size in dflash_config and at the top level
  - quantization metadata: flat quantization_config with quant_method (modelopt_fp4 / modelopt) and
    ignore, nested hf_quant_config.json, exclusions recomputed from the tensors (index-free suffix
    wildcards, *qkv_proj / *gate_up_proj aliases; training prefixes and base-model names gone)
  - repairs: modules the runtimes read as raw floats (lilicorr factor heads, feature_mlp; q/k/v for
    TensorRT-LLM) that were quantized are dequantized to the model dtype; their scales are dropped
  - fused NVFP4 linears (q/k/v, gate/up): shards stored with different weight_scale_2 get the group's
    largest, and the others are re-quantized against it (SGLang and vLLM serve one per fused linear)
  - sibling heads (DFlash2 selector, DSpark Markov / confidence heads) stored quantized are refused,
    naming --dequantize; an NVFP4 export without input_scale is refused, naming --relabel-w4a16
\b
Layouts (--to): zlab (the default) writes the z-lab config every engine reads; a speculators SRC
(vllm-project/speculators) is read as vLLM translates it, with the attention mask speculators trained.
--to speculators writes a DFlash, DFlash2 or DSpark drafter in the speculators layout, which only vLLM
reads (so the default -r is vllm), with sliding_window_non_causal set to the mask the drafter was
trained with; a LiLiCorr or Domino head, which that layout cannot express, is refused. The tensors are
the same bytes in both layouts.
\b
By default the output is made for the released engines (sglang,vllm). TensorRT-LLM's loader, which
no release has yet, takes q/k/v only in float: name it (-r trtllm, -r all, -r every) to dequantize
them for it too.
Other files of SRC (model card, licence, tokenizer, chat template, generation_config.json, ...) are
copied unchanged; weights in other formats (*.bin, *.pt, *.gguf, ...), safetensors files and indexes that
are not part of the checkpoint, and subdirectories are left out. Everything changed, copied or left out is
listed in the summary and in DST/conversion.json.

\b
Examples (from the repository root):
  lilicorr-ckpt convert examples/tiny-modelopt-nvfp4 ./drafter             # for SGLang and vLLM (newest releases)
  lilicorr-ckpt convert examples/tiny-modelopt-nvfp4 ./drafter --dry-run   # show the plan; write nothing
  lilicorr-ckpt convert examples/tiny-modelopt-nvfp4 ./drafter -r trtllm --naming sequential  # legacy names
  lilicorr-ckpt convert examples/tiny-modelopt-nvfp4 ./drafter --no-repair  # refuse (exit 1) instead of dequantizing
  lilicorr-ckpt convert examples/tiny-modelopt-nvfp4 ./drafter --set dflash_config.lilicorr_logit_scale=12
  lilicorr-ckpt convert examples/tiny-modelopt-nvfp4 ./drafter --max-shard-size 50KB --force
  lilicorr-ckpt convert examples/tiny-modelopt-nvfp4 ./drafter --verify    # compare outputs through lilicorr_runtime
  lilicorr-ckpt convert tests/data/producers/modelopt-0.48.0rc1/dflash2-bf16 ./dflash2-spec --to speculators
  lilicorr-ckpt convert tests/data/producers/speculators-0.9.0/dflash-bf16 ./dflash-zlab  # speculators -> z-lab
"""

EPILOG = (
    "Exit codes: 0 converted, 1 refused (reasons listed; nothing written), 2 unreadable input or I/O error, "
    "4 usage error."
)


def _emit_json(doc: dict[str, Any]) -> None:
    click.echo(json.dumps(doc, indent=2))


def register(group: click.Group) -> None:
    @group.command("convert", help=HELP, epilog=EPILOG)
    @click.argument("src")
    @click.argument("dst")
    @click.option(
        "--runtime",
        "-r",
        type=RUNTIME,
        default=None,
        help=runtime_help(),
    )
    @click.option(
        "--to",
        "to",
        type=click.Choice(LAYOUT_CHOICES),
        default="zlab",
        show_default=True,
        help="The layout of the output's config.json: zlab (dflash_config; every engine reads it) or speculators "
        "(vllm-project/speculators; vLLM reads it). A LiLiCorr or Domino head cannot be written as speculators.",
    )
    @click.option(
        "--verifier",
        metavar="REPO_ID",
        help="--to speculators: the target's Hub repo id, written as speculators_config.verifier.name_or_path "
        "(what `vllm serve DRAFTER` starts as the target; null when not given).",
    )
    @click.option(
        "--naming",
        type=click.Choice(NAMING_CHOICES),
        default="auto",
        show_default=True,
        help="LiLiCorr head MLP names: named (feature_mlp.up_proj) or sequential (feature_mlp.1, the "
        "nn.Sequential names the oldest SGLang release builds and TensorRT-LLM renames); auto: the one every "
        "selected release loads (refused, naming the selections to convert for separately, when there is none).",
    )
    @click.option(
        "--max-shard-size",
        default="5GB",
        show_default=True,
        metavar="SIZE",
        help="Split the output into shards of at most SIZE (5GB, 500MB, 2GiB) with an index.",
    )
    @click.option(
        "--no-repair",
        is_flag=True,
        help="Refuse instead of dequantizing modules that must stay floating point.",
    )
    @click.option(
        "--dequantize",
        "dequantize",
        multiple=True,
        metavar="PATTERN",
        help="Also store these modules in float (fnmatch over module names, e.g. 'lm_head'; a sibling "
        "head's linears by their source or served name: candidate_selector.hidden_projection, markov_w2, "
        "confidence_proj). Repeatable.",
    )
    @click.option(
        "--relabel-w4a16",
        is_flag=True,
        help="An NVFP4 (W4A4) export without activation scales (calibrated without running the drafter): "
        "write quant_algo W4A16_NVFP4 (weight-only) in both quantization configs; the weights are unchanged. "
        "Refused when a selected release does not load W4A16_NVFP4.",
    )
    @click.option(
        "--drop",
        multiple=True,
        metavar="PATTERN",
        help="Drop tensors matching PATTERN (source or converted name); reported. Repeatable.",
    )
    @click.option(
        "--set",
        "set_items",
        multiple=True,
        metavar="KEY=VALUE",
        help="Set a config.json key (dotted path, JSON value), e.g. dflash_config.block_size=16; quote "
        "strings as JSON: dflash_config.name='\"x\"'. Repeatable.",
    )
    @click.option(
        "--force",
        is_flag=True,
        help="Replace DST if it is an empty directory or the output of an earlier convert (it holds "
        "conversion.json); anything else is refused. Only the files that convert wrote are "
        "replaced: every other entry of DST (a README.md from `card`, .git/, .gitattributes) is "
        "kept, and a weight or config file changed since is refused by name. The old DST stays "
        "until the new one is complete.",
    )
    @click.option("--dry-run", is_flag=True, help="Plan and pre-validate only; print what would change.")
    @click.option(
        "--verify",
        is_flag=True,
        help="Load source and output through lilicorr_runtime (needs torch) and compare draft logits "
        "and head scores: exact for renames, within bf16 rounding for repaired modules.",
    )
    @click.option("--strict", is_flag=True, help="Refuse when the output has validate warnings too.")
    @click.option(
        "--format",
        "-f",
        "fmt",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help="json prints one JSON document to stdout whatever happens: the conversion record "
        "(conversion.json) with status converted / dry-run, or status refused / error with the "
        "reasons.",
    )
    @click.option(
        "--quiet", "-q", is_flag=True, help="No progress on stderr (it is off anyway when not a terminal)."
    )
    def convert_command(
        src: str,
        dst: str,
        runtime: str | None,
        to: str,
        verifier: str | None,
        naming: str,
        max_shard_size: str,
        no_repair: bool,
        dequantize: tuple[str, ...],
        relabel_w4a16: bool,
        drop: tuple[str, ...],
        set_items: tuple[str, ...],
        force: bool,
        dry_run: bool,
        verify: bool,
        strict: bool,
        fmt: str,
        quiet: bool,
    ) -> None:
        from lilicorr_ckpt.convert.pipeline import convert
        from lilicorr_ckpt.convert.summary import render_summary

        as_json = fmt == "json"
        head = {"src": src, "dst": dst, "written": False}
        try:
            options = ConvertOptions(
                runtime=runtime or "",
                to=to,
                verifier=verifier,
                naming=naming,
                max_shard_size=parse_size(max_shard_size),
                repair=not no_repair,
                drop=drop,
                dequantize=dequantize,
                relabel_w4a16=relabel_w4a16,
                set_keys=tuple(parse_set(s) for s in set_items),
                force=force,
                verify=verify,
                strict=strict,
                dry_run=dry_run,
                quiet=quiet,
            )
            result = convert(src, dst, options)
        except ConversionRefused as exc:
            click.echo(f"lilicorr-ckpt convert: refused: {exc}\n  Nothing was written to {dst}.", err=True)
            if as_json:
                _emit_json(
                    {
                        "status": "refused",
                        "exit_code": 1,
                        **head,
                        "summary": exc.summary,
                        "reasons": exc.reasons,
                    }
                )
            sys.exit(1)
        except (UsageError, InputError) as exc:  # the top-level handler prints it on stderr and sets the code
            if as_json:
                _emit_json(
                    {
                        "status": "error",
                        "exit_code": 4 if isinstance(exc, UsageError) else 2,
                        **head,
                        "error": str(exc),
                    }
                )
            raise
        except OSError as exc:  # not expected (the pipeline names its I/O errors); still no traceback
            error = InputError(
                f"I/O error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
            )
            if as_json:
                _emit_json({"status": "error", "exit_code": 2, **head, "error": str(error)})
            raise error from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where the command line raises a subclass for it
            if as_json:
                how = "terminated" if type(exc).__name__ == "Terminated" else "interrupted"
                _emit_json({"status": how, **head, "error": f"{how} before DST was written"})
            raise
        except Exception as exc:
            if as_json:
                _emit_json(
                    {
                        "status": "error",
                        "exit_code": 2,
                        **head,
                        "error": f"internal error: {type(exc).__name__}: {exc}",
                    }
                )
            raise
        if as_json:
            _emit_json(  # src and dst as given (conversion.json has no paths); kept: what --force kept in DST
                {
                    "status": "converted" if result.written else "dry-run",
                    "src": src,
                    "dst": dst,
                    **result.record,
                    "kept": result.kept,
                }
            )
        else:
            click.echo(render_summary(result), nl=False)
