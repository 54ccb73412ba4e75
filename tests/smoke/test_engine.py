"""`smoke PATH --engine sglang=URL | vllm=URL` end to end against the loopback servers (engine_servers.py): a full
run against each engine, the refusals, retries, unreachable and hostile servers, concurrency, credentials."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import engine_servers as es
import jsonschema
import msgspec
import pytest
from smoke_helpers import drafter_config, write_target

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.smoke.options import SmokeOptions
from lilicorr_ckpt.smoke.probes import load_probes
from lilicorr_ckpt.smoke.profile import SmokeReport, encode
from lilicorr_ckpt.smoke.run import run_smoke
from lilicorr_ckpt.smoke.tokenize import load_tokenizer, tokenize_probes

REPO = Path(__file__).resolve().parents[2]
RUN = ("--limit", "2", "--max-new-tokens", "24", "--quiet")
KEY = "sk-engine-0123456789abcdef"


class Pair(msgspec.Struct):
    target: Path
    drafter: Path
    profile: Path
    report: SmokeReport
    prompts: dict[str, list[int]]  # probe id -> prompt ids
    n: int

    def continuations(self) -> dict[tuple[int, ...], list[int]]:
        return {tuple(self.prompts[r.id]): list(r.reference_tokens) for r in self.report.requests}

    def like_reference(self) -> es.FakeModel:
        """A model that emits the reference's greedy tokens and accepts, per request, as many drafts as the
        reference did (one per step until they are used up), so the engine's tau lands on the reference's."""
        owed = {}
        for r in self.report.requests:
            blocks = r.blocks["head"]
            owed[tuple(self.prompts[r.id])] = round(r.tau["head"] * blocks) - blocks

        def accept(prompt: tuple[int, ...], step: int) -> int:
            return 1 if step < owed.get(prompt, 0) else 0

        return es.FakeModel(self.n, 16, continuations=self.continuations(), accept=accept, eos=[2])


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    root = tmp_path_factory.mktemp("engine")
    target = write_target(root / "target", eos=True)
    drafter = fixtures.write_checkpoint(root / "drafter", drafter_config())
    report = run_smoke(
        SmokeOptions(
            path=str(drafter), target=str(target), limit=2, max_new_tokens=24, warmup=False, min_head_gain=-1
        )
    )
    profile = root / "reference.json"
    profile.write_bytes(encode(report))
    tok = load_tokenizer(str(target))
    probes = load_probes("code,chat,math", 2)
    prompts, _ = tokenize_probes(tok.tokenizer, probes, tok.eos_token_ids)
    return Pair(
        target=target,
        drafter=drafter,
        profile=profile,
        report=report,
        prompts={p.id: ids for p, ids in zip(probes, prompts, strict=True)},
        n=report.block_size - 1,
    )


def sglang_state(pair: Pair, model: es.FakeModel | None = None, **kw) -> es.SGLangState:
    kw.setdefault("drafter", str(pair.drafter))
    return es.SGLangState(model or pair.like_reference(), target=str(pair.target), **kw)


def vllm_state(pair: Pair, model: es.FakeModel | None = None, **kw) -> es.VLLMState:
    kw.setdefault("drafter", str(pair.drafter))
    return es.VLLMState(model or pair.like_reference(), target=str(pair.target), **kw)


def engine_args(pair: Pair, kind: str, url: str, *extra: str) -> list[str]:
    return [str(pair.drafter), "-t", str(pair.target), "--engine", f"{kind}={url}", *RUN, *extra]


def true_counts(model: es.FakeModel) -> tuple[int, int, list[int]]:
    """(steps, accepted drafts, steps accepting drafts 1..j) over every request the fake decoded."""
    steps = [a for log in model.log.values() for a in log]
    return len(steps), sum(steps), [sum(a >= j for a in steps) for j in range(1, model.n + 1)]


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_full_run_reports_what_the_engine_counted_beside_the_reference(smoke, pair, kind, tmp_path):
    state = sglang_state(pair) if kind == "sglang" else vllm_state(pair, engines=2, metrics_lag_s=0.15)
    out = tmp_path / "engine.json"
    with (es.sglang if kind == "sglang" else es.vllm)(state) as server:
        result = smoke(
            *engine_args(
                pair, kind, server.url, "--baseline", pair.profile, "--format", "json", "--output", out
            )
        )
    assert result.code == 0, result.stderr + result.stdout
    report = result.report
    jsonschema.validate(report, json.loads((REPO / "schemas" / "smoke-engine.schema.json").read_text()))
    assert json.loads(out.read_text()) == report
    steps, accepted, positions = true_counts(state.model)
    acc = report["acceptance"]
    assert (acc["blocks"], acc["accepted"]) == (steps, accepted) and accepted > 0
    assert acc["mean_accept_length"] == pytest.approx(1 + accepted / steps, abs=1e-6)
    assert acc["marginal_accept_rates"] == pytest.approx([p / steps for p in positions], abs=1e-6)
    assert [c["accepted"] for c in acc["position_counts"]] == positions
    assert sum(acc["acceptance_length_histogram"].values()) == steps
    assert report["per_request"] is True and set(report["per_category"]) == {"code", "chat", "math"}
    ref = report["reference"]
    assert ref["overall"]["reference"] == pair.report.mean_accept_length
    assert ref["conditions_match"] and ref["paired_requests"] == 6
    assert abs(ref["overall"]["relative_delta"]) <= ref["tolerance"]
    assert ref["greedy_requests_compared"] == ref["greedy_requests_equal"] == 6 and not ref["divergences"]
    assert {g["name"]: g["status"] for g in report["gates"]} == {
        "measured": "pass",
        "engine-tau": "pass",
        "engine-tokens": "pass",
    }
    for r in report["requests"]:  # per request: the engine's own counts for that prompt
        log = state.model.log[tuple(pair.prompts[r["id"]])]
        assert (r["blocks"], r["accepted"]) == (len(log), sum(log)) and r["tokens_match"] is True
    assert report["engine"]["served_drafter"] == str(pair.drafter)
    throughput = report["throughput"]
    assert throughput["tokens"] == sum(r["new_tokens"] for r in report["requests"]) > 0
    # the engine's own timing, beside the wall clock here: each request's, and their sum (the fakes time a request
    # at SECONDS_PER_TOKEN a token, so the figures are known)
    assert [r["engine_latency_s"] for r in report["requests"]] == pytest.approx(
        [es.SECONDS_PER_TOKEN * r["new_tokens"] for r in report["requests"]]
    )
    assert throughput["engine_time_s"] == pytest.approx(es.SECONDS_PER_TOKEN * throughput["tokens"])
    assert throughput["engine_tokens_per_second"] == pytest.approx(1 / es.SECONDS_PER_TOKEN, rel=1e-4)
    # the probes went as the reference's prompt tokens, with every sampling parameter spelled out
    sent = state.bodies[1:]  # after the warm-up
    prompts = [b["input_ids"] if kind == "sglang" else b["prompt"] for b in sent]
    assert sorted(map(tuple, prompts)) == sorted(map(tuple, pair.prompts.values()))
    params = sent[0]["sampling_params"] if kind == "sglang" else sent[0]
    assert params["temperature"] == 0.0 and params["top_p"] == 1.0 and params["repetition_penalty"] == 1.0


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_the_launch_command_and_the_text_report(smoke, pair, kind):
    state = sglang_state(pair) if kind == "sglang" else vllm_state(pair)
    with (es.sglang if kind == "sglang" else es.vllm)(state) as server:
        port = server.url.rsplit(":", 1)[1]
        args = engine_args(pair, kind, server.url, "--baseline", pair.profile)
        args.remove("--quiet")
        result = smoke(*args)
        junit = smoke(*engine_args(pair, kind, server.url, "--baseline", pair.profile, "--format", "junit"))
    assert result.code == 0, result.stderr
    if kind == "sglang":
        assert f"python -m sglang.launch_server --model-path {pair.target}" in result.stderr
        assert f"--speculative-draft-model-path {pair.drafter}" in result.stderr
    else:
        assert (
            f'"num_speculative_tokens": {pair.n}' in result.stderr
            and f"vllm serve {pair.target}" in result.stderr
        )
    assert f"--port {port}" in result.stderr
    for text in (
        "acceptance by position",
        "reference",
        "throughput",
        "tokens/s per request as the engine timed them",
        "PASS  engine-tau",
        "PASS  engine-tokens",
    ):
        assert text in result.stdout
    assert junit.code == 0 and junit.stdout.count("<testcase") == 3 and 'name="engine-tau"' in junit.stdout


def inflated(report: SmokeReport, factor: float) -> SmokeReport:
    """The same profile claiming `factor` times the committed tokens per block (a better drafter)."""
    requests = [
        msgspec.structs.replace(r, tau={a: t * factor for a, t in r.tau.items()}) for r in report.requests
    ]
    arms = {
        a: msgspec.structs.replace(s, mean_accept_length=s.mean_accept_length * factor)
        for a, s in report.arms.items()
    }
    return msgspec.structs.replace(
        report, requests=requests, arms=arms, mean_accept_length=report.mean_accept_length * factor
    )


def test_an_engine_that_accepts_less_or_more_than_the_reference_fails_the_tau_gate(smoke, pair, tmp_path):
    better = tmp_path / "better.json"
    better.write_bytes(encode(inflated(pair.report, 2.0)))
    with es.sglang(sglang_state(pair)) as server:
        low = smoke(*engine_args(pair, "sglang", server.url, "--baseline", better, "--format", "json"))
    assert low.code == 1
    gate = low.gate("engine-tau")
    assert gate["status"] == "fail" and "accepts fewer drafted tokens" in gate["summary"]
    assert low.report["reference"]["overall"]["relative_delta"] < -0.4
    always = es.FakeModel(pair.n, 16, continuations=pair.continuations(), accept=lambda p, s: pair.n, eos=[2])
    with es.sglang(sglang_state(pair, always)) as server:
        high = smoke(*engine_args(pair, "sglang", server.url, "--baseline", pair.profile, "--format", "json"))
    assert high.code == 1 and "accepts more than the reference" in high.gate("engine-tau")["summary"]
    # an explicit --tolerance replaces the derived one
    with es.sglang(sglang_state(pair, always)) as server:
        lax = smoke(
            *engine_args(
                pair,
                "sglang",
                server.url,
                "--baseline",
                pair.profile,
                "--tolerance",
                "100",
                "--format",
                "json",
            )
        )
    assert (
        lax.gate("engine-tau")["status"] == "pass"
        and lax.report["reference"]["tolerance_source"] == "--tolerance"
    )


def test_greedy_tokens_are_compared_up_to_the_references_first_near_tie(smoke, pair):
    untied = next(r for r in pair.report.requests if r.first_near_tie is None and len(r.reference_tokens) > 3)
    tied = next(
        r
        for r in pair.report.requests
        if r.first_near_tie is not None and r.first_near_tie + 1 < len(r.reference_tokens)
    )
    continuations = pair.continuations()
    for record, position in ((untied, 2), (tied, tied.first_near_tie + 1)):
        tokens = list(record.reference_tokens)
        tokens[position] = 3 if tokens[position] != 3 else 4
        continuations[tuple(pair.prompts[record.id])] = tokens
    model = es.FakeModel(pair.n, 16, continuations=continuations, eos=[2])
    with es.vllm(vllm_state(pair, model)) as server:
        result = smoke(*engine_args(pair, "vllm", server.url, "--baseline", pair.profile, "--format", "json"))
    assert result.code == 1
    gate = result.gate("engine-tokens")
    assert gate["status"] == "fail" and gate["summary"].startswith("1 of 6 greedy outputs differ")
    [divergence] = result.report["reference"]["divergences"]
    assert (divergence["request"], divergence["position"]) == (untied.id, 2)
    flags = {r["id"]: r["tokens_match"] for r in result.report["requests"]}
    assert flags[untied.id] is False and flags[tied.id] is True  # past its near-tie the engine may differ


def test_a_server_that_serves_another_or_no_drafter_is_refused(smoke, pair):
    cases = [
        (es.sglang, sglang_state(pair, drafter="/models/some-other-drafter"), "serves another drafter"),
        (es.sglang, sglang_state(pair, algorithm=None), "decodes without a drafter"),
        (es.sglang, sglang_state(pair, algorithm="EAGLE3"), "not DFLASH"),
        (es.sglang, sglang_state(pair, draft_tokens=4), "verifies 4 tokens per step"),
        (es.vllm, vllm_state(pair, drafter="org/other-drafter"), "serves another drafter"),
        (es.vllm, vllm_state(pair, speculative=False), "decodes without a drafter"),
        (es.vllm, vllm_state(pair, es.FakeModel(3, 16, eos=[2])), "drafts 3 tokens per step"),
    ]
    for serve, state, message in cases:
        kind = "sglang" if serve is es.sglang else "vllm"
        with serve(state) as server:
            result = smoke(*engine_args(pair, kind, server.url))
        assert result.code == 1, (message, result.stderr)
        assert message in result.stderr and "refused" in result.stderr
        assert not [c for c in state.calls if c[0] == "POST"]  # refused before any generation
    # the same checkpoint under another name on the server: --served-drafter says so
    with es.sglang(sglang_state(pair, drafter="/models/some-other-drafter")) as server:
        named = smoke(
            *engine_args(pair, "sglang", server.url, "--served-drafter", "/models/some-other-drafter/")
        )
    assert named.code == 0, named.stderr
    # a Hugging Face cache snapshot of the drafter's repo is recognised by its repo id
    snapshot = "/root/.cache/huggingface/hub/models--me--drafter/snapshots/0123abcd"
    with es.sglang(sglang_state(pair, drafter=snapshot)) as server:
        assert smoke(*engine_args(pair, "sglang", server.url)).code == 0


def test_a_drafter_the_engines_release_refuses_is_refused_before_any_request_naming_the_engine_that_serves_it(
    smoke, pair, tmp_path
):
    """The bundled SmolLM2 drafter's second version tapped the target's last layer, which SGLang's newest release
    cannot feed (LC148): smoke --engine sglang says so, with validate's finding, instead of measuring a server that
    fails on its first batch; vLLM's newest release serves it, and the refusal says so."""
    bundled = REPO / "examples" / "smollm2-lilicorr"
    config = json.loads((bundled / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 8, 15, 22, 29]
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copyfile(bundled / "model.safetensors", tmp_path / "model.safetensors")
    drafter = str(tmp_path)
    state = sglang_state(pair, drafter=drafter)
    with es.sglang(state) as server:
        result = smoke(
            drafter, "-t", str(pair.target), "--engine", f"sglang={server.url}", *RUN, "--format", "junit"
        )
    assert result.code == 1, result.stderr
    assert f"SGLang {es.SGLANG_VERSION} refuses" in result.stderr
    assert "LC148 target-layer-ids-last-layer" in result.stderr
    assert f"vLLM {es.VLLM_VERSION} serves it" in result.stderr and "--engine vllm=URL" in result.stderr
    assert "<failure" in result.stdout and "LC148" in result.stdout
    assert state.calls == []  # not even the server's health was asked


def test_vllm_without_its_dev_mode_server_info_is_measured_and_says_what_was_checked(smoke, pair):
    with es.vllm(vllm_state(pair, dev_mode=False)) as server:
        result = smoke(*engine_args(pair, "vllm", server.url, "--format", "json"))
    assert result.code == 0, result.stderr
    engine = result.report["engine"]
    assert engine["served_drafter"] is None and "VLLM_SERVER_DEV_MODE=1" in engine["drafter_check"]
    assert result.gate("engine-tau")["status"] == "skip"  # no reference given


def test_503_and_429_are_retried_with_backoff_and_give_up_bounded(smoke, pair):
    refusals = {"left": 3}

    def busy(handler) -> bool:
        if refusals["left"] <= 0:
            return False
        refusals["left"] -= 1
        status = 503 if refusals["left"] % 2 else 429
        handler.send(status, {"error": {"message": "busy", "code": status}}, headers={"Retry-After": "0"})
        return True

    state = sglang_state(pair)
    state.hooks[("POST", "/generate")] = busy
    with es.sglang(state) as server:
        result = smoke(*engine_args(pair, "sglang", server.url, "--format", "json"))
    assert result.code == 0, result.stderr
    assert state.calls.count(("POST", "/generate")) == 1 + 6 + 3  # warm-up, the probes, three refused tries
    state = sglang_state(pair)
    state.hooks[("GET", "/health")] = lambda h: h.send(503, b"", "text/plain", {"Retry-After": "0"}) or True
    started = time.monotonic()
    with es.sglang(state) as server:
        down = smoke(*engine_args(pair, "sglang", server.url))
    assert down.code == 2 and "answered HTTP 503 to 6 attempts" in down.stderr and "/health" in down.stderr
    assert state.calls.count(("GET", "/health")) == 6 and time.monotonic() - started < 20


def test_an_unreachable_or_wrong_server_exits_2_with_the_launch_command(smoke, pair):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    result = smoke(*[a for a in engine_args(pair, "sglang", f"http://127.0.0.1:{port}") if a != "--quiet"])
    assert result.code == 2
    assert (
        f"nothing answers at http://127.0.0.1:{port}" in result.stderr
        and "connection refused" in result.stderr
    )
    assert "python -m sglang.launch_server" in result.stderr and "Traceback" not in result.stderr
    with es.vllm(vllm_state(pair)) as server:  # SGLang asked of a vLLM server
        wrong = smoke(*engine_args(pair, "sglang", server.url))
    assert wrong.code == 2 and "not an SGLang server" in wrong.stderr and "--engine vllm=URL" in wrong.stderr


def test_above_concurrency_1_vllm_reports_the_runs_aggregate_and_sglang_still_per_request(smoke, pair):
    state = vllm_state(pair)
    with es.vllm(state) as server:
        result = smoke(
            *engine_args(
                pair, "vllm", server.url, "--concurrency", "3", "--baseline", pair.profile, "--format", "json"
            )
        )
    assert result.code == 0, result.stderr
    report = result.report
    steps, accepted, positions = true_counts(state.model)
    assert (report["acceptance"]["blocks"], report["acceptance"]["accepted"]) == (steps, accepted)
    assert report["per_request"] is False and report["per_category"] == {}
    assert report["acceptance"]["mean_accept_length_per_request"] is None
    assert all(r["blocks"] is None and r["tau"] is None for r in report["requests"])
    assert report["throughput"]["concurrency"] == 3 and report["measurement_conditions"]["concurrency"] == 3
    # the engine's timing of the whole run: its latency histogram's delta over all six requests
    assert report["throughput"]["engine_time_s"] == pytest.approx(
        es.SECONDS_PER_TOKEN * report["throughput"]["tokens"]
    )
    assert all(r["engine_latency_s"] is None for r in report["requests"])
    assert "sqrt(2)" in report["reference"]["tolerance_source"]
    state = sglang_state(pair)
    with es.sglang(state) as server:
        sg = smoke(*engine_args(pair, "sglang", server.url, "--concurrency", "3", "--format", "json"))
    assert sg.code == 0 and sg.report["per_request"] is True
    assert all(r["blocks"] is not None for r in sg.report["requests"])


def test_a_vllm_server_shared_with_another_client_is_not_measured_per_request(smoke, pair):
    state = vllm_state(pair)

    def another_client(handler) -> bool:
        state.record([pair.n] * 50)  # someone else's long request lands in our counters
        return False

    state.hooks[("POST", "/v1/completions")] = another_client
    with es.vllm(state) as server:
        result = smoke(*engine_args(pair, "vllm", server.url))
    assert result.code == 2 and "another client is using the server" in result.stderr


@pytest.mark.parametrize("how", ["env", "flag"])
def test_the_api_key_is_sent_and_never_printed(smoke, pair, tmp_path, monkeypatch, how):
    flag = ("--api-key", KEY) if how == "flag" else ()
    if how == "env":
        monkeypatch.setenv("LILICORR_ENGINE_API_KEY", KEY)
    outputs = []
    formats = (
        ("text", "json", "junit") if how == "flag" else ("text",)
    )  # the key is read once, whatever its source
    for kind, serve, state in (
        ("sglang", es.sglang, sglang_state(pair, api_key=KEY)),
        ("vllm", es.vllm, vllm_state(pair, api_key=KEY)),
    ):
        with serve(state) as server:
            for fmt in formats:
                out = tmp_path / f"{kind}-{fmt}.json"
                result = smoke(
                    *engine_args(
                        pair,
                        kind,
                        server.url,
                        *flag,
                        "--format",
                        fmt,
                        "--output",
                        out,
                        "--baseline",
                        pair.profile,
                    )
                )
                assert result.code == 0, result.stderr
                outputs += [result.stdout, result.stderr, out.read_text()]
    assert not any(KEY in text for text in outputs)
    # a server that echoes the key in its errors: masked
    state = sglang_state(pair, api_key=KEY)
    state.hooks[("POST", "/generate")] = lambda h: (
        h.send(400, {"error": f"bad request from key {KEY}"}) or True
    )
    with es.sglang(state) as server:
        echoed = smoke(*engine_args(pair, "sglang", server.url, *flag))
    assert echoed.code == 2 and "bad request from key ***" in echoed.stderr and KEY not in echoed.stderr
    monkeypatch.delenv("LILICORR_ENGINE_API_KEY", raising=False)
    with es.vllm(vllm_state(pair, api_key=KEY)) as server:
        missing = smoke(*engine_args(pair, "vllm", server.url))
        wrong = smoke(*engine_args(pair, "vllm", server.url, "--api-key", KEY[::-1]))
    assert (
        missing.code == 2
        and "wants an API key" in missing.stderr
        and "LILICORR_ENGINE_API_KEY" in missing.stderr
    )
    assert wrong.code == 2 and "the key given was refused" in wrong.stderr and KEY[::-1] not in wrong.stderr


def test_hostile_replies_end_the_run_with_exit_2_and_bounded_memory(smoke, pair):
    def endless(handler) -> bool:  # a chunked reply that never ends
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        chunk = b"[" * 65536
        try:
            for _ in range(1000):  # 64 MiB, more than any limit
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the client stopped reading, as it should
        return True

    def huge_length(handler) -> bool:
        handler.send_response(200)
        handler.send_header("Content-Length", str(10**12))
        handler.end_headers()
        return True

    def slow(handler) -> bool:
        time.sleep(3)
        return False

    def html(handler) -> bool:
        handler.send(200, "<html><body>proxy login</body></html>", "text/html")
        return True

    def bad_histogram(handler) -> bool:
        handler.send(
            200,
            {
                "output_ids": [5, 6],
                "meta_info": {
                    "completion_tokens": 2,
                    "prompt_tokens": 3,
                    "spec_verify_ct": 1,
                    "spec_num_correct_drafts": 0,
                    "spec_correct_drafts_histogram": [0, 5],
                },
            },
        )
        return True

    def negative_latency(handler) -> bool:
        handler.send(
            200,
            {
                "output_ids": [5, 6],
                "meta_info": {
                    "completion_tokens": 2,
                    "prompt_tokens": 3,
                    "spec_verify_ct": 1,
                    "spec_num_correct_drafts": 1,
                    "e2e_latency": -3.0,
                },
            },
        )
        return True

    cases = [
        (("GET", "/server_info"), endless, "more than"),
        (("GET", "/server_info"), huge_length, "1000000000000 bytes"),
        (("POST", "/generate"), slow, "did not answer within 0.5 s"),
        (("GET", "/server_info"), html, "is not JSON"),
        (("POST", "/generate"), bad_histogram, "is [0, 5], whose steps add up to 5, not spec_verify_ct 1"),
        (("POST", "/generate"), negative_latency, "e2e_latency is -3.0, not the seconds a request took"),
    ]
    for route, hook, message in cases:
        state = sglang_state(pair)
        state.hooks[route] = hook
        with es.sglang(state) as server:
            result = smoke(*engine_args(pair, "sglang", server.url, "--timeout", "0.5", "--no-warmup"))
        assert result.code == 2, (message, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr


def test_a_request_the_server_rejects_names_the_servers_reason(smoke, pair):
    state = sglang_state(pair)
    state.hooks[("POST", "/generate")] = lambda h: (
        h.send(
            400, {"error": {"message": "The input (9000 tokens) is longer than the model's context length"}}
        )
        or True
    )
    with es.sglang(state) as server:
        result = smoke(*engine_args(pair, "sglang", server.url))
    assert result.code == 2 and "answered HTTP 400: The input (9000 tokens) is longer" in result.stderr


def test_a_prompt_longer_than_the_servers_context_is_refused_before_any_generation(smoke, pair):
    state = vllm_state(pair, max_model_len=30)
    with es.vllm(state) as server:
        result = smoke(*engine_args(pair, "vllm", server.url))
    assert result.code == 2 and "exceed the server's 30 positions" in result.stderr
    assert ("POST", "/v1/completions") not in state.calls


def test_the_reference_must_have_been_measured_under_the_same_conditions(smoke, pair):
    with es.sglang(sglang_state(pair)) as server:
        other = smoke(
            *engine_args(
                pair,
                "sglang",
                server.url,
                "--baseline",
                pair.profile,
                "--max-new-tokens",
                "20",
                "--format",
                "json",
            )
        )
    assert other.code == 1
    gate = other.gate("engine-tau")
    assert gate["status"] == "fail" and "measured under other conditions" in gate["summary"]
    assert "max_new_tokens: reference 24, this run 20" in gate["details"]


def test_bad_baselines_exit_2(smoke, pair, tmp_path):
    engine_report = tmp_path / "engine.json"
    with es.sglang(sglang_state(pair)) as server:
        assert smoke(*engine_args(pair, "sglang", server.url, "--output", engine_report)).code == 0
        for path, message in (
            (engine_report, "is an engine report"),
            (tmp_path / "none.json", "does not exist"),
        ):
            result = smoke(*engine_args(pair, "sglang", server.url, "--baseline", path))
            assert result.code == 2 and message in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--engine", "tgi=http://x"), "--engine takes sglang=URL or vllm=URL"),
        (("--engine", "sglang"), "--engine takes sglang=URL or vllm=URL"),
        (("--engine", "sglang=ftp://host"), "scheme must be http or https"),
        (("--engine", "vllm=http://me:hunter22@host:8000"), "credentials do not go in the URL"),
        (("--engine", "vllm=http://host", "--concurrency", "0"), "--concurrency must be in [1, 256]"),
        (("--engine", "vllm=http://host", "--gpu"), "add --reference"),
        (("--engine", "vllm=http://host", "--reference", "--baseline", "x.json"), "choose one"),
        (("--engine", "sglang=http://host", "-k", "3"), "does not apply to --engine sglang"),
        (("--engine", "sglang=http://host", "--runtime", "vllm"), "validated for the engine it is served by"),
        (
            ("--engine", "vllm=http://host", "--batch", "4"),
            "--batch with --engine applies to the reference run",
        ),
        (
            (
                "--concurrency",
                "2",
            ),
            "apply with --engine only",
        ),
    ],
)
def test_engine_usage_errors_exit_4_before_any_request(smoke, pair, args, message):
    result = smoke(str(pair.drafter), "-t", str(pair.target), *args)
    assert result.code == 4 and message in result.stderr
    assert "hunter22" not in result.stderr


