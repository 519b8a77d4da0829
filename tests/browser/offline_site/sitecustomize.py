"""Put on PYTHONPATH of the browser tests' JupyterLab (and so of its kernels) with WB_TEST_OFFLINE=1.

Any socket connection to a host other than loopback fails with a message that says why, so a notebook that
downloads something fails here the way it would on an offline machine; Binder users and CI must not depend
on the network. Loopback stays open: the server, the kernel and the browser talk over it.
"""

import os

if os.environ.get("WB_TEST_OFFLINE") == "1":
    import ipaddress
    import socket

    _connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex

    def _check(address):
        if not isinstance(address, tuple):  # AF_UNIX path: local by definition
            return
        host = str(address[0])
        try:
            local = host == "localhost" or ipaddress.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            local = False
        if not local:
            raise OSError(
                f"connection to {host}:{address[1]} refused: the browser tests run with the network cut "
                "(WB_TEST_OFFLINE=1) because notebooks must work without it; use a shipped sample instead"
            )

    def connect(self, address):
        _check(address)
        return _connect(self, address)

    def connect_ex(self, address):
        _check(address)
        return _connect_ex(self, address)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
