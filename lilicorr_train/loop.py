"""The training loop: batches of target-generated sequences, the target's taps computed on the fly, AdamW with
a cosine schedule, and a state file that lets a run stop at a time budget and resume where it left off."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
from msgspec import Struct, structs

from lilicorr_ckpt.checkpoint import load_checkpoint
from lilicorr_ckpt.errors import UsageError
from lilicorr_runtime.model.drafter import Drafter
from lilicorr_runtime.model.load import CheckpointRefused
from lilicorr_runtime.model.load import build_drafter as build_runtime_drafter
from lilicorr_runtime.target.fast import FastTarget

from .data import Dataset
from .export import build_drafter
from .objective import LossWeights, TrainBatch, sample_anchors, training_step
from .state import StateError, TrainState, check_taps, open_log, read_state, save_state, state_path

STATE_NAMES = "state.safetensors, or an earlier version's state.pt"
PLAN_FROM, PLAN_TO = 4, 14  # the steps timed to plan a run's length
LOG = "log.jsonl"


class TrainConfig(Struct, frozen=True, kw_only=True):
    steps: int = 4000
    batch_size: int = 16  # sequences per step
    anchors: int = 48  # blocks per sequence
    max_length: int = 640  # tokens per sequence (longer ones are cut)
    lr_drafter: float = 6e-4
    lr_head: float = 3e-4
    weight_decay_head: float = 0.01
    warmup: float = 0.04  # share of the steps
    clip: float = 1.0
    seed: int = 0
    log_every: int = 25
    beta: float = 7.0
    gamma: float = 0.25
    lam: float = 1.0


LAYER_NAME = re.compile(r"layers\.(\d+)\.(.+)")
OUTPUT_PROJECTIONS = ("self_attn.o_proj.", "mlp.down_proj.")  # a layer's two residual branches' outputs
HEAD_PREFIX = "lilicorr."  # the LiLiCorr head's tensors in a drafter's state dict


def init_from_checkpoint(drafter: Drafter, path: Path, fresh_head: bool = False) -> None:
    """Copy a drafter checkpoint's weights into `drafter`; every tensor must match by name and shape, except
    that `drafter` may have more draft layers than the checkpoint (a deeper drafter grown from a trained one):
    each extra layer starts as a copy of the checkpoint's last layer with its two output projections (o_proj,
    down_proj) zeroed, so the deeper drafter computes exactly what the checkpoint computes until training opens
    the new layers' residual branches. With `fresh_head` only the backbone is copied: `drafter`'s LiLiCorr head
    keeps its own initialization, whatever its shape (K, width, layers) and whether or not the checkpoint has a
    head (to compare head shapes on one trained backbone)."""
    try:
        trained = build_runtime_drafter(load_checkpoint(str(path)), dtype=torch.float32, device="cpu")
    except (CheckpointRefused, KeyError, RuntimeError) as exc:  # its config and its weights disagree
        first = (str(exc).strip("'\"").splitlines() or [type(exc).__name__])[0][:300]
        if isinstance(exc, KeyError):
            first = f"its weights lack {first}"
        raise ValueError(f"{path} is not a drafter this run can start from ({first})") from None
    if tuple(trained.target_layer_ids) != tuple(drafter.target_layer_ids):  # fc reads the taps in their order
        raise ValueError(
            f"{path} was trained on target layers {list(trained.target_layer_ids)}, this run taps "
            f"{list(drafter.target_layer_ids)}: its fc projection would read other layers than it learned "
            f"(leave --taps out to take its layers)"
        )
    ours, theirs = drafter.state_dict(), dict(trained.state_dict())
    if fresh_head:
        theirs = {k: v for k, v in theirs.items() if not k.startswith(HEAD_PREFIX)}
        theirs.update({k: v for k, v in ours.items() if k.startswith(HEAD_PREFIX)})
    have = len(trained.layers)
    if len(drafter.layers) > have > 0:
        for name in ours:
            match = LAYER_NAME.fullmatch(name)
            if match is None or int(match.group(1)) < have:
                continue
            source = theirs.get(f"layers.{have - 1}.{match.group(2)}")
            if source is not None:
                theirs[name] = (
                    torch.zeros_like(source) if match.group(2).startswith(OUTPUT_PROJECTIONS) else source
                )
    mismatched = sorted(
        k
        for k in ours.keys() | theirs.keys()
        if k not in ours or k not in theirs or ours[k].shape != theirs[k].shape
    )
    if mismatched:
        raise ValueError(
            f"{path} is not a drafter of this shape: {len(mismatched)} tensors differ "
            f"(first: {', '.join(mismatched[:4])})"
        )
    drafter.load_state_dict(theirs)


def checkpoint_taps(path: Path, target_layers: int) -> tuple[int, ...]:
    """The target layers the drafter checkpoint at `path` reads (its config's target_layer_ids): a run started
    from it taps the same ones unless told otherwise. ValueError when it names none, or a layer past the
    target's `target_layers` (a drafter of a deeper target: that tap's features would be written by no layer)."""
    taps = load_checkpoint(str(path)).geometry.target_layer_ids
    if not taps:
        raise ValueError("its config names no target_layer_ids")
    past = [t for t in taps if not 0 <= t < target_layers]
    if past:
        raise ValueError(
            f"it was trained on target layers {list(taps)}, and {past} are not layers of this target "
            f"(0 to {target_layers - 1}): a drafter of another target?"
        )
    return tuple(taps)


def init_from_target(drafter: Drafter, target: FastTarget, layer: int) -> None:
    """Start the draft layers from one target layer's attention and MLP (same shapes), and fc from the mean of
    the taps: a warm start that keeps the per-tap statistics the context rows see."""
    hf_layers = target.model.model.layers
    source = hf_layers[layer]
    with torch.no_grad():
        for draft_layer in drafter.layers:
            pairs = [
                (draft_layer.self_attn.q_proj, source.self_attn.q_proj),
                (draft_layer.self_attn.k_proj, source.self_attn.k_proj),
                (draft_layer.self_attn.v_proj, source.self_attn.v_proj),
                (draft_layer.self_attn.o_proj, source.self_attn.o_proj),
                (draft_layer.mlp.gate_proj, source.mlp.gate_proj),
                (draft_layer.mlp.up_proj, source.mlp.up_proj),
                (draft_layer.mlp.down_proj, source.mlp.down_proj),
                (draft_layer.input_layernorm, source.input_layernorm),
                (draft_layer.post_attention_layernorm, source.post_attention_layernorm),
            ]
            for mine, theirs in pairs:
                if mine.weight.shape == theirs.weight.shape:
                    mine.weight.copy_(theirs.weight.float())
        m = drafter.geometry.hidden_size
        taps = len(drafter.target_layer_ids)
        eye = torch.eye(m) / taps
        drafter.fc.weight.copy_(
            torch.cat([eye] * taps, dim=1) + 0.01 * torch.randn(m, m * taps) / math.sqrt(m)
        )
    if drafter.lilicorr is not None:
        drafter.lilicorr.invalidate_derived()


def _optimizer(drafter: Drafter, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    head = [p for n, p in drafter.named_parameters() if n.startswith("lilicorr.")]
    backbone = [p for n, p in drafter.named_parameters() if not n.startswith("lilicorr.")]
    groups = [
        {"params": backbone, "lr": cfg.lr_drafter, "weight_decay": 0.0, "base_lr": cfg.lr_drafter},
        {"params": head, "lr": cfg.lr_head, "weight_decay": cfg.weight_decay_head, "base_lr": cfg.lr_head},
    ]
    return torch.optim.AdamW(groups, betas=(0.9, 0.95), fused=device.type == "cuda")


def _schedule(step: int, cfg: TrainConfig) -> float:
    warm = max(1, int(cfg.warmup * cfg.steps))
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, cfg.steps - warm)
    return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


POOL = 16  # batches drawn together and cut by length (batch_rows)


def batch_rows(lengths: np.ndarray, step: int, batch_size: int, seed: int) -> np.ndarray:
    """The sequences of training step `step`, drawn uniformly with replacement as before, but the batches of
    POOL steps together: one pool of POOL x batch_size draws, sorted by length, cut into POOL batches of
    similar length and handed out in an order drawn with them. Each sequence is drawn as often as before; a
    batch is padded to its longest sequence, so a batch of similar lengths pads little (the target's pass and
    the drafter's context run over the padding: on the v3 data, random batches were 1.53 times as wide as their
    mean sequence, pooled ones 1.06). Seeded per pool, so a resumed run draws the same batches."""
    pool, within = divmod(step, POOL)
    rng = np.random.default_rng([seed, pool])
    rows = rng.integers(0, len(lengths), POOL * batch_size)
    rows = rows[np.argsort(lengths[rows], kind="stable")]
    start = int(rng.permutation(POOL)[within]) * batch_size
    return rows[start : start + batch_size]


def _batch(
    dataset: Dataset, rows: np.ndarray, cfg: TrainConfig, generator: torch.Generator, device: torch.device
) -> TrainBatch:
    seqs = [dataset.sequence(int(i))[: cfg.max_length].astype(np.int64) for i in rows]
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    for r, s in enumerate(seqs):
        tokens[r, : len(s)] = torch.from_numpy(s)
    lengths = torch.tensor([len(s) for s in seqs])
    prompts = torch.from_numpy(dataset.prompt_lengths[rows].astype(np.int64))
    anchors, valid = sample_anchors(lengths, prompts, cfg.anchors, generator)
    return TrainBatch(tokens.to(device), lengths.to(device), anchors.to(device), valid.to(device))


@torch.no_grad()
def target_pass(
    target: FastTarget, tokens: torch.Tensor, taps: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target over right-padded tokens [b, L]: (final-normed hidden [b, L, M], taps [b, L, T·M])."""
    b, length = tokens.shape
    cache = target.core.new_cache(b, length)
    zero = torch.zeros((), dtype=torch.long, device=tokens.device)
    return target.core.forward(
        cache, target.embed_tokens(tokens), zero, torch.zeros(b, dtype=torch.long, device=tokens.device), taps
    )


