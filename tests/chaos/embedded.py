"""An app with an embedded worker, restarted the way ``uvicorn --reload`` restarts it.

Usage: as ``worker.py`` (same arguments, same ledger, same handlers). The process is shaped
like a web app whose lifespan starts a ``Worker`` in-process (``await worker.start()`` at
startup, ``await worker.stop()`` at shutdown, as docs/production.md shows for FastAPI):

- SIGHUP is a reload (a code edit under ``uvicorn --reload``): the app's shutdown runs (the
  worker stops gracefully, with the configured grace period: jobs still running after it are
  handed back), then a new app object starts a new ``Worker`` under the same consumer name,
  in the same process. When the new worker is up, the count of finished reloads is written to
  ``reload_file`` (the harness polls it to end the fault's window; a 0 once the first is up).
- SIGTERM stops it for good (the reloader's own restart of its server process is this, then a
  new process: the harness starts the replacement, ``reload_proc``); a second signal hurries.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from streamq import Worker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from chaos.worker import Ledger, grace, make_worker, setup, written


class App:
    """The app: its lifespan owns the embedded worker."""

    def __init__(self, url: str, queue: str, name: str, config: dict[str, Any],
                 ledger: Ledger) -> None:
        self.worker: Worker = make_worker(url, queue, name, config, ledger)

    async def startup(self) -> None:
        await self.worker.start()

    async def shutdown(self) -> None:
        await self.worker.stop()


async def serve(argv: list[str]) -> None:
    url, queue, name, config, ledger = setup(argv)
    loop = asyncio.get_running_loop()
    stop, reload = asyncio.Event(), asyncio.Event()
    app = App(url, queue, name, config, ledger)

    def on_term() -> None:
        if stop.is_set():
            app.worker.hurry()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_term)
    loop.add_signal_handler(signal.SIGHUP, reload.set)
    await app.startup()
    done = 0
    if config.get("reload_file"):  # up, signals handled: reloads may come
        written(config["reload_file"], done)
    try:
        while not stop.is_set():
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(reload.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            if stop.is_set():
                break
            reload.clear()
            await app.shutdown()  # the old code's app: stopped gracefully
            app = App(url, queue, name, config, ledger)  # the new code's app
            while True:  # a start that meets an outage is tried again (uvicorn would crash)
                try:
                    await app.startup()
                    break
                except Exception as exc:  # noqa: BLE001 - logged, tried again
                    print(f"embedded worker start failed, retrying: {exc!r}", file=sys.stderr)
                    if stop.is_set():
                        return
                    await asyncio.sleep(0.5)
            done += 1
            if config.get("reload_file"):
                written(config["reload_file"], done)
    finally:
        grace(app.worker, config.get("grace_file"))
        await app.shutdown()


def main(argv: list[str]) -> int:
    asyncio.run(serve(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
