"""Loopback stand-ins for SGLang and vLLM servers (the newest release of each that lilicorr_ckpt.runtimes lists), in
the test process (a thread each, 127.0.0.1, an ephemeral port), answering with exactly the endpoints and fields the
released code defines. The version each reports is RELEASES[engine][-1].version, so a release bump needs no edit
here.

Every name below is written here as the released source writes it, independently of lilicorr_ckpt's client;
test_engine_wheel.py parses the wheels and checks each of these names (routes, request and reply fields, metric
and label names) against them, so a rename in a new release fails that test, and the end-to-end tests fail when
the client reads a name the servers do not send.

What they decode is a `FakeModel`: a continuation per prompt (the reference's greedy tokens, when the test gives
them) and an acceptance schedule per verification step, which the test knows and checks the report against.

Misbehaving modes (ServerState), for the hostile-server tests: `framing` "close" (HTTP/1.1, no Content-Length, the
body ends when the connection closes) or "http10" (an HTTP/1.0 reply, likewise); `header_drip_s` (the status line
and headers sent one byte per that many seconds); `busy` (the first requests answered 503 with each Retry-After
value in turn); `rewrite` (SGLang's /generate and vLLM's /v1/completions reply dict, rewritten before it is sent);
and VLLMState's `miscount` (the counters a request adds, rewritten before they are added)."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lilicorr_ckpt.runtimes import RELEASES

SGLANG_VERSION = RELEASES["sglang"][-1].version
VLLM_VERSION = RELEASES["vllm"][-1].version

# --- SGLang (SGLANG_VERSION) -----------------------------------------------------------------------------------
# srt/entrypoints/http_server.py routes
SGLANG_ROUTES = {
    ("GET", "/health"),
    ("GET", "/health_generate"),
    ("GET", "/server_info"),
    ("GET", "/get_server_info"),
    ("GET", "/model_info"),
    ("POST", "/generate"),
}
# api/v1/api_types.py SamplingParams ("unknown keys rejected")
SGLANG_SAMPLING_FIELDS = {
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
}
# api/v1/api_types.py GenerateRequest: the fields these servers read
SGLANG_GENERATE_FIELDS = {"rid", "input_ids", "sampling_params", "stream", "return_prompt_token_ids"}
# srt/managers/tokenizer_manager.py: the reply's keys, meta_info's keys, and the speculative ones
SGLANG_REPLY_KEYS = {"text", "output_ids", "meta_info", "prompt_token_ids"}
SGLANG_META_KEYS = {
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "e2e_latency",
}
SGLANG_SPEC_KEYS = {
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_correct_drafts_histogram",
}
# srt/arg_groups/fields/*.py ServerArgs fields that /server_info reports (flat)
SGLANG_SERVER_FIELDS = {
    "model_path",
    "served_model_name",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_draft_tokens",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "context_length",
    "api_key",
    "tp_size",
}
# srt/managers/schedule_batch.py finish reasons' to_json
SGLANG_FINISH_KEYS = {"type", "matched", "length"}
# srt/utils/auth.py: paths open without the key
SGLANG_OPEN_PREFIXES = ("/health", "/ready", "/metrics")

# --- vLLM (VLLM_VERSION) ---------------------------------------------------------------------------------------
VLLM_ROUTES = {
    ("GET", "/health"),
    ("GET", "/v1/models"),
    ("GET", "/version"),
    ("GET", "/metrics"),
    ("GET", "/server_info"),
    ("POST", "/v1/completions"),
}
# entrypoints/openai/completion/protocol.py CompletionRequest: the fields these servers read
VLLM_REQUEST_FIELDS = {
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "stop_token_ids",
    "ignore_eos",
    "return_token_ids",
    "n",
    "stream",
}
VLLM_CHOICE_FIELDS = {
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "token_ids",
    "prompt_token_ids",
}
VLLM_USAGE_FIELDS = {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"}
VLLM_MODEL_CARD_FIELDS = {
    "id",
    "object",
    "created",
    "owned_by",
    "root",
    "parent",
    "max_model_len",
    "permission",
}
# v1/spec_decode/metrics.py SpecDecodingProm counters; v1/metrics/loggers.py labelnames
VLLM_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# v1/metrics/loggers.py: a histogram observed with the spec counters, per finished request (prometheus_client
# writes its _bucket, _count and _sum samples; the buckets are configurable there, the client reads no bucket)
VLLM_E2E_LATENCY = "vllm:e2e_request_latency_seconds"
VLLM_E2E_BUCKETS = (0.3, 1.0, 5.0, 30.0, 120.0)
# what the fakes report as a request's time inside the server: known to the test, unlike the wall clock
SECONDS_PER_TOKEN = 0.004
VLLM_LABELS = ("model_name", "engine")
VLLM_POSITION_LABEL = "position"
# config/speculative.py SpeculativeConfig, config/vllm.py VllmConfig, config/model.py ModelConfig
VLLM_SPEC_CONFIG_FIELDS = {"model", "method", "num_speculative_tokens"}
VLLM_CONFIG_FIELDS = {"model_config", "speculative_config"}
# entrypoints/serve/middleware/authenticate.py
VLLM_GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


class FakeModel:
    """Greedy decoding of a fixed continuation per prompt, in verification steps of `n` drafts.

    continuations: prompt ids -> the tokens to emit (missing prompts get a deterministic pseudo-random sequence of
    non-eos tokens); accept(prompt, step) -> drafts accepted at that step (default: none). The steps each request
    ran are logged in `log` (prompt -> list of accepted counts), so a test knows the true acceptance."""

    def __init__(
        self,
        n: int,
        vocab: int,
        *,
        continuations: dict[tuple[int, ...], list[int]] | None = None,
        accept: Callable[[tuple[int, ...], int], int] | None = None,
        eos: Sequence[int] = (),
    ) -> None:
        self.n, self.vocab, self.eos = n, vocab, set(eos)
        self.continuations = continuations or {}
        self.accept = accept or (lambda prompt, step: 0)
        self.log: dict[tuple[int, ...], list[int]] = {}
        self.lock = threading.Lock()

    def decode(
        self, prompt: Sequence[int], max_new: int, stop: Sequence[int], seed: int | None
    ) -> tuple[list[int], list[int], str, int | None]:
        """(tokens, accepted per step, finish type, the stop token matched)."""
        key = tuple(prompt)
        tokens = self.continuations.get(key)
        if tokens is None:
            rng = random.Random(hash((key, seed)))
            tokens = [
                t for t in (rng.randrange(self.vocab) for _ in range(4 * max_new)) if t not in self.eos
            ][:max_new]
        stops = self.eos | set(stop)
        out = [tokens[0]]  # the prefill's
        steps: list[int] = []
        step = 0
        while len(out) < max_new and out[-1] not in stops and len(out) < len(tokens):
            a = max(0, min(self.n, self.accept(key, step)))
            steps.append(a)
            for t in tokens[len(out) : len(out) + a + 1]:
                out.append(t)
                if t in stops or len(out) >= max_new:
                    break
            step += 1
        with self.lock:
            self.log[key] = steps
        if out[-1] in stops:
            return out, steps, "stop", out[-1]
        return out, steps, "length", None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Loopback:
    """A running fake server; `url` is its base address. Use as a context manager (stops on exit)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], state: Any) -> None:
        self.state = state
        handler_cls = type("Bound", (handler,), {"state": state})
        self.httpd = _Server(("127.0.0.1", 0), handler_cls)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Loopback:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    state: Any
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        pass

    def send(
        self,
        status: int,
        body: bytes | str | dict | list,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        data = body.encode() if isinstance(body, str) else body
        framing = self.state.framing
        if framing == "http10":
            self.protocol_version = "HTTP/1.0"  # the status line says so; the body ends with the connection
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if framing == "length":
            self.send_header("Content-Length", str(len(data)))
        else:  # close-delimited: no length, no chunking
            self.send_header("Connection", "close")
            self.close_connection = True
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        with contextlib.suppress(OSError):  # the client gave up (a test's deadline)
            self.wfile.write(data)

    def flush_headers(self) -> None:
        drip = self.state.header_drip_s
        buffered = b"".join(getattr(self, "_headers_buffer", []))
        if not drip or not buffered:
            super().flush_headers()
            return
        self._headers_buffer = []
        try:
            for i in range(len(buffered)):  # one byte at a time: each read gets one, no read waits long
                self.wfile.write(buffered[i : i + 1])
                self.wfile.flush()
                time.sleep(drip)
        except OSError:
            self.close_connection = True  # the client gave up, as it should

    def body_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def authorized(self, open_path: bool) -> bool:
        key = self.state.api_key
        if key is None or open_path:
            return True
        return self.headers.get("Authorization") == f"Bearer {key}"

    def do_GET(self) -> None:
        self.route("GET")

    def do_POST(self) -> None:
        self.route("POST")

    def route(self, method: str) -> None:
        s = self.state
        path = urlsplit(self.path).path
        with s.lock:
            s.calls.append((method, path))
            hook = s.hooks.get((method, path))
        if hook is not None and hook(self):
            return  # the test's own answer (a 503, a hang, a huge body, ...)
        with s.lock:
            retry_after = s.busy.pop(0) if s.busy else None
        if retry_after is not None:
            self.send(503, {"error": "Service Unavailable"}, headers={"Retry-After": retry_after})
            return
        self.handle_route(method, path)

    def handle_route(self, method: str, path: str) -> None:
        raise NotImplementedError


class ServerState:
    """What a fake server serves and what it saw. hooks: (method, path) -> callable(handler) that answers itself
    and returns True, or returns False to let the server answer."""

    def __init__(
        self,
        model: FakeModel,
        *,
        target: str,
        drafter: str | None,
        api_key: str | None = None,
        framing: str = "length",
        header_drip_s: float = 0.0,
        busy: Sequence[str] = (),
        rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.model = model
        self.target = target
        self.drafter = drafter
        self.api_key = api_key
        self.calls: list[tuple[str, str]] = []
        self.bodies: list[Any] = []
        self.hooks: dict[tuple[str, str], Callable[[Any], bool]] = {}
        self.lock = threading.Lock()
        # misbehaving modes (the module's docstring)
        assert framing in ("length", "close", "http10")
        self.framing = framing
        self.header_drip_s = header_drip_s
        self.busy = list(busy)
        self.rewrite = rewrite or (lambda reply: reply)


class SGLangState(ServerState):
    def __init__(
        self,
        model: FakeModel,
        *,
        target: str,
        drafter: str | None,
        api_key: str | None = None,
        algorithm: str | None = "DFLASH",
        draft_tokens: int | None = None,
        histogram: bool = True,
        context_length: int = 4096,
        legacy_info_only: bool = False,
        **misbehaviour: Any,
    ) -> None:
        super().__init__(model, target=target, drafter=drafter, api_key=api_key, **misbehaviour)
        self.algorithm = algorithm
        self.draft_tokens = model.n + 1 if draft_tokens is None else draft_tokens
        self.histogram = histogram
        self.context_length = context_length
        self.legacy_info_only = legacy_info_only  # only /get_server_info, as before the rename


class SGLangHandler(_Handler):
    state: SGLangState

    def handle_route(self, method: str, path: str) -> None:
        s = self.state
        if (method, path) not in SGLANG_ROUTES or (path == "/server_info" and s.legacy_info_only):
            self.send(404, {"detail": "Not Found"})
            return
        if not self.authorized(path.startswith(SGLANG_OPEN_PREFIXES)):
            self.send(401, {"error": "Unauthorized"})
            return
        if path in ("/health", "/health_generate"):
            self.send(200, b"", "text/plain")
        elif path in ("/server_info", "/get_server_info"):
            spec = s.algorithm is not None
            self.send(
                200,
                {
                    "model_path": s.target,
                    "served_model_name": s.target,
                    "speculative_algorithm": s.algorithm,
                    "speculative_draft_model_path": s.drafter if spec else None,
                    "speculative_num_draft_tokens": s.draft_tokens if spec else None,
                    "speculative_num_steps": 1 if spec else None,
                    "speculative_eagle_topk": 1 if spec else None,
                    "context_length": s.context_length,
                    "tp_size": 8,
                    "api_key": s.api_key,  # the release reports every server argument, its key included
                    "launch_command": "python -m sglang.launch_server ...",
                    "internal_states": [{}],
                    "version": SGLANG_VERSION,
                    "frontend": "python",
                },
            )
        elif path == "/model_info":
            self.send(200, {"model_path": s.target, "is_generation": True})
        else:
            self.generate()

    def generate(self) -> None:
        s = self.state
        body = self.body_json()
        with s.lock:
            s.bodies.append(body)
        params = body.get("sampling_params") or {}
        unknown = sorted(set(params) - SGLANG_SAMPLING_FIELDS)
        if unknown:  # the release's contract check: SamplingParams rejects unknown keys
            self.send(400, {"error": f"sampling_params: unknown field {unknown[0]!r}"})
            return
        prompt = body["input_ids"]
        tokens, steps, finish, matched = s.model.decode(
            prompt,
            params.get("max_new_tokens", 128),
            params.get("stop_token_ids") or [],
            params.get("sampling_seed"),
        )
        finish_reason = (
            {"type": "stop", "matched": matched}
            if finish == "stop"
            else {"type": "length", "length": len(tokens)}
        )
        meta: dict[str, Any] = {
            "id": body.get("rid") or uuid.uuid4().hex,
            "finish_reason": finish_reason,
            "prompt_tokens": len(prompt),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(tokens),
            "cached_tokens": 0,
            "e2e_latency": SECONDS_PER_TOKEN * len(tokens),
        }
        if s.algorithm is not None and steps:
            n = s.draft_tokens - 1
            correct = sum(steps)
            meta.update(
                {
                    "spec_accept_rate": correct / (len(steps) * n),
                    "spec_accept_length": len(tokens) / len(steps),
                    "spec_num_correct_drafts": correct,
                    "spec_num_proposed_drafts": len(steps) * n,
                    "spec_verify_ct": len(steps),
                }
            )
            histogram = [0] * (max(steps) + 1)
            for a in steps:
                histogram[a] += 1
            if s.histogram:
                meta["spec_correct_drafts_histogram"] = histogram
        reply: dict[str, Any] = {
            "text": "".join(chr(97 + t % 26) for t in tokens),
            "output_ids": tokens,
            "meta_info": meta,
        }
        if body.get("return_prompt_token_ids"):
            reply["prompt_token_ids"] = prompt
        self.send(200, s.rewrite(reply))


@dataclass
class Counts:
    """What one request adds to vLLM's counters (VLLMState.miscount may rewrite it)."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_pos: list[int]


class VLLMState(ServerState):
    def __init__(
        self,
        model: FakeModel,
        *,
        target: str,
        drafter: str | None,
        api_key: str | None = None,
        speculative: bool = True,
        dev_mode: bool = True,
        method: str = "dflash",
        max_model_len: int = 4096,
        engines: int = 1,
        metrics_lag_s: float = 0.0,
        log_stats: bool = True,
        miscount: Callable[[Counts], Counts] | None = None,
        **misbehaviour: Any,
    ) -> None:
        super().__init__(model, target=target, drafter=drafter, api_key=api_key, **misbehaviour)
        self.miscount = miscount or (lambda counts: counts)
        self.speculative, self.dev_mode, self.method = speculative, dev_mode, method
        self.max_model_len, self.engines, self.metrics_lag_s, self.log_stats = (
            max_model_len,
            engines,
            metrics_lag_s,
            log_stats,
        )
        self.counters = [dict.fromkeys(VLLM_COUNTERS, 0) for _ in range(engines)]
        self.per_pos = [[0] * model.n for _ in range(engines)]
        self.latencies: list[list[float]] = [
            [] for _ in range(engines)
        ]  # e2e_request_latency_seconds observations
        self.requests = 0

    def record(self, steps: Sequence[int], tokens: int | None = None) -> None:
        if not self.log_stats:
            return
        with self.lock:
            engine = self.requests % self.engines  # data parallel: requests spread over the engines
            self.requests += 1
            if tokens is not None:
                self.latencies[engine].append(SECONDS_PER_TOKEN * tokens)
            counts = self.miscount(
                Counts(
                    drafts=len(steps),
                    draft_tokens=len(steps) * self.model.n,
                    accepted=sum(steps),
                    per_pos=[sum(a > j for a in steps) for j in range(self.model.n)],
                )
            )
            c = self.counters[engine]
            c["vllm:spec_decode_num_drafts"] += counts.drafts
            c["vllm:spec_decode_num_draft_tokens"] += counts.draft_tokens
            c["vllm:spec_decode_num_accepted_tokens"] += counts.accepted
            for j, a in enumerate(counts.per_pos):
                self.per_pos[engine][j] += a


class VLLMHandler(_Handler):
    state: VLLMState

    def handle_route(self, method: str, path: str) -> None:
        s = self.state
        if (method, path) not in VLLM_ROUTES or (path == "/server_info" and not s.dev_mode):
            self.send(404, {"detail": "Not Found"})
            return
        if not self.authorized(not path.startswith(VLLM_GUARDED_PREFIX)):
            self.send(401, {"error": "Unauthorized"})
            return
        if path == "/health":
            self.send(200, b"", "text/plain")
        elif path == "/version":
            self.send(200, {"version": VLLM_VERSION})
        elif path == "/v1/models":
            self.send(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": s.target,
                            "object": "model",
                            "created": int(time.time()),
                            "owned_by": "vllm",
                            "root": s.target,
                            "parent": None,
                            "max_model_len": s.max_model_len,
                            "permission": [{"id": "modelperm-x", "object": "model_permission"}],
                        }
                    ],
                },
            )
        elif path == "/server_info":
            fmt = parse_qs(urlsplit(self.path).query).get("config_format", ["text"])[0]
            spec = (
                {"model": s.drafter, "method": s.method, "num_speculative_tokens": s.model.n}
                if s.speculative
                else None
            )
            config = {"model_config": {"model": s.target}, "speculative_config": spec}
            self.send(
                200,
                {"vllm_config": config if fmt == "json" else str(config), "vllm_env": {}, "system_env": {}},
            )
        elif path == "/metrics":
            self.send(200, self.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self.completion()

    def metrics(self) -> str:
        s = self.state
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{engine="0",model_name="{s.target}"}} 0.0',
        ]
        if not s.speculative:
            return "\n".join(lines) + "\n"
        with s.lock:
            counters = [dict(c) for c in s.counters]
            per_pos = [list(p) for p in s.per_pos]
            latencies = [list(x) for x in s.latencies]
        lines += [
            f"# HELP {VLLM_E2E_LATENCY} Histogram of e2e request latency in seconds.",
            f"# TYPE {VLLM_E2E_LATENCY} histogram",
        ]
        for e in range(s.engines):
            labels = f'engine="{e}",model_name="{s.target}"'
            for bound in (*VLLM_E2E_BUCKETS, float("inf")):
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(
                    f'{VLLM_E2E_LATENCY}_bucket{{{labels},le="{le}"}} '
                    f"{float(sum(x <= bound for x in latencies[e]))}"
                )
            lines += [
                f"{VLLM_E2E_LATENCY}_count{{{labels}}} {float(len(latencies[e]))}",
                f"{VLLM_E2E_LATENCY}_sum{{{labels}}} {sum(latencies[e])!r}",
            ]
        for name in VLLM_COUNTERS:
            lines += [f"# HELP {name}_total Number of spec decoding drafts.", f"# TYPE {name}_total counter"]
            for e in range(s.engines):
                labels = f'engine="{e}",model_name="{s.target}"'
                lines.append(f"{name}_total{{{labels}}} {float(counters[e][name])}")
            for e in range(s.engines):
                lines.append(f'{name}_created{{engine="{e}",model_name="{s.target}"}} 1.7e9')
        lines += [
            f"# HELP {VLLM_PER_POS}_total Accepted tokens per draft position.",
            f"# TYPE {VLLM_PER_POS}_total counter",
        ]
        for e in range(s.engines):
            for j in range(s.model.n):
                lines.append(
                    f'{VLLM_PER_POS}_total{{engine="{e}",model_name="{s.target}",{VLLM_POSITION_LABEL}="{j}"}} '
                    f"{float(per_pos[e][j])}"
                )
        return "\n".join(lines) + "\n"

    def completion(self) -> None:
        s = self.state
        body = self.body_json()
        with s.lock:
            s.bodies.append(body)
        prompt = body["prompt"]
        if body.get("model") not in (None, s.target):
            self.send(
                404,
                {
                    "error": {
                        "message": f"The model `{body.get('model')}` does not exist.",
                        "type": "NotFoundError",
                        "param": "model",
                        "code": 404,
                    }
                },
            )
            return
        tokens, steps, finish, matched = s.model.decode(
            prompt, body.get("max_tokens", 16), body.get("stop_token_ids") or [], body.get("seed")
        )
        if s.metrics_lag_s:
            threading.Timer(s.metrics_lag_s, s.record, args=(steps, len(tokens))).start()
        else:
            s.record(steps, len(tokens))
        choice: dict[str, Any] = {
            "index": 0,
            "text": "".join(chr(97 + t % 26) for t in tokens),
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": matched,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = tokens
            choice["prompt_token_ids"] = prompt
        self.send(
            200,
            s.rewrite(
                {
                    "id": f"cmpl-{uuid.uuid4().hex}",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": s.target,
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": len(prompt),
                        "total_tokens": len(prompt) + len(tokens),
                        "completion_tokens": len(tokens),
                        "prompt_tokens_details": None,
                    },
                }
            ),
        )


def sglang(state: SGLangState) -> Loopback:
    return Loopback(SGLangHandler, state)


def vllm(state: VLLMState) -> Loopback:
    return Loopback(VLLMHandler, state)
