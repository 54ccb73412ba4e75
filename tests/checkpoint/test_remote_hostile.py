"""A Hub is input: one that lies, floods, stalls or leaks cannot hang the tool, exhaust its memory, crash it,
forge its reports or put a credential in front of people. Each test served by the loopback fake Hub."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from fakehub import FakeHub, Reply, Sparse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_remote import TINY, cli

from lilicorr_ckpt.checkpoint import remote
from lilicorr_ckpt.checkpoint.source import JSON_LIMIT
from lilicorr_ckpt.checkpoint.tensors import MAX_HEADER_BYTES
from lilicorr_ckpt.checks.run import Report, validate_spec
from lilicorr_ckpt.errors import InputError, UsageError
from lilicorr_ckpt.redact import redact

CONFIG = (TINY / "config.json").read_bytes()
SHARD = (TINY / "model.safetensors").read_bytes()


def env_for(hub: FakeHub, tmp: Path, **extra: str) -> dict[str, str]:
    """The environment `cli` gives its subprocess, for the runs that need Popen."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    base.update(
        {
            "NO_COLOR": "1",
            "HF_HOME": str(tmp / "hf-home"),
            "HF_HUB_CACHE": str(tmp / "hf-cache"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "NO_PROXY": "127.0.0.1",
            "no_proxy": "127.0.0.1",
            "HF_ENDPOINT": hub.url,
            **extra,
        }
    )
    return base


_PEAK_RSS = """
import atexit, sys
def peak():  # VmHWM is this process's own high-water mark; ru_maxrss would count the parent forked from
    with open(sys.argv[1], "w") as out, open("/proc/self/status") as status:
        out.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
atexit.register(peak)
from lilicorr_ckpt.cli import main
main(sys.argv[2:])
"""