class Run(Struct):
    drafter: Drafter
    config: dict[str, Any]  # the drafter's config.json
    train: TrainConfig
    step: int
    optimizer: torch.optim.AdamW
    generator: torch.Generator


def mask_token_in(run: Run, tokens: Any) -> int | None:
    """The run's mask token when the data holds it (a resumed run with new data: the block's mask would then be
    a token the drafter also reads as text), else None."""
    mask = (run.config.get("dflash_config") or {}).get("mask_token_id")
    if isinstance(mask, int) and bool((tokens == mask).any()):
        return mask
    return None


def open_run(
    run_dir: Path,
    drafter_config: dict[str, Any] | None,
    train: TrainConfig,
    target: FastTarget,
    init_layer: int | None,
    steps: int | None = None,
    *,
    init_from: Path | None = None,
    fresh_head: bool = False,
    state: TrainState | None = None,
) -> Run:
    """Resume the run in `run_dir` (its own settings, `steps` extending or shortening it), or start one with
    `train` (drafter_config required then), from the target's layer `init_layer` or from the weights of the
    drafter checkpoint `init_from` (which must have the shape drafter_config gives, or fewer draft layers:
    init_from_checkpoint grows the rest; with `fresh_head` its backbone alone, the head starting afresh).
    `state`: the run's state, already read with read_state (it is read here otherwise)."""
    device = target.device
    found = state_path(run_dir)
    if found is not None:
        return _resume(found, state if state is not None else read_state(found), train, target, steps)
    if drafter_config is None:
        raise ValueError(f"{run_dir} holds no run to resume; give a drafter config to start one")
    if steps is not None:
        train = structs.replace(train, steps=steps)
    torch.manual_seed(train.seed)
    drafter = build_drafter(drafter_config)
    if init_from is not None:
        init_from_checkpoint(drafter, init_from, fresh_head)
    elif init_layer is not None:
        init_from_target(drafter, target, init_layer)
    drafter.to(device)
    return Run(
        drafter,
        drafter_config,
        train,
        0,
        _optimizer(drafter, train, device),
        torch.Generator().manual_seed(train.seed),
    )


