"""`serve`'s command-line values: `--vm NAME=SOCKET` and `--listen HOST:PORT` (argparse
types: a bad value is refused in one line), and the bounds of `--max-seconds` (here, not
in commands/serve.py, so that building the parser imports no asyncio)."""

from __future__ import annotations

import argparse
import re

#: VM names go into URL paths and pprof labels as they are: no escaping ever needed.
VM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DEFAULT_PORT = 6060
#: The default `--max-seconds`: longer than any scrape interval in use (Parca 10 s,
#: Alloy 15 s, `go tool pprof` 30 s); every sample is kept in memory until it is answered.
DEFAULT_MAX_SECONDS = 300
#: `--max-seconds` itself: an hour of samples of a few vCPUs at 99 Hz is ~1.5 M samples.
MAX_SECONDS_LIMIT = 3600


def vm_spec(text: str) -> tuple[str, str]:
    """`NAME=SOCKET` as (name, socket path)."""
    name, equals, socket = text.partition("=")
    if not equals or not socket:
        raise argparse.ArgumentTypeError(f"expected NAME=SOCKET, not {text!r}")
    if not VM_NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(
            f"a VM name is 1 to 64 letters, digits, '.', '_' or '-' "
            f"(starting with a letter or digit), not {name!r}"
        )
    return name, socket


def listen_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:PORT` for IPv6) as (host, port); port 0 picks a free one."""
    host, colon, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or not port.isdigit() or not port.isascii() or int(port) > 65535:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT (127.0.0.1:{DEFAULT_PORT}, [::1]:{DEFAULT_PORT}), not {text!r}"
        )
    return host, int(port)
