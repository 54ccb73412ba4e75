"""The names smoke --engine and its loopback servers use, against the released code of the newest SGLang and vLLM
releases lilicorr_ckpt.runtimes lists (the versions the loopback servers report).

The wheels come from tests/conformance/engines.py (downloaded once into .cache/engines; a failed download skips
these tests, and fails them under CI=true). Each check parses the released source with `ast`, so a field, route,
metric or label renamed in a new release fails here, naming it, instead of in a user's run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import engine_servers as es
import msgspec
import pytest
from conformance.engines import sources

from lilicorr_ckpt.smoke.engine import servers
from lilicorr_ckpt.smoke.engine.transport import Client, Endpoint


def _tree(root: Path, relative: str) -> ast.Module:
    return ast.parse((root / relative).read_text())


def _class_fields(tree: ast.Module, name: str) -> set[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    raise AssertionError(f"no class {name} in the released source")


def _routes(tree: ast.Module) -> set[tuple[str, str]]:
    """(method, path) of every @app.get / @router.post / @app.api_route(..., methods=[...]) decorator."""
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for d in node.decorator_list:
            if not (
                isinstance(d, ast.Call)
                and isinstance(d.func, ast.Attribute)
                and d.args
                and isinstance(d.args[0], ast.Constant)
            ):
                continue
            path, verb = d.args[0].value, d.func.attr
            if verb in ("get", "post", "put"):
                out.add((verb.upper(), path))
            elif verb == "api_route":
                methods = next((k.value for k in d.keywords if k.arg == "methods"), None)
                for m in methods.elts if isinstance(methods, ast.List) else ():
                    out.add((m.value, path))
    return out


def _strings(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _dict_keys(tree: ast.AST) -> set[str]:
    return {
        k.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Dict)
        for k in n.keys
        if isinstance(k, ast.Constant) and isinstance(k.value, str)
    }


def _subscript_keys(tree: ast.AST, variable: str) -> set[str]:
    """Keys written as variable["key"] = ... anywhere in the tree."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if (
                    isinstance(t, ast.Subscript)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == variable
                    and isinstance(t.slice, ast.Constant)
                ):
                    out.add(t.slice.value)
    return out


def _function(tree: ast.Module, name: str) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise AssertionError(f"no function {name} in the released source")


def _struct_fields(kind: type) -> set[str]:
    return {f.name for f in msgspec.structs.fields(kind)}


@pytest.fixture(scope="module")
def sglang() -> Path:
    return sources("sglang") / "sglang"


@pytest.fixture(scope="module")
def vllm() -> Path:
    return sources("vllm") / "vllm"


def _client(kind: str) -> Client:
    return Client(Endpoint(kind=kind, scheme="http", host="127.0.0.1", port=1, base_path=""), api_key=None)


def test_sglang_routes_exist(sglang):
    routes = _routes(_tree(sglang, "srt/entrypoints/http_server.py"))
    assert routes >= es.SGLANG_ROUTES, es.SGLANG_ROUTES - routes
    auth = _strings(_tree(sglang, "srt/utils/auth.py"))
    assert set(es.SGLANG_OPEN_PREFIXES) <= auth


def test_sglang_generate_request_is_what_the_release_parses(sglang):
    api = _tree(sglang, "api/v1/api_types.py")
    sampling = _class_fields(api, "SamplingParams")
    assert sampling == es.SGLANG_SAMPLING_FIELDS  # the loopback rejects exactly the keys the release rejects
    generate = _class_fields(api, "GenerateRequest")
    assert generate >= es.SGLANG_GENERATE_FIELDS
    body = servers.SGLang(_client("sglang"), 16).body([1, 2], 8, 0.5, 3, [2], "rid")
    assert set(body) <= generate and set(body["sampling_params"]) <= sampling


def test_sglang_reply_and_meta_info_fields_are_the_releases(sglang):
    manager = _tree(sglang, "srt/managers/tokenizer_manager.py")
    meta = _subscript_keys(manager, "meta_info") | _dict_keys(manager)
    spec = _subscript_keys(_function(manager, "_calculate_spec_decoding_metrics"), "meta_info")
    assert spec >= es.SGLANG_SPEC_KEYS, es.SGLANG_SPEC_KEYS - spec
    assert meta >= es.SGLANG_META_KEYS, es.SGLANG_META_KEYS - meta
    client_meta = _struct_fields(servers.SGLangMeta)
    assert client_meta <= meta | spec, client_meta - meta - spec
    reply = _dict_keys(manager) | _subscript_keys(manager, "out_dict")
    assert reply >= es.SGLANG_REPLY_KEYS and _struct_fields(servers.SGLangReply) <= reply
    finish = _dict_keys(_tree(sglang, "srt/managers/schedule_batch.py"))
    assert finish >= es.SGLANG_FINISH_KEYS and _struct_fields(servers.SGLangFinish) <= finish


