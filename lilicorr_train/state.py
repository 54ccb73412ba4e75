"""A training run's state on disk: RUN/state.safetensors, tensors and JSON, never a pickle.

The tensors are the drafter's weights (`model.<name>`), AdamW's per-parameter moments and step counts
(`optimizer.<param index>.<key>`) and the data sampler's random state (`rng`). Everything else (the step, the
drafter's config.json, the training settings, AdamW's parameter groups) is JSON in the header's `__metadata__`.
One file, replaced atomically, so a run killed while saving resumes from the previous save.

Nothing in a state file can run code, and nothing is read before it has been checked: the file must be a
regular file; the header must name exactly the tensors that the drafter its own config describes has, with
their shapes, before a byte of tensor data is read, so a state cannot make the loader allocate more than a
real one of that drafter needs.

Runs saved by earlier versions of this tool (RUN/state.pt, a torch zip archive) still resume: they are read
with torch.load(weights_only=True), torch's restricted unpickler that refuses anything but tensors and plain
data, memory-mapped, then checked the same way; the next save writes state.safetensors and removes state.pt.
"""

from __future__ import annotations

import json
import os
import stat
import zipfile
from pathlib import Path
from typing import Any

import torch
from msgspec import Struct
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lilicorr_ckpt.checkpoint.source import file_kind

from .export import build_drafter, normal_mode

STATE = "state.safetensors"
LEGACY_STATE = "state.pt"  # written by earlier versions (torch.save)
FORMAT = "lilicorr-train-state"
FORMAT_VERSION = "1"
METADATA_LIMIT = 64 << 20  # bytes of JSON in the header: a config, settings and two parameter groups


class StateError(ValueError):
    """A state file that is not one this tool wrote (or can resume): the message names the file and why."""


class TrainState(Struct, kw_only=True):
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]  # torch.optim.Optimizer.state_dict() form
    rng: torch.Tensor  # torch.Generator.get_state()
    step: int
    config: dict[str, Any]  # the drafter's config.json
    train: dict[str, Any]  # TrainConfig as a dict


def state_path(run_dir: Path) -> Path | None:
    """The state file of `run_dir` (the current format first), or None for a directory that holds no run. Any
    entry of the name counts, a directory or a FIFO included: it is refused by name when read, never taken for
    a new run and written over."""
    for name in (STATE, LEGACY_STATE):
        if os.path.lexists(run_dir / name):
            return run_dir / name
    return None


