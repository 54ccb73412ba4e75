"""What SGLang and vLLM serve, as smoke --engine reads it: the endpoints, the request bodies and the
reply fields, named as the released code names them (tests/smoke/test_engine_wheel.py checks each name against
the wheels, so a rename in a new release fails a test rather than a user's run).

SGLang
- `GET /health` 200 once the server runs (503 while it starts);
- `GET /server_info` (`/get_server_info` before it was renamed): the resolved server arguments, flat, among them
  `speculative_algorithm`, `speculative_draft_model_path`, `speculative_num_draft_tokens` (the verify window: the
  block size for DFLASH), `model_path`, `context_length`, and the release's `version`;
- `POST /generate` with `input_ids` and `sampling_params` (whose unknown keys the release rejects): the reply's
  `output_ids`, `prompt_token_ids` (with `return_prompt_token_ids`) and `meta_info`, which with speculative
  decoding carries per request `spec_verify_ct` (verification steps), `spec_num_correct_drafts` (accepted drafted
  tokens, the bonus token excluded), `spec_correct_drafts_histogram` ([k]: steps that accepted k drafts),
  `spec_accept_length` (its completion_tokens / spec_verify_ct, the prefill token included) and `spec_accept_rate`.

vLLM
- `GET /health`; `GET /v1/models` (the served model's `id`, `root`, `max_model_len`); `GET /version`;
- `GET /metrics`: the Prometheus counters `vllm:spec_decode_num_drafts_total` (verification steps),
  `..._num_draft_tokens_total`, `..._num_accepted_tokens_total` and `..._num_accepted_tokens_per_pos_total` with
  label `position` ("0" .. n-1; [i]: steps that accepted drafts 1..i+1), each also labelled `model_name` and
  `engine` (summed here over data-parallel engines). They count every request: per-request figures are their
  deltas around one request at a time;
- `GET /server_info?config_format=json` only when the server runs with VLLM_SERVER_DEV_MODE=1: the whole
  `vllm_config`, whose `speculative_config` names the drafter (`model`, `method`, `num_speculative_tokens`);
- `POST /v1/completions` with a token-id `prompt` and `return_token_ids`: `choices[0].token_ids`,
  `prompt_token_ids`, `finish_reason`, `stop_reason`, and `usage.completion_tokens`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from lilicorr_ckpt.report.escape import printable
from lilicorr_ckpt.smoke.engine import consistency, prometheus
from lilicorr_ckpt.smoke.engine.transport import Client, EngineError, EngineRefused, EngineUnreachable

SERVER_INFO_LIMIT = 4 << 20
METRICS_LIMIT = 8 << 20
SMALL_LIMIT = 1 << 20
METRICS_SETTLE_S = 2.0  # how long per-request counters may lag the reply before the run gives up waiting
METRICS_POLL_S = 0.05
METRICS_QUIET_S = 0.5  # counters unchanged this long have settled
FINISH_CHARS = 40  # of a server's finish reason, in the report


def generate_limit(max_new_tokens: int) -> int:
    """The largest reply a generation of max_new_tokens may take: ids, their text, and the metadata."""
    return (1 << 20) + 256 * max_new_tokens


class Expectation(msgspec.Struct, frozen=True, kw_only=True):
    """What a server must serve for this run to measure this drafter."""

    drafter_names: tuple[str, ...]  # what the drafter may be called on the server (see checkpoint_names)
    served_drafter: str | None  # --served-drafter: the name the server gives it, when it differs
    block_size: int
    num_speculative_tokens: int
    launch: str  # the launch command, for the refusals


class ServerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The server as it described itself, and how far this run could check that it serves the drafter."""

    kind: str  # sglang | vllm
    url: str  # scheme://host:port[/prefix], never credentials
    version: str | None  # the release, as the server reports it
    served_target: str | None
    served_drafter: str | None  # None: the server does not say (vLLM without its dev-mode /server_info)
    method: str | None  # SGLang's speculative_algorithm, vLLM's speculative method
    num_speculative_tokens: int  # drafted tokens per verification step
    drafter_check: str  # what was checked, in one sentence
    max_model_len: int | None = None
    launch_command: str = ""