def test_sglang_server_info_fields_are_server_arguments(sglang):
    fields: set[str] = set()
    for path in sorted((sglang / "srt/arg_groups/fields").glob("*.py")):
        tree = ast.parse(path.read_text())
        fields |= {
            s.target.id
            for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef)
            for s in n.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        }
    server_info = _dict_keys(_function(_tree(sglang, "srt/entrypoints/http_server.py"), "server_info"))
    assert fields >= es.SGLANG_SERVER_FIELDS, es.SGLANG_SERVER_FIELDS - fields
    assert "version" in server_info
    assert _struct_fields(servers.SGLangServerInfo) <= fields | server_info


def test_vllm_routes_exist(vllm):
    routes: set[tuple[str, str]] = set()
    for path in sorted((vllm / "entrypoints").rglob("*.py")):
        routes |= _routes(ast.parse(path.read_text()))
    wanted = es.VLLM_ROUTES - {("GET", "/metrics")}
    assert wanted <= routes, wanted - routes
    metrics = _tree(vllm, "entrypoints/serve/instrumentator/metrics.py")
    assert any(
        isinstance(n, ast.Call)
        and getattr(n.func, "id", None) == "Mount"
        and n.args
        and isinstance(n.args[0], ast.Constant)
        and n.args[0].value == "/metrics"
        for n in ast.walk(metrics)
    )
    guarded = next(
        n.value
        for n in ast.walk(_tree(vllm, "entrypoints/serve/middleware/authenticate.py"))
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "GUARDED_PREFIX"
    )
    assert ast.literal_eval(guarded) == es.VLLM_GUARDED_PREFIX


def test_vllm_completion_request_and_reply_fields_are_the_releases(vllm):
    protocol = _tree(vllm, "entrypoints/openai/completion/protocol.py")
    request = _class_fields(protocol, "CompletionRequest")
    body = servers.VLLM(_client("vllm"), 16).body([1, 2], 8, 0.5, 3, [2])
    assert request >= es.VLLM_REQUEST_FIELDS and set(body) <= request, set(body) - request
    choice = _class_fields(protocol, "CompletionResponseChoice")
    assert choice >= es.VLLM_CHOICE_FIELDS and _struct_fields(servers.VLLMChoice) <= choice
    assert {"choices", "usage"} <= _class_fields(protocol, "CompletionResponse")
    engine = _tree(vllm, "entrypoints/serve/engine/protocol.py")
    usage = _class_fields(engine, "UsageInfo")
    assert usage >= es.VLLM_USAGE_FIELDS and _struct_fields(servers.VLLMUsage) <= usage
    card = _class_fields(engine, "ModelCard")
    assert card >= es.VLLM_MODEL_CARD_FIELDS and _struct_fields(servers.VLLMModel) <= card
    assert "data" in _class_fields(engine, "ModelList")


def test_vllm_metric_and_label_names_are_the_releases(vllm):
    metrics = _tree(vllm, "v1/spec_decode/metrics.py")
    prom = next(n for n in ast.walk(metrics) if isinstance(n, ast.ClassDef) and n.name == "SpecDecodingProm")
    names = {s for s in _strings(prom) if s.startswith("vllm:spec_decode_")}
    assert set(es.VLLM_COUNTERS) | {es.VLLM_PER_POS} <= names, set(es.VLLM_COUNTERS) - names
    assert {servers.DRAFTS, servers.DRAFT_TOKENS, servers.ACCEPTED, servers.ACCEPTED_PER_POS} <= names
    assert es.VLLM_POSITION_LABEL == servers.POSITION_LABEL and servers.POSITION_LABEL in _strings(prom)
    loggers = _tree(vllm, "v1/metrics/loggers.py")
    labelnames = [
        ast.literal_eval(n.value)
        for n in ast.walk(loggers)
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "labelnames"
    ]
    assert list(es.VLLM_LABELS) in labelnames
    # the engine's own request timing: a histogram (its _sum and _count samples are what the client reads)
    histograms = {
        k.value.value
        for n in ast.walk(loggers)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "_histogram_cls"
        for k in n.keywords
        if k.arg == "name" and isinstance(k.value, ast.Constant)
    }
    assert es.VLLM_E2E_LATENCY == servers.E2E_LATENCY and servers.E2E_LATENCY in histograms


def test_vllm_server_info_and_its_speculative_config(vllm):
    spec = _class_fields(_tree(vllm, "config/speculative.py"), "SpeculativeConfig")
    assert spec >= es.VLLM_SPEC_CONFIG_FIELDS and _struct_fields(servers.VLLMSpeculativeConfig) <= spec
    config = _class_fields(_tree(vllm, "config/vllm.py"), "VllmConfig")
    assert config >= es.VLLM_CONFIG_FIELDS and _struct_fields(servers.VLLMConfig) <= config
    assert _struct_fields(servers.VLLMModelConfig) <= _class_fields(
        _tree(vllm, "config/model.py"), "ModelConfig"
    )
    info = _tree(vllm, "entrypoints/serve/dev/server_info/api_router.py")
    assert {"vllm_config"} <= _dict_keys(info) and "config_format" in {
        a.arg for n in ast.walk(info) if isinstance(n, ast.AsyncFunctionDef) for a in n.args.args
    }
    version = _dict_keys(_tree(vllm, "entrypoints/serve/instrumentator/basic.py"))
    assert _struct_fields(servers.VLLMVersion) <= version
