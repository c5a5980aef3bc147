"""Ports for the servers tests start: chosen by the OS, and held until the test ends.

Binding port 0, closing the socket and handing the number to a server leaves a
window in which another process (another server, a client's outgoing
connection) can take the port. `HeldPort` keeps its socket bound, never
listening, with SO_REUSEADDR and SO_REUSEPORT: the server binds the same port
beside it (uvicorn sets SO_REUSEADDR; gRPC, which serves JAX's coordinator and
TensorFlow's workers, sets both) and is the only one listening there, while
the kernel gives the port to no other bind to port 0 and to no outgoing
connection. `test_harness.py` checks both.

    with HeldPort() as port:
        server = start_server(port)
"""

import socket


class HeldPort:
    """A port the OS chose, held by a bound socket until `close()` (or the `with`)."""

    def __init__(self, host="127.0.0.1"):
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._socket.bind((host, 0))
        self.port = self._socket.getsockname()[1]

    def close(self):
        self._socket.close()

    def __enter__(self):
        return self.port

    def __exit__(self, *exc_info):
        self.close()
