"""smoke --engine against hostile servers (issue 40, round three), each a misbehaving mode of the loopback servers
(engine_servers.py): replies that end when the connection closes, Retry-After values no server should send, headers
trickled past the deadline, replies cut short, and figures no engine can count. Every case ends in a sentence that
names the problem (exit 2) or a correct measurement, never an internal error or an exception's name."""

from __future__ import annotations

import email.utils
import re
import time
from pathlib import Path
from typing import Any

import engine_servers as es
import msgspec
import pytest
from smoke_helpers import drafter_config, write_target

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint import load_checkpoint
from lilicorr_ckpt.runtimes import RELEASES
from lilicorr_ckpt.smoke.engine import consistency, target
from lilicorr_ckpt.smoke.engine.profile import Counted, acceptance
from lilicorr_ckpt.smoke.engine.transport import (
    MAX_ATTEMPTS,
    RETRY_AFTER_CAP,
    Client,
    EngineError,
    parse_engine,
    retry_delay,
)

RUN = ("--limit", "1", "--max-new-tokens", "24", "--quiet")
MAX_NEW = 24
# what no message may show: an exception's class name (the user reads sentences)
EXCEPTION_NAME = re.compile(
    r"\b\w*(Error|Exception)\b|IncompleteRead|RemoteDisconnected|BadStatusLine|LineTooLong"
)


class Pair(msgspec.Struct):
    target: Path
    drafter: Path
    n: int  # drafted per step: block_size - 1


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    root = tmp_path_factory.mktemp("hostile")
    drafter = fixtures.write_checkpoint(root / "drafter", drafter_config())
    block = load_checkpoint(str(drafter)).geometry.block_size
    assert block is not None
    return Pair(target=write_target(root / "target", eos=True), drafter=drafter, n=block - 1)


def model(pair: Pair) -> es.FakeModel:
    """Random continuations (no eos), one draft accepted per step."""
    return es.FakeModel(pair.n, 16, accept=lambda prompt, step: 1, eos=[2])


def state(pair: Pair, kind: str, **kw: Any) -> es.SGLangState | es.VLLMState:
    make = es.SGLangState if kind == "sglang" else es.VLLMState
    return make(
        kw.pop("model", None) or model(pair), target=str(pair.target), drafter=str(pair.drafter), **kw
    )


def serve(kind: str, s: es.ServerState) -> es.Loopback:
    return es.sglang(s) if kind == "sglang" else es.vllm(s)


def args(pair: Pair, kind: str, url: str, *extra: str) -> list[str]:
    return [str(pair.drafter), "-t", str(pair.target), "--engine", f"{kind}={url}", *RUN, *extra]


def readable(text: str) -> None:
    assert "Traceback" not in text and "internal error" not in text, text
    assert not EXCEPTION_NAME.search(text), text


# ---- framing: a body that ends when the connection does ----------------------------------------------------------


@pytest.mark.parametrize("framing", ["close", "http10"])
@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_reply_that_ends_when_the_connection_closes_is_read_whole(smoke, pair, kind, framing):
    s = state(pair, kind, framing=framing)
    with serve(kind, s) as server:
        result = smoke(*args(pair, kind, server.url, "--format", "json"))
    assert result.code == 0, result.stderr
    steps = [a for log in s.model.log.values() for a in log]
    assert (result.report["acceptance"]["blocks"], result.report["acceptance"]["accepted"]) == (
        len(steps),
        sum(steps),
    )
    # the loopback servers report the newest release runtimes lists, not a version written in the tests
    assert result.report["engine"]["version"] == RELEASES[kind][-1].version


def test_a_close_delimited_body_is_held_to_the_size_limit(pair):
    s = state(pair, "sglang", framing="close")

    def endless(handler) -> bool:
        handler.send(200, b"[" * (4 << 20))  # no length: only the connection's end would end it
        return True

    s.hooks[("GET", "/health")] = endless
    with es.sglang(s) as server:
        client = Client(parse_engine(f"sglang={server.url}"), api_key=None, timeout=10)
        with pytest.raises(EngineError) as info:
            client.get("/health", 1 << 16)
    assert f"sent more than {1 << 16} bytes" in str(info.value)


# ---- Retry-After ----------------------------------------------------------------------------------------------


