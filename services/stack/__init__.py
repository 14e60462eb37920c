"""The local stack: embedded Postgres + pgvector, Redis, the three services, worker and beat.

`make run` and the test suite both start Engram through this package, so what the tests
exercise is what a newcomer runs.
"""