def _resume(path: Path, state: TrainState, train: TrainConfig, target: FastTarget, steps: int | None) -> Run:
    """The run a checked state holds (read_state checked its tensors' names and shapes against its own drafter
    config); whatever else does not fit is a StateError naming the file."""

    def refuse(why: str) -> StateError:
        return StateError(f"{path} is not a training state this tool can resume: {why}")

    try:
        train = msgspec.convert(state.train, TrainConfig)
    except msgspec.ValidationError as exc:
        raise refuse(f"its training settings are invalid ({exc})") from None
    if steps is not None:
        train = structs.replace(train, steps=steps)
    trained_for = {
        "hidden size": (state.config.get("hidden_size"), target.hidden_size),
        "vocabulary": (state.config.get("vocab_size"), target.vocab_size),
        "layers": (state.config.get("num_target_layers", target.num_layers), target.num_layers),
    }
    differ = [
        f"{what} {run} (this --target: {given})" for what, (run, given) in trained_for.items() if run != given
    ]
    if differ:
        raise StateError(
            f"{path.parent} was trained for another target: its target's {', '.join(differ)}; resume it with "
            "the target it started with"
        )
    check_taps(path, state.config, target.num_layers)  # a config without num_target_layers: the target's
    drafter = build_drafter(state.config)
    try:
        drafter.load_state_dict(state.model)
    except RuntimeError as exc:
        raise refuse(f"its weights do not load into its drafter ({str(exc).splitlines()[0]})") from None
    drafter.to(target.device)
    optimizer = _optimizer(drafter, train, target.device)
    for group in state.optimizer["param_groups"]:
        if isinstance(group.get("betas"), list):  # JSON has no tuples
            group["betas"] = tuple(group["betas"])
    try:
        optimizer.load_state_dict(state.optimizer)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise refuse(f"its optimizer state does not fit the drafter ({exc})") from None
    generator = torch.Generator().manual_seed(train.seed)
    try:
        generator.set_state(state.rng)
    except (RuntimeError, TypeError) as exc:
        raise refuse(f"its random state is not a generator's ({str(exc).splitlines()[0]})") from None
    return Run(drafter, state.config, train, state.step, optimizer, generator)