class Generation(msgspec.Struct, frozen=True, kw_only=True):
    """One request as the engine answered it. The acceptance fields are None where the engine gives no
    per-request figure (vLLM: filled from counter deltas, at concurrency 1 only)."""

    output_ids: list[int]
    completion_tokens: int
    finish: str  # stop | length | abort | other
    stop_token: int | None  # the token a stop matched, when the engine names it
    latency_s: float
    blocks: int | None = None  # verification steps
    accepted: int | None = None  # drafted tokens accepted, the bonus token excluded
    position_accepted: list[int] | None = None  # [j]: steps that accepted drafts 1..j+1
    reported: dict[str, float] = {}  # the engine's own per-request figures, as it reported them
    # the request's time as the engine itself timed it (SGLang meta_info e2e_latency, vLLM's
    # e2e_request_latency_seconds): arrival to finish inside the server, without the network; None: not reported
    engine_latency_s: float | None = None


def checkpoint_names(location: str) -> set[str]:
    """The names a checkpoint location may go by on another machine: the path as given, its last component and
    last two, and for a Hugging Face cache snapshot (.../models--org--name/snapshots/rev) the repo id."""
    text = location.strip().rstrip("/\\")
    parts = [p for p in text.replace("\\", "/").split("/") if p and p != "."]
    names = {text}
    if parts:
        names.add(parts[-1])
        names.add("/".join(parts[-2:]))
    for i, part in enumerate(parts):
        if part.startswith("models--") and part.count("--") >= 2:
            repo = part[len("models--") :].replace("--", "/", 1)
            names |= {repo, repo.rsplit("/", 1)[-1]}  # org/name, and name: a local copy's directory
            if i + 2 < len(parts) and parts[i + 1] == "snapshots":
                names.discard(parts[-1])  # a commit hash names nothing by itself
    return {n.casefold() for n in names if n}


def _drafter_matches(served: str, expect: Expectation) -> bool:
    if expect.served_drafter is not None:
        return served.strip().rstrip("/").casefold() == expect.served_drafter.strip().rstrip("/").casefold()
    return bool(checkpoint_names(served) & set(expect.drafter_names))


def _indented(command: str) -> str:
    """A multi-line command under a refusal's reason line."""
    return "".join(f"\n      {line}" for line in command.split("\n"))


def _not_this_drafter(kind: str, served: str, expect: Expectation) -> EngineRefused:
    return EngineRefused(
        f"the {kind} server serves another drafter: {printable(served)!r}",
        [
            f"this run measures {printable(expect.drafter_names[0])!r} (names it may go by: "
            f"{', '.join(sorted(printable(n) for n in expect.drafter_names))})",
            "if the server's copy is this checkpoint under another name, pass --served-drafter NAME",
            f"otherwise restart the server with this drafter:{_indented(expect.launch)}",
        ],
    )


def sampling(temperature: float) -> dict[str, float]:
    """The sampling parameters spelled out, so that no server default (a model's generation_config.json may set
    top_p, top_k or a repetition penalty) changes what the reference runtime does: temperature only."""
    return {
        "temperature": temperature,
        "top_p": 1.0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
    }


def _echo_check(client: Client, sent: Sequence[int], echoed: Sequence[int] | None) -> None:
    if echoed is not None and list(echoed) != list(sent):
        raise EngineError(
            f"{client.endpoint.url} decoded another prompt than it was sent ({len(echoed)} tokens back "
            f"for {len(sent)} sent): the server truncates or rewrites prompts, so its acceptance is "
            "not that of the probes"
        )


def _ids(values: Sequence[int], vocab: int, client: Client, what: str) -> list[int]:
    bad = [v for v in values if not 0 <= v < vocab]
    if bad:
        raise EngineError(
            f"{client.endpoint.url}: {what} holds token id {bad[0]}, outside the target's vocabulary "
            f"({vocab}): the server serves another model"
        )
    return list(values)


# ---- SGLang --------------------------------------------------------------------------------------------------


class SGLangServerInfo(msgspec.Struct, frozen=True):
    # UNSET (the key absent, not null): not SGLang's reply, which lists every server argument
    model_path: str | None | msgspec.UnsetType = msgspec.UNSET
    speculative_algorithm: str | None | msgspec.UnsetType = msgspec.UNSET
    speculative_draft_model_path: str | None = None
    speculative_num_draft_tokens: int | None = None
    context_length: int | None = None
    version: str | None = None


class SGLangFinish(msgspec.Struct, frozen=True):
    type: str | None = None
    matched: int | str | list[int] | None = None
    message: str | None = None