def measured(
    args: list[str], env: dict[str, str], tmp: Path, limit_fsize: int | None = None
) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS in MiB) of one command line run."""
    out, err, peak = tmp / "out.txt", tmp / "err.txt", tmp / "peak.txt"

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_fsize, limit_fsize))

    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.run(
            [sys.executable, "-c", _PEAK_RSS, str(peak), *args],
            stdout=o,
            stderr=e,
            env=env,
            preexec_fn=limits if limit_fsize is not None else None,
            timeout=120,
        )
    return proc.returncode, out.read_text(), err.read_text(), int(peak.read_text()) // 1024


def leftovers(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("lilicorr-hub-*"))


# --- credentials -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, shown",
    [
        ("http://user:pass@mirror:8080/api", "http://***@mirror:8080/api"),
        ("https://u:p@ss@hub.example/x?token=abc&y=1", "https://***@hub.example/x?token=***&y=1"),
        ("token hf_abcdefghijklmnopqrstuvwxyz0123456 leaked", "token hf_*** leaked"),
        ("Authorization: Bearer abc.def", "Authorization: ***"),
        ("got Bearer abcdef123 back", "got Bearer *** back"),
        ("cdn/x?X-Amz-Signature=deadbeef&X-Amz-Date=1", "cdn/x?X-Amz-Signature=***&X-Amz-Date=1"),
        (
            "hf_transfer and hf_quant_config.json, basic checks",
            "hf_transfer and hf_quant_config.json, basic checks",
        ),
        ("user@example.com wrote org/name@v1", "user@example.com wrote org/name@v1"),
    ],
)
def test_redact(text, shown):
    assert redact(text) == shown


def test_a_password_in_hf_endpoint_reaches_no_report_and_no_message(tmp_path):
    secret = "pa55-w0rd-xyz"
    with FakeHub() as hub:
        hub.add("acme/drafter", TINY)
        endpoint = hub.url.replace("http://", f"http://alice:{secret}@")
        env = {"HF_ENDPOINT": endpoint}
        ok = cli(
            "validate",
            "acme/drafter",
            "-f",
            "json",
            "--junit",
            str(tmp_path / "v.xml"),
            "--markdown",
            str(tmp_path / "v.md"),
            "--sarif",
            str(tmp_path / "v.sarif"),
            hub=hub,
            tmp=tmp_path,
            env=env,
        )
        github = cli("validate", "acme/drafter", "-f", "github", hub=hub, tmp=tmp_path, env=env)
        missing = cli("validate", "acme/none", "-f", "json", hub=hub, tmp=tmp_path, env=env)
    unreachable = cli(
        "validate", "acme/drafter", tmp=tmp_path, env={"HF_ENDPOINT": f"http://alice:{secret}@127.0.0.1:9"}
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["hub"]["endpoint"] == hub.url.replace("http://", "http://***@")
    assert missing.returncode == unreachable.returncode == 2
    assert "acme/none was not found on http://***@127.0.0.1:" in missing.stderr
    assert json.loads(missing.stdout)["error"].startswith("acme/none was not found on http://***@")
    assert "cannot reach the Hub at http://***@127.0.0.1:9" in unreachable.stderr
    texts = [r.stdout + r.stderr for r in (ok, github, missing, unreachable)]
    texts += [(tmp_path / name).read_text() for name in ("v.xml", "v.md", "v.sarif")]
    for text in texts:
        assert secret not in text and "alice" not in text


def test_a_token_a_server_echoes_back_is_redacted(tmp_path):
    token = "hf_" + "Q" * 34
    with FakeHub() as hub:
        hub.raw_info["acme/drafter"] = Reply(
            status=500,
            body=json.dumps(
                {"error": f"backend said: Authorization: Bearer {token} at https://cdn/x?token=abc123"}
            ).encode(),
        )
        result = cli("validate", "acme/drafter", hub=hub, tmp=tmp_path, env={"HF_TOKEN": token})
    assert result.returncode == 2
    assert "answered 500 for model info (a server error; try again later)" in result.stderr
    assert token not in result.stderr and "abc123" not in result.stderr
    assert "Authorization: ***" in result.stderr


# --- the commit id -----------------------------------------------------------------------------------------


def test_a_commit_id_that_is_not_40_hex_digits_is_refused(tmp_path):
    with FakeHub() as hub:
        hub.add("acme/drafter", TINY)
        forged = "0" * 40 + "\nexit-code=0\nresult=pass"
        hub.raw_info["acme/drafter"] = Reply(
            body=json.dumps({"sha": forged, "siblings": [{"rfilename": "config.json"}]}).encode()
        )
        result = cli("validate", "acme/drafter", "-f", "github-output", hub=hub, tmp=tmp_path)
    assert result.returncode == 2
    assert "not a commit id (40 hex digits)" in result.stderr and f"the Hub at {hub.url}" in result.stderr
    assert "result=pass" not in result.stdout.splitlines()
    assert [h.path for h in hub.hits] == [
        "/api/models/acme/drafter/revision/main"
    ]  # nothing read at that "commit"


# --- hangs -------------------------------------------------------------------------------------------------


def _header_read(path: str, rng: str | None) -> bool:
    return path.endswith(".safetensors") and (rng or "").startswith("bytes=8-")


@pytest.mark.parametrize(
    "sig, code, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")]
)
def test_a_signal_during_header_reads_ends_promptly_and_removes_the_stand_in(tmp_path, sig, code, word):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    with FakeHub(stall=_header_read) as hub:
        hub.add("acme/drafter", TINY)
        env = env_for(hub, tmp_path, TMPDIR=str(tmpdir))
        proc = subprocess.Popen(
            [sys.executable, "-m", "lilicorr_ckpt.cli", "validate", "acme/drafter"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert hub.stalled.wait(60), "the header read never started"
            assert leftovers(tmpdir), "the stand-in directory should exist while headers are read"
            sent = time.monotonic()
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=10)
            took = time.monotonic() - sent
        finally:
            proc.kill()
    assert proc.returncode == code and word in stderr and "Traceback" not in stderr
    assert took < 5
    assert leftovers(tmpdir) == []


def test_a_slow_loris_hub_meets_the_overall_deadline(tmp_path):
    with FakeHub(drip=(r"/config\.json$", 0.25)) as hub:  # one byte every 0.25 s: no read ever times out
        hub.add("acme/drafter", TINY)
        start = time.monotonic()
        result = cli("validate", "acme/drafter", "--timeout", "1.5", "-f", "json", hub=hub, tmp=tmp_path)
        took = time.monotonic() - start
    assert result.returncode == 2
    assert "did not finish within 1.5 s (still reading config.json)" in result.stderr
    assert "--timeout SECONDS" in result.stderr
    assert json.loads(result.stdout)["error"].startswith("acme/drafter: the Hub at")
    assert took < 1.5 + 8  # the deadline, plus starting an interpreter on a busy machine


def test_a_stalled_request_meets_its_own_timeout(tmp_path):
    with FakeHub(stall=lambda path, rng: path.startswith("/api/models/")) as hub:
        result = cli("validate", "acme/drafter", hub=hub, tmp=tmp_path, env={"HF_HUB_DOWNLOAD_TIMEOUT": "1"})
        fractional = cli(
            "validate", "acme/drafter", hub=hub, tmp=tmp_path, env={"HF_HUB_DOWNLOAD_TIMEOUT": "0.5"}
        )
    assert result.returncode == 2
    assert "did not answer within 1 s for model info (HF_HUB_DOWNLOAD_TIMEOUT" in result.stderr
    # huggingface_hub itself wants whole seconds: said so, not an internal error
    assert (
        fractional.returncode == 4
        and "HF_HUB_DOWNLOAD_TIMEOUT and HF_HUB_ETAG_TIMEOUT take whole seconds" in fractional.stderr
    )


def test_a_bad_hf_variable_is_named_by_every_command_that_reads_the_cache(tmp_path):
    bad = {"HF_HUB_DOWNLOAD_TIMEOUT": "0.5"}  # huggingface_hub parses it as an int when imported
    for args in (("inspect", "acme/drafter"), ("validate", str(TINY), "--target", "acme/target")):
        result = cli(*args, tmp=tmp_path, env=bad)
        assert result.returncode == 4, result.stderr
        assert "huggingface_hub cannot start" in result.stderr and "internal error" not in result.stderr


def test_timeout_option_is_checked_and_documented(tmp_path):
    bad = cli("validate", "acme/drafter", "--timeout", "0", tmp=tmp_path)
    assert bad.returncode == 4 and "--timeout" in bad.stderr
    shown = cli("validate", "--help", tmp=tmp_path).stdout
    assert "--timeout SECONDS" in shown and f"default: {remote.DEFAULT_TIMEOUT:g}" in shown.replace("\n", " ")


# --- memory ------------------------------------------------------------------------------------------------


def gzip_bomb(gib: int) -> bytes:
    """A gzip stream that inflates to `gib` GiB of zeros, built without ever holding them: a sync-flushed deflate
    segment of 1 MiB of zeros repeats byte for byte once the window is all zeros."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    head = c.compress(zeros) + c.flush(zlib.Z_SYNC_FLUSH)
    segment = c.compress(zeros) + c.flush(zlib.Z_SYNC_FLUSH)
    return head + segment * ((gib << 10) - 1)


