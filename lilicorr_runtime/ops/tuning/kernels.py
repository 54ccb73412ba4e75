"""The runtime's Triton kernels compiled ahead, many at once, before a run launches them.

A process that finds Triton's disk cache empty (a fresh machine, a new container, a new Triton) compiles each
kernel variant the first time it is launched, one after another on the launching thread: on an H200 that was
about 25 s of a 66 s smoke. Which variants a run needs is known before it starts, from an earlier run on the same
GPU: a variant is a kernel with its specialization (constexprs, tile, argument dtypes and alignments), which
Triton can serialize and compile again from that record alone (`JITFunction.preload`).

- `record()` installs a Triton post-compile hook that notes every variant of the runtime's own kernels
  (`lilicorr_runtime.*`) this process's launches compile or load (not what a warm-up compiled); `save()` merges them into a per-user table,
  `$XDG_CACHE_HOME/lilicorr/kernels.json` (default `~/.cache/...`) or the path in LILICORR_KERNEL_CACHE;
- a table shipped with the package (kernels.json beside this module) holds the variants of the bundled example
  models on the GPUs named in it;
- `start(device)` compiles the stored variants of this GPU and Triton, or where there are none, those of other
  GPUs of its compute capability (the same code comes out of a variant on an H100 and an H200), in a pool of
  threads (Triton's compiler leaves the interpreter lock while it works), in the background, so that it overlaps
  loading the target. Call `join()` on the handle before the first launch.

LILICORR_KERNEL_CACHE=off reads and writes neither table. What a variant compiles into goes only to Triton's disk
cache, keyed by the variant's own specialization: the preload runs on a copy of the kernel with kernel tables of
its own, so every launch still finds its kernel by its own specialization (a disk hit). A damaged, stale or
planted entry can therefore cost compile time, never run a kernel other than the one its launch asks for. An entry is compiled only if it names a kernel of this
package whose own source text is unchanged since it was recorded.
"""

from __future__ import annotations

import collections
import copy
import hashlib
import importlib
import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ... import settings
from . import tables

FORMAT = 1
BUNDLED = Path(__file__).with_name("kernels.json")
ENV = settings.KERNEL_CACHE.name
PACKAGE = "lilicorr_runtime."
MAX_ENTRIES = 1024  # per device in a table: a run of the bundled models needs about a hundred
TABLE_LIMIT = 64 << 20  # bytes of a kernel table (the bundled one is about 280 kB); read by tables.read_table

_lock = threading.Lock()
_recorded: dict[str, dict[str, dict[str, str]]] = {}  # device key -> spec -> entry
_hooked = False
_warned: set[str] = set()
_clock = time.perf_counter
_started = threading.local()  # the launch compile under way on this thread: its start (perf_counter)
# device key -> spec -> the seconds a launch of this package's kernels waited for the variant (compiled, or read from
# Triton's disk cache, where the ahead compile or an earlier process put it)
_waits: dict[str, dict[str, float]] = {}


def _warn(key: str, message: str) -> None:
    tables.warn_once(_warned, key, message, stacklevel=4)


def user_path() -> Path | None:
    """The per-user table, or None when LILICORR_KERNEL_CACHE=off."""
    return settings.kernel_cache()


def device_key(device: torch.device) -> str:
    """The GPU (name and compute capability) and the Triton version the variants were compiled for."""
    import triton

    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} sm{major}{minor} triton {triton.__version__}"


def _entry_ok(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and set(entry) == {"name", "source", "spec"}
        and all(isinstance(entry[k], str) for k in entry)
        and entry["name"].startswith(PACKAGE)
    )


def portable(spec: str) -> str:
    """A variant's record without what names the recording machine's files: Triton writes the path of its libdevice
    into the options (`extern_libs`), and compiling from a record whose path does not exist here fails (Triton hashes
    the file), while a launch here names this machine's own. Without it, Triton fills in its own library, as for a
    launch. A record that is not a JSON object is left as it is."""
    try:
        data = json.loads(spec)
    except ValueError:
        return spec
    options = data.get("options") if isinstance(data, dict) else None
    if not isinstance(options, dict) or "extern_libs" not in options:
        return spec
    del options["extern_libs"]
    return json.dumps(data)


def read(path: Path) -> dict[str, list[dict[str, str]]]:
    """device key -> entries of a table file (their specs `portable`); {} (with one warning) for a file that is not
    a table."""
    data = tables.read_table(path, "the kernel table", TABLE_LIMIT, _warned)
    if data is None:
        return {}
    if (
        not isinstance(data, dict)
        or data.get("format") != FORMAT
        or not isinstance(data.get("devices"), dict)
    ):
        _warn(str(path), f"ignoring the kernel table {path}: not a format-{FORMAT} kernel table")
        return {}
    out: dict[str, list[dict[str, str]]] = {}
    for device, entries in data["devices"].items():
        if isinstance(device, str) and isinstance(entries, list):
            out[device] = [{**e, "spec": portable(e["spec"])} for e in entries if _entry_ok(e)][-MAX_ENTRIES:]
    return out


