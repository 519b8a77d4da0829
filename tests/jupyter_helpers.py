"""Start a real JupyterLab from this environment on a free loopback port with a token; stop it always."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Server:
    url: str
    token: str
    process: subprocess.Popen
    log: Path


def _api(server: Server, method: str, route: str, timeout: float = 10.0):
    req = urllib.request.Request(f"{server.url}api/{route}", method=method,
                                 headers={"Authorization": f"token {server.token}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body else None


def shutdown_sessions(server: Server, path: str, timeout: float = 30.0) -> int:
    """Shut down every session (and so its kernel) the server holds for the notebook ``path`` (relative to its
    root), through the REST API; return how many. Closing a browser tab leaves the kernel running."""
    sessions = [s for s in _api(server, "GET", "sessions") if s.get("path") == path]
    for s in sessions:
        _api(server, "DELETE", f"sessions/{s['id']}", timeout=timeout)
    return len(sessions)


def running_kernels(server: Server) -> list[dict]:
    """The kernels the server runs now (id, name, execution_state)."""
    return _api(server, "GET", "kernels")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_jupyter_lab(
    root_dir: Path, settings_dir: Path | None = None, timeout: float = 60.0, env: dict[str, str] | None = None
):
    """Yield a Server for ``root_dir``; ``env`` entries are added to the server's (and so its kernels') environment."""
    port, token = free_port(), secrets.token_hex(16)
    log = Path(root_dir) / ".jupyter-server.log"
    extra_env = dict(env or {})
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if settings_dir is not None:
        env["JUPYTERLAB_SETTINGS_DIR"] = str(settings_dir)
    env.update(extra_env)
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip", "127.0.0.1", f"--port={port}",
        f"--IdentityProvider.token={token}", "--allow-root", f"--ServerApp.root_dir={root_dir}",
        "--ServerApp.open_browser=False", "--LabApp.news_url=", "--ServerApp.port_retries=0",
        # No keep-alive pings on the kernels' websockets: on loopback they detect nothing, and a browser tab too
        # busy to read its socket for 2 minutes (a loaded 2-core machine) had its connection closed, lost the
        # replies sent meanwhile and showed a cell running for ever.
        '--ServerApp.tornado_settings={"ws_ping_interval": 0}',
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not answer within {timeout} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield Server(url=url, token=token, process=proc, log=log)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