class SGLangMeta(msgspec.Struct, frozen=True):
    completion_tokens: int
    prompt_tokens: int | None = None
    finish_reason: SGLangFinish | None = None
    spec_verify_ct: int = 0
    spec_num_correct_drafts: int = 0
    spec_correct_drafts_histogram: list[int] | None = None
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None
    e2e_latency: float | None = None  # seconds, as the server timed the request
    num_retractions: int = 0  # times the request was evicted and re-prefilled (each re-prefill makes a token)


class SGLangReply(msgspec.Struct, frozen=True):
    meta_info: SGLangMeta
    output_ids: list[int] = []
    prompt_token_ids: list[int] | None = None


class SGLang:
    """An SGLang server: per-request acceptance in every reply, at any concurrency."""

    kind = "sglang"
    per_request_at_any_concurrency = True

    def __init__(self, client: Client, vocab: int) -> None:
        self.client = client
        self.vocab = vocab
        self.n = 0
        self.context_length: int | None = None

    def check(self, expect: Expectation) -> ServerRecord:
        c = self.client
        c.get("/health", SMALL_LIMIT)
        reply = c.get("/server_info", SERVER_INFO_LIMIT, accept=(200, 404))
        if reply.status == 404:  # the name before 0.5.x
            reply = c.get("/get_server_info", SERVER_INFO_LIMIT, accept=(200, 404))
        if reply.status == 404:
            raise EngineError(
                f"{c.endpoint.url} has no /server_info or /get_server_info: it is not an SGLang server "
                "(for vLLM use --engine vllm=URL)"
            )
        info = c.decode(reply, SGLangServerInfo, f"{c.where('/server_info')}")
        if info.model_path is msgspec.UNSET or info.speculative_algorithm is msgspec.UNSET:
            raise EngineError(
                f"{c.where('/server_info')} does not list SGLang's server arguments (model_path, "
                "speculative_algorithm): it is not an SGLang server (for vLLM use --engine vllm=URL)"
            )
        algorithm = info.speculative_algorithm
        if not algorithm:
            raise EngineRefused(
                "the SGLang server decodes without a drafter (its speculative_algorithm is unset)",
                [f"restart it with this drafter:{_indented(expect.launch)}"],
            )
        if algorithm.upper() != "DFLASH":
            raise EngineRefused(
                f"the SGLang server runs speculative algorithm {c.scrub(algorithm)!r}, not DFLASH "
                "(the algorithm that serves DFlash-family drafters)",
                [f"restart it with this drafter:{_indented(expect.launch)}"],
            )
        served = info.speculative_draft_model_path or ""
        if not _drafter_matches(served, expect):
            raise _not_this_drafter("SGLang", c.scrub(served) or "(none)", expect)
        window = info.speculative_num_draft_tokens
        if window != expect.block_size:
            raise EngineRefused(
                f"the SGLang server verifies {window} tokens per step (speculative_num_draft_tokens), "
                f"but this drafter's block is {expect.block_size}",
                [
                    "start it without --speculative-num-draft-tokens (DFLASH reads the block size from "
                    f"the drafter's config):{_indented(expect.launch)}"
                ],
            )
        self.n = window - 1
        self.context_length = info.context_length
        return ServerRecord(
            kind="sglang",
            url=c.endpoint.url,
            version=_text(c, info.version),
            served_target=_text(c, info.model_path or None),
            served_drafter=c.scrub(served),
            method=c.scrub(algorithm),
            num_speculative_tokens=self.n,
            drafter_check=(
                f"/server_info: speculative_algorithm {c.scrub(algorithm)}, draft model "
                f"{c.scrub(served)!r}, {window} tokens verified per step"
            ),
            max_model_len=info.context_length,
        )

    def body(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        temperature: float,
        seed: int,
        eos: Sequence[int],
        rid: str,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            **sampling(temperature),
            "top_k": -1,
            "stop_token_ids": list(eos),
            "ignore_eos": False,
            "no_stop_trim": True,
        }
        if temperature > 0:
            params["sampling_seed"] = seed
        return {
            "rid": rid,
            "input_ids": list(prompt),
            "sampling_params": params,
            "stream": False,
            "return_prompt_token_ids": True,
        }

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        temperature: float,
        seed: int,
        eos: Sequence[int],
        rid: str,
    ) -> Generation:
        c = self.client
        begin = time.perf_counter()
        reply = c.post_json(
            "/generate",
            self.body(prompt, max_new_tokens, temperature, seed, eos, rid),
            generate_limit(max_new_tokens),
        )
        latency = time.perf_counter() - begin
        answer: SGLangReply = c.decode(reply, SGLangReply, f"the reply of {c.where('/generate')}")
        _echo_check(c, prompt, answer.prompt_token_ids)
        meta = answer.meta_info
        finish = meta.finish_reason
        if finish is not None and finish.type == "abort":
            raise EngineError(
                f"{c.where('/generate')} aborted the request: {c.scrub(finish.message or 'no reason')}"
            )
        blocks, accepted = meta.spec_verify_ct, meta.spec_num_correct_drafts
        histogram = meta.spec_correct_drafts_histogram
        where = f"{c.where('/generate')} meta_info"
        consistency.sglang_request(
            where,
            n=self.n,
            max_new_tokens=max_new_tokens,
            completion_tokens=meta.completion_tokens,
            output_ids=len(answer.output_ids),
            blocks=blocks,
            accepted=accepted,
            histogram=histogram,
            retractions=meta.num_retractions,
            accept_length=meta.spec_accept_length,
            accept_rate=meta.spec_accept_rate,
        )
        consistency.latency(where, "e2e_latency", meta.e2e_latency)
        positions: list[int] | None = None
        if histogram and blocks:
            positions = [sum(histogram[k] for k in range(j + 1, len(histogram))) for j in range(self.n)]
        elif not blocks:
            positions = [0] * self.n
        matched = finish.matched if finish is not None and isinstance(finish.matched, int) else None
        if matched is not None:
            _ids([matched], self.vocab, c, "finish_reason.matched")
        reported = {
            k: float(v)
            for k, v in (
                ("spec_accept_length", meta.spec_accept_length),
                ("spec_accept_rate", meta.spec_accept_rate),
            )
            if v is not None
        }
        return Generation(
            output_ids=_ids(answer.output_ids, self.vocab, c, "output_ids"),
            completion_tokens=meta.completion_tokens,
            finish=c.scrub(finish.type or "other")[:FINISH_CHARS] if finish is not None else "other",
            stop_token=matched,
            latency_s=latency,
            blocks=blocks,
            accepted=accepted,
            position_accepted=positions,
            reported=reported,
            engine_latency_s=meta.e2e_latency,
        )


