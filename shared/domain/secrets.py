"""Secrets are never stored: the detector every write path runs before anything is kept.

seed 003 (capture policy): content that looks like a password, bearer token, API key or
private key is refused or redacted before it becomes memory. Each rule matches a *shape*
that only a credential has (a vendor prefix, a PEM armour line, an assignment to a
credential-named variable), never "long random-looking text": git SHAs, UUIDs, content
hashes and fragment ids are ordinary memory and must pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

SecretPolicy = Literal["reject", "redact"]


@dataclass(frozen=True)
class SecretFinding:
    kind: str
    start: int
    end: int


@dataclass(frozen=True)
class _Rule:
    kind: str
    pattern: re.Pattern[str]
    # The regex group holding the secret itself; 0 = the whole match. Redaction replaces
    # only this span, so "password=[REDACTED:password]" keeps the readable part.
    group: int = 0


def _rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


# Words that name a credential when something is assigned to them (English and Korean).
_CREDENTIAL_NAMES = (
    r"pass(?:word|wd|phrase)?|pwd|secret(?:[_-]?key)?|client[_-]?secret|api[_-]?key|apikey|"
    r"access[_-]?key(?:[_-]?id)?|secret[_-]?access[_-]?key|access[_-]?token|auth[_-]?token|refresh[_-]?token|"
    r"private[_-]?key|db[_-]?pass(?:word)?|token|비밀번호|패스워드|암호"
)

_RULES: tuple[_Rule, ...] = (
    _Rule("private_key", _rx(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----)?", re.S)),
    _Rule("aws_access_key", _rx(r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b")),
    _Rule("github_token", _rx(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b")),
    _Rule("gitlab_token", _rx(r"\bglpat-[A-Za-z0-9_\-]{20,}\b")),
    _Rule("slack_token", _rx(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b")),
    _Rule("slack_webhook", _rx(r"https://hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]+")),
    _Rule("anthropic_api_key", _rx(r"\bsk-ant-[A-Za-z0-9_\-]{20,}")),
    _Rule("openai_api_key", _rx(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}")),
    _Rule("stripe_key", _rx(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}\b")),
    _Rule("google_api_key", _rx(r"\bAIza[0-9A-Za-z_\-]{35}\b")),
    _Rule("huggingface_token", _rx(r"\bhf_[A-Za-z]{34,}\b")),
    _Rule("npm_token", _rx(r"\bnpm_[A-Za-z0-9]{36}\b")),
    _Rule("sendgrid_key", _rx(r"\bSG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}\b")),
    # Engram's (and memento-mcp's) own API keys.
    _Rule("engram_api_key", _rx(r"\bmmcp_[0-9a-f]{32,}\b")),
    _Rule("jwt", _rx(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")),
    # "Bearer <token>": the token must be long and carry a digit, so prose such as
    # "send a Bearer token in the Authorization header" passes.
    _Rule("bearer_token", _rx(r"\bBearer\s+((?=[A-Za-z0-9\-._~+/]*\d)[A-Za-z0-9\-._~+/]{20,}=*)", re.I), 1),
    _Rule("basic_auth", _rx(r"\bAuthorization:\s*Basic\s+([A-Za-z0-9+/]{12,}={0,2})", re.I), 1),
    # scheme://user:password@host
    _Rule("credentials_in_url", _rx(r"\b[a-z][a-z0-9+.\-]*://[^\s:/@]+:([^\s:/@]{3,})@[^\s]+", re.I), 1),
    # password=hunter2, API_KEY="...", secret: 's3cr3t' — '=' assigns anything that is not a
    # placeholder; ':' only a quoted value or one with a digit or symbol (prose like
    # "password: rotated every 90 days" passes).
    _Rule(
        "password_assignment",
        _rx(rf"(?<![A-Za-z0-9])(?:[A-Za-z0-9]+[_-])?(?:{_CREDENTIAL_NAMES})\s*=\s*[\"']?([^\s\"',;]{{4,}})", re.I),
        1,
    ),
    _Rule(
        "password_assignment",
        _rx(rf"(?<![A-Za-z0-9])(?:[A-Za-z0-9]+[_-])?(?:{_CREDENTIAL_NAMES})[\"']?\s*:\s*(?:[\"']([^\s\"']{{4,}})[\"']|((?=\S*[0-9!@#$%^&*+/\\])[^\s\"',;]{{6,}}))", re.I),
        -1,
    ),
)

# Values that stand for a secret without being one.
_PLACEHOLDER = re.compile(
    r"""^(?:
        \$\{?[A-Za-z_][A-Za-z0-9_]*\}?          # $VAR, ${VAR}
      | \{\{.*\}\}                              # {{ template }}
      | <[^>]*>                                 # <password>
      | \[[^\]]*\]                              # [REDACTED...]
      | \*+ | x+ | X+ | \.\.\.+ | …             # masks
      | %\(?[A-Za-z_]*\)?s                       # printf-style
      | (?:os\.environ|process\.env|env|getenv|settings|config|vault|secrets?)\b.*
      | (?:none|null|nil|true|false|required|optional|empty|unset|redacted|hidden|masked|changeme|placeholder|your[_-]?\w*|example|string|value|secret|password|token)
    )$""",
    re.X | re.I,
)


def _secret_span(rule: _Rule, match: re.Match[str]) -> tuple[int, int] | None:
    if rule.group == 0:
        return match.span()
    if rule.group == -1:  # first group that matched
        for index in range(1, (match.lastindex or 0) + 1):
            if match.group(index) is not None:
                return match.span(index)
        return None
    return match.span(rule.group)


def find_secrets(text: str) -> list[SecretFinding]:
    """Every credential-shaped span in text, earliest first, overlaps merged."""
    if not text:
        return []
    found: list[SecretFinding] = []
    for rule in _RULES:
        for match in rule.pattern.finditer(text):
            span = _secret_span(rule, match)
            if span is None:
                continue
            value = text[span[0]:span[1]]
            if rule.group != 0 and _PLACEHOLDER.match(value.strip("\"'")):
                continue
            found.append(SecretFinding(rule.kind, *span))
    found.sort(key=lambda f: (f.start, -(f.end - f.start)))
    merged: list[SecretFinding] = []
    for finding in found:
        if merged and finding.start < merged[-1].end:
            continue  # inside a longer, earlier finding (e.g. a JWT after "Bearer")
        merged.append(finding)
    return merged


def secret_kinds(findings: list[SecretFinding]) -> list[str]:
    kinds: list[str] = []
    for finding in findings:
        if finding.kind not in kinds:
            kinds.append(finding.kind)
    return kinds


def redact(text: str, findings: list[SecretFinding] | None = None) -> str:
    findings = find_secrets(text) if findings is None else findings
    out: list[str] = []
    cursor = 0
    for finding in findings:
        out.append(text[cursor:finding.start])
        out.append(f"[REDACTED:{finding.kind}]")
        cursor = finding.end
    out.append(text[cursor:])
    return "".join(out)


class SecretFound(Exception):
    """A write carried a credential and the policy is to refuse it. Never holds the value."""

    def __init__(self, field: str, kinds: list[str]) -> None:
        self.field = field
        self.kinds = kinds
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return (
            f"{self.field} contains a secret ({', '.join(self.kinds)}); secrets are never stored. "
            "Remove it or store a reference to where it is kept instead"
        )


@dataclass
class Screened:
    """A text after screening: what to store and which kinds of secret were redacted."""

    text: str
    redacted: list[str]


def screen(field: str, text: str | None, policy: SecretPolicy) -> Screened:
    """Refuse (SecretFound) or redact one field's text according to the operator's policy."""
    if not text:
        return Screened(text or "", [])
    findings = find_secrets(text)
    if not findings:
        return Screened(text, [])
    kinds = secret_kinds(findings)
    if policy == "reject":
        raise SecretFound(field, kinds)
    return Screened(redact(text, findings), kinds)