def test_a_gzip_bomb_model_info_is_cut_off_at_its_cap(tmp_path):
    with FakeHub() as hub:
        hub.raw_info["acme/drafter"] = Reply(body=gzip_bomb(3), headers={"Content-Encoding": "gzip"})
        rc, _, stderr, rss = measured(["validate", "acme/drafter"], env_for(hub, tmp_path), tmp_path)
    assert rc == 2
    assert (
        f"model info from the Hub at {hub.url} is over {remote.MODEL_INFO_LIMIT} bytes decompressed" in stderr
    )
    assert rss < 400, f"peak RSS {rss} MiB"


def test_header_bytes_are_capped_in_total_before_any_header_is_fetched(tmp_path):
    n = 45 << 20  # three headers of 45 MiB: each within the per-file limit, 135 MiB together
    shards = {
        f"model-0000{i}-of-00003.safetensors": Sparse(struct.pack("<Q", n), 8 + n + 4096) for i in (1, 2, 3)
    }
    with FakeHub() as hub:
        hub.add("acme/big", {"config.json": CONFIG, **shards})
        rc, _, stderr, rss = measured(["validate", "acme/big"], env_for(hub, tmp_path), tmp_path)
    assert rc == 2
    assert (
        f"the safetensors headers come to over {MAX_HEADER_BYTES} bytes ({MAX_HEADER_BYTES >> 20} MiB, the "
        f"limit for one checkpoint's tensor table) by model-00003-of-00003.safetensors"
    ) in stderr
    for name in shards:
        assert hub.bytes_sent(name) == 8  # the length prefixes alone
    assert rss < 400, f"peak RSS {rss} MiB"


