"""A minimal Chrome DevTools Protocol client over `--remote-debugging-pipe` (stdlib only).

Headless Chromium reads commands from its fd 3 and writes replies and events to its fd 4,
each a JSON object ended by a NUL byte. This is enough to load a page, evaluate
JavaScript, move and click the real mouse, press keys and answer dialogs, so the tests
exercise a flame graph as a person would.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

#: The flags of every headless Chromium run: no network, no profile of the user's, no GPU.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


class Browser:
    """One headless Chromium with one page, driven over the DevTools pipe.

    `dialogs` collects every JavaScript dialog the page opened (alert, confirm, prompt) as
    (type, message); `answer` decides what a prompt is answered with.
    """

    def __init__(self, chromium: str, width: int = 1200, height: int = 400) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="qmpprof-chromium-")
        self._process, self._write_fd = self._launch(chromium, width, height)
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._next_id = 0
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.dialogs: list[tuple[str, str]] = []
        self.answer: Callable[[str], str] = lambda message: ""
        self.session = ""
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self._attach()
        except BaseException:
            self.close()
            raise

    def _attach(self) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session = attached["sessionId"]
        self.send("Page.enable")
        self.send("Runtime.enable")

    def _launch(
        self, chromium: str, width: int, height: int
    ) -> tuple[subprocess.Popen[bytes], int]:
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        flags = [*CHROMIUM_FLAGS, "--hide-scrollbars", f"--user-data-dir={self._profile.name}"]
        flags += [f"--window-size={width},{height}", "--remote-debugging-pipe", "about:blank"]
        redirect = f'exec "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}'
        process = subprocess.Popen(
            ["bash", "-c", redirect, "chromium", chromium, *flags],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._read_fd = from_chrome_r
        return process, to_chrome_w

    def _read(self) -> None:
        buffer = b""
        while chunk := os.read(self._read_fd, 65536):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for message in messages:
                self._dispatch(json.loads(message))

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            self._replies.put(message)
            return
        self.events.append(message)
        if message.get("method") == "Page.javascriptDialogOpening":
            params = message["params"]
            self.dialogs.append((params["type"], params["message"]))
            reply = {"accept": True, "promptText": self.answer(params["message"])}
            self._post("Page.handleJavaScriptDialog", reply)

    def _post(
        self, method: str, params: dict[str, Any] | None = None, browser: bool = False
    ) -> int:
        with self._lock:
            self._next_id += 1
            message: dict[str, Any] = {"id": self._next_id, "method": method}
            message["params"] = params or {}
            if self.session and not browser:
                message["sessionId"] = self.session
            os.write(self._write_fd, json.dumps(message).encode() + b"\0")
            return self._next_id

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run one DevTools command and return its result; raises RuntimeError on an error."""
        wanted = self._post(method, params)
        deadline = time.monotonic() + 30
        while True:
            reply = self._replies.get(timeout=max(0.1, deadline - time.monotonic()))
            if reply["id"] == wanted:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def open(self, url: str, settle_s: float = 0.5) -> None:
        """Navigate to `url` and wait for its load event (and `settle_s` more)."""
        loaded = len(self.events)
        self.send("Page.navigate", {"url": url})
        deadline = time.monotonic() + 30
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events[loaded:]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load")
            time.sleep(0.05)
        time.sleep(settle_s)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def mouse(self, kind: str, x: float, y: float) -> None:
        """A real mouse event at page coordinates: mouseMoved, mousePressed, mouseReleased."""
        params: dict[str, Any] = {"type": kind, "x": x, "y": y, "button": "left"}
        if kind != "mouseMoved":
            params["clickCount"] = 1
        self.send("Input.dispatchMouseEvent", params)

    def click(self, x: float, y: float) -> None:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.mouse(kind, x, y)

    def key(self, key: str, code: str, key_code: int, modifiers: int = 0) -> None:
        """Press and release one key (modifiers: 2 = Ctrl)."""
        params = {"key": key, "code": code, "windowsVirtualKeyCode": key_code}
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", {"type": kind, "modifiers": modifiers, **params})

    def close(self) -> None:
        """End the browser (only the process this object started) and remove its profile."""
        try:
            self._post("Browser.close", browser=True)
            self._process.wait(timeout=10)
        except (subprocess.TimeoutExpired, OSError):  # it hangs, or is gone already
            self._process.kill()
            self._process.wait()
        finally:
            os.close(self._write_fd)
            self._profile.cleanup()
