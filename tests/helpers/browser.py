"""Headless Chromium for the page tests: a minimal DevTools client and a page to drive."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class DevTools:
    """A minimal Chrome DevTools Protocol client over a standard-library WebSocket."""

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(4096)
        assert b" 101 " in response.split(b"\r\n")[0], response
        self.buffer = response.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _receive(self) -> dict[str, Any]:
        message = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            message += self._read(length)
            if first & 0x80:  # FIN
                return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.next_id += 1
        payload: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            payload["sessionId"] = session
        data = json.dumps(payload).encode()
        mask = os.urandom(4)
        header = bytes([0x81])
        header += (bytes([0x80 | len(data)]) if len(data) < 126 else
                   bytes([0x80 | 126]) + struct.pack(">H", len(data)) if len(data) < 65536 else
                   bytes([0x80 | 127]) + struct.pack(">Q", len(data)))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        while True:
            message = self._receive()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == event for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(event)
            self.events.append(self._receive())


def evaluate(devtools: DevTools, session: str, expression: str) -> Any:
    """The value of a JavaScript ``expression`` in the page (awaited where it is a promise)."""
    result = devtools.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=session)["result"]
    return result.get("value")


def until(devtools: DevTools, session: str, expression: str, timeout: float = 30) -> Any:
    """The first truthy value of ``expression``, polled while the page renders."""
    deadline = time.monotonic() + timeout
    while True:
        value = evaluate(devtools, session, expression)
        if value:
            return value
        assert time.monotonic() < deadline, f"the page never showed: {expression}"
        time.sleep(0.1)


@contextmanager
def headless_page(browser: str, profile: Path, width: int = 1400, height: int = 900) -> Iterator[tuple[DevTools, str]]:
    """A blank page of a headless ``browser`` (its profile in ``profile``), with the Runtime, Log,
    Network and Page domains on: ``(devtools, session)``. The browser is stopped on leaving."""
    process = subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            assert process.poll() is None, f"{browser} exited with {process.returncode}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port in 60 s"
            time.sleep(0.2)
        port, path = port_file.read_text().splitlines()[:2]
        devtools = DevTools(int(port), path)
        target = devtools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = devtools.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            devtools.call(f"{domain}.enable", session=session)
        devtools.call("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        yield devtools, session
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