def test_a_header_over_the_local_limit_is_refused_as_locally(tmp_path):
    n = MAX_HEADER_BYTES + 1
    with FakeHub() as hub:
        hub.add("acme/big", {"config.json": CONFIG, "model.safetensors": Sparse(struct.pack("<Q", n), 8 + n)})
        result = cli("validate", "acme/big", hub=hub, tmp=tmp_path)
    assert result.returncode == 2
    assert f"model.safetensors: header length {n} is absurd (limit {MAX_HEADER_BYTES})" in result.stderr
    assert hub.bytes_sent("model.safetensors") == 8


def test_a_small_file_is_read_no_further_than_its_local_limit(tmp_path):
    with FakeHub() as hub:
        hub.add("acme/big", {"config.json": Sparse(b"{", 200 << 20), "model.safetensors": SHARD})
        result = cli("validate", "acme/big", hub=hub, tmp=tmp_path)
    assert result.returncode == 2
    assert f"config.json from the Hub at {hub.url} is over {JSON_LIMIT} bytes" in result.stderr
    assert hub.bytes_sent("config.json") < 3 * JSON_LIMIT  # the cap, and what the socket buffers took


def test_a_stand_in_the_disk_cannot_hold_names_its_file(tmp_path):
    size = 2 << 30  # the header, then a 2 GiB hole; the child may write files of 1 GiB
    shard = Sparse(SHARD[: 8 + struct.unpack("<Q", SHARD[:8])[0]], size)
    with FakeHub() as hub:
        hub.add("acme/drafter", {"config.json": CONFIG, "model.safetensors": shard})
        rc, _, stderr, _ = measured(
            ["validate", "acme/drafter"], env_for(hub, tmp_path), tmp_path, limit_fsize=1 << 30
        )
    assert rc == 2
    assert "cannot lay out the header-only stand-in of model.safetensors (2147483648 bytes, sparse)" in stderr
    assert "File too large" in stderr