def save_state(run_dir: Path, state: TrainState) -> Path:
    """Write RUN/state.safetensors atomically (a temporary file renamed over it); a state.pt of an earlier
    version is removed once the new file is in place."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {f"model.{k}": v for k, v in state.model.items()}
    scalars: dict[str, dict[str, Any]] = {}
    for index, values in state.optimizer["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value
            else:
                scalars.setdefault(str(index), {})[key] = value
    tensors["rng"] = state.rng
    doc = {
        "step": state.step,
        "config": state.config,
        "train": state.train,
        "param_groups": state.optimizer["param_groups"],
        "optimizer_scalars": scalars,
    }
    metadata = {"format": FORMAT, "version": FORMAT_VERSION, "state": json.dumps(doc)}
    tmp = run_dir / f".{STATE}.{os.getpid()}.tmp"
    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    normal_mode(tmp)
    tmp.replace(run_dir / STATE)
    legacy = run_dir / LEGACY_STATE
    if legacy.is_file() and not legacy.is_symlink():
        legacy.unlink()
    return run_dir / STATE


def check_log(path: Path) -> None:
    """The run's log, appended to by training: a FIFO or device there would block or never end, so anything
    but a regular file (or nothing yet) is refused by name."""
    if not os.path.lexists(path):
        return
    try:
        kind = file_kind(os.stat(path).st_mode)
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
    if kind is not None:
        raise StateError(
            f"{path} is {kind}, not a regular file; the run's log is appended to it: move it away"
        )


def _refuse(path: Path, why: str) -> StateError:
    return StateError(f"{path} is not a training state this tool can resume: {why}")


def _require_regular(path: Path) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
    kind = file_kind(st.st_mode)
    if kind is not None:
        raise _refuse(path, f"it is {kind}, not a regular file (never opened)")


def _open_regular(path: Path) -> int:
    """A descriptor of `path`, which must still be a regular file once opened (no FIFO swapped in meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refuse(path, "it is not a regular file")
    return fd


def read_state(path: Path) -> TrainState:
    """The state in `path` (state.safetensors, or an earlier version's state.pt), its structure checked; the
    tensors' shapes are checked against the drafter by `check_shapes` before any is used."""
    _require_regular(path)
    if path.name == LEGACY_STATE:
        return _read_legacy(path)
    return _read_safetensors(path)


def _read_safetensors(path: Path) -> TrainState:
    fd = _open_regular(path)
    os.close(fd)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            if metadata.get("format") != FORMAT:
                raise _refuse(
                    path, f"its header has no `format: {FORMAT}` (a safetensors file of something else)"
                )
            if metadata.get("version") != FORMAT_VERSION:
                raise _refuse(
                    path,
                    f"it is version {metadata.get('version')!r} of the state format; this tool reads "
                    f"version {FORMAT_VERSION}",
                )
            text = metadata.get("state", "")
            if len(text) > METADATA_LIMIT:
                raise _refuse(
                    path, f"its JSON is {len(text)} bytes, more than {METADATA_LIMIT} a state needs"
                )
            try:
                doc = json.loads(text)
            except ValueError as exc:
                raise _refuse(path, f"its JSON is corrupt ({exc})") from None
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
            step, config, train, groups, scalars = _document(path, doc)
            plan = _Expected.of(path, config, groups)
            plan.check(path, shapes)
            tensors = {name: f.get_tensor(name) for name in shapes}
    except SafetensorError as exc:
        raise _refuse(path, f"not a readable safetensors file ({exc})") from None
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
    optimizer_state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            index, key = name[len("optimizer.") :].split(".", 1)
            optimizer_state.setdefault(int(index), {})[key] = value
    for index, values in scalars.items():
        optimizer_state.setdefault(int(index), {}).update(values)
    return TrainState(
        model={k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")},
        optimizer={"state": optimizer_state, "param_groups": groups},
        rng=tensors["rng"],
        step=step,
        config=config,
        train=train,
    )


def _document(
    path: Path, doc: Any
) -> tuple[int, dict[str, Any], dict[str, Any], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    if not isinstance(doc, dict):
        raise _refuse(path, "its JSON is not an object")
    step, config, train = doc.get("step"), doc.get("config"), doc.get("train")
    groups, scalars = doc.get("param_groups"), doc.get("optimizer_scalars", {})
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise _refuse(path, f"its step is {step!r}, not a count of steps")
    if not isinstance(config, dict):
        raise _refuse(path, "it holds no drafter config")
    if not isinstance(train, dict):
        raise _refuse(path, "it holds no training settings")
    if not (isinstance(groups, list) and groups and all(isinstance(g, dict) for g in groups)):
        raise _refuse(path, "it holds no optimizer parameter groups")
    if not (
        isinstance(scalars, dict)
        and all(isinstance(k, str) and k.isdigit() and isinstance(v, dict) for k, v in scalars.items())
    ):
        raise _refuse(path, "its optimizer values are not per-parameter tables")
    return step, config, train, groups, scalars


class _Expected(Struct):
    """The tensors a state of this drafter holds: name -> shape (None: a scalar or the parameter's shape)."""

    params: dict[str, tuple[int, ...]]  # the drafter's parameters, by state_dict name
    order: list[str]  # optimizer parameter index -> parameter name
    rng_shape: tuple[int, ...]

    @classmethod
    def of(cls, path: Path, config: dict[str, Any], groups: list[dict[str, Any]]) -> _Expected:

        try:
            with torch.device("meta"):  # the drafter the config describes, without its memory
                drafter = build_drafter(config)
        except (ValueError, TypeError, KeyError) as exc:
            raise _refuse(path, f"its drafter config is not one this tool builds ({exc})") from None
        params = {name: tuple(t.shape) for name, t in drafter.state_dict().items()}
        by_id = [name for name, _ in drafter.named_parameters()]
        indices = [
            i for g in groups for i in (g.get("params") if isinstance(g.get("params"), list) else [None])
        ]
        if sorted(i for i in indices if isinstance(i, int)) != list(range(len(by_id))) or len(indices) != len(
            by_id
        ):
            raise _refuse(
                path, f"its optimizer groups list {len(indices)} parameters; the drafter has {len(by_id)}"
            )
        return cls(params=params, order=by_id, rng_shape=tuple(torch.Generator().get_state().shape))

    def check(self, path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
        """Every tensor named and shaped as this drafter's state has it, and no other."""
        expected: dict[str, tuple[int, ...] | None] = {f"model.{k}": v for k, v in self.params.items()}
        expected["rng"] = self.rng_shape
        wrong = []
        for name, shape in shapes.items():
            if name.startswith("optimizer."):
                index, _, key = name[len("optimizer.") :].partition(".")
                if not (index.isdigit() and int(index) < len(self.order) and key):
                    wrong.append(name)
                elif shape not in ((), self.params[self.order[int(index)]]):
                    wrong.append(f"{name} {list(shape)}")
            elif name not in expected:
                wrong.append(name)
            elif expected[name] != shape:
                wrong.append(f"{name} {list(shape)} (the drafter's is {list(expected[name] or ())})")
        missing = sorted(n for n in expected if n not in shapes)
        if wrong or missing:
            parts = (
                [
                    f"{len(wrong)} tensors that its drafter does not have in that shape (first: "
                    f"{', '.join(wrong[:3])})"
                ]
                if wrong
                else []
            ) + (
                [f"{len(missing)} of its drafter's tensors missing (first: {', '.join(missing[:3])})"]
                if missing
                else []
            )
            raise _refuse(path, "it holds " + "; ".join(parts))


def _read_legacy(path: Path) -> TrainState:
    """An earlier version's state.pt: a torch zip archive of plain data, read with the restricted unpickler."""
    fd = _open_regular(path)
    try:
        with os.fdopen(fd, "rb") as f:
            if not zipfile.is_zipfile(f):
                raise _refuse(path, "it is not a torch zip archive (random bytes, or a legacy pickle)")
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # the restricted unpickler's refusal (a code payload), a corrupt archive, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _refuse(path, f"torch.load(weights_only=True) refused it: {first}") from None
    if (
        not isinstance(raw, dict)
        or not {"model", "optimizer", "step", "rng", "config", "train"} <= raw.keys()
    ):
        raise _refuse(path, "it is not a dict with the model, optimizer, step, rng, config and train entries")
    model, optimizer, rng = raw["model"], raw["optimizer"], raw["rng"]
    if not (
        isinstance(model, dict)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items())
    ):
        raise _refuse(path, "its model entry is not a table of tensors")
    if not (
        isinstance(optimizer, dict)
        and isinstance(optimizer.get("state"), dict)
        and all(isinstance(k, int) and isinstance(v, dict) for k, v in optimizer["state"].items())
    ):
        raise _refuse(path, "its optimizer entry is not an optimizer state")
    if not isinstance(rng, torch.Tensor):
        raise _refuse(path, "its rng entry is not a tensor")
    step, config, train, groups, _ = _document(
        path,
        {
            "step": raw["step"],
            "config": raw["config"],
            "train": raw["train"],
            "param_groups": optimizer.get("param_groups"),
        },
    )
    shapes = {f"model.{k}": tuple(v.shape) for k, v in model.items()}
    shapes["rng"] = tuple(rng.shape)
    for index, values in optimizer["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                shapes[f"optimizer.{index}.{key}"] = tuple(value.shape)
    _Expected.of(path, config, groups).check(path, shapes)
    return TrainState(
        model=model,
        optimizer={"state": optimizer["state"], "param_groups": groups},
        rng=rng,
        step=step,
        config=config,
        train=train,
    )
