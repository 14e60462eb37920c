"""The rule set the secret detector runs: detect-secrets' maintained plugins, plus the few
shapes they lack, each documented here.

detect-secrets (Yelp) is configured in code: a chosen plugin list, called through each
plugin's own `analyze_string`, never `scan_line` (that one reads a process-wide settings
object and may verify a secret over the network). Its entropy plugins are left out on
purpose: git SHAs, UUIDs, content hashes and fragment ids are ordinary memory, and a
high-entropy rule cannot tell them from a key. Every rule here needs a *shape* only a
credential has: a vendor prefix, a PEM armour line, or a credential-named slot (a password
flag, an `AccountKey=`, `password=`) whose value itself looks like a secret.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from dataclasses import dataclass

from detect_secrets.filters.heuristic import (
    is_indirect_reference,
    is_not_alphanumeric_string,
    is_potential_uuid,
    is_prefixed_with_dollar_sign,
    is_sequential_string,
    is_templated_secret,
)
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import BasePlugin
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.cloudant import CloudantDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
from detect_secrets.plugins.ibm_cloud_iam import IbmCloudIamDetector
from detect_secrets.plugins.ibm_cos_hmac import IbmCosHmacDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.keyword import DENYLIST as KEYWORD_DENYLIST
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.softlayer import SoftlayerDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector


@dataclass(frozen=True)
class Hit:
    kind: str
    start: int
    end: int


# ------------------------------------------------------------------ anchors: which rules can match

# Every rule below has an anchor: what any text it matches contains (a literal it cannot
# match without, or a long run of token characters). A text's anchors are looked up once
# (`in` per anchor word) and only the rules whose anchor it holds run their regexes; prose
# holds almost none. A LoCoMo turn ran 49 regex passes, 120 us idle and the largest part of
# batch_remember's own Python; now 12 us, 95% of turns running no rule at all. Anchors
# only skip rules that cannot match: the findings are the same (tests/ingest/
# test_secret_anchors.py compares them with every rule run, by hypothesis and the corpus).

# Characters Python's re.IGNORECASE matches to an ASCII letter: "ſ" to s, "ı" and "İ" to i,
# the Kelvin sign to k (re docs). Folded onto them, lower() finds an ignore-case rule's literal.
_IGNORECASE_FOLD = str.maketrans({"\u017f": "s", "\u0131": "i", "\u0130": "i", "\u212a": "k"})
# The shortest run a rule without a literal needs: a Discord token's first part (24), then
# Telegram's 35, IBM's 44 / 48, Cloudant's 24 / 64, SoftLayer's 64. Each of those runs is
# token characters (also under IGNORECASE inside [\w-]), so it lies within one
# whitespace-free word of the text at least this long.
_LONG_RUN = 24


@dataclass(frozen=True)
class Anchor:
    """What every text a rule matches contains: one of `words` as written, or one of
    `folded` (lower case) in any case as re.IGNORECASE sees it, or (`long_run`) a run of
    24 token characters."""

    words: frozenset[str] = frozenset()
    folded: frozenset[str] = frozenset()
    long_run: bool = False


def literal(*words: str) -> Anchor:
    return Anchor(words=frozenset(words))


def folded(*words: str) -> Anchor:
    return Anchor(folded=frozenset(words))


LONG_RUN = Anchor(long_run=True)


def either(*anchors: Anchor) -> Anchor:
    return Anchor(
        frozenset().union(*(a.words for a in anchors)), frozenset().union(*(a.folded for a in anchors)),
        any(a.long_run for a in anchors),
    )


class Anchored:
    """One text as the anchors read it: which anchor words it holds (each looked for once,
    for every rule at the same time) and whether one of its words is a long run."""

    __slots__ = ("folded", "long_run", "text", "words")

    def __init__(self, text: str) -> None:
        self.text = text
        self.words = {w for w in _ANCHOR_WORDS if w in text}
        lower = (text if text.isascii() else text.translate(_IGNORECASE_FOLD)).lower()
        self.folded = {w for w in _ANCHOR_FOLDED if w in lower}
        self.long_run = max(map(len, text.split()), default=0) >= _LONG_RUN

    def any(self) -> bool:
        """Whether any rule's anchor is here (most prose: none, and nothing runs)."""
        return bool(self.words or self.folded or self.long_run)

    def has(self, anchor: Anchor) -> bool:
        return (
            not anchor.words.isdisjoint(self.words) or not anchor.folded.isdisjoint(self.folded)
            or (anchor.long_run and self.long_run)
        )


