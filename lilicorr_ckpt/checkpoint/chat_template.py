"""A chat template rendered within bounds: a template read from a target (a GGUF's tokenizer.chat_template) is code
from the file, and transformers renders it with no limit on time or size (nested loops run for ever; a template
can print a 15 MB prompt, which the tokenizer then aborts on).

`render_chat_template` renders in jinja2's immutable sandbox set up as transformers sets up its own (trim_blocks,
lstrip_blocks, loop controls, `{% generation %}`, `tojson`, `raise_exception`, `strftime_now`, and the special
tokens as variables), so a template renders to the same text, within these bounds:

- time: MAX_SECONDS of wall clock for the compile and the render together, checked on every line the template's
  code runs (a tracing timeout: the template compiles to Python);
- size: the conversation given to it at most MAX_INPUT_CHARS (as JSON), the output at most MAX_OUTPUT_CHARS, and no
  value the template builds larger than that: string and list repetition, concatenation, %-formatting,
  str.format, replace, join, sum, indent and expandtabs are sized before they run, any integer argument larger
  than the output bound is refused, and every result is measured;
- range(): jinja2's sandbox bound (100,000 items).

Past a bound, or on any error in the template, ChatTemplateError (an InputError: exit 2 on the command line, and a
ValueError) says what happened and what to do, never an exception's class name.

Torch-free; needs jinja2 (a transformers dependency), imported here at module level: nothing in validate imports
this module."""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lilicorr_ckpt.errors import InputError

MAX_SECONDS = 2.0  # a real template renders in milliseconds
MAX_TEMPLATE_CHARS = 1 << 20  # the largest real templates (tool use, several modes) are tens of KB
MAX_INPUT_CHARS = 1 << 20  # the conversation, tools and documents as JSON: about 256k tokens of text
MAX_OUTPUT_CHARS = 1 << 20  # the rendered prompt; the tokenizer takes ~1 s on 1 MiB of adversarial text
MAX_TOJSON_INDENT = 64
FIX = "fix or remove the chat template (tokenizer.chat_template in a GGUF), or give probes without chat"


class ChatTemplateError(InputError, ValueError):
    """The chat template cannot be rendered within the bounds, or fails (exit 2; a ValueError for the runtime's
    callers)."""


class _Stop(BaseException):
    """Raised inside the template's code: a BaseException, so no `except Exception` in jinja2 swallows it."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def _too_large(what: str, size: int) -> _Stop:
    return _Stop(f"it builds {what} of {size:,} items or characters, over the limit of {MAX_OUTPUT_CHARS:,}")


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else None


def _check_result(value: Any, what: str = "a value") -> Any:
    size = _sized(value)
    if size is not None and size > MAX_OUTPUT_CHARS:
        raise _too_large(what, size)
    return value


def _check_ints(args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_OUTPUT_CHARS:
            raise _Stop(f"it passes {value:,} to a function (a width or count over {MAX_OUTPUT_CHARS:,})")


_WIDTHS = re.compile(r"\d+")


def _format_widths(spec: str) -> int:
    """The widths and precisions a format spec asks for (one of more than 9 digits counts as over any bound)."""
    return sum(int(w) if len(w) <= 9 else MAX_OUTPUT_CHARS + 1 for w in _WIDTHS.findall(spec))


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[a-zA-Z%]")
_BRACE_SPEC = re.compile(r"\{[^{}]*\}")


def _check_percent(template: str, args: Any) -> None:
    widths = sum(_format_widths(m.group(0)) for m in _PERCENT_SPEC.finditer(template))
    values = args if isinstance(args, tuple) else (args,)
    widths += sum(
        abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool) and "*" in template
    )
    if len(template) + widths > MAX_OUTPUT_CHARS:
        raise _too_large("a %-formatted string", len(template) + widths)


def _check_format(template: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    _check_ints(args, kwargs)
    widths = sum(_format_widths(m.group(0)) for m in _BRACE_SPEC.finditer(template))
    if len(template) + widths > MAX_OUTPUT_CHARS:
        raise _too_large("a formatted string", len(template) + widths)


def _check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            size = _sized(seq)
            if size is not None and isinstance(n, int) and size * n > MAX_OUTPUT_CHARS:
                raise _too_large("a repeated value", size * n)
    elif operator == "+":
        a, b = _sized(left), _sized(right)
        if a is not None and b is not None and a + b > MAX_OUTPUT_CHARS:
            raise _too_large("a concatenation", a + b)
    elif operator == "**":
        if (
            isinstance(right, int)
            and isinstance(left, (int, float))
            and abs(right) > 4096
            and abs(left) not in (0, 1)
        ):
            raise _Stop(f"it raises a number to the power {right:,}")
    elif operator == "%" and isinstance(left, str):
        _check_percent(left, right)


def _joined(separator: Any, items: Any) -> int | None:
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        return None
    return sum(len(i) for i in items) + len(str(separator)) * max(len(items) - 1, 0)


def _replaced(text: Any, old: Any, new: Any, count: Any = -1) -> int | None:
    if not isinstance(text, str) or not isinstance(old, str) or not isinstance(new, str):
        return None
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * (len(new) - len(old))


def _check_method(obj: Any, args: Sequence[Any]) -> None:
    """A str method that can multiply its input, sized before it runs."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return
    size: int | None = None
    if name == "join" and args:
        size = _joined(owner, list(args[0]) if isinstance(args[0], (list, tuple)) else args[0])
    elif name == "replace" and len(args) >= 2:
        size = _replaced(owner, *args[:3])
    elif name == "expandtabs" and args and isinstance(args[0], int):
        size = len(owner) + owner.count("\t") * args[0]
    if size is not None and size > MAX_OUTPUT_CHARS:
        raise _too_large(f"a string (str.{name})", size)


