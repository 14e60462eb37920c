"""The secret detector against a corpus of realistic positives and negatives (no stack)."""

from __future__ import annotations

import pytest

from shared.domain.secrets import SecretFound, find_secrets, redact, screen, secret_kinds

# (text, kind) — each must be flagged with that kind. Values are fabricated but shaped like
# the real thing.
POSITIVES = [
    ("The CI user key is AKIAIOSFODNN7EXAMPLE in us-east-1.", "aws_access_key"),
    ("export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "password_assignment"),
    ("Use ghp_1234567890abcdefghijklmnopqrstuvwxyzAB to push to the mirror.", "github_token"),
    ("fine-grained token github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH", "github_token"),
    ("gitlab deploy token glpat-Ab3dEf6hIj9kLm2nOp5q", "gitlab_token"),
    ("slack bot token xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "slack_token"),
    ("alerts go to https://hooks.slack.com/services/T0123ABCD/B0456EFGH/abcdefghijklmnopqrstuvwx", "slack_webhook"),
    ("OPENAI key: sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcd", "openai_api_key"),
    ("legacy openai key sk-AbCdEfGhIjKlMnOpQrStT3BlbkFJabcdefghij0123", "openai_api_key"),
    ("claude key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abc", "anthropic_api_key"),
    ("stripe live key sk_live_4eC39HqLyjWDarjtT1zdp7dc", "stripe_key"),
    ("maps key AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "google_api_key"),
    ("hf token hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGhIj", "huggingface_token"),
    ("npm publish with npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "npm_token"),
    ("the admin key mmcp_0123456789abcdef0123456789abcdef0123456789abcdef works", "engram_api_key"),
    (
        "session cookie eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
        "jwt",
    ),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq\n-----END RSA PRIVATE KEY-----", "private_key"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----", "private_key"),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC", "private_key"),
    ("curl -H 'Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0abcd' https://api.internal", "bearer_token"),
    ("Authorization: Basic dXNlcjpodW50ZXIyMDI0", "basic_auth"),
    ("DATABASE_URL=postgres://app:Sup3rS3cret@db.internal:5432/app", "credentials_in_url"),
    ("redis://default:hunter2xyz@cache:6379/0 is the cache", "credentials_in_url"),
    ("The staging db password=hunter2 until Friday.", "password_assignment"),
    ("set DB_PASSWORD='c0rrect-horse' in the env file", "password_assignment"),
    ("config: {\"api_key\": \"a1b2c3d4e5f6\"}", "password_assignment"),
    ("client_secret: 8f!kq2@Lz9", "password_assignment"),
    ("api_key = 3f9a1c7e22", "password_assignment"),
    ("서버 비밀번호: qwer1234! 로 접속한다", "password_assignment"),
]

NEGATIVES = [
    "The billing service retries failed card payments three times before emailing the customer.",
    "Fixed in commit 3f9a1c7e2b8d4f6a0c1e5b7d9f2a4c6e8b0d1f3a on main.",
    "Short SHA a1b2c3d of the release tag.",
    "Request id 550e8400-e29b-41d4-a716-446655440000 failed with 502.",
    "sha256 of the artifact is e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.",
    "md5 d41d8cd98f00b204e9800998ecf8427e matches the mirror.",
    "Fragment frag-1a2b3c4d5e6f7a8b supersedes frag-0f1e2d3c4b5a6978.",
    "Job batch-1750000000000-a1b2c3d4 completed.",
    "Always send a Bearer token in the Authorization header; never log it.",
    "Passwords must be rotated every 90 days and stored in Vault.",
    "password: rotated every quarter by the platform team",
    "The password field is required on the signup form.",
    "Set password=${DB_PASSWORD} in compose and the value comes from the secret store.",
    "api_key=<your-api-key> is a placeholder in the README.",
    "token = os.environ['GITHUB_TOKEN'] reads it at start-up.",
    "secret: [REDACTED] in the incident timeline",
    "The AWS region is eu-central-1 and the bucket is logs-prod.",
    "Docker image ghcr.io/acme/api:1.4.2@sha256:9b2c6f1d2e3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c",
    "postgresql://postgres@127.0.0.1:5432/engram is the dev database.",
    "Ask-me-anything task list: sk-learn pipeline notes",
    "Our API keys live in 1Password; rotate with the `keys rotate` command.",
    "Korean: 비밀번호는 매달 변경해야 한다.",
    "base64 of hello is aGVsbG8= and that is fine.",
    "The private key lives in the HSM; only the public key is in the repo.",
    "eyJ is how a base64 JSON object starts.",
    "ETag W/\"5d41402abc4b2a76b9719d911017c592\" never changes for static assets.",
]


@pytest.mark.parametrize(("text", "kind"), POSITIVES)
def test_positive_is_flagged(text: str, kind: str) -> None:
    findings = find_secrets(text)
    assert kind in secret_kinds(findings), (text, findings)


@pytest.mark.parametrize("text", NEGATIVES)
def test_negative_is_not_flagged(text: str) -> None:
    assert find_secrets(text) == []


def test_redaction_keeps_prose_and_drops_the_value() -> None:
    text = "Deploy with password=hunter2 and token ghp_1234567890abcdefghijklmnopqrstuvwxyzAB today."
    out = redact(text)
    assert "hunter2" not in out and "ghp_1234" not in out
    assert out == "Deploy with password=[REDACTED:password_assignment] and token [REDACTED:github_token] today."


def test_screen_reject_names_the_kind_never_the_value() -> None:
    with pytest.raises(SecretFound) as err:
        screen("content", "the key is AKIAIOSFODNN7EXAMPLE", "reject")
    assert "aws_access_key" in err.value.message and "AKIA" not in err.value.message
    kept = screen("content", "the key is AKIAIOSFODNN7EXAMPLE", "redact")
    assert kept.text == "the key is [REDACTED:aws_access_key]" and kept.redacted == ["aws_access_key"]