def _stack(device: str) -> str | None:
    """The compile target of a device key ("sm90 triton 3.6.0"): what a variant's code depends on. Two GPUs of
    one compute capability (an H100 and an H200) build the same code from a variant under the same Triton."""
    match = re.search(r" (sm\d+ triton \S+)$", device)
    return match.group(1) if match else None


def stored(device: str) -> list[dict[str, str]]:
    """The entries for a device key: the bundled table's, then the user's, each spec once; where neither holds
    any for this GPU, those recorded on other GPUs of the same compute capability and Triton (a launch there may
    ask for the same variant). A GPU with entries of its own takes only those: smoke waits for every stored
    variant before its first launch, and another GPU's (other tiles, so mostly variants no launch here asks
    for) cost an H100 with its own table 71 compiles where its 60 serve."""
    user = user_path()
    if user is None:
        return []
    tables_read = [read(BUNDLED), read(user)]
    seen: dict[str, dict[str, str]] = {}
    for data in tables_read:
        for entry in data.get(device, []):
            seen.setdefault(entry["spec"], entry)
    stack = _stack(device)
    if stack is not None and not seen:
        for data in tables_read:
            for other, entries in data.items():
                if other != device and _stack(other) == stack:
                    for entry in entries:
                        seen.setdefault(entry["spec"], entry)
    return list(seen.values())


def _ours(fn: Any) -> bool:
    """Whether a hook's `fn` is a launch of one of this package's kernels (not a warm-up's shadow copy)."""
    try:
        return not getattr(fn.jit_function, "_lilicorr_shadow", False) and f"{fn.module}.".startswith(PACKAGE)
    except Exception:
        return False


def _pre_hook(*, fn: Any = None, **_: Any) -> None:
    """Triton's cache hook, called before a launch compiles (or reads from Triton's disk cache) a variant."""
    if _ours(fn):
        _started.at = _clock()


def _hook(*, key: Any = None, repr: Any = None, fn: Any = None, compile: Any = None, **_: Any) -> None:  # noqa: A002
    """Triton's post-compile hook: note a variant of one of this package's kernels, and the time its launch
    waited for it."""
    begin = getattr(_started, "at", None)
    waited = None if begin is None else _clock() - begin
    _started.at = None
    if not _ours(fn):  # a warm-up's compile (only what launches use is noted), or another package's kernel
        return
    try:
        jit = fn.jit_function
        name = f"{fn.module}.{fn.name}"
        spec = compile["specialization_data"]
        if not isinstance(spec, str):
            return
        spec = portable(spec)
        device = device_key(torch.device("cuda", int(compile["device"])))
        if waited is not None:
            with _lock:
                waits = _waits.setdefault(device, {})
                waits[spec] = waits.get(spec, 0.0) + waited
        source = source_hash(jit)
        if source is None:  # not a kernel with source text: nothing a later process could check it against
            return
        with _lock:
            _recorded.setdefault(device, {})[spec] = {"name": name, "source": source, "spec": spec}
    except Exception:  # a Triton whose hook passes other things: nothing is recorded
        return


def record() -> bool:
    """Note the variants this process compiles from now on (Triton's post-compile hook, chained to one already
    set). False where this Triton has no such hook."""
    global _hooked
    import triton

    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    if _hooked:
        return True
    previous = runtime.jit_post_compile_hook

    def hook(**kwargs: Any) -> Any:
        _hook(**kwargs)
        return previous(**kwargs) if previous is not None else None

    runtime.jit_post_compile_hook = hook
    if hasattr(runtime, "jit_cache_hook"):  # before a compile: its start, for launch_waits()
        before = runtime.jit_cache_hook

        def pre(**kwargs: Any) -> Any:
            _pre_hook(**kwargs)
            # a true answer skips the compile: only the hook set before ours gives one
            return before(**kwargs) if before is not None else None

        runtime.jit_cache_hook = pre
    _hooked = True
    return True


def launch_waits() -> dict[str, dict[str, float]]:
    """device key -> (portable) spec -> the seconds this process's launches waited for that variant since
    record(): its compile, or its read from Triton's disk cache (where a variant compiled ahead is found, since the
    ahead compile fills the disk cache, not the launching kernel's own tables). Not what a warm-up compiled."""
    with _lock:
        return {device: dict(waits) for device, waits in _waits.items()}


