"""The runtime captures CUDA graphs in one place (lilicorr_runtime/graphs.py): no other module builds a graph or a
capture stream, and the helper orders its streams as the capture sites did (checked on the CPU with a recording
stand-in for torch.cuda; the captures themselves run in the GPU tests)."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path
from types import SimpleNamespace

from lilicorr_runtime import graphs

RUNTIME = Path(graphs.__file__).parent
CAPTURE_CALLS = {"CUDAGraph", "graph", "capture_begin", "capture_end", "make_graphed_callables"}


def _captures(path: Path) -> list[str]:
    """torch.cuda.CUDAGraph(), torch.cuda.graph(...), .capture_begin()/.capture_end() calls in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CAPTURE_CALLS
        ):
            target = node.func.value
            cuda = isinstance(target, ast.Attribute) and target.attr == "cuda"
            if node.func.attr in ("capture_begin", "capture_end") or cuda:
                found.append(f"{path.relative_to(RUNTIME)}:{node.lineno}: {ast.unparse(node.func)}")
    return found


def test_no_module_but_graphs_py_captures_a_graph():
    found = [
        hit for path in sorted(RUNTIME.rglob("*.py")) if path.name != "graphs.py" for hit in _captures(path)
    ]
    assert not found, "capture through lilicorr_runtime.graphs:\n" + "\n".join(found)
    assert _captures(RUNTIME / "graphs.py")  # the scan does see a capture


class _Recorder:
    """torch.cuda as far as graphs.py uses it, logging what happens in which order."""

    def __init__(self):
        self.log: list[str] = []
        self.current = "main"
        recorder = self

        class Stream:
            count = 0

            def __init__(self, device=None):
                Stream.count += 1
                self.name = f"side{Stream.count}"
                recorder.log.append(f"new {self.name} on {device}")

            def wait_stream(self, other):
                recorder.log.append(f"{self.name} waits for {other.name}")

        class Graph:
            def capture_begin(self):
                recorder.log.append(f"begin on {recorder.current}")

            def capture_end(self):
                recorder.log.append(f"end on {recorder.current}")

        @contextlib.contextmanager
        def stream(s):
            before, recorder.current = recorder.current, s.name
            try:
                yield
            finally:
                recorder.current = before

        def current_stream(device=None):
            return SimpleNamespace(
                name=self.current,
                wait_stream=lambda other: self.log.append(f"{self.current} waits for {other.name}"),
            )

        self.cuda = SimpleNamespace(
            Stream=Stream, CUDAGraph=Graph, stream=stream, current_stream=current_stream
        )


def test_warm_up_then_capture_order_their_streams(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(graphs.torch, "cuda", rec.cuda)

    def run():
        rec.log.append(f"run on {rec.current}")
        return "outputs"

    graphs.warm_up(run)
    graph, out = graphs.capture(run, device="cuda:1")
    assert out == "outputs" and isinstance(graph, rec.cuda.CUDAGraph)
    assert rec.log == [
        "new side1 on None",
        "side1 waits for main",
        "run on side1",
        "run on side1",
        "main waits for side1",
        "new side2 on cuda:1",
        "side2 waits for main",
        "begin on side2",
        "run on side2",
        "end on side2",
        "main waits for side2",
    ]


def test_a_failing_capture_still_ends_it(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(graphs.torch, "cuda", rec.cuda)

    def broken():
        raise RuntimeError("not capturable")

    try:
        graphs.capture(broken)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the capture's error must reach the caller (the sites fall back to eager)")
    assert rec.log[-1] == "end on side1"