def test_reference_decodes_the_probes_here_and_compares(smoke, pair):
    first = next(
        r for r in pair.report.requests if r.category == "code"
    )  # one probe: the reference run is short
    with es.sglang(sglang_state(pair)) as server:
        result = smoke(
            *engine_args(
                pair,
                "sglang",
                server.url,
                "--reference",
                "--probes",
                "code",
                "--limit",
                "1",
                "--format",
                "json",
            )
        )
    assert result.code == 0, result.stderr
    ref = result.report["reference"]
    assert (
        ref["source"] == "this run (--reference)" and ref["conditions_match"] and ref["paired_requests"] == 1
    )
    # the same CPU decoding as the module's reference run, deterministic
    assert ref["overall"]["reference"] == pytest.approx(first.tau["head"], abs=1e-6)
    assert ref["greedy_requests_equal"] == 1


def test_sampled_runs_send_each_seed_and_skip_the_token_comparison(smoke, pair):
    state = vllm_state(pair)
    with es.vllm(state) as server:
        result = smoke(
            *engine_args(
                pair, "vllm", server.url, "--temperature", "0.7", "--seeds", "3,4", "--format", "json"
            )
        )
    assert result.code == 0, result.stderr
    assert sorted({b["seed"] for b in state.bodies[1:]}) == [3, 4] and len(state.bodies) == 1 + 12
    assert result.gate("engine-tokens")["status"] == "skip"
    assert all(b["temperature"] == 0.7 and b["top_k"] == 0 for b in state.bodies)