def test_retry_after_is_held_to_a_sane_wait(pair):
    """delay-seconds is held to RETRY_AFTER_CAP; an HTTP-date is the time until it, held to [0, cap]; anything else
    (nan, inf, negative, 1e9) is no delay the header can carry, so the doubling backoff applies."""
    soon = email.utils.formatdate(time.time() + 10, usegmt=True)
    later = email.utils.formatdate(time.time() + 3600, usegmt=True)
    cases = [
        (["nan", "inf", "-3", "1e9", "9" * 40], [0.5, 1.0, 2.0, 4.0, RETRY_AFTER_CAP]),
        (["Wed, 21 Oct 2015 07:28:00 GMT", later, "2", "soon"], [0.0, RETRY_AFTER_CAP, 2.0, 4.0]),
    ]
    for busy, expected in cases:
        assert len(busy) < MAX_ATTEMPTS
        waits: list[float] = []
        notes: list[str] = []
        with es.sglang(state(pair, "sglang", busy=busy)) as server:
            client = Client(
                parse_engine(f"sglang={server.url}"),
                api_key=None,
                timeout=5,
                sleep=waits.append,
                notify=notes.append,
            )
            assert client.get("/health", 1 << 20).status == 200
        assert waits == expected, (busy, waits)
        assert all("HTTP 503, retrying in" in note for note in notes)
    assert 8.0 <= retry_delay(soon) <= 10.0
    for value in ("nan", "NaN", "inf", "-inf", "-1", "1e400", "", "²", "Thu, 99 Foo 2025 00:00:00 GMT"):
        assert retry_delay(value) is None, value
    assert retry_delay("0") == 0.0 and retry_delay("1.5") == 1.5 and retry_delay(None) is None
    # retry_delay itself holds a huge wait to the cap (not only the client that sleeps it)
    for value in ("9" * 40, "31", f" {RETRY_AFTER_CAP + 0.5} ", later):
        assert retry_delay(value) == RETRY_AFTER_CAP, value


def test_retry_after_nan_on_a_live_run_is_retried_not_an_internal_error(smoke, pair):
    s = state(pair, "sglang", busy=["nan"])
    with es.sglang(s) as server:
        result = smoke(*args(pair, "sglang", server.url))
    assert result.code == 0, result.stderr
    assert s.calls[:2] == [("GET", "/health"), ("GET", "/health")]


# ---- one deadline over the whole exchange --------------------------------------------------------------------


def test_headers_trickled_a_byte_at_a_time_end_at_the_deadline(pair):
    with es.sglang(state(pair, "sglang", header_drip_s=0.05)) as server:
        client = Client(parse_engine(f"sglang={server.url}"), api_key=None, timeout=0.6)
        started = time.monotonic()
        with pytest.raises(EngineError) as info:
            client.post_json("/generate", {"input_ids": [1]}, 1 << 20)
        elapsed = time.monotonic() - started
    message = str(info.value)
    assert elapsed < 0.6 + 0.4, elapsed  # a read per byte must not restart the clock
    assert "did not answer within 0.6 s (--timeout)" in message
    assert "status line and headers were still arriving" in message and "raise --timeout" in message
    readable(message)


def test_a_slow_headers_server_ends_the_run_within_its_timeout(smoke, pair):
    with es.sglang(state(pair, "sglang", header_drip_s=0.1)) as server:
        started = time.monotonic()
        result = smoke(*args(pair, "sglang", server.url, "--timeout", "1"))
        elapsed = time.monotonic() - started
    assert elapsed < 12, elapsed  # validate and the tokenizer, then one second: not a tenth per header byte
    assert result.code == 2, result.stderr
    assert "/health did not answer within 1 s (--timeout)" in result.stderr
    assert "headers were still arriving" in result.stderr
    readable(result.stderr)


# ---- replies cut short or malformed: sentences, never an exception's name ------------------------------------


def _raw(reply: bytes):
    def hook(handler) -> bool:
        handler.wfile.write(reply)
        handler.wfile.flush()
        handler.close_connection = True
        return True

    return hook


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}",
            "the reply ended after 2 of the 100 bytes its Content-Length announced",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
            "the reply ended in the middle of a chunk",
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "the reply ended in the middle"),
        (b"HTTP/1.1 abc\r\n\r\n", "its status line is"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "its status line is"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n", "a header line longer than 64 KiB"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n{}", ""),  # a superscript two is no length
        (b"", "closed the connection without a reply"),
    ],
)
def test_replies_cut_short_or_malformed_are_named_in_words(pair, reply, says):
    s = state(pair, "sglang")
    s.hooks[("POST", "/generate")] = _raw(reply)
    with es.sglang(s) as server:
        client = Client(parse_engine(f"sglang={server.url}"), api_key=None, timeout=5)
        try:
            client.post_json("/generate", {"input_ids": [1]}, 1 << 20)
            message = ""
        except EngineError as exc:
            message = str(exc)
    assert says in message
    readable(message)


def test_an_unresolvable_or_invalid_host_name_is_unreachable_in_words():
    for host in ("no-such-host.invalid", "a" * 70 + ".example"):
        client = Client(parse_engine(f"vllm=http://{host}:8000"), api_key=None, timeout=5)
        with pytest.raises(EngineError) as info:
            client.get("/health", 1 << 20)
        assert "nothing answers at" in str(info.value) and "does not resolve" in str(info.value)
        readable(str(info.value))


