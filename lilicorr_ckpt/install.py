"""What to run to install the `runtime` extra (torch, transformers, ...), worked out without importing torch.

lilicorr-ckpt is not on PyPI: it installs from its repository (a checkout, or a git URL), as the GitHub Action
does. The hint names where this copy came from (pip's direct_url.json: the checkout's directory or the git URL),
and, on a Linux or Windows machine with no NVIDIA driver, the CPU torch wheel first: from PyPI pip would fetch
the CUDA build (several GB) that such a machine cannot use. Torch is never imported here (the hint is printed
because torch is missing or broken).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
from urllib.parse import unquote, urlparse

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EXTRA = "runtime"
REPOSITORY_HINT = "a checkout of the lilicorr-ckpt repository"


def has_nvidia_driver() -> bool:
    """Whether this machine has an NVIDIA driver (CUDA can work): nvidia-smi on PATH, the kernel driver's /proc
    entry, or a device node. Imports nothing."""
    if shutil.which("nvidia-smi"):
        return True
    return any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/nvidia0", "/dev/nvidiactl"))


def cpu_wheel_needed(system: str | None = None, cuda: bool | None = None) -> bool:
    """Whether pip must be pointed at the CPU wheel: Linux and Windows wheels on PyPI are CUDA builds; macOS's
    are CPU (and Metal) builds already."""
    system = platform.system() if system is None else system
    cuda = has_nvidia_driver() if cuda is None else cuda
    return system in ("Linux", "Windows") and not cuda


def installed_from() -> str | None:
    """Where pip installed this lilicorr-ckpt from (direct_url.json): a directory, a git URL at its commit, or
    None (not known: a wheel from an index, or not installed, run from the source tree)."""
    from importlib.metadata import PackageNotFoundError, distribution  # ~100 ms: only when a hint is printed

    try:
        text = distribution("lilicorr-ckpt").read_text("direct_url.json")
    except (PackageNotFoundError, OSError):
        return None
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    url = data.get("url") if isinstance(data, dict) else None
    if not isinstance(url, str):
        return None
    if url.startswith("file://"):
        return unquote(urlparse(url).path) or None
    vcs = data.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("vcs"), str):
        commit = vcs.get("commit_id")
        return f"{vcs['vcs']}+{url}" + (f"@{commit}" if isinstance(commit, str) and commit else "")
    return None


def extra_spec(source: str | None) -> str:
    """The pip argument that installs the runtime extra from `source` (installed_from())."""
    if source is None:
        return f"'.[{EXTRA}]'"
    if "+" in source.split("://", 1)[0]:  # git+https://...
        return shlex.quote(f"lilicorr-ckpt[{EXTRA}] @ {source}")
    return shlex.quote(f"{source}[{EXTRA}]")


def install_command(*, system: str | None = None, cuda: bool | None = None, source: str | None = "?") -> str:
    """The shell command that installs the runtime extra on this machine."""
    where = installed_from() if source == "?" else source
    steps = []
    if cpu_wheel_needed(system, cuda):
        steps.append(f"pip install torch --index-url {CPU_INDEX}")
    steps.append(f"pip install {extra_spec(where)}")
    return " && ".join(steps)


def runtime_hint(what: str) -> str:
    """`what` needs the runtime extra, and the command that installs it here (one line)."""
    where = installed_from()
    command = install_command(source=where)
    notes = []
    if cpu_wheel_needed():
        notes.append("no NVIDIA driver found, so the CPU torch wheel")
    if where is None:
        notes.append(f"lilicorr-ckpt is not on PyPI: run it in {REPOSITORY_HINT}")
    return f"{what} needs the {EXTRA} extra (torch, transformers, gguf, accelerate): {command}" + (
        f" ({'; '.join(notes)})" if notes else ""
    )