# ------------------------------------------------------------------ detect-secrets plugins

# Plugin -> the kind Engram reports. Left out: the two high-entropy plugins (see above),
# IPPublicDetector (an address is not a credential), ArtifactoryDetector (its password shape
# `AP[0-9A-F]` + 8 letters flags words such as "APDashboards").
# KeywordDetector's names are used (the slot rule below); its regexes are not (see there).
_PLUGINS: tuple[tuple[BasePlugin, str, Anchor], ...] = (
    (AWSKeyDetector(), "aws_access_key", either(literal("A3T", "ABIA", "ACCA", "AKIA", "ASIA"), folded("aws"))),
    (AzureStorageKeyDetector(), "azure_storage_key", literal("AccountKey=")),
    (BasicAuthDetector(), "credentials_in_url", literal("://")),
    (CloudantDetector(), "cloudant_credentials", LONG_RUN),  # a 64-hex or 24-letter password
    (DiscordBotTokenDetector(), "discord_bot_token", LONG_RUN),
    (GitHubTokenDetector(), "github_token", literal("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    (GitLabTokenDetector(), "gitlab_token", literal(
        "glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "GR1348941", "glcbt-", "glimt-", "glptt-", "glagent-", "gloas-")),
    (IbmCloudIamDetector(), "ibm_cloud_iam_key", LONG_RUN),  # a 44-character key
    (IbmCosHmacDetector(), "ibm_cos_hmac", LONG_RUN),  # a 48-hex secret
    (JwtTokenDetector(), "jwt", literal("eyJ")),
    (MailchimpDetector(), "mailchimp_key", literal("-us")),
    (NpmDetector(), "npm_token", literal("/:_authToken=")),
    (OpenAIDetector(), "openai_api_key", literal("T3BlbkFJ")),
    (PrivateKeyDetector(), "private_key", literal("PRIVATE KEY", "PuTTY-User-Key-File-2")),
    (PypiTokenDetector(), "pypi_token", literal("pypi-AgE")),
    (SendGridDetector(), "sendgrid_key", literal("SG.")),
    (SlackDetector(), "slack_token", folded("xox", "hooks.slack.com")),
    (SoftlayerDetector(), "softlayer_credentials", LONG_RUN),  # a 64-character key
    (SquareOAuthDetector(), "square_oauth_secret", literal("sq0csp-")),
    (StripeDetector(), "stripe_key", literal("k_live_")),
    (TelegramBotTokenDetector(), "telegram_bot_token", LONG_RUN),  # a 35-character secret
    (TwilioKeyDetector(), "twilio_key", literal("AC", "SK")),
)


def _secret_span(match: re.Match[str]) -> tuple[int, int]:
    """A plugin regex's secret: the first group that follows some context (`://user:(pw)@`,
    `_authToken=(npm_...)`); a group at the very start is a prefix (gitlab's `(glpat)-...`),
    so then the whole match."""
    for index in range(1, (match.lastindex or 0) + 1):
        start, end = match.span(index)
        if start > match.start() and end > start:
            return start, end
    return match.span()


def plugin_hits(text: str, anchored: Anchored | None = None) -> Iterator[Hit]:
    """Each plugin's findings; with `anchored` (the same text), only plugins whose anchor it has."""
    for plugin, kind, anchor in _PLUGINS:
        if anchored is not None and not anchored.has(anchor):
            continue
        # analyze_string is the plugin's verdict (with its own checks, e.g. a JWT's parts
        # must decode); its regexes, run again, give the offsets.
        values = set(plugin.analyze_string(text))
        if not values:
            continue
        for regex in plugin.denylist:  # type: ignore[attr-defined]
            for match in regex.finditer(text):
                if values.intersection((match.group(0), *match.groups())):
                    yield Hit(kind, *_secret_span(match))


# ------------------------------------------------------------------ is this value a secret?

# Values that stand for a secret without being one.
_PLACEHOLDER = re.compile(
    r"""^(?:
        [<{\[] .*                                       # <password>, {{ template }}, [REDACTED:...]
      | \*+ | x+ | X+ | \.\.\.+ | …                    # masks
      | %\(?[A-Za-z_]*\)?s                              # printf-style
      | (?:os\.environ|process\.env|env|getenv|settings|config|vault|secrets?)\b.*
      | (?:none|null|nil|true|false|required|optional|empty|unset|redacted|hidden|masked|changeme|placeholder
         |your[_-]?\w*|example|string|value|secret|password|token)
    )$""",
    re.X | re.I,
)
# A path (pwd=/srv/app), a URL (a credential in one is BasicAuthDetector's), a version.
_NOT_A_SECRET = re.compile(r"^(?:[/~.]|[A-Za-z][A-Za-z0-9+.\-]*://|v?\d+(?:\.\d+)+$)")
# `_` and `.` join identifiers (`self.service_token`, `TOKEN_PREFIX`): code, not a secret.
_SYMBOLS = frozenset(string.punctuation) - {"_", "."}
_ENTROPY = Base64HighEntropyString()
# A letters-only value counts as random past this length and Shannon entropy (bits/char):
# "wJalrXUtnFEMIbPxRfiCY" is ~4.2, English words of that length stay under ~3.6.
_RANDOM_LETTERS_MIN = 16
_RANDOM_LETTERS_ENTROPY = 3.7


def is_placeholder(value: str) -> bool:
    v = value.strip("\"'`")
    return (
        not v
        or bool(_PLACEHOLDER.match(v))
        or is_templated_secret(v)
        or is_prefixed_with_dollar_sign(v)
    )


def looks_like_secret(value: str, min_length: int = 6) -> bool:
    """A value in a credential-named slot that looks like a secret, not a word, a number or
    an identifier: `password=hunter2` yes; `pass=three`, `first_pass=done`, `max_token=4096`,
    `pwd=/srv/app`, `token = self.service_token`, `password: rotated every quarter` no."""
    v = value.strip("\"'`")
    if len(v) < min_length or any(c.isspace() for c in v) or is_placeholder(v) or _NOT_A_SECRET.match(v):
        return False
    # detect-secrets' own filters: at least one letter; no "abcdef123456"; no UUID.
    if is_not_alphanumeric_string(v) or is_sequential_string(v) or is_potential_uuid(v):
        return False
    if any(c.isdigit() or c in _SYMBOLS for c in v):
        return True
    return len(v) >= _RANDOM_LETTERS_MIN and _ENTROPY.calculate_shannon_entropy(v) >= _RANDOM_LETTERS_ENTROPY


# ------------------------------------------------------------------ the shapes it lacks

@dataclass(frozen=True)
class Rule:
    kind: str
    pattern: re.Pattern[str]
    # Regex group holding the secret (0 = the whole match); redaction replaces only it, so
    # "password=[REDACTED:password_assignment]" keeps the readable part.
    group: int = 0
    # "shape": the match is a credential by itself (a vendor prefix, a password flag of a
    # client); "slot": a credential-named slot whose value must also look like a secret.
    check: str = "shape"
    # What every text the pattern matches contains (see "anchors" above); None: run always.
    anchor: Anchor | None = None


def _rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


# Names that make `name = value` a credential slot: detect-secrets' KeywordDetector list
# (its own regexes cost ~3.5 ms per 4000 characters, most of a write's screening), and the
# token / secret names it lacks, English and Korean. A name starts a word or follows a
# separator (`DB_PASSWORD`, `first_pass`), so `bypass=` or `compass=` are no slots.
_NAMES = "|".join(
    [name.replace("_?", "[_-]?") for name in KEYWORD_DENYLIST]
    + [r"passphrase", r"client[_-]?secret", r"secret[_-]?(?:access[_-]?)?key", r"access[_-]?key(?:[_-]?id)?",
       r"(?:access|auth|refresh|bearer)[_-]?token", r"token", r"pass", r"pw", r"비밀번호", r"패스워드", r"암호"]
)
_SLOT_NAME = rf"(?<![A-Za-z0-9])(?:{_NAMES})"
# A piece of every name above, lower case (tests/ingest/test_secret_anchors.py holds each
# name to it): a text without any of them has no slot.
_SLOT_ANCHORS = ("key", "pass", "pw", "secret", "token", "contrasena", "contraseña", "비밀번호", "패스워드", "암호")

EXTRA_RULES: tuple[Rule, ...] = (
    # A PEM block, armour to armour (or to the end of the text when cut): the whole body is
    # key material; detect-secrets reports only the "BEGIN ... PRIVATE KEY" words.
    Rule("private_key", _rx(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|.*\Z)",
        re.S), anchor=literal("-----BEGIN ")),
    # Vendor prefixes detect-secrets 1.5 lacks (formats from the vendors' docs / gitleaks).
    Rule("github_token", _rx(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
         anchor=literal("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
    Rule("slack_webhook", _rx(r"https://hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]+"),
         anchor=literal("https://hooks.slack.com/services/T")),
    Rule("anthropic_api_key", _rx(r"\bsk-ant-[A-Za-z0-9_\-]{20,}"), anchor=literal("sk-ant-")),
    # Project / service-account keys carry no T3BlbkFJ marker (detect-secrets needs it).
    Rule("openai_api_key", _rx(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}"), anchor=literal("sk-")),
    Rule("stripe_key", _rx(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b"), anchor=literal("k_live_", "k_test_")),
    Rule("google_api_key", _rx(r"\bAIza[0-9A-Za-z_\-]{35}\b"), anchor=literal("AIza")),
    Rule("huggingface_token", _rx(r"\bhf_[A-Za-z]{34,}\b"), anchor=literal("hf_")),
    Rule("npm_token", _rx(r"\bnpm_[A-Za-z0-9]{36}\b"), anchor=literal("npm_")),
    Rule("digitalocean_token", _rx(r"\bdo[por]_v1_[a-f0-9]{64}\b"), anchor=literal("_v1_")),
    # HashiCorp Vault service / batch / recovery tokens (Vault >= 1.10).
    Rule("vault_token", _rx(r"\bhv[sbr]\.[A-Za-z0-9_\-]{24,}"), anchor=literal("hvs.", "hvb.", "hvr.")),
    # detect-secrets' JWT regex stops at a lazy third part and its Discord one at 27
    # characters (newer tokens have 38): the whole token is the secret.
    Rule("jwt", _rx(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"), anchor=literal(".eyJ")),
    Rule("discord_bot_token", _rx(r"\b[MNO][A-Za-z\d_-]{23,25}\.[A-Za-z\d_-]{6}\.[A-Za-z\d_-]{27,38}\b"), anchor=LONG_RUN),
    Rule("discord_webhook", _rx(r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]{20,}"),
         anchor=literal("/api/webhooks/")),
    # Engram's (and memento-mcp's) own API keys.
    Rule("engram_api_key", _rx(r"\bmmcp_[0-9a-f]{32,}\b"), anchor=literal("mmcp_")),
    # GCP service-account JSON: the key id names the private key it belongs to.
    Rule("gcp_private_key_id", _rx(r"private_key_id[\"']?\s*[:=]\s*[\"']?([0-9a-f]{40})\b"), 1, anchor=literal("private_key_id")),
    # Azure connection strings (storage, Service Bus, Event Hubs) of any key length.
    Rule("azure_storage_key", _rx(r"\b(?:AccountKey|SharedAccessKey)=([A-Za-z0-9+/]{20,}={0,2})"), 1,
         anchor=literal("AccountKey=", "SharedAccessKey=")),
    # Credentials given to a client on its command line or in its environment.
    Rule("password_assignment", _rx(r"\b(?:PGPASSWORD|MYSQL_PWD|REDISCLI_AUTH)\s*=\s*[\"']?([^\s\"';]+)"), 1,
         anchor=literal("PGPASSWORD", "MYSQL_PWD", "REDISCLI_AUTH")),
    Rule("password_assignment", _rx(r"\bmysql(?:dump|admin|sh)?\b[^\n]*?\s-p([^\s\"';]+)"), 1, anchor=literal("mysql")),
    Rule("password_assignment", _rx(r"\bsshpass\s+-p\s*[\"']?([^\s\"';]+)"), 1, anchor=literal("sshpass")),
    Rule("password_assignment", _rx(r"(?<![\w-])--password[= ][\"']?([^\s\"';]+)"), 1, anchor=literal("--password")),
    Rule("basic_auth", _rx(r"\bcurl\b[^\n]*?\s(?:-u|--user)\s*[\"']?[^\s:\"']+:([^\s\"']+)"), 1, anchor=literal("curl")),
    # .netrc / _netrc: "machine host login user password secret".
    Rule("password_assignment", _rx(r"\bmachine\s+\S+\s+login\s+\S+\s+password\s+(\S+)"), 1, anchor=literal("machine")),
    # "Bearer <token>": long and carrying a digit, so "send a Bearer token" passes.
    Rule("bearer_token", _rx(r"\bBearer\s+((?=[A-Za-z0-9\-._~+/]*\d)[A-Za-z0-9\-._~+/]{20,}=*)", re.I), 1, anchor=folded("bearer")),
    Rule("basic_auth", _rx(r"\bAuthorization:\s*Basic\s+([A-Za-z0-9+/]{12,}={0,2})", re.I), 1,
         anchor=folded("authorization:")),
    # scheme://user:password@host with characters detect-secrets' BasicAuthDetector excludes.
    Rule("credentials_in_url", _rx(r"\b[a-z][a-z0-9+.\-]*://[^\s:/@]+:([^\s:/@]{3,})@[^\s]+", re.I), 1, anchor=literal("://")),
    # name=value / name: value in a credential-named slot; the value must look like a secret.
    Rule("password_assignment", _rx(rf"{_SLOT_NAME}[\"']?\s*[:=]\s*[\"']?([^\s\"',;]+)", re.I), 1, "slot",
         anchor=folded(*_SLOT_ANCHORS)),
)


_TRAILING = ".,:)]}`"


def extra_hits(text: str, anchored: Anchored | None = None) -> Iterator[Hit]:
    """Each rule's findings; with `anchored` (the same text), only rules whose anchor it has."""
    for rule in EXTRA_RULES:
        if anchored is not None and rule.anchor is not None and not anchored.has(rule.anchor):
            continue
        for match in rule.pattern.finditer(text):
            start, end = match.span(rule.group)
            if rule.group:
                # The sentence's own punctuation ("password=hunter2.", "(token=abc123)").
                end = start + len(text[start:end].rstrip(_TRAILING))
            value = text[start:end]
            if rule.group and is_placeholder(value):
                continue
            if rule.check == "slot":
                line_end = text.find("\n", match.start())
                # detect-secrets' filter for `token = os.environ['X']` / `secret = get_secret()`.
                if is_indirect_reference(text[match.start():line_end if line_end != -1 else len(text)]):
                    continue
                if not looks_like_secret(value):
                    continue
            yield Hit(rule.kind, start, end)


# Every anchor word of the tables above, looked for once a text (Anchored).
_ANCHORS = [anchor for _, _, anchor in _PLUGINS] + [rule.anchor for rule in EXTRA_RULES if rule.anchor is not None]
_ANCHOR_WORDS = frozenset().union(*(a.words for a in _ANCHORS))
_ANCHOR_FOLDED = frozenset().union(*(a.folded for a in _ANCHORS))