# ---- figures no engine can count ------------------------------------------------------------------------------


def _meta(**changes: Any):
    """meta_info rewritten: a key set to a value, to a function of the engine's own value, or dropped (None)."""

    def rewrite(reply: dict[str, Any]) -> dict[str, Any]:
        meta = dict(reply["meta_info"])
        for key, value in changes.items():
            if value is None:
                meta.pop(key, None)
            else:
                meta[key] = value(meta.get(key)) if callable(value) else value
        return {**reply, "meta_info": meta}

    return rewrite


def _one_step_of(tokens: int, n: int):
    """One verification step that claims `tokens` generated tokens (n drafts accepted)."""

    def rewrite(reply: dict[str, Any]) -> dict[str, Any]:
        meta = {
            **reply["meta_info"],
            "completion_tokens": tokens,
            "spec_verify_ct": 1,
            "spec_num_correct_drafts": n,
            "spec_correct_drafts_histogram": [0] * n + [1],
        }
        meta.pop("spec_accept_length", None)
        meta.pop("spec_accept_rate", None)
        return {**reply, "output_ids": [5] * tokens, "meta_info": meta}

    return rewrite


def _usage(completion: int):
    def rewrite(reply: dict[str, Any]) -> dict[str, Any]:
        return {**reply, "usage": {**reply["usage"], "completion_tokens": completion}}

    return rewrite


def _counts(**how: Any):
    """vLLM's counters, miscounted: each value a function of the true Counts."""

    def miscount(c: es.Counts) -> es.Counts:
        return es.Counts(
            **{f: how[f](c) if f in how else getattr(c, f) for f in es.Counts.__dataclass_fields__}
        )

    return miscount


def _figure_cases(n: int) -> list[Any]:
    block = n + 1
    return [
        pytest.param(
            "sglang",
            {
                "rewrite": _meta(
                    spec_verify_ct=1, spec_num_correct_drafts=2 * n, spec_correct_drafts_histogram=None
                )
            },
            [
                f"spec_num_correct_drafts is {2 * n}, above {n}",
                f"accepted <= drafted: spec_verify_ct 1 x {n} drafted per step",
            ],
            id=f"sglang-tau-{2 * n + 1}-with-block-{block}",
        ),
        pytest.param(
            "sglang",
            {"rewrite": _meta(spec_accept_rate=14.0)},
            ["spec_accept_rate is 14.0, outside [0, 1] (a rate)"],
            id="sglang-1400%-acceptance-rate",
        ),
        pytest.param(
            "sglang",
            {"rewrite": _one_step_of(2 * block + 1, n)},
            [
                f"completion_tokens is {2 * block + 1}, above {1 + block}",
                f"at most {block} tokens per verification step",
            ],
            id=f"sglang-{2 * block}-tokens-from-one-verify-step",
        ),
        pytest.param(
            "sglang",
            {"rewrite": _meta(completion_tokens=10**9)},
            [f"completion_tokens is 1000000000, above {MAX_NEW} (the --max-new-tokens {MAX_NEW} asked"],
            id="sglang-1e9-completion-tokens",
        ),
        pytest.param(
            "sglang",
            {"rewrite": _meta(spec_correct_drafts_histogram=lambda h: [*h[:-1], -1])},
            ["is -1, below 0 (a count)", "spec_correct_drafts_histogram["],
            id="sglang-negative-histogram",
        ),
        pytest.param(
            "sglang",
            {"rewrite": _meta(num_retractions=-4)},
            ["num_retractions is -4, below 0 (a count)"],
            id="sglang-negative-retractions",
        ),
        pytest.param(
            "sglang",
            {"rewrite": _meta(spec_accept_length=float(2 * block))},
            [f"spec_accept_length is {float(2 * block)}, outside [0, "],
            id="sglang-accept-length-above-the-block",
        ),
        pytest.param(
            "vllm",
            {"miscount": _counts(accepted=lambda c: 2 * n * c.drafts, per_pos=lambda c: [2 * c.drafts] * n)},
            ["the change of vllm:spec_decode_num_accepted_tokens is", "(accepted <= drafted:"],
            id=f"vllm-tau-{2 * n + 1}-with-block-{block}",
        ),
        pytest.param(
            "vllm",
            {
                "miscount": _counts(
                    accepted=lambda c: n * c.drafts, per_pos=lambda c: [n * c.drafts] + [0] * (n - 1)
                )
            },
            ["accepted_tokens_per_pos at position 0 is", "a step accepts its first draft at most once"],
            id="vllm-first-position-accepted-more-often-than-steps",
        ),
        pytest.param(
            "vllm",
            {"miscount": _counts(per_pos=lambda c: list(reversed(c.per_pos)))},
            [
                f"accepted_tokens_per_pos at position {n - 1} is",
                "a draft is accepted only with every one before it",
            ],
            id="vllm-per-position-counts-increasing",
        ),
        pytest.param(
            "vllm",
            {"miscount": _counts(draft_tokens=lambda c: c.draft_tokens + n + 1)},
            ["the change of vllm:spec_decode_num_draft_tokens is", f"x {n} drafted per step"],
            id="vllm-more-draft-tokens-than-steps-draft",
        ),
        pytest.param(
            "vllm",
            {"rewrite": _usage(-5)},
            ["usage.completion_tokens is -5, below 0 (a count)"],
            id="vllm-negative-completion-tokens",
        ),
        pytest.param(
            "vllm",
            {"rewrite": _usage(10**9)},
            [f"usage.completion_tokens is 1000000000, above {MAX_NEW}"],
            id="vllm-1e9-completion-tokens",
        ),
    ]


