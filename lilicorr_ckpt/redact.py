"""Credentials never reach a report, a message or a log: one function, `redact`, applied to everything remote
reads put in front of people (the endpoint in a JSON report, every Hub error, a server's own error text).

What it removes, leaving the text around it readable:
- the userinfo of a URL: `http://user:pass@mirror/x` -> `http://***@mirror/x`;
- Hugging Face tokens (`hf_...`, `api_org_...`) wherever they appear;
- the values of query parameters that carry credentials (`?token=`, `access_token`, `X-Amz-Signature`, ...);
- Authorization values (`Authorization: Basic x`, `Bearer x`);
- the literal values of HF_TOKEN / HUGGING_FACE_HUB_TOKEN and of any token the tool itself sent (`remember`),
  in case a server echoes one back in another form.
"""

from __future__ import annotations

import os
import re
import threading

MASK = "***"
_MIN_SECRET = 6  # shorter values are no secret worth hiding, and masking them would garble ordinary words

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s@]*(?:@[^/?#\s@]*)*@")
_HF_TOKEN = re.compile(r"\b(hf_|api_org_)[A-Za-z0-9]{20,}")  # user tokens are hf_ + 34; not `hf_transfer`
_QUERY_SECRET = re.compile(
    r"(?i)([?&;](?:[a-z0-9_\-]*token|access[_-]?key|api[_-]?key|key|secret|password|passwd|pwd"
    r"|sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|credential|auth)=)"
    r"[^&#\s'\"<>]*"
)
_AUTHORIZATION = re.compile(
    r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)(?:(?:bearer|basic|token)\s+)?"
    r"[^\s,;'\"]+"
)
_BEARER = re.compile(
    r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/\-]{6,}=*"
)  # Basic only after Authorization: a word too

_remembered: set[str] = set()
_lock = threading.Lock()


def remember(secret: str | None) -> None:
    """A credential this process sends (the token in an Authorization header): masked wherever it shows up."""
    if secret and len(secret) >= _MIN_SECRET:
        with _lock:
            _remembered.add(secret)


def _secrets() -> list[str]:
    found = {os.environ.get(name, "").strip() for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    with _lock:
        found |= _remembered
    return sorted((s for s in found if len(s) >= _MIN_SECRET), key=len, reverse=True)  # longest first


def redact(text: str) -> str:
    """text with every credential in it replaced by ***."""
    for secret in _secrets():
        text = text.replace(secret, MASK)
    text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _AUTHORIZATION.sub(lambda m: m.group(1) + MASK, text)
    text = _BEARER.sub(lambda m: m.group(1) + " " + MASK, text)
    text = _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, text)
    return _HF_TOKEN.sub(lambda m: m.group(1) + MASK, text)