def kept_options(state: TrainState) -> dict[str, Any]:
    """What a resumed run keeps of its start, by the option that sets it on a new run (`train`'s and `pieces
    fit`'s names): its drafter's shape and its training settings."""
    head = state.config.get("dflash_config")
    head = head if isinstance(head, dict) else {}
    return {
        "--taps": head.get("target_layer_ids"),
        "--mask-token-id": head.get("mask_token_id"),
        "--layers": state.config.get("num_hidden_layers"),
        "--block-size": state.config.get("block_size"),
        "--k": head.get("lilicorr_candidate_topk"),
        "--head-width": head.get("lilicorr_hidden_size"),
        "--head-layers": head.get("lilicorr_num_layers"),
        "--batch-size": state.train.get("batch_size"),
        "--anchors": state.train.get("anchors"),
        "--lr-drafter": state.train.get("lr_drafter"),
        "--lr-head": state.train.get("lr_head"),
    }


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return "" if value is True else str(value)  # a flag (--fresh-head) is its name alone


def _same(given: Any, kept: Any) -> bool:
    if isinstance(given, list | tuple) and isinstance(kept, list | tuple):
        return tuple(given) == tuple(kept)
    return type(given) is not bool and given == kept


def resume_options(run_dir: Path, state: TrainState, given: dict[str, Any]) -> str | None:
    """The new-run options given on the command line (option -> value) when `run_dir` holds a run to resume, by
    one rule: the run keeps its drafter and settings (only --steps changes it). An option whose value the run
    keeps (`kept_options`) must give that value: the same command then resumes the run, and the option is named
    as ignored in the returned warning; another value asks for another run, a UsageError (exit 4) naming each
    such option, its value and the run's. An option that only says how a new run starts (--init-layer,
    --init-from, --fresh-head, --plan-seconds) has nothing to differ from: named as ignored. None: none given."""
    kept = kept_options(state)
    differ, ignored = [], []
    for option, value in given.items():
        shown = f"{option} {_shown(value)}".rstrip()
        if option not in kept:
            ignored.append(f"{shown} (a new run's start only)")
        elif _same(value, kept[option]):
            ignored.append(f"{shown} (the run's own)")
        else:
            differ.append(f"{shown} (the run's: {_shown(kept[option])})")
    if differ:
        raise UsageError(
            f"{run_dir} holds a run, which resumes with its own drafter and settings, and {', '.join(differ)} "
            "would change them: leave them out (or give the run's values) to resume it, or give another RUN to "
            "start a new run with them"
        )
    if not ignored:
        return None
    return f"{run_dir} resumes at step {state.step} with its own drafter and settings; ignored: {', '.join(ignored)}"


