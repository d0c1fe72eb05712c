"""A hostile operator in Python, the sandbox probes of tests/guests/hostile for this language.
`config.mode` picks the misbehaviour, which starts at the first record:

- `probe`: tries the environment, files, clocks, randomness and network, and emits what it saw;
- `allocate`: allocates without bound; `loop`: spins forever; `recurse`: recurses without bound;
- `raise`: raises an exception the SDK does not know (not an eddy.OperatorError).
"""

import os
import socket
import time

import eddy


def can(action):
    try:
        action()
        return True
    except Exception:  # noqa: BLE001 - any refusal counts as one
        return False


def probe():
    def read_file():
        with open("/etc/hostname") as f:
            f.read()

    def connect():
        socket.create_connection(("127.0.0.1", 9), timeout=1).close()

    return {
        "env": sorted(os.environ),
        "file": can(read_file) or can(lambda: os.listdir("/")),
        "clock_ms": int(time.time() * 1000),
        "monotonic_ns": time.monotonic_ns(),
        "random": os.urandom(8).hex(),
        "network": can(connect),
    }


def recurse(depth):
    return recurse(depth + 1) + 1


class Hostile(eddy.Operator):
    def open(self, ctx, config):
        self.mode = config["mode"]

    def process(self, record, ctx):
        if self.mode == "probe":
            ctx.emit_value(probe())
        elif self.mode == "allocate":
            hoard = []
            while True:
                hoard.append(bytearray(1 << 20))
        elif self.mode == "loop":
            while True:
                pass
        elif self.mode == "recurse":
            recurse(0)
        elif self.mode == "raise":
            raise KeyError("no such thing")
        else:
            raise eddy.BadConfig(f"no mode {self.mode!r}")


Operator = eddy.export_operator(Hostile)

