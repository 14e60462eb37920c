"""Artifacts (reference 004): the bytes of files attached to memories, kept outside Postgres
rows (local disk or an S3-compatible store), their content rules, and download tokens. No web
framework here: ingest, recall and the gateway each use what they need."""
