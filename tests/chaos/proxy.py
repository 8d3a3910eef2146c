"""A small asyncio TCP proxy between the chaos run's clients and the Redis under test.

Run as a process: ``python proxy.py TARGET_PORT``. It listens on two free ports of 127.0.0.1 and
prints them on one line (``LISTEN_PORT CONTROL_PORT``). The control port takes one command per
connection, one line each, and answers one JSON line:

- ``cut``: abort every proxied connection at once, both sides (bytes in flight are lost, so a
  client may see a command fail whose effect the server applied: a lost reply);
- ``delay MS``: hold every chunk MS milliseconds before forwarding it (0 = off);
- ``target PORT``: forward new connections to another port (a server that had to move);
- ``stats``: counters.

While the target is down, a new client connection is accepted and closed at once.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import Any

Pair = tuple[asyncio.StreamWriter, asyncio.StreamWriter]


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.delay_s = 0.0
        self.conns: set[Pair] = set()
        self.accepted = 0
        self.refused = 0
        self.cut_total = 0

    async def serve_client(self, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_r, up_w = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.target_port), 2.0)
        except (OSError, TimeoutError):
            self.refused += 1
            writer.transport.abort()
            return
        pair = (writer, up_w)
        self.conns.add(pair)
        try:
            await asyncio.gather(self._pump(reader, up_w, pair), self._pump(up_r, writer, pair))
        finally:
            self.conns.discard(pair)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    pair: Pair) -> None:
        try:
            while True:
                data = await src.read(1 << 16)
                if not data:
                    dst.close()  # orderly close: what is buffered still goes out
                    return
                if self.delay_s > 0:
                    await asyncio.sleep(self.delay_s)
                dst.write(data)
                await dst.drain()
        except (OSError, RuntimeError):  # the other side is gone (or was cut)
            for w in pair:
                w.transport.abort()

    def cut(self) -> int:
        pairs = list(self.conns)
        for pair in pairs:
            for w in pair:
                w.transport.abort()
        self.conns.clear()
        self.cut_total += len(pairs)
        return len(pairs)

    async def serve_control(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        words = (await reader.readline()).decode().split()
        reply: dict[str, Any]
        if words == ["cut"]:
            reply = {"cut": self.cut()}
        elif len(words) == 2 and words[0] == "delay":
            self.delay_s = float(words[1]) / 1000
            reply = {"delay_ms": float(words[1])}
        elif len(words) == 2 and words[0] == "target":
            self.target_port = int(words[1])
            reply = {"target": self.target_port}
        elif words == ["stats"]:
            reply = {"open": len(self.conns), "accepted": self.accepted,
                     "refused": self.refused, "cut": self.cut_total}
        else:
            reply = {"error": f"unknown command {words!r}"}
        writer.write(json.dumps(reply).encode() + b"\n")
        await writer.drain()
        writer.close()


async def _main(target_port: int) -> None:
    proxy = Proxy(target_port)
    listen = await asyncio.start_server(proxy.serve_client, "127.0.0.1", 0)
    control = await asyncio.start_server(proxy.serve_control, "127.0.0.1", 0)
    ports = [s.sockets[0].getsockname()[1] for s in (listen, control)]
    print(f"{ports[0]} {ports[1]}", flush=True)
    async with listen, control:
        await asyncio.gather(listen.serve_forever(), control.serve_forever())


class ProxyControl:
    """The harness side of the control port."""

    def __init__(self, port: int) -> None:
        self.port = port

    def send(self, *words: object) -> dict[str, Any]:
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall((" ".join(str(w) for w in words) + "\n").encode())
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        reply: dict[str, Any] = json.loads(data)
        return reply


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1])))
