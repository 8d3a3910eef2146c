"""A small asyncio TCP proxy between the chaos run's clients and the Redis under test.

Run as a process: ``python proxy.py TARGET_PORT``. It listens on two free ports of 127.0.0.1 and
prints them on one line (``LISTEN_PORT CONTROL_PORT``). The control port takes one command per
connection, one line each, and answers one JSON line:

- ``cut``: abort every proxied connection at once, both sides (bytes in flight are lost, so a
  client may see a command fail whose effect the server applied: a lost reply);
- ``delay MS``: hold every chunk MS milliseconds before forwarding it (0 = off);
- ``drop P MS``: for the next MS milliseconds, each request (a chunk from a client) is, with
  probability P, forwarded to the server and its reply dropped: the proxy waits for the
  server's answer (so the server has run the command) and then aborts that connection instead
  of passing the answer on. The client sees a command fail that the server applied;
- ``target PORT``: forward new connections to another port (a server that had to move);
- ``stats``: counters (``dropped``: replies dropped so far).

While the target is down, a new client connection is accepted and closed at once.
"""

from __future__ import annotations

import asyncio
import json
import random
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
        self.drop_p = 0.0
        self.drop_until = 0.0
        """Loop time until which requests may have their reply dropped."""
        self.doomed: set[Pair] = set()
        """Connections whose next reply from the server is dropped (and the connection cut)."""
        self.dropped = 0

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
            await asyncio.gather(self._pump(reader, up_w, pair, request=True),
                                 self._pump(up_r, writer, pair, request=False))
        finally:
            self.conns.discard(pair)
            self.doomed.discard(pair)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    pair: Pair, *, request: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await src.read(1 << 16)
                if not data:
                    dst.close()  # orderly close: what is buffered still goes out
                    return
                if not request and pair in self.doomed:
                    # the server answered a request whose reply is to be lost: drop the answer
                    # and the connection (the client cannot tell whether the command ran)
                    self.doomed.discard(pair)
                    self.dropped += 1
                    for w in pair:
                        w.transport.abort()
                    return
                if self.delay_s > 0:
                    await asyncio.sleep(self.delay_s)
                if (request and loop.time() < self.drop_until
                        and random.random() < self.drop_p):
                    self.doomed.add(pair)  # before the request goes out: its answer is lost
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
        elif len(words) == 3 and words[0] == "drop":
            self.drop_p = float(words[1])
            self.drop_until = asyncio.get_running_loop().time() + float(words[2]) / 1000
            reply = {"drop_p": self.drop_p, "drop_ms": float(words[2]), "dropped": self.dropped}
        elif len(words) == 2 and words[0] == "target":
            self.target_port = int(words[1])
            reply = {"target": self.target_port}
        elif words == ["stats"]:
            reply = {"open": len(self.conns), "accepted": self.accepted,
                     "refused": self.refused, "cut": self.cut_total, "dropped": self.dropped}
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
