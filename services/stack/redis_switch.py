"""A switch in front of a Redis, for fault tests and benches: a TCP proxy on loopback that
forwards, hangs, or drops.

Hung is the case that makes timeouts bite: connections are accepted and nothing is ever
answered (open ones stop forwarding too), as with a Redis that is paused or wedged. Down
closes every connection as it is accepted, as with a Redis that is gone. Back up, every open
connection is closed so that clients reconnect to the real server. It runs on an event loop
of its own thread, so the stack's processes and a test's own loop are unaffected.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

Mode = Literal["up", "hung", "down"]


class RedisSwitch:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.mode: Mode = "up"
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redis-switch", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Redis switch did not start listening")

    def stop(self) -> None:
        async def shutdown() -> None:
            for writer in list(self._writers):
                writer.close()
            # Closed transports end every handler's reads; what is left after that is cancelled.
            pending = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
            if pending:
                _, left = await asyncio.wait(pending, timeout=2)
                for task in left:
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def set(self, mode: Mode) -> None:
        """Switch mode; leaving "up" or coming back closes the open connections."""

        async def apply() -> None:
            previous, self.mode = self.mode, mode
            if mode != "hung" and previous != mode:
                for writer in list(self._writers):
                    writer.close()
                self._writers.clear()

        # Applied on the switch's loop, and done when this returns.
        asyncio.run_coroutine_threadsafe(apply(), self._loop).result(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "down":
            writer.close()
            return
        self._writers.add(writer)
        try:
            if self.mode == "hung":
                while await reader.read(65536):
                    pass
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._writers.add(up_writer)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.mode == "up":  # hung: swallowed, as by a server that stopped answering
                    writer.write(data)
                    await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
