"""A page loaded in headless Chromium, driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: JSON messages ended by NUL on file descriptors 3 and 4), so
the test needs no websocket client and no port: the console messages, uncaught
exceptions and failed loads of the page, a script's result and a screenshot."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def chromium_path() -> str | None:
    """The Chromium executable on PATH (Debian's ``chromium``), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@dataclass
class PageLoad:
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, failed loads
    requests: list[str] = field(default_factory=list)  # URLs the page fetched (file: and data: left out)
    console: list[str] = field(default_factory=list)  # every console / log message, as "level: text"
    value: Any = None  # what the script evaluated to
    screenshot: bytes = b""


class _Pipe:
    def __init__(self, exe: str, profile: str) -> None:
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()

        def fds() -> None:  # the child's fd 3 reads commands, fd 4 writes replies and events
            # copies above 3 and 4 first: either end may itself be fd 3 or 4
            r, w = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [
                exe,
                "--headless",
                "--no-sandbox",  # the test may run as root in a container
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=fds,
            pass_fds=(3, 4),  # kept open in the child after fds() has set them
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        return self._id

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
                self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 60,
    ) -> dict[str, Any]:
        want = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read(deadline)
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        for i, ev in enumerate(self.events):
            if ev["method"] == method:
                return self.events[i]
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read(deadline)
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return msg

    def close(self) -> None:
        try:
            self.send("Browser.close")
            self.proc.wait(timeout=20)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        finally:
            os.close(self._w)
            os.close(self._r)
            if self.proc.stderr is not None:
                self.proc.stderr.close()


def _text(args: list[dict[str, Any]]) -> str:
    return " ".join(str(a.get("value", a.get("description", a.get("type", "")))) for a in args)


def load_page(
    path: Path, script: str, *, width: int = 1200, height: int = 2400, timeout: float = 120
) -> PageLoad:
    """Load the file ``path`` in headless Chromium, evaluate ``script`` (an expression whose
    value is returned by value) once the load event has fired, and take a PNG of the whole
    page (the viewport grows to the page's height, at least ``height``)."""
    exe = chromium_path()
    if exe is None:
        raise FileNotFoundError("chromium is not installed")
    with tempfile.TemporaryDirectory() as profile:
        pipe = _Pipe(exe, profile)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                pipe.call(f"{domain}.enable", session=session)
            pipe.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            nav = pipe.call("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
            load = PageLoad()
            if nav.get("errorText"):
                load.errors.append(f"navigation: {nav['errorText']}")
            pipe.wait_for("Page.loadEventFired", timeout=timeout)
            # the viewport as tall as the page: the script's client rectangles are then the
            # screenshot's pixel coordinates
            full = pipe.call(
                "Runtime.evaluate",
                {"expression": "document.documentElement.scrollHeight", "returnByValue": True},
                session=session,
            )["result"]["value"]
            pipe.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": max(height, int(full)), "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            res = pipe.call(
                "Runtime.evaluate",
                {"expression": script, "returnByValue": True, "awaitPromise": True},
                session=session,
            )
            if "exceptionDetails" in res:
                load.errors.append(f"script: {res['exceptionDetails'].get('text')}")
            load.value = res.get("result", {}).get("value")
            shot = pipe.call("Page.captureScreenshot", {"format": "png"}, session=session)
            load.screenshot = base64.b64decode(shot["data"])
            for ev in pipe.events:
                p = ev.get("params", {})
                if ev["method"] == "Runtime.consoleAPICalled":
                    line = f"{p.get('type')}: {_text(p.get('args', []))}"
                    load.console.append(line)
                    if p.get("type") in ("error", "assert"):
                        load.errors.append(line)
                elif ev["method"] == "Runtime.exceptionThrown":
                    d = p.get("exceptionDetails", {})
                    load.errors.append(
                        f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}"
                    )
                elif ev["method"] == "Log.entryAdded":
                    e = p.get("entry", {})
                    line = f"{e.get('level')}: {e.get('text')} {e.get('url', '')}".strip()
                    load.console.append(line)
                    if e.get("level") == "error":
                        load.errors.append(line)
                elif ev["method"] == "Network.requestWillBeSent":
                    url = p.get("request", {}).get("url", "")
                    if not url.startswith(("file:", "data:")):
                        load.requests.append(url)
                elif ev["method"] == "Network.loadingFailed":
                    load.errors.append(f"load failed: {p.get('errorText')}")
            return load
        finally:
            pipe.close()