def recorded() -> dict[str, list[dict[str, str]]]:
    with _lock:
        return {device: list(specs.values()) for device, specs in _recorded.items()}


def save() -> None:
    """Merge what this process recorded into the per-user table (written atomically; a file that cannot be
    written costs a warning, never the run)."""
    path = user_path()
    mine = recorded()
    if path is None or not mine:
        return
    try:
        table = read(path)
        changed = False
        for device, entries in mine.items():
            known = {e["spec"] for e in table.get(device, [])}
            new = [e for e in entries if e["spec"] not in known]
            if new:
                table[device] = (table.get(device, []) + new)[-MAX_ENTRIES:]
                changed = True
        if changed:
            tables.write_json(path, {"format": FORMAT, "devices": table})
    except OSError as exc:
        _warn(f"write {path}", f"could not write the kernel table {path} ({exc})")


def source_hash(fn: Any) -> str | None:
    """A hash of a kernel's own source text. Not Triton's cache key, which also hashes the line the kernel starts
    on, so that any edit above a kernel in its file would make every stored variant of it stale; a changed helper
    changes what a variant compiles to, never the specialization a launch asks for."""
    src = getattr(fn, "src", None)
    if not isinstance(src, str):
        return None
    return hashlib.sha256(src.encode()).hexdigest()[:16]


def _kernel(name: str) -> Any:
    """The JITFunction an entry names, if it is one of this package's kernels; else None."""
    module, _, attr = name.rpartition(".")
    if not module.startswith(PACKAGE) or not attr.isidentifier():
        return None
    try:
        fn = getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None
    return fn if hasattr(fn, "preload") and hasattr(fn, "device_caches") else None


def shadow(fn: Any) -> Any:
    """A copy of a JITFunction with kernel tables of its own: what `preload` compiles into it lands in Triton's
    disk cache (keyed by the variant's real specialization) but never in the tables the kernel's launches use."""
    twin = copy.copy(fn)
    twin.device_caches = collections.defaultdict(twin.create_binder)
    twin._lilicorr_shadow = True
    return twin


class Warming:
    """A background compile of stored variants (`start`); `join()` waits for it and returns what it did."""

    def __init__(self, jobs: list[tuple[Any, str]], workers: int, device: torch.device):
        self.jobs = jobs
        self.workers = workers
        self.device = device
        self.compiled = 0
        self.failed = 0
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="lilicorr-warm", daemon=True)
        self._thread.start()

    def _one(self, job: tuple[Any, str]) -> bool:
        fn, spec = job
        try:
            with torch.cuda.device(self.device):
                fn.preload(spec)
            return True
        except Exception:  # a variant this Triton or GPU cannot build: the launch compiles what it needs
            return False

    def _run(self) -> None:
        begin = time.perf_counter()
        try:
            with torch.cuda.device(self.device):
                for fn in {id(fn): fn for fn, _ in self.jobs}.values():
                    fn.device_caches[torch.cuda.current_device()]  # its binder, once, before the threads
            with ThreadPoolExecutor(self.workers, thread_name_prefix="lilicorr-compile") as pool:
                done = list(pool.map(self._one, self.jobs))
            self.compiled = sum(done)
            self.failed = len(done) - self.compiled
        except Exception:  # the warm-up is an optimisation: launches compile what it did not
            self.failed = len(self.jobs) - self.compiled
        finally:
            self.seconds = time.perf_counter() - begin

    def join(self, timeout: float | None = None) -> Warming:
        self._thread.join(timeout)
        return self


def start(
    device: torch.device | str, workers: int | None = None, entries: list[dict] | None = None
) -> Warming | None:
    """Compile this GPU's stored variants (or `entries`) in the background; None when there is nothing to do
    (not CUDA, the tables off or empty, a Triton without `preload`). Also starts `record()`."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    record()
    if entries is None:
        entries = stored(device_key(device))
    jobs = []
    sources: dict[str, str | None] = {}
    shadows: dict[str, Any] = {}
    for entry in entries:
        if not _entry_ok(entry):
            continue
        fn = _kernel(entry["name"])
        if fn is None:
            continue
        if entry["name"] not in sources:
            sources[entry["name"]] = source_hash(fn)
        if sources[entry["name"]] == entry["source"]:  # the kernel's source is the one recorded
            if entry["name"] not in shadows:
                shadows[entry["name"]] = shadow(fn)
            jobs.append((shadows[entry["name"]], entry["spec"]))
    if not jobs:
        return None
    workers = workers or max(1, min(16, (os.cpu_count() or 2), len(jobs)))
    return Warming(jobs, workers, device)
