"""The missing-extra hint names a command that works on this machine (issue 40): lilicorr-ckpt is not on PyPI, so
the extra installs from where this copy came from, and without an NVIDIA driver the CPU torch wheel comes first."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

from lilicorr_ckpt import install
from lilicorr_ckpt.install import CPU_INDEX, extra_spec, install_command

from helpers import REPO


@pytest.mark.parametrize(
    ("system", "cuda", "cpu_first"),
    [("Linux", False, True), ("Windows", False, True), ("Linux", True, False), ("Darwin", False, False)],
)
def test_the_cpu_wheel_comes_first_where_there_is_no_cuda(system, cuda, cpu_first):
    command = install_command(system=system, cuda=cuda, source="/src/lilicorr-ckpt")
    steps = command.split(" && ")
    assert steps[-1] == "pip install '/src/lilicorr-ckpt[runtime]'"
    assert (steps[0] == f"pip install torch --index-url {CPU_INDEX}") is cpu_first
    assert len(steps) == (2 if cpu_first else 1)


def test_the_extra_installs_from_where_this_copy_came_from():
    assert extra_spec(None) == "'.[runtime]'"  # not known: the checkout it runs from
    assert extra_spec("/home/me/lilicorr ckpt") == "'/home/me/lilicorr ckpt[runtime]'"
    git = "git+https://example.org/acme/lilicorr-ckpt@0123abc"
    assert extra_spec(git) == f"'lilicorr-ckpt[runtime] @ {git}'"
    assert "lilicorr-ckpt[runtime]'" not in install_command(system="Linux", cuda=True, source=None)


def test_installed_from_reads_pips_record(monkeypatch):
    class Dist:
        def __init__(self, text):
            self.text = text

        def read_text(self, name):
            assert name == "direct_url.json"
            return self.text

    for record, expected in (
        ({"url": "file:///work/my%20checkout", "dir_info": {"editable": True}}, "/work/my checkout"),
        (
            {"url": "https://example.org/acme/lilicorr-ckpt", "vcs_info": {"vcs": "git", "commit_id": "abc"}},
            "git+https://example.org/acme/lilicorr-ckpt@abc",
        ),
        ({"url": "https://files.example.org/lilicorr_ckpt-0.1.0.whl", "archive_info": {}}, None),
    ):
        monkeypatch.setattr(importlib.metadata, "distribution", lambda name, r=record: Dist(json.dumps(r)))
        assert install.installed_from() == expected
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Dist(None))
    assert install.installed_from() is None


def test_the_driver_is_found_without_importing_torch(monkeypatch):
    monkeypatch.setattr(install.shutil, "which", lambda name: None)
    monkeypatch.setattr(install.os.path, "exists", lambda path: False)
    assert not install.has_nvidia_driver()
    assert install.cpu_wheel_needed("Linux")
    monkeypatch.setattr(
        install.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None
    )
    assert install.has_nvidia_driver() and not install.cpu_wheel_needed("Linux")
    code = "import sys, lilicorr_ckpt.install as i; i.runtime_hint('smoke'); print('torch' in sys.modules)"
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert ran.stdout.strip() == "False", ran.stderr


def test_smoke_without_torch_prints_the_command(tmp_path):
    """smoke with torch unimportable: exit 4 and the command for this machine (here: no NVIDIA driver, so the
    CPU wheel first, when the machine running the suite has none)."""
    blocker = tmp_path / "no-torch" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker.parent), str(REPO)])}
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "lilicorr_ckpt",
            "smoke",
            "examples/tiny-lilicorr",
            "-t",
            "examples/tiny-target",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert ran.returncode == 4, ran.stderr
    assert "smoke needs the runtime extra" in ran.stderr and "Traceback" not in ran.stderr
    expected = install_command()
    assert expected in ran.stderr
    assert (f"--index-url {CPU_INDEX}" in ran.stderr) is install.cpu_wheel_needed()
