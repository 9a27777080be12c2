"""A free TCP port for a test's two-process launch: torch's launchers bind 29500 by default, and two launches
at once (pytest-xdist workers, or anything else on the machine) would collide on it."""

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
