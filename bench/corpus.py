"""A deterministic corpus of agent memories and the queries asked of it.

Fragments read like what a coding/ops agent stores over months: facts about services,
decisions with reasons, errors with causes, people's preferences, runbooks, ownership,
meeting episodes. Each template has a paraphrased question over the same slots, so a
text query names its source fragment with different words (semantic search), while a
keyword query reuses the fragment's distinctive tokens (lexical search). Same seed, same
corpus: runs compare.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

TYPES = ("fact", "decision", "error", "preference", "procedure", "relation", "episode")
WORKSPACES = ("platform", "payments", "web-app", "data", "personal")
MIN_CHARS, MAX_CHARS = 60, 280

PEOPLE = ("Alice", "Bongsu", "Chen", "Dana", "Emeka", "Farah", "Gil", "Hana", "Ivan", "Jisoo",
          "Kofi", "Lena", "Minho", "Nadia", "Oscar", "Priya", "Quinn", "Rafael", "Sora", "Tomas")
SERVICES = ("billing-api", "auth-service", "checkout", "search-indexer", "notification-hub",
            "user-profile", "ledger", "report-builder", "media-proxy", "gateway", "inventory",
            "recommendation", "webhook-relay", "admin-console", "scheduler", "export-worker")
ENVS = ("prod", "staging", "eu-west prod", "us-east prod", "dev", "canary")
MEETINGS = ("weekly sync", "incident review", "architecture review", "sprint planning",
            "retro", "1:1", "design crit", "quarterly planning", "security review")

# Per domain: technologies, components, error signatures, causes, tasks with steps,
# preferences. Topics share a domain's vocabulary but keep their own name in the text.
DOMAINS: dict[str, dict[str, tuple[str, ...]]] = {
    "data": {
        "tech": ("PostgreSQL 16.2", "PostgreSQL 15.6", "MySQL 8.0.36", "Redis 7.2", "pgvector 0.7", "PgBouncer 1.22", "Kafka 3.7", "ClickHouse 24.3"),
        "component": ("connection pool", "read replica", "autovacuum settings", "statement_timeout", "WAL archiving", "index on orders.created_at", "partitioning of events", "maxmemory policy", "consumer group lag"),
        "error": ("ERROR 40001 serialization failure", "FATAL: too many connections", "deadlock detected (40P01)", "OOM command not allowed", "replication slot lag over 20 GB", "canceling statement due to statement timeout"),
        "cause": ("a missing index on the foreign key", "long-running analytics queries holding locks", "the pool size set higher than max_connections", "an unbounded IN list from the export job", "vacuum falling behind on a hot table"),
        "task": ("fail over the primary", "restore a point-in-time backup", "add a column without locking", "rotate the database password", "rebuild a bloated index"),
        "step": ("pause the writers", "check replication lag is under 1 s", "run pg_basebackup to the new host", "create the index CONCURRENTLY", "update the secret in Vault", "bounce PgBouncer", "verify with a read-only smoke query", "announce in #db-ops"),
        "pref": ("explicit SQL over the ORM for reports", "migrations that are reversible", "UUIDv7 primary keys", "small transactions"),
    },
    "infra": {
        "tech": ("Kubernetes 1.29", "nginx 1.25.4", "Helm 3.14", "Terraform 1.7", "Argo CD 2.10", "Istio 1.21", "Cloudflare", "GitHub Actions"),
        "component": ("HPA min replicas", "readiness probe", "proxy_read_timeout", "ingress rate limit", "node pool", "PodDisruptionBudget", "TLS certificate renewal", "image pull secret", "client_max_body_size"),
        "error": ("CrashLoopBackOff", "OOMKilled", "502 Bad Gateway", "upstream timed out (110)", "ImagePullBackOff", "413 Request Entity Too Large", "x509: certificate has expired", "Evicted: node disk pressure"),
        "cause": ("a memory limit of 256Mi for a JVM service", "the readiness probe hitting a slow endpoint", "an expired Let's Encrypt cert after the cron stopped", "keepalive disabled to the upstream", "a stale node image without the CA bundle"),
        "task": ("roll back a deployment", "drain a node for maintenance", "renew the wildcard certificate", "scale the cluster before a launch", "promote a canary"),
        "step": ("run kubectl rollout undo", "cordon the node", "check the PDB allows eviction", "bump the chart version", "apply with terraform plan first", "watch error rate in Grafana for 10 minutes", "reload nginx with nginx -s reload", "tag the release in git"),
        "pref": ("GitOps through Argo CD only", "small PRs to the infra repo", "dashboards before alerts", "blue-green over rolling updates for stateful services"),
    },
    "identity": {
        "tech": ("Keycloak 24", "OAuth 2.1 with PKCE", "JWT RS256", "WebAuthn", "SAML 2.0", "Auth0", "OpenID Connect"),
        "component": ("refresh token lifetime", "session cookie SameSite flag", "JWKS cache", "password hashing cost", "MFA enrolment flow", "API key scopes", "rate limit on /login"),
        "error": ("401 invalid_token", "invalid_grant: refresh token expired", "403 insufficient_scope", "clock skew rejected the JWT", "CSRF token mismatch", "redirect_uri mismatch"),
        "cause": ("the JWKS cache not refreshing after key rotation", "server clocks drifting by 90 seconds", "a missing scope on the mobile client", "SameSite=Strict breaking the SSO redirect"),
        "task": ("rotate the signing keys", "onboard a new SSO tenant", "revoke a leaked API key", "reset MFA for a user"),
        "step": ("publish the new key in JWKS", "wait one cache TTL", "switch signing to the new kid", "audit the key's last use", "notify the customer's admin", "log the change in the security tracker"),
        "pref": ("short-lived access tokens with rotation", "no secrets in environment dumps", "passkeys for staff accounts"),
    },
    "money": {
        "tech": ("Stripe API 2024-04", "Adyen", "the in-house ledger", "Chargebee", "NetSuite export", "Toss Payments"),
        "component": ("invoice numbering", "dunning schedule", "proration rules", "webhook signature check", "currency rounding", "refund approval threshold", "tax calculation"),
        "error": ("card_declined spike", "duplicate invoice INV-2291", "webhook 400 signature mismatch", "ledger imbalance of 0.01 EUR", "idempotency key reuse rejected", "payout failed: account_closed"),
        "cause": ("retries without an idempotency key", "rounding per line instead of per invoice", "the webhook secret rotated in only one region", "a timezone bug at month end"),
        "task": ("issue a partial refund", "close the books at month end", "migrate a customer to annual billing", "replay failed webhooks"),
        "step": ("look up the charge in the dashboard", "check the ledger entry balances", "create the credit note", "re-run the reconciliation job", "email finance the summary", "mark the ticket resolved"),
        "pref": ("amounts in integer minor units", "every money mutation idempotent", "reconciliation reports as CSV"),
    },
    "product": {
        "tech": ("React 18", "Next.js 14", "TypeScript 5.4", "Vite 5", "Tailwind", "Storybook 8", "React Native 0.73", "Playwright"),
        "component": ("bundle size budget", "checkout form validation", "dark mode tokens", "image lazy loading", "feature flag for the new onboarding", "error boundary", "i18n catalogue"),
        "error": ("hydration mismatch warning", "TypeError: cannot read properties of undefined (reading 'id')", "CLS regression to 0.31", "ChunkLoadError after deploy", "white screen on Safari 16"),
        "cause": ("Date.now() rendered on the server", "a stale service worker caching old chunks", "a missing optional chain on user.address", "fonts loaded without size-adjust"),
        "task": ("ship a feature behind a flag", "add a new locale", "profile a slow page", "update the design tokens"),
        "step": ("create the flag in LaunchDarkly", "write the Storybook story", "run Playwright against staging", "check Lighthouse scores", "ask design for sign-off", "enable for 5% of users"),
        "pref": ("server components for data fetching", "tests with Testing Library, not snapshots", "CSS variables over inline styles", "reviews within one working day"),
    },
    "ops": {
        "tech": ("Prometheus 2.51", "Grafana 10", "OpenTelemetry", "PagerDuty", "Sentry", "Loki", "Datadog"),
        "component": ("p95 latency SLO", "alert on error budget burn", "log retention", "trace sampling rate", "on-call rotation", "status page", "runbook links in alerts"),
        "error": ("alert storm of 400 pages", "missing metrics after relabeling", "Sentry quota exhausted", "trace gaps between gateway and worker", "disk full on the Loki node"),
        "cause": ("a label with user ids exploding cardinality", "sampling set to 100% in prod", "the exporter pinned to an old protocol", "retention never configured"),
        "task": ("hand over on-call", "write a postmortem", "add an SLO for a new service", "silence a noisy alert"),
        "step": ("list open incidents", "link the dashboard", "write the timeline", "name the contributing factors", "file follow-up tickets", "review in the incident meeting"),
        "pref": ("blameless postmortems", "alerts that page only on user impact", "one dashboard per service"),
    },
}

TOPICS: dict[str, str] = {
    "postgres": "data", "mysql-migration": "data", "redis-cache": "data", "kafka": "data", "backups": "data",
    "data-pipeline": "data", "search-index": "data", "analytics": "data",
    "kubernetes": "infra", "nginx": "infra", "deployment": "infra", "helm": "infra", "terraform": "infra",
    "ci-cd": "infra", "dns": "infra", "cdn": "infra", "cost-optimization": "infra", "load-testing": "infra",
    "auth": "identity", "oauth": "identity", "sso": "identity", "api-keys": "identity", "security": "identity",
    "compliance": "identity",
    "billing": "money", "invoicing": "money", "payments": "money", "refunds": "money", "subscriptions": "money",
    "frontend": "product", "react": "product", "mobile-app": "product", "design-system": "product",
    "onboarding-flow": "product", "user-preferences": "product",
    "observability": "ops", "alerting": "ops", "incident-review": "ops", "on-call": "ops", "meetings": "ops",
}

# (statement, question) pairs per type; the question paraphrases the statement.
TEMPLATES: dict[str, tuple[tuple[str, str], ...]] = {
    "fact": (
        ("{service} runs {tech} in {env}; the {component} is owned by {person}'s team.",
         "what does {service} run in {env}, and which team owns its {component}?"),
        ("The {component} for {service} has been {num} since {date}, per {person}.",
         "what is {service}'s {component} currently configured to?"),
        ("{topic}: {service} in {env} handles about {num}k requests per minute at peak, mostly from {service2}.",
         "how much traffic does {service} get at peak, and from where?"),
    ),
    "decision": (
        ("Decided on {date} to move {service} to {tech} because {cause} kept recurring. Owner: {person}.",
         "why did we switch {service} to {tech}?"),
        ("We keep the {component} of {service} at {num} until the {meeting} in {month}; {person} will revisit.",
         "what's the plan for the {component} on {service}?"),
        ("Agreed: no more changes to {component} in {env} without a ticket after the {error} incident.",
         "what rule did we set for {component} changes in {env} after the {error}?"),
    ),
    "error": (
        ("{service} hit {error} during {task_ing} on {date}; root cause was {cause}.",
         "what caused the {error} in {service}?"),
        ("{error} in {service} ({env}) right after deploying v{version}; {person} rolled back within {num} minutes.",
         "{service} broke after release {version}, what happened?"),
        ("Recurring {error} on {service} every night around {hour}:00 UTC, traced to {cause}.",
         "why does {service} throw {error} every night?"),
    ),
    "preference": (
        ("{person} prefers {pref} and asks for it in every review of {topic} work.",
         "how does {person} like {topic} work to be done?"),
        ("For {service}, {person} wants {pref}; don't ping them before {hour}:00 KST.",
         "what does {person} expect for {service}?"),
        ("User preference: answers about {topic} should be short, with {pref} as the default suggestion.",
         "how should I answer questions about {topic}?"),
    ),
    "procedure": (
        ("To {task} for {service}: 1) {step} 2) {step2} 3) {step3}.",
         "steps to {task} on {service}"),
        ("Runbook {topic}/{num}: before you {task}, {step}, then {step2}; never skip this in {env}.",
         "what must be done before we {task} in {env}?"),
    ),
    "relation": (
        ("{service} depends on {service2} for its {component}; an outage there shows up as {error}.",
         "what does {service} rely on for its {component}?"),
        ("{person} owns {service}; escalate {topic} issues to {person2} when {person} is away.",
         "who is responsible for {service}?"),
        ("The {component} of {service} is shared with {service2}, so changes need both teams ({person}, {person2}).",
         "which services share the {component} with {service}?"),
    ),
    "episode": (
        ("In the {meeting} on {date}, {person} and {person2} reviewed the {component} of {service} and agreed to fix it by {month}.",
         "what did {person} and {person2} agree about {service} in the {meeting}?"),
        ("{date}: paired with {person} debugging {error} on {service}; it turned out to be {cause}.",
         "when did I debug {error} with {person} and what was it?"),
        ("Session {date}: helped {person} {task} for {service} in {env}; took {num} minutes and went smoothly.",
         "did we ever {task} for {service} in {env}, and how long did it take?"),
    ),
}

IMPORTANCE = {"fact": 0.5, "decision": 0.7, "error": 0.65, "preference": 0.6, "procedure": 0.6, "relation": 0.5, "episode": 0.4}
START = date(2025, 1, 6)
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December")


@dataclass
class Memory:
    """One fragment to store plus the paraphrase that should find it."""

    fragment: dict[str, Any]
    question: str
    slots: dict[str, str] = field(repr=False)


def _slots(rng: random.Random, topic: str) -> dict[str, str]:
    vocab = DOMAINS[TOPICS[topic]]
    service, service2 = rng.sample(SERVICES, 2)
    person, person2 = rng.sample(PEOPLE, 2)
    step, step2, step3 = rng.sample(vocab["step"], 3)
    task = rng.choice(vocab["task"])
    day = START + timedelta(days=rng.randrange(640))
    return {
        "topic": topic, "service": service, "service2": service2, "person": person, "person2": person2,
        "env": rng.choice(ENVS), "meeting": rng.choice(MEETINGS), "tech": rng.choice(vocab["tech"]),
        "component": rng.choice(vocab["component"]), "error": rng.choice(vocab["error"]),
        "cause": rng.choice(vocab["cause"]), "task": task, "task_ing": f"an attempt to {task}",
        "step": step, "step2": step2, "step3": step3, "pref": rng.choice(vocab["pref"]),
        "date": day.isoformat() if rng.random() < 0.6 else f"{MONTHS[day.month - 1][:3]} {day.day}",
        "month": MONTHS[rng.randrange(12)], "hour": str(rng.randrange(24)),
        "num": str(rng.choice((2, 3, 5, 8, 12, 15, 20, 30, 45, 64, 100, 128, 250, 500))),
        "version": f"{rng.randrange(1, 6)}.{rng.randrange(30)}.{rng.randrange(10)}",
    }


def _keywords(rng: random.Random, slots: dict[str, str], content: str) -> list[str]:
    """The service and topic, plus a few distinctive slot values, as an agent would tag."""
    lowered = content.lower()
    candidates = [slots[k].lower() for k in ("person", "person2", "tech", "component", "error", "env", "service2")]
    candidates = [c for c in candidates if c in lowered]
    picks = [slots["service"], slots["topic"], *rng.sample(candidates, min(len(candidates), rng.randrange(1, 4)))]
    return list(dict.fromkeys(p.lower() for p in picks))


def generate(n: int, seed: int = 7) -> list[Memory]:
    """n distinct memories; the i-th is the same for every run with the same seed."""
    rng = random.Random(seed)
    topics = sorted(TOPICS)
    seen: set[str] = set()
    out: list[Memory] = []
    while len(out) < n:
        topic = rng.choice(topics)
        kind = rng.choices(TYPES, weights=(30, 14, 16, 8, 10, 10, 12))[0]
        statement, question = rng.choice(TEMPLATES[kind])
        slots = _slots(rng, topic)
        content = statement.format(**slots)
        content = content[0].upper() + content[1:]
        if not MIN_CHARS <= len(content) <= MAX_CHARS or content in seen:
            continue
        seen.add(content)
        importance = round(min(1.0, max(0.05, rng.gauss(IMPORTANCE[kind], 0.15))), 2)
        fragment = {
            "content": content, "topic": topic, "type": kind, "importance": importance,
            "keywords": _keywords(rng, slots, content),
            "workspace": rng.choices(WORKSPACES, weights=(35, 20, 20, 15, 10))[0],
        }
        out.append(Memory(fragment, question.format(**slots), slots))
    return out


# -- queries -------------------------------------------------------------------------------

@dataclass
class Query:
    kind: str
    arguments: dict[str, Any]
    expected: int  # index of the memory it paraphrases, for a sanity hit rate


def text_queries(memories: list[Memory], count: int, seed: int = 11) -> list[Query]:
    rng = random.Random(seed)
    picks = rng.sample(range(len(memories)), min(count, len(memories)))
    return [Query("text", {"text": memories[i].question}, i) for i in picks]


def keyword_queries(memories: list[Memory], count: int, seed: int = 13) -> list[Query]:
    rng = random.Random(seed)
    picks = rng.sample(range(len(memories)), min(count, len(memories)))
    out = []
    for i in picks:
        keywords = memories[i].fragment["keywords"]
        out.append(Query("keyword", {"keywords": rng.sample(keywords, min(2, len(keywords)))}, i))
    return out


def filtered_queries(memories: list[Memory], count: int, seed: int = 17) -> list[Query]:
    """Text query scoped to the source's workspace and type, above an importance floor
    the source clears, as an agent narrowing a search would ask."""
    rng = random.Random(seed)
    picks = rng.sample(range(len(memories)), min(count, len(memories)))
    out = []
    for i in picks:
        f = memories[i].fragment
        floor = round(max(0.0, f["importance"] - rng.choice((0.0, 0.1, 0.2))), 2)
        args = {"text": memories[i].question, "workspace": f["workspace"], "type": f["type"], "minImportance": floor}
        out.append(Query("filtered", args, i))
    return out


if __name__ == "__main__":
    for memory in generate(12):
        print(memory.fragment)
        print("   Q:", memory.question)
