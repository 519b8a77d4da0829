"""JupyterLab from this environment starts, answers /api/status, and stops."""

from __future__ import annotations

import json
import urllib.request

from jupyter_helpers import running_jupyter_lab


def test_jupyter_lab_starts_and_answers_status(tmp_path):
    with running_jupyter_lab(tmp_path) as server:
        with urllib.request.urlopen(f"{server.url}api/status?token={server.token}", timeout=10) as r:
            assert r.status == 200
            status = json.loads(r.read())
        assert "started" in status
    assert server.process.poll() is not None, "server still running after the context ended"
