"""`--runtime`, as every command takes it: a runtime selection (runtimes/__init__.py select_profiles), checked when
the command line is parsed so that an unsupported release is a usage error naming the supported ones."""

from __future__ import annotations

from typing import Any

import click

from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.runtimes import RELEASES, select_profiles, supported_releases

METAVAR = "RUNTIME"


class RuntimeSelection(click.ParamType):
    """A runtime selection, kept as written (the commands pass the string on; select_profiles reads it)."""

    name = "runtime"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            select_profiles(value)
        except UsageError as exc:
            self.fail(str(exc).split(": ", 1)[-1], param, ctx)
        return str(value)

    def get_metavar(self, param: click.Parameter, *args: Any, **kwargs: Any) -> str:
        return METAVAR


RUNTIME = RuntimeSelection()


def runtime_help(what: str) -> str:
    """The --runtime help of a command: what the selection is for, then the grammar and the releases."""
    chain = RELEASES["vllm"]
    one, since = chain[0].version, chain[min(1, len(chain) - 1)].version
    return (
        f"{what} `all` (the default): the newest release of each engine; `sglang`, `vllm` or `trtllm`: that "
        f"engine's newest; `vllm=={one}`: one release; `vllm>={since}`: a verdict per release in the range; "
        f"`every`: every release; comma-separated to combine. Supported: {supported_releases()}."
    )


def check_runtime(value: str) -> str:
    """The Python API's check: the same selection, or UsageError naming the supported releases."""
    select_profiles(value)
    return value