def save_run(run: Run, run_dir: Path) -> Path:
    return save_state(
        run_dir,
        TrainState(
            model=run.drafter.state_dict(),
            optimizer=run.optimizer.state_dict(),
            rng=run.generator.get_state(),
            step=run.step,
            config=run.config,
            train=structs.asdict(run.train),
        ),
    )


def load_run_drafter(run_dir: Path) -> tuple[Drafter, dict[str, Any], int]:
    """(the drafter, its config, the step) of the run in `run_dir`, for export."""
    found = state_path(run_dir)
    if found is None:
        raise StateError(f"{run_dir} holds no training run (no {STATE_NAMES})")
    state = read_state(found)
    drafter = build_drafter(state.config)
    try:
        drafter.load_state_dict(state.model)
    except RuntimeError as exc:
        raise StateError(
            f"{found} is not a training state this tool can resume: its weights do not load into its "
            f"drafter ({str(exc).splitlines()[0]})"
        ) from None
    return drafter, state.config, state.step


def fit(
    run: Run,
    run_dir: Path,
    target: FastTarget,
    dataset: Dataset,
    *,
    time_budget_s: float = float("inf"),
    save_every_s: float = 120.0,
    plan_seconds: float | None = None,
    log: Callable[[dict[str, Any]], None] | None = None,
) -> bool:
    """Train until the run's last step or the time budget; saves the state at the end and every
    `save_every_s`. Returns True when the run is finished. plan_seconds (a new run only): time steps 4..13
    and set the run's total steps to what fits in that many seconds of training, so the schedule's cosine
    ends when the planned device time does."""
    cfg, drafter, device = run.train, run.drafter, target.device
    weights = LossWeights(beta=cfg.beta, gamma=cfg.gamma, lam=cfg.lam)
    embed_w = target.embed_tokens.weight.detach()
    head_w = target.lm_head.weight.detach()
    taps = drafter.target_layer_ids
    lengths = np.minimum(dataset.lengths(), cfg.max_length)
    started = last_save = time.monotonic()
    drafter.train()
    totals: dict[str, float] = {}
    seen = 0
    plan_start = 0.0
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    with open_log(run_dir / LOG) as log_file:
        while run.step < cfg.steps:
            if time.monotonic() - started > time_budget_s:
                break
            scale = _schedule(run.step, cfg)
            for group in run.optimizer.param_groups:
                group["lr"] = group["base_lr"] * scale
            rows = batch_rows(lengths, run.step, cfg.batch_size, cfg.seed)
            batch = _batch(dataset, rows, cfg, run.generator, device)
            hidden, features = target_pass(target, batch.tokens, taps)
            with autocast:
                out = training_step(drafter, embed_w, head_w, features, hidden, batch, weights)
            run.optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.clip)
            run.optimizer.step()
            run.step += 1
            if plan_seconds is not None and run.step in (PLAN_FROM, PLAN_TO):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if run.step == PLAN_FROM:
                    plan_start = time.monotonic()
                else:
                    rate = (PLAN_TO - PLAN_FROM) / (time.monotonic() - plan_start)
                    run.train = cfg = structs.replace(cfg, steps=max(PLAN_TO + 1, int(rate * plan_seconds)))
                    if log is not None:
                        log({"planned_steps": cfg.steps, "steps_per_s": round(rate, 3)})
            for key, value in out.metrics.items():
                totals[key] = totals.get(key, 0.0) + value
            seen += 1
            if run.step % cfg.log_every == 0 or run.step == cfg.steps:
                record = {
                    "step": run.step,
                    "lr_scale": round(scale, 4),
                    "grad_norm": round(float(norm), 4),
                    "elapsed_s": round(time.monotonic() - started, 1),
                    **{k: round(v / seen, 4) for k, v in totals.items()},
                }
                log_file.write(json.dumps(record) + "\n")
                log_file.flush()
                if log is not None:
                    log(record)
                totals, seen = {}, 0
            if time.monotonic() - last_save > save_every_s:
                save_run(run, run_dir)
                last_save = time.monotonic()
    drafter.eval()
    if drafter.lilicorr is not None:
        drafter.lilicorr.invalidate_derived()
    save_run(run, run_dir)
    return run.step >= cfg.steps