def _text(client: Client, value: str | None) -> str | None:
    return client.scrub(value) if value else None


# ---- vLLM ----------------------------------------------------------------------------------------------------

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
E2E_LATENCY = "vllm:e2e_request_latency_seconds"  # a histogram: its _sum and _count samples are read
POSITION_LABEL = "position"
COUNTER_SUFFIX = "_total"  # the Prometheus client's name for a counter's sample


class VLLMModel(msgspec.Struct, frozen=True):
    id: str
    root: str | None = None
    max_model_len: int | None = None


class VLLMModels(msgspec.Struct, frozen=True):
    data: list[VLLMModel]


class VLLMVersion(msgspec.Struct, frozen=True):
    version: str


class VLLMSpeculativeConfig(msgspec.Struct, frozen=True):
    model: str | None = None
    method: str | None = None
    num_speculative_tokens: int | None = None


class VLLMModelConfig(msgspec.Struct, frozen=True):
    model: str | None = None


class VLLMConfig(msgspec.Struct, frozen=True):
    model_config: VLLMModelConfig | None = None
    speculative_config: VLLMSpeculativeConfig | None = None


class VLLMServerInfo(msgspec.Struct, frozen=True):
    vllm_config: VLLMConfig


class VLLMChoice(msgspec.Struct, frozen=True):
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class VLLMUsage(msgspec.Struct, frozen=True):
    completion_tokens: int | None = None
    prompt_tokens: int | None = None


class VLLMCompletion(msgspec.Struct, frozen=True):
    choices: list[VLLMChoice]
    usage: VLLMUsage