def test_engine_mode_runs_without_torch(pair, tmp_path):
    """A fresh interpreter where torch cannot be imported (as without the runtime extra) runs a whole engine
    measurement: the tokenizer comes from transformers alone."""
    state = sglang_state(pair)
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from lilicorr_ckpt.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    print('TORCH', any(m == 'torch' or m.startswith('torch.') for m, v in sys.modules.items() "
        "if v is not None), file=sys.stderr)\n    raise\n"
    )
    with es.sglang(state) as server:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                script,
                "smoke",
                *engine_args(pair, "sglang", server.url, "--baseline", pair.profile),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    assert done.returncode == 0, done.stderr
    assert "TORCH False" in done.stderr and "PASS  engine-tau" in done.stdout


INTERRUPTED = """
import os, signal, sys, threading, time
from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.smoke.engine.run import _decode
from lilicorr_ckpt.smoke.options import SmokeOptions
from lilicorr_ckpt.smoke.probes import Probe

class Slow:  # a server whose requests outlast the test
    def generate(self, *args):
        time.sleep(60)

jobs = [(Probe(id=f"p{i}", category="code", prompt="x", chat=False), 0, [1, 2]) for i in range(4)]
threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGINT)).start()
try:
    _decode(Slow(), jobs, SmokeOptions(path="d", target="t", warmup=False), [2], 2, Progress(enabled=False, name="s"),
            print)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_ctrl_c_at_concurrency_above_1_ends_the_run_without_waiting_for_the_requests_in_flight():
    """Requests in flight at --concurrency N must not hold the process after a Ctrl-C (a thread pool's workers are
    joined at exit: up to --timeout seconds, 300 by default)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 130, done.stderr
    assert time.monotonic() - started < 20, "the interrupted run waited for its requests in flight"


def test_an_sglang_without_the_per_request_histogram_still_gives_tau(smoke, pair):
    state = sglang_state(pair, histogram=False)
    with es.sglang(state) as server:
        result = smoke(*engine_args(pair, "sglang", server.url, "--format", "json"))
    assert result.code == 0, result.stderr
    steps, accepted, _ = true_counts(state.model)
    acc = result.report["acceptance"]
    assert (acc["blocks"], acc["accepted"]) == (steps, accepted) and acc["marginal_accept_rates"] is None
    with es.sglang(sglang_state(pair, histogram=False)) as server:
        floors = smoke(
            *engine_args(pair, "sglang", server.url, "--min-accept-rates", "0.0", "--format", "json")
        )
    assert floors.gate("min-accept-rates")["status"] == "fail"  # no per-position counts to hold to a floor


def test_progress_and_the_launch_command_go_to_stderr(pair):
    import io

    from lilicorr_ckpt.console import Progress
    from lilicorr_ckpt.smoke.engine.run import EngineOptions, run_engine
    from lilicorr_ckpt.smoke.engine.transport import parse_engine

    stream, said = io.StringIO(), []
    with es.vllm(vllm_state(pair)) as server:
        report = run_engine(
            SmokeOptions(path=str(pair.drafter), target=str(pair.target), limit=2, max_new_tokens=24),
            EngineOptions(endpoint=parse_engine(f"vllm={server.url}")),
            Progress(enabled=True, stream=stream, interval=0, name="smoke"),
            said.append,
        )
    assert report.passed and "6/6" in stream.getvalue() and "checking the server" in stream.getvalue()
    assert (
        said
        and said[0].startswith(f"engine: {server.url} must serve this drafter")
        and "vllm serve" in said[0]
    )