@pytest.mark.parametrize(("kind", "mode", "says"), _figure_cases(7))
def test_figures_no_engine_can_count_are_refused_naming_the_figure_value_and_bound(
    smoke, pair, kind, mode, says
):
    assert pair.n == 7  # the cases above are written for the fixture drafter's block of 8
    with serve(kind, state(pair, kind, **mode)) as server:
        result = smoke(*args(pair, kind, server.url, "--format", "json"))
    assert result.code == 2, result.stderr + result.stdout
    assert result.stdout == ""  # nothing reported, nothing gated
    for fragment in says:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert "unmodified release" in result.stderr  # what to check
    readable(result.stderr)


def test_a_concurrent_vllm_runs_aggregate_is_held_to_the_same_bounds(smoke, pair):
    mode = {
        "miscount": _counts(
            accepted=lambda c: 2 * pair.n * c.drafts, per_pos=lambda c: [2 * c.drafts] * pair.n
        )
    }
    with es.vllm(state(pair, "vllm", **mode)) as server:
        result = smoke(*args(pair, "vllm", server.url, "--concurrency", "3"))
    assert (
        result.code == 2 and "(over 3 requests)" in result.stderr and "(accepted <= drafted:" in result.stderr
    )


def test_the_totals_are_checked_again_before_the_gates():
    """consistency.acceptance holds the arithmetic over requests to the same bounds as each request's counts."""
    where = "http://h:1: the engine's figures over the run"
    good = acceptance([Counted(4, 6, [3, 2, 1])], 3, requests=1, tokens=11, wall_time_s=1.0, per_request=True)
    consistency.acceptance(where, good, 3, 24)
    cases = [
        (Counted(1, 14, [1, 1, 1]), 5, "tau is 15, outside [1, 4]"),
        (Counted(1, 3, [14, 0, 0]), 5, "the conditional acceptance rate at position 1 is 14, outside [0, 1]"),
        (Counted(2, 1, [1, 0, 0]), 10**9, "tokens is 1000000000, above 24"),
        (Counted(2, -1, [0, 0, 0]), 5, "accepted drafts is -1, below 0"),
    ]
    for counted, tokens, says in cases:
        figures = acceptance([counted], 3, requests=1, tokens=tokens, wall_time_s=1.0, per_request=True)
        with pytest.raises(EngineError) as info:
            consistency.acceptance(where, figures, 3, 24)
        assert says in str(info.value), str(info.value)


# ---- the target's tokenizer: the seam for a GGUF's direct reader ------------------------------------------------


def test_a_gguf_targets_tokenizer_comes_from_the_direct_reader_when_one_is_plugged_in(tmp_path, monkeypatch):
    gguf = tmp_path / "target.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    directory = tmp_path / "dir"
    directory.mkdir()
    converted: list[str] = []
    monkeypatch.setattr(target, "load_tokenizer", lambda spec: converted.append(spec) or "converted")
    direct = "direct"  # a TargetTokenizer in a real reader
    assert target.tokenizer_for(str(gguf), gguf_reader=lambda spec: direct) == direct
    assert converted == []
    # a file the reader cannot map exactly, and any target when no reader is plugged in: transformers' converter
    assert target.tokenizer_for(str(gguf), gguf_reader=lambda spec: None) == "converted"
    assert target.DIRECT_GGUF is None and target.tokenizer_for(str(gguf)) == "converted"
    (directory / "config.json").write_text("{}")
    asked: list[str] = []
    assert target.tokenizer_for(str(directory), gguf_reader=lambda spec: asked.append(spec)) == "converted"
    assert asked == []  # a model directory never goes to the GGUF reader
