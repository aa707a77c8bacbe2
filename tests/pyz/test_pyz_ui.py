"""The web UI from kl.pyz: templates and the stylesheet are read from inside the zip, and Jinja2's
MarkupSafe works without its C speedups (they are optional: its pure-Python escaping takes over)."""
from __future__ import annotations

import base64
import os
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kit.pyz import clean_env, extracted_files, unit_dir

TOKEN = "pyz-ui-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _serve(pyz: Path, host_python: Path, home: Path) -> Iterator[str]:
    port = _free_port()
    env = clean_env(home, KL_SERVE_TOKEN=TOKEN)
    proc = subprocess.Popen([str(host_python), "-I", str(pyz), "serve", "--listen", f"127.0.0.1:{port}"], env=env,
                            cwd=str(home), stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "web UI at http://127.0.0.1:" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _get(url: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": "Basic " + base64.b64encode(f"me:{TOKEN}".encode()).decode()})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _check_pages(base: str) -> None:
    status, html = _get(base + "/ui/")
    assert status == 200 and ">prod</a>" in html, html[:1000]
    status, html = _get(base + "/ui/state?name=prod")
    assert status == 200 and "null_resource.a" in html and "<svg" in html, html[:1000]
    status, css = _get(base + "/ui/static/style.css")
    assert status == 200 and "--accent" in css
    status, html = _get(base + "/ui/search?type=%3Cb%3Ex%3C%2Fb%3E")  # the form echoes it, escaped
    assert status == 200 and "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html


def test_the_web_ui_serves_from_the_pyz(run_pyz, pyz, host_python, home, db_url, make_state):
    assert run_pyz("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}}).decode()).returncode == 0
    with _serve(pyz, host_python, home) as base:
        _check_pages(base)


def test_markupsafe_falls_back_to_pure_python_in_the_pyz(run_pyz, pyz, host_python, home, db_url, make_state):
    assert run_pyz("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}}).decode()).returncode == 0
    unit = unit_dir(home / ".cache" / "kilolock" / "pyz")
    speedups = [p for p in extracted_files(unit) if p.startswith("markupsafe/_speedups")]
    assert speedups, "the pyz carries MarkupSafe's C speedups for this python"
    for name in speedups:  # a native that cannot load, as on a host it was not built for
        path = unit / name
        size = path.stat().st_size
        st = path.stat()
        path.write_bytes(b"\x7fELF garbage" + b"\0" * (size - 12))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with _serve(pyz, host_python, home) as base:
        _check_pages(base)
