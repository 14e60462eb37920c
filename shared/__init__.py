"""Engram's common package: domain, schema, repositories, settings, embeddings, telemetry.

Nothing here imports a web framework, so the Celery worker and scripts can use all of it.
"""