# --- hostile model info and repo ids: messages, never internal errors --------------------------------------


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """In-process runs against a fake Hub (no interpreter start per case): the environment validate reads."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with FakeHub() as hub:
        sha = hub.add("acme/drafter", TINY)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub, sha, tmp_path


def info(sha: str, siblings) -> bytes:
    return json.dumps({"sha": sha, "siblings": siblings}).encode()


def good_siblings() -> list[dict]:
    return [
        {"rfilename": "config.json", "size": len(CONFIG)},
        {"rfilename": "model.safetensors", "size": len(SHARD), "lfs": {"size": len(SHARD)}},
    ]


HOSTILE_INFO = {
    "not JSON": (lambda sha: b"<html>oops</html>", "sent model info that is not JSON"),
    "a JSON array": (lambda sha: b"[1, 2]", "does not describe a repo (Expected `object`, got `array`)"),
    "no sha": (
        lambda sha: json.dumps({"siblings": good_siblings()}).encode(),
        "did not say which commit main is",
    ),
    "sha a number": (
        lambda sha: json.dumps({"sha": 5, "siblings": []}).encode(),
        "Expected `str | null`, got `int`",
    ),
    "no siblings": (lambda sha: json.dumps({"sha": sha}).encode(), "did not list the files of main"),
    "siblings an object": (
        lambda sha: info(sha, {"a": 1}),
        "Expected `array | null`, got `object` - at `$.siblings`",
    ),
    "rfilename a number": (lambda sha: info(sha, [{"rfilename": 7}]), "at `$.siblings[0].rfilename`"),
    "size a string": (
        lambda sha: info(sha, [{"rfilename": "config.json", "size": "9"}]),
        "at `$.siblings[0].size`",
    ),
    "lfs a list": (lambda sha: info(sha, [{"rfilename": "a.bin", "lfs": []}]), "at `$.siblings[0].lfs`"),
    "negative size": (
        lambda sha: info(sha, [*good_siblings()[:1], {"rfilename": "model.safetensors", "size": -5}]),
        "lists model.safetensors as -5 bytes, which is no file's size",
    ),
    "huge size": (
        lambda sha: info(sha, [{"rfilename": "model.safetensors", "size": 2**62}]),
        f"as {2**62} bytes, which is no file's size",
    ),
    "size past 64 bits": (
        lambda sha: info(sha, [{"rfilename": "config.json", "size": 2**70}]),
        f"lists config.json as {2**70} bytes, which is no file's size",
    ),
    "path traversal": (
        lambda sha: info(sha, [*good_siblings(), {"rfilename": "../../x.safetensors"}]),
        "lists a file '../../x.safetensors' with an empty, '.' or '..' component",
    ),
    "absolute path": (
        lambda sha: info(sha, [*good_siblings(), {"rfilename": "/etc/passwd"}]),
        "with an absolute or backslashed path",
    ),
    "a NUL in a name": (
        lambda sha: info(sha, [*good_siblings(), {"rfilename": "a\x00.safetensors"}]),
        "lists a file 'a\\\\x00.safetensors' with a control character",
    ),
    "a name too long": (
        lambda sha: info(sha, [*good_siblings(), {"rfilename": "x" * 300 + ".safetensors"}]),
        "with a name too long for a file system",
    ),
    "a file and a folder of one name": (
        lambda sha: info(sha, [*good_siblings(), {"rfilename": "config.json/x"}]),
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_INFO))
def test_a_hostile_model_info_is_a_message(hub_env, case):
    hub, sha, tmp = hub_env
    body, expected = HOSTILE_INFO[case]
    hub.raw_info["acme/drafter"] = Reply(body=body(sha))
    try:
        report = validate_spec("acme/drafter")
    except InputError as exc:
        assert expected is not None, f"refused: {exc}"
        assert expected in str(exc) and hub.url in str(exc)
    else:
        assert expected is None, "read as a repo"
        assert isinstance(report, Report)
    assert leftovers(tmp) == []


@pytest.mark.parametrize(
    "encoding, body, expected",
    [
        ("br", b"\x0b\x02\x80{}\x03", "sent model info with Content-Encoding 'br', which was not asked for"),
        ("gzip", b"\x1f\x8b\x08\x00 not a gzip stream", "sent model info with a corrupt gzip body"),
    ],
)
def test_a_reply_that_cannot_be_decoded_is_a_message(hub_env, encoding, body, expected):
    hub, _, _ = hub_env
    hub.raw_info["acme/drafter"] = Reply(body=body, headers={"Content-Encoding": encoding})
    with pytest.raises(InputError, match=re.escape(expected)):
        validate_spec("acme/drafter")


@pytest.mark.parametrize(
    "spec", ["adv/..", "a..b/c", "-x/y", "x/-y", "a--b/c", "org/name.git", "org/" + "n" * 100, ".x/y", "x/y."]
)
def test_a_repo_id_huggingface_hub_refuses_is_a_message(hub_env, spec):
    hub, _, _ = hub_env
    with pytest.raises(
        InputError, match=r"is not a local directory, and .* is not a Hub repo id \(a repo id is"
    ):
        validate_spec(spec)
    assert hub.hits == []


def test_an_invalid_repo_id_on_the_command_line_exits_2(tmp_path):
    result = cli("validate", "adv/..", tmp=tmp_path)
    assert (
        result.returncode == 2
        and "is not a Hub repo id" in result.stderr
        and "internal error" not in result.stderr
    )


@pytest.mark.parametrize(
    "args",
    [
        ("acme/drafter@x\x01y",),
        ("acme/drafter", "--revision", "a b"),
        ("acme/drafter", "--revision", ""),
        ("acme/drafter@",),
        ("acme/drafter@../../../etc/passwd",),
        ("acme/drafter", "--revision", "/x"),
    ],
)
def test_an_unusable_revision_is_a_usage_error(hub_env, args):
    hub, _, _ = hub_env
    with pytest.raises(UsageError):
        validate_spec(args[0], revision=args[2] if len(args) > 2 else None)
    assert hub.hits == []


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_names = st.sampled_from(
    [
        "config.json",
        "model.safetensors",
        "hf_quant_config.json",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "../x.safetensors",
        "a/b.safetensors",
        "",
        ".",
        "x\x00y",
        "\u202e.bin",
        "sub/../config.json",
        "x" * 260,
    ]
) | st.text(max_size=12)
_sibling = st.fixed_dictionaries(
    {"rfilename": _names | _json},
    optional={
        "size": st.integers(-(2**40), 2**66) | _json,
        "lfs": st.none() | st.fixed_dictionaries({"size": st.integers(-5, 2**66)}) | _json,
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    doc=st.one_of(
        _json,
        st.fixed_dictionaries(
            {"sha": st.just("SHA") | _json, "siblings": st.lists(_sibling, max_size=5) | _json}
        ),
    )
)
def test_fuzzed_model_info_never_crashes(hub_env, doc):
    hub, sha, tmp = hub_env
    if isinstance(doc, dict) and doc.get("sha") == "SHA":
        doc["sha"] = sha  # the real commit, so the files it lists can be fetched
    hub.raw_info["acme/drafter"] = Reply(body=json.dumps(doc).encode())
    try:
        report = validate_spec("acme/drafter", timeout=20)
    except (InputError, UsageError) as exc:
        assert "Traceback" not in str(exc)
    else:
        assert report.exit_code in (0, 1)
    assert leftovers(tmp) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefix=st.binary(max_size=40)
    | st.builds(
        lambda n, tail: struct.pack("<Q", n) + tail,
        st.integers(0, 2**64 - 1) | st.integers(0, 4096),
        st.binary(max_size=64),
    ),
    size=st.integers(0, 1 << 34),
    listed=st.none() | st.integers(-1, 1 << 34),
)
def test_fuzzed_shard_bytes_and_sizes_never_crash(hub_env, prefix, size, listed):
    hub, _, tmp = hub_env
    shard = Sparse(prefix, size)
    sha = hub.add("acme/fuzz", {"config.json": CONFIG, "model.safetensors": shard})
    siblings = [
        {"rfilename": "config.json", "size": len(CONFIG)},
        {"rfilename": "model.safetensors", "size": listed},
    ]
    hub.raw_info["acme/fuzz"] = Reply(body=info(sha, siblings))
    before = hub.bytes_sent("model.safetensors")  # the hub serves every example
    try:
        report = validate_spec("acme/fuzz", timeout=20)
    except (InputError, UsageError) as exc:
        assert "Traceback" not in str(exc) and "lilicorr-hub-" not in str(exc)
    else:
        assert report.exit_code in (0, 1)
    # the length prefix and at most the header it states: never tensor data
    first = shard[0:8]  # the prefix, then the zeros the file goes on with
    stated = struct.unpack("<Q", first)[0] if len(first) == 8 else 0
    assert hub.bytes_sent("model.safetensors") - before <= 8 + min(stated, MAX_HEADER_BYTES)
    assert leftovers(tmp) == []
