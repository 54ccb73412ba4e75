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

import errno
import json
import math
import os
import stat
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import torch
from msgspec import Struct
from safetensors import SafetensorError, safe_open

from lilicorr_ckpt.checkpoint.readfile import file_kind, open_regular_file
from lilicorr_ckpt.checkpoint.stwrite import Entry, header_bytes, layout
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.outfile import atomic_writer

from .export import build_drafter

STATE = "state.safetensors"
LEGACY_STATE = "state.pt"  # written by earlier versions (torch.save)
FORMAT = "lilicorr-train-state"
FORMAT_VERSION = "1"
METADATA_LIMIT = 64 << 20  # bytes of JSON in the header: a config, settings and two parameter groups

# The training settings a run may have (`train`'s options take the same bounds): (type, least, most). A resumed
# state's are checked against them before anything is built, so a state cannot ask for a batch of 10^9
# sequences or a log every 0 steps.
SETTINGS: dict[str, tuple[type, float, float]] = {
    "steps": (int, 1, 10**9),
    "batch_size": (int, 1, 1024),
    "anchors": (int, 1, 1024),
    "max_length": (int, 2, 1 << 14),
    "lr_drafter": (float, 0.0, 1.0),
    "lr_head": (float, 0.0, 1.0),
    "weight_decay_head": (float, 0.0, 1.0),
    "warmup": (float, 0.0, 1.0),
    "clip": (float, 1e-6, 1e6),
    "seed": (int, 0, 2**63 - 1),
    "log_every": (int, 1, 10**9),
    "beta": (float, 1e-3, 1e4),
    "gamma": (float, 0.0, 1e4),
    "lam": (float, 0.0, 1e4),
}
# The drafter a run may train: a config's sizes, checked before a drafter is built from it (even on the meta
# device, 200k layers is minutes of Python objects; a width of 2^40 overflows torch's storage size).
CONFIG_LIMITS: dict[str, tuple[float, float]] = {
    "num_hidden_layers": (1, 64),
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 18),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "vocab_size": (1, 1 << 22),
    "max_position_embeddings": (1, 1 << 24),
    "block_size": (2, 16),
    "num_target_layers": (1, 1024),
}
HEAD_LIMITS: dict[str, tuple[float, float]] = {
    "mask_token_id": (0, (1 << 22) - 1),
    "lilicorr_candidate_topk": (1, 1024),
    "lilicorr_hidden_size": (1, 1 << 16),
    "lilicorr_num_layers": (1, 64),
    "lilicorr_num_heads": (1, 1024),
    "lilicorr_factor_dim": (1, 1 << 16),
    "lilicorr_mlp_ratio": (1e-3, 64),
}
MAX_TAPS = 64


class StateError(ValueError):
    """A state file that is not one this tool wrote (or can resume): the message names the file and why."""


class StateMisfit(StateError):
    """A state that reads, but a field of which does not fit (its optimizer's parameter groups, its mask token, its
    taps against the target: a hand-edited file, or a run of another target): refused, exit 1, the message naming
    the file and the field."""


# AdamW's hyperparameters in a state's parameter groups (those the optimizer reads on every step): (least, most)
GROUP_NUMBERS: dict[str, tuple[float, float]] = {
    "lr": SETTINGS["lr_drafter"][1:],
    "base_lr": SETTINGS["lr_drafter"][1:],
    "weight_decay": SETTINGS["weight_decay_head"][1:],
}
GROUP_OFF = ("amsgrad", "maximize", "capturable", "differentiable")  # this tool's AdamW runs with them off
GROUP_FLAGS = ("foreach", "fused", "decoupled_weight_decay")  # true, false or null


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


_SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float64: "F64",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def _write_safetensors(f: BinaryIO, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A safetensors file streamed to `f`, tensor by tensor (laid out as the safetensors library lays them out,
    never a copy of the whole state in memory)."""
    entries = layout(Entry(name, _SAFETENSORS_DTYPES[t.dtype], tuple(t.shape)) for name, t in tensors.items())
    f.write(header_bytes(entries, metadata))
    for entry in entries:
        tensor = tensors[entry.name]
        if tensor.numel():
            f.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))


def save_state(run_dir: Path, state: TrainState) -> Path:
    """Write RUN/state.safetensors through the atomic writer (an unpredictable temporary in RUN, never through a
    symlink, fsynced, renamed over it); a state.pt of an earlier version is removed once the new file is in
    place."""
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
    with atomic_writer(run_dir / STATE) as f:
        _write_safetensors(f, {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, metadata)
    legacy = run_dir / LEGACY_STATE
    if legacy.is_file() and not legacy.is_symlink():
        legacy.unlink()
    return run_dir / STATE


def check_log(path: Path) -> None:
    """The run's log, appended to by training: a FIFO or device there would block or never end, and a symlink
    would send the appends to wherever it points, so anything but a regular file (or nothing yet) is refused by
    name, before the target loads (open_log refuses the same once more when it opens it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise StateError(
            f"{path} is a symlink; the run's log is appended only to a regular file in the run's directory: "
            "remove the link (or move the file it points to there)"
        )
    kind = file_kind(st.st_mode)
    if kind is not None:
        raise StateError(
            f"{path} is {kind}, not a regular file; the run's log is appended to it: move it away"
        )


def open_log(path: Path) -> TextIO:
    """The run's log opened for appending: created if missing, never through a symlink (O_NOFOLLOW), without
    blocking on a FIFO (O_NONBLOCK), and refused unless what was opened is a regular file."""
    flags = (
        os.O_WRONLY
        | os.O_APPEND
        | os.O_CREAT
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_NOCTTY", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            check_log(path)  # names the symlink
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise StateError(
                f"{path} is a FIFO (named pipe), not a regular file; the run's log is appended to it: move it away"
            ) from None
        raise StateError(f"cannot append to {path}: {exc.strerror or exc}") from None
    kind = file_kind(os.fstat(fd).st_mode)
    if kind is not None:
        os.close(fd)
        raise StateError(
            f"{path} is {kind}, not a regular file; the run's log is appended to it: move it away"
        )
    return os.fdopen(fd, "a", encoding="utf-8")


def _refuse(path: Path, why: str) -> StateError:
    return StateError(f"{path} is not a training state this tool can resume: {why}")


def misfit(path: Path, why: str) -> StateMisfit:
    return StateMisfit(
        f"{path}: {why}; restore the state file training saved, or start a new run in another RUN"
    )


def _require_regular(path: Path) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
    kind = file_kind(st.st_mode)
    if kind is not None:
        raise _refuse(path, f"it is {kind}, not a regular file (never opened)")


def _open_regular(path: Path) -> BinaryIO:
    """`path` opened through the guarded reader: without blocking, and still a regular file once open (no FIFO
    swapped in meanwhile)."""
    try:
        return open_regular_file(path, what=str(path))
    except InputError as exc:
        raise StateError(str(exc)) from None


def _number(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, int)
    return isinstance(value, (int, float)) and math.isfinite(value)


def _bounded(value: Any, kind: type, low: float, high: float) -> bool:
    return _number(value, kind) and low <= value <= high


def _describe(kind: type, low: float, high: float) -> str:
    what = "an integer" if kind is int else "a number"
    return f"{what} from {low:g} to {high:g}"


def check_settings(path: Path, train: dict[str, Any]) -> None:
    """A state's training settings, each of the type and within the bounds `SETTINGS` gives (StateError naming
    the setting and the bound)."""
    for name, (kind, low, high) in SETTINGS.items():
        if name in train and not _bounded(train[name], kind, low, high):
            raise _refuse(
                path,
                f"its training setting {name} is {str(train[name])[:40]}; a run's {name} is "
                f"{_describe(kind, low, high)}",
            )


def check_param_groups(path: Path, groups: list[dict[str, Any]]) -> None:
    """AdamW's hyperparameters in each of a state's parameter groups, as this tool writes them (StateMisfit naming
    the group and the key otherwise): a hand-edited value (one beta, a base_lr of null) failed inside the
    optimizer."""
    for index, group in enumerate(groups):
        wrong = _group_fault(group)
        if wrong is not None:
            key, want = wrong
            has = f"has {key} {str(group[key])[:40]}" if key in group else f"has no {key}"
            raise misfit(path, f"its optimizer's parameter group {index} {has}; {want}")


def _group_fault(group: dict[str, Any]) -> tuple[str, str] | None:
    """(the key, what it should be) of a parameter group's first wrong hyperparameter, or None."""
    for key, (low, high) in GROUP_NUMBERS.items():
        if not _bounded(group.get(key), float, low, high):
            return key, f"a group's {key} is {_describe(float, low, high)}"
    if not (_number(group.get("eps"), float) and 0 < group["eps"] <= 1):
        return "eps", "AdamW's eps is a number above 0, at most 1"
    betas = group.get("betas")
    if not (
        isinstance(betas, list | tuple)
        and len(betas) == 2
        and all(_bounded(b, float, 0.0, 1.0) and b < 1 for b in betas)
    ):
        return "betas", "AdamW takes two betas, each a number from 0 to below 1"
    for key in GROUP_OFF:
        if key in group and group[key] is not False:
            return key, f"this tool's AdamW runs with {key} false"
    for key in GROUP_FLAGS:
        if key in group and not (group[key] is None or isinstance(group[key], bool)):
            return key, f"AdamW's {key} is true, false or null"
    return None


def check_config_bounds(path: Path, config: dict[str, Any]) -> None:
    """A state's drafter config, its sizes within `CONFIG_LIMITS` and `HEAD_LIMITS`, before a drafter is built from
    it (StateError naming the key and the bound). Missing keys and other types are the config parser's to judge."""
    head = config.get("dflash_config")
    head = head if isinstance(head, dict) else {}
    checks = [(name, config, bound) for name, bound in CONFIG_LIMITS.items()]
    checks += [(name, head, bound) for name, bound in HEAD_LIMITS.items()]
    for name, table, (low, high) in checks:
        if name not in table or table[name] is None:
            continue
        kind = float if name == "lilicorr_mlp_ratio" else int
        if not _bounded(table[name], kind, low, high):
            where = f"dflash_config.{name}" if table is head else name
            raise _refuse(
                path,
                f"its drafter config's {where} is {str(table[name])[:40]}; this tool trains drafters whose "
                f"{where} is {_describe(kind, low, high)}",
            )
    taps = head.get("target_layer_ids")
    if isinstance(taps, list) and not (
        1 <= len(taps) <= MAX_TAPS
        and all(_bounded(t, int, 0, CONFIG_LIMITS["num_target_layers"][1]) for t in taps)
    ):
        raise _refuse(
            path,
            f"its drafter config's dflash_config.target_layer_ids lists {len(taps)} layers; this tool trains "
            f"drafters with 1 to {MAX_TAPS} taps, each a target layer from 0 to "
            f"{CONFIG_LIMITS['num_target_layers'][1]:g}",
        )


def check_mask_token(path: Path, config: dict[str, Any]) -> None:
    """The drafter config's mask token inside its vocabulary (StateMisfit otherwise: the embedding lookup of the
    block's mask failed as an internal error)."""
    head = config.get("dflash_config")
    mask = head.get("mask_token_id") if isinstance(head, dict) else None
    vocab = config.get("vocab_size")
    if _number(mask, int) and _number(vocab, int) and mask >= vocab:
        raise misfit(
            path,
            f"its drafter config's dflash_config.mask_token_id is {mask}, past its vocabulary of {vocab} ids "
            f"(vocab_size): the block's mask must be a token id from 0 to {vocab - 1}",
        )


def check_taps(path: Path, config: dict[str, Any], target_layers: Any = None) -> None:
    """The drafter config's taps inside its target's layers: `target_layers` (the loaded target's, on a resume) or
    the config's own num_target_layers (StateMisfit otherwise: the target's pass gives such a tap no layer's
    features, and `lilicorr-ckpt convert` refuses the export, LC113). Without either, nothing to check."""
    head = config.get("dflash_config")
    taps = head.get("target_layer_ids") if isinstance(head, dict) else None
    layers = config.get("num_target_layers") if target_layers is None else target_layers
    if not (isinstance(taps, list) and _number(layers, int)):
        return
    past = [t for t in taps if _number(t, int) and t >= layers]
    if past:
        raise misfit(
            path,
            f"its drafter taps target layers {taps}, and {past} are not layers of its target ({layers} layers, "
            f"0 to {layers - 1}): `lilicorr-ckpt convert` would refuse its export (LC113)",
        )


def read_state(path: Path) -> TrainState:
    """The state in `path` (state.safetensors, or an earlier version's state.pt), its structure checked; the
    tensors' shapes are checked against the drafter by `check_shapes` before any is used."""
    _require_regular(path)
    if path.name == LEGACY_STATE:
        return _read_legacy(path)
    return _read_safetensors(path)


def _read_safetensors(path: Path) -> TrainState:
    _open_regular(path).close()
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
    check_settings(path, train)
    check_config_bounds(path, config)
    if not (isinstance(groups, list) and groups and all(isinstance(g, dict) for g in groups)):
        raise _refuse(path, "it holds no optimizer parameter groups")
    check_param_groups(path, groups)
    check_mask_token(path, config)
    check_taps(path, config)
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
        except (ValueError, TypeError, KeyError, ArithmeticError, RuntimeError, AssertionError) as exc:
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise _refuse(path, f"its drafter config is not one this tool builds ({why})") from None
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
    try:
        with _open_regular(path) as f:
            if not zipfile.is_zipfile(f):
                raise _refuse(path, "it is not a torch zip archive (random bytes, or a legacy pickle)")
            size = os.fstat(f.fileno()).st_size
            try:
                with zipfile.ZipFile(f) as archive:
                    members = archive.infolist()
            except (zipfile.BadZipFile, ValueError, EOFError) as exc:
                raise _refuse(path, f"it is a corrupt zip archive ({exc})") from None
            for info in members:  # torch.save stores every member: nothing in a state inflates
                if info.compress_type != zipfile.ZIP_STORED or info.header_offset + info.file_size > size:
                    raise _refuse(
                        path,
                        f"its member {info.filename[:80]!r} is compressed or claims more bytes than the file "
                        "holds (torch.save stores every member as it is)",
                    )
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