class SpecCounters(msgspec.Struct, frozen=True):
    """vLLM's speculative-decoding counters at one moment, summed over its engines."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]
    # the e2e_request_latency_seconds histogram's sum and count (finished requests, as the server timed them);
    # None where the server exports no such histogram
    request_seconds: float | None = None
    requests_timed: int | None = None

    def minus(self, before: SpecCounters) -> SpecCounters:
        # the latency histogram's change, where both moments export it
        request_seconds: float | None = None
        requests_timed: int | None = None
        if self.request_seconds is not None and before.request_seconds is not None:
            request_seconds = self.request_seconds - before.request_seconds
            if self.requests_timed is not None and before.requests_timed is not None:
                requests_timed = self.requests_timed - before.requests_timed
        return SpecCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(a - b for a, b in zip(self.per_position, before.per_position, strict=True)),
            request_seconds=request_seconds,
            requests_timed=requests_timed,
        )


class VLLM:
    """A vLLM server: acceptance from its Prometheus counters, per request only one request at a time."""

    kind = "vllm"
    per_request_at_any_concurrency = False

    def __init__(self, client: Client, vocab: int) -> None:
        self.client = client
        self.vocab = vocab
        self.n = 0
        self.model_id = ""

    def check(self, expect: Expectation) -> ServerRecord:
        c = self.client
        c.get("/health", SMALL_LIMIT)
        models = c.decode(c.get("/v1/models", SERVER_INFO_LIMIT), VLLMModels, c.where("/v1/models"))
        if not models.data:
            raise EngineError(f"{c.where('/v1/models')} lists no model")
        base = models.data[0]  # the base model comes first; LoRA adapters follow it
        self.model_id = base.id
        version_reply = c.get("/version", SMALL_LIMIT, accept=(200, 404))
        version = (
            c.decode(version_reply, VLLMVersion, c.where("/version")).version
            if version_reply.status == 200
            else None
        )
        counters = self.counters()
        if counters is None:
            raise EngineRefused(
                "the vLLM server decodes without a drafter: its /metrics has no "
                f"{ACCEPTED_PER_POS}{COUNTER_SUFFIX} counters",
                [f"restart it with this drafter:{_indented(expect.launch)}"],
            )
        self.n = len(counters.per_position)
        if self.n != expect.num_speculative_tokens:
            raise EngineRefused(
                f"the vLLM server drafts {self.n} tokens per step (num_speculative_tokens), this run "
                f"measures {expect.num_speculative_tokens}",
                [
                    f"restart it with:{_indented(expect.launch)}",
                    "or pass --num-speculative-tokens to measure at the server's setting",
                ],
            )
        info_reply = c.get("/server_info?config_format=json", SERVER_INFO_LIMIT, accept=(200, 404))
        served_drafter = method = None
        if info_reply.status == 200:
            spec = c.decode(
                info_reply, VLLMServerInfo, c.where("/server_info")
            ).vllm_config.speculative_config
            if spec is None or not spec.model:
                raise EngineRefused(
                    "the vLLM server's /server_info shows no speculative_config",
                    [f"restart it with this drafter:{_indented(expect.launch)}"],
                )
            served_drafter, method = c.scrub(spec.model), c.scrub(spec.method or "")
            if (spec.method or "").lower() != "dflash":
                raise EngineRefused(
                    f"the vLLM server runs speculative method {method!r}, not dflash (the method that "
                    "serves DFlash-family drafters)",
                    [f"restart it with:{_indented(expect.launch)}"],
                )
            if not _drafter_matches(spec.model, expect):
                raise _not_this_drafter("vLLM", served_drafter, expect)
            check = (
                f"/server_info: speculative_config method {method}, model {served_drafter!r}; /metrics: "
                f"{self.n} draft positions"
            )
        else:
            check = (
                f"/metrics: speculative decoding with {self.n} draft positions; vLLM names its drafter only in "
                "/server_info (served with VLLM_SERVER_DEV_MODE=1), so the drafter's identity rests on the "
                "acceptance comparison"
            )
        return ServerRecord(
            kind="vllm",
            url=c.endpoint.url,
            version=_text(c, version),
            served_target=_text(c, base.root or base.id),
            served_drafter=served_drafter,
            method=method,
            num_speculative_tokens=self.n,
            drafter_check=check,
            max_model_len=base.max_model_len,
        )

    def counters(self) -> SpecCounters | None:
        """The counters now; None when the server exports none (it decodes without a drafter)."""
        c = self.client
        reply = c.get("/metrics", METRICS_LIMIT)
        names = {name + COUNTER_SUFFIX for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)}
        timing = {E2E_LATENCY + "_sum", E2E_LATENCY + "_count"}
        try:
            samples = prometheus.parse(reply.body.decode("utf-8", errors="replace"), names | timing)
            totals = dict.fromkeys(names, 0)
            per_pos: dict[int, int] = {}
            seconds: float | None = None
            timed: int | None = None
            for s in samples:
                if s.name == E2E_LATENCY + "_sum":
                    if not (math.isfinite(s.value) and s.value >= 0):
                        raise prometheus.ExpositionError(f"{s.name} is {s.value!r}, not a number of seconds")
                    seconds = (seconds or 0.0) + s.value
                    continue
                value = prometheus.count(s.value, s.name)
                if s.name == E2E_LATENCY + "_count":
                    timed = (timed or 0) + value
                elif s.name == ACCEPTED_PER_POS + COUNTER_SUFFIX:
                    position = s.labels.get(POSITION_LABEL, "")
                    if not position.isdigit() or int(position) > 4096:
                        raise prometheus.ExpositionError(f"{s.name} has position label {position[:20]!r}")
                    per_pos[int(position)] = per_pos.get(int(position), 0) + value
                else:
                    totals[s.name] += value
        except prometheus.ExpositionError as exc:
            raise EngineError(f"{c.where('/metrics')}: {c.scrub(str(exc))}") from None
        if not per_pos:
            return None
        if sorted(per_pos) != list(range(len(per_pos))):
            raise EngineError(
                f"{c.where('/metrics')}: {ACCEPTED_PER_POS} positions {sorted(per_pos)[:10]} are not 0..n-1"
            )
        return SpecCounters(
            totals[DRAFTS + COUNTER_SUFFIX],
            totals[DRAFT_TOKENS + COUNTER_SUFFIX],
            totals[ACCEPTED + COUNTER_SUFFIX],
            tuple(per_pos[i] for i in range(len(per_pos))),
            request_seconds=seconds if timed is not None else None,
            requests_timed=timed if seconds is not None else None,
        )

    def body(
        self, prompt: Sequence[int], max_new_tokens: int, temperature: float, seed: int, eos: Sequence[int]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model_id,
            "prompt": list(prompt),
            "max_tokens": max_new_tokens,
            **sampling(temperature),
            "top_k": 0,
            "n": 1,
            "stream": False,
            "stop_token_ids": list(eos),
            "ignore_eos": False,
            "return_token_ids": True,
        }
        if temperature > 0:
            body["seed"] = seed
        return body

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        temperature: float,
        seed: int,
        eos: Sequence[int],
        rid: str,
    ) -> Generation:
        c = self.client
        begin = time.perf_counter()
        reply = c.post_json(
            "/v1/completions",
            self.body(prompt, max_new_tokens, temperature, seed, eos),
            generate_limit(max_new_tokens),
        )
        latency = time.perf_counter() - begin
        answer: VLLMCompletion = c.decode(reply, VLLMCompletion, f"the reply of {c.where('/v1/completions')}")
        if not answer.choices:
            raise EngineError(f"{c.where('/v1/completions')} answered no choice")
        choice = answer.choices[0]
        if choice.token_ids is None:
            raise EngineError(
                f"{c.where('/v1/completions')} returned no token_ids although asked "
                "(return_token_ids): vLLM before 0.10 cannot be measured"
            )
        _echo_check(c, prompt, choice.prompt_token_ids)
        tokens = _ids(choice.token_ids, self.vocab, c, "token_ids")
        completion = (
            answer.usage.completion_tokens if answer.usage.completion_tokens is not None else len(tokens)
        )
        where = c.where("/v1/completions")
        consistency.generated(where, "usage.completion_tokens", completion, max_new_tokens)
        consistency.generated(where, "the number of token_ids", len(tokens), max_new_tokens)
        stop = choice.stop_reason if isinstance(choice.stop_reason, int) else None
        if stop is not None:
            _ids([stop], self.vocab, c, "stop_reason")
        return Generation(
            output_ids=tokens,
            completion_tokens=completion,
            finish=c.scrub(choice.finish_reason or "other")[:FINISH_CHARS],
            stop_token=stop,
            latency_s=latency,
        )

    def steady_counters(self) -> SpecCounters:
        """The counters once they have not moved for METRICS_QUIET_S (at most METRICS_SETTLE_S): what an earlier
        request (the warm-up) still adds must not land in the first measured one."""
        now = self._counters_or_fail()
        return self._quiet(now, lambda counters: False)

    def _counters_or_fail(self) -> SpecCounters:
        now = self.counters()
        if now is None:
            raise EngineError(
                f"{self.client.where('/metrics')} no longer exports the speculative-decoding counters"
            )
        return now

    def _quiet(self, now: SpecCounters, done: Any) -> SpecCounters:
        """Read again until done(counters) or they stay unchanged for METRICS_QUIET_S, within METRICS_SETTLE_S."""
        deadline = time.monotonic() + METRICS_SETTLE_S
        since = time.monotonic()
        while not done(now) and time.monotonic() < deadline and time.monotonic() - since < METRICS_QUIET_S:
            time.sleep(METRICS_POLL_S)
            later = self._counters_or_fail()
            if later != now:
                now, since = later, time.monotonic()
        return now

    def settled_delta(
        self, before: SpecCounters, generation: Generation, requests: int = 1
    ) -> tuple[SpecCounters, SpecCounters]:
        """(counters now, delta since `before`) for the request(s) just answered (`generation` stands for all of
        them: its completion_tokens - 1 is their tokens after the prefills'). The counters are updated as the
        server logs the step, which may come a moment after the reply: they are read again until they account for
        the tokens or stop moving (at most METRICS_SETTLE_S)."""
        c = self.client
        # every token after the prefill's came out of a counted step, or the counters stopped moving (a request may
        # have steps without drafts: the counters count drafted steps only)
        now = self._quiet(
            self._counters_or_fail(),
            lambda counters: (
                counters.drafts - before.drafts + counters.accepted - before.accepted
                >= generation.completion_tokens - 1
                and (
                    counters.requests_timed is None
                    or before.requests_timed is None
                    or counters.requests_timed - before.requests_timed >= requests
                )
            ),
        )
        delta = now.minus(before)
        if (
            min(delta.drafts, delta.draft_tokens, delta.accepted, *delta.per_position, 0) < 0
            or (delta.request_seconds or 0.0) < 0
            or (delta.requests_timed or 0) < 0
        ):
            raise EngineError(
                f"{c.where('/metrics')}: the speculative-decoding counters went down: the server "
                "restarted during the run"
            )
        consistency.vllm_counters(
            f"{c.where('/metrics')} (over {'the request' if requests == 1 else f'{requests} requests'})",
            n=self.n,
            drafts=delta.drafts,
            draft_tokens=delta.draft_tokens,
            accepted=delta.accepted,
            per_position=delta.per_position,
        )
        if delta.drafts == 0 and generation.completion_tokens > self.n + 2:
            raise EngineError(
                f"{c.where('/metrics')}: the speculative-decoding counters did not move during a request "
                f"of {generation.completion_tokens} tokens: the server keeps no statistics (started with "
                "--disable-log-stats?); restart it without that flag"
            )
        if delta.drafts + delta.accepted > generation.completion_tokens - 1 + 2 * (self.n + 1) * requests:
            raise EngineError(
                f"{c.where('/metrics')}: the counters moved by {delta.drafts} steps and {delta.accepted} "
                f"accepted tokens during a request of {generation.completion_tokens} tokens: another "
                "client is using the server, and per-request figures need it to themselves"
            )
        return now, delta


def with_counters(generation: Generation, delta: SpecCounters, requests: int = 1) -> Generation:
    """The generation with the acceptance and, when the histogram counted exactly these requests, the engine's own
    time (the sum of their latencies) read from the counters' delta around it."""
    timed = (
        delta.request_seconds
        if delta.requests_timed == requests and delta.request_seconds is not None
        else None
    )
    return msgspec.structs.replace(
        generation,
        blocks=delta.drafts,
        accepted=delta.accepted,
        position_accepted=list(delta.per_position),
        engine_latency_s=timed,
    )


def drafter_names(path: str) -> tuple[str, ...]:
    """The names a local drafter checkpoint may be served under (the path as given first, for messages)."""
    names = checkpoint_names(path)
    local = Path(path).expanduser()
    if local.exists():
        names |= checkpoint_names(str(local.resolve()))
    first = path.strip().rstrip("/").casefold()
    return (first, *sorted(names - {first}))


__all__ = [
    "SGLang",
    "VLLM",
    "EngineError",
    "EngineRefused",
    "EngineUnreachable",
    "Expectation",
    "Generation",
    "ServerRecord",
    "SpecCounters",
    "checkpoint_names",
    "drafter_names",
    "with_counters",
]