def _filter_size(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> int | None:
    """The size a filter that can multiply its input would produce, before it runs (args[0] is its input)."""
    value = args[0] if args else None
    rest = list(args[1:])
    if name == "join":
        separator = rest[0] if rest else kwargs.get("d", "")
        return _joined(separator, list(value) if isinstance(value, (list, tuple)) else value)
    if name == "replace" and len(rest) >= 2:
        return _replaced(value, *rest[:3])
    if name == "indent" and isinstance(value, str):
        width = rest[0] if rest else kwargs.get("width", 4)
        unit = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        return len(value) + (value.count("\n") + 1) * unit
    if name == "sum" and isinstance(value, (list, tuple)):
        sizes = [_sized(v) for v in value]
        if sizes and all(s is not None for s in sizes):
            return sum(s for s in sizes if s is not None)
    if name == "format" and isinstance(value, str):
        _check_percent(value, tuple(rest))
    if name == "tojson":
        indent = rest[1] if len(rest) > 1 else kwargs.get("indent")
        if isinstance(indent, int) and indent > MAX_TOJSON_INDENT:
            raise _Stop(f"it indents JSON by {indent:,} (at most {MAX_TOJSON_INDENT})")
    return None


def _guard_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    # a filter marked to take the context, eval context or environment gets it first; its input is then args[1]
    skip = 1 if getattr(function, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        plain = args[skip:]
        _check_ints(plain[1:], kwargs)
        size = _filter_size(name, plain, kwargs)
        if size is not None and size > MAX_OUTPUT_CHARS:
            raise _too_large(f"a value (|{name})", size)
        return _check_result(function(*args, **kwargs), f"a value (|{name})")

    return guarded


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (it marks assistant text for masks): the body as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # transformers' tojson: json.dumps, without jinja2's HTML escaping
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: Any) -> None:
    raise jinja2.exceptions.TemplateError(str(message))


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
        )
        self.filters["tojson"] = _tojson
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right)
        return _check_result(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja2's)
        _check_ints(args, kwargs)
        _check_method(__obj, args)
        return _check_result(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # jinja2 3.1.6+ hands out str.format / format_map as its own sandboxed function when they are looked up
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        template = value.__self__

        def sized(*args: Any, **kwargs: Any) -> str:
            _check_format(template, args, kwargs)
            return str(_check_result(wrapped(*args, **kwargs), "a formatted string"))

        return sized


_ENVIRONMENT: _BoundedSandbox | None = None


def _environment() -> _BoundedSandbox:
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        _ENVIRONMENT = _BoundedSandbox()
    return _ENVIRONMENT


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    return _environment().from_string(template)


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise _Stop in the running Python code once `seconds` have passed (checked on every call and line)."""
    end = time.monotonic() + seconds

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > end:
            raise _Stop(f"it ran for more than {seconds:g} s (a loop that does not end, or one too long)")
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(previous)


def _input_size(value: Any) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False, default=str))
    except (TypeError, ValueError, RecursionError):
        return len(repr(value))


def _refusal(problem: str) -> ChatTemplateError:
    return ChatTemplateError(f"the target's chat template cannot be rendered: {problem}; {FIX}")


def render_chat_template(
    template: str,
    messages: Sequence[Any],
    *,
    add_generation_prompt: bool = False,
    tools: Any = None,
    documents: Any = None,
    variables: dict[str, Any] | None = None,
    seconds: float = MAX_SECONDS,
) -> str:
    """`template` rendered for one conversation as transformers renders it (`variables`: the special tokens and
    any extra template arguments), within the bounds above; ChatTemplateError past one or on any failure."""
    if not isinstance(template, str):
        raise _refusal(f"it is a {type(template).__name__}, not text")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise _refusal(f"it is {len(template):,} characters long, over the limit of {MAX_TEMPLATE_CHARS:,}")
    context = {
        **(variables or {}),
        "messages": messages,
        "tools": tools,
        "documents": documents,
        "add_generation_prompt": add_generation_prompt,
    }
    size = _input_size({k: context[k] for k in ("messages", "tools", "documents")})
    if size > MAX_INPUT_CHARS:
        raise _refusal(
            f"the conversation is {size:,} characters (as JSON), over the limit of {MAX_INPUT_CHARS:,}"
        )
    pieces: list[str] = []
    total = 0
    try:
        with _deadline(seconds):
            compiled = _compiled(template)
            for piece in compiled.generate(**context):
                total += len(piece)
                if total > MAX_OUTPUT_CHARS:
                    raise _too_large("a prompt", total)
                pieces.append(piece)
    except _Stop as stop:
        raise _refusal(stop.problem) from None
    except jinja2.TemplateSyntaxError as exc:
        raise _refusal(f"it does not parse (line {exc.lineno}: {str(exc.message or exc)[:300]})") from None
    except jinja2.TemplateError as exc:
        raise _refusal(f"it fails: {str(exc.message or exc)[:300]}") from None
    except RecursionError:
        raise _refusal("it nests or recurses too deeply") from None
    except MemoryError:
        raise _refusal("it ran out of memory") from None
    except Exception as exc:  # an operation in the template failed (a bad index, a type mismatch)
        raise _refusal(f"it fails on this conversation: {str(exc)[:300] or 'an operation failed'}") from None
    return "".join(pieces)
