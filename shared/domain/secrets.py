"""Secrets are never stored: the detector every write path runs before anything is kept.

seed 003 (capture policy): content that looks like a password, bearer token, API key or
private key is refused or redacted before it becomes memory. The rules (detect-secrets'
plugins plus a few documented shapes) live in shared/domain/secret_rules.py; this module
finds, redacts, and screens a tool's arguments as a whole, so a new free-text field is
screened without anyone remembering to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from shared.domain.errors import InvalidParams
from shared.domain.secret_rules import Anchored, extra_hits, plugin_hits

SecretPolicy = Literal["reject", "redact"]


@dataclass(frozen=True)
class SecretFinding:
    kind: str
    start: int
    end: int


def find_secrets(text: str, *, every_rule: bool = False) -> list[SecretFinding]:
    """Every credential-shaped span in text, earliest first, overlaps merged. Only the rules
    whose anchor the text has run (secret_rules.Anchored); `every_rule` runs all of them,
    with the same findings (the anchors' test compares the two)."""
    if not text:
        return []
    anchored = None if every_rule else Anchored(text)
    if anchored is not None and not anchored.any():
        return []
    # House rules first: on a tie (the same span) the more specific kind is kept, e.g.
    # slack_webhook over detect-secrets' slack_token for a webhook URL.
    hits = [*extra_hits(text, anchored), *plugin_hits(text, anchored)]
    order = sorted(range(len(hits)), key=lambda i: (hits[i].start, -(hits[i].end - hits[i].start), i))
    merged: list[SecretFinding] = []
    for i in order:
        hit = hits[i]
        if merged and hit.start < merged[-1].end:
            if hit.end > merged[-1].end:  # overlapping tails: one span covers both
                last = merged[-1]
                merged[-1] = SecretFinding(last.kind, last.start, hit.end)
            continue
        merged.append(SecretFinding(hit.kind, hit.start, hit.end))
    return merged


def secret_kinds(findings: list[SecretFinding]) -> list[str]:
    return list(dict.fromkeys(f.kind for f in findings))


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


class SecretFound(InvalidParams):
    """A write carried a credential and the policy is to refuse it (-32602 naming the field
    and the kinds). Never holds the value."""

    def __init__(self, field: str, kinds: list[str]) -> None:
        self.field = field
        self.kinds = kinds
        super().__init__(
            f"{field} contains a secret ({', '.join(kinds)}); secrets are never stored. "
            "Remove it or store a reference to where it is kept instead",
            {"field": field, "secretKinds": kinds},
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


Args = TypeVar("Args", bound=BaseModel)

# Fields that name a request rather than describe it: a redacted copy is no longer the same
# name (two keys holding different secrets would redact to one, and replay each other's
# result), so a secret in one is refused under either policy.
IDENTIFIERS = frozenset({"idempotencyKey"})


def screen_args(
    args: Args, policy: SecretPolicy, redacted: list[str], skip: frozenset[str] = frozenset(), prefix: str = ""
) -> Args:
    """Every string a tool's arguments carry, screened: each str field, each item of a list
    field, each string of a dict and of a nested model, by the field's wire name. Returns the
    arguments with redacted texts (reject: SecretFound). Kinds redacted are added to
    `redacted`.

    Nothing is exempt by type: enum fields hold one of a fixed set of words (they cannot
    match a rule), and ids are screened like text because some are stored as given
    (sessionId, caseId, agentId, idempotencyKey). `skip` is only for fields the caller
    screens elsewhere, item by item (batch_remember's fragments)."""
    updates: dict[str, Any] = {}
    for name, info in type(args).model_fields.items():
        if name in skip:
            continue
        value = getattr(args, name)
        kept = screen_value(prefix + (info.alias or name), value, policy, redacted)
        if kept is not value:
            updates[name] = kept
    return args.model_copy(update=updates) if updates else args


def screen_value(field: str, value: Any, policy: SecretPolicy, redacted: list[str]) -> Any:
    """One argument value screened: a string, or every string inside a list, dict or model."""
    if isinstance(value, str):
        kept = screen(field, value, "reject" if field.rsplit(".", 1)[-1] in IDENTIFIERS else policy)
        if not kept.redacted:
            return value
        redacted.extend(k for k in kept.redacted if k not in redacted)
        return kept.text
    if isinstance(value, BaseModel):
        return screen_args(value, policy, redacted, prefix=f"{field}.")
    if isinstance(value, list):
        items = [screen_value(field, item, policy, redacted) for item in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        # Keys are names the caller chose as well (free-form objects reach jsonb as given).
        pairs = [(screen_value(field, k, policy, redacted), screen_value(f"{field}.{k}", v, policy, redacted))
                 for k, v in value.items()]
        changed = any(k2 is not k or v2 is not v for (k2, v2), (k, v) in zip(pairs, value.items(), strict=True))
        return dict(pairs) if changed else value
    return value
