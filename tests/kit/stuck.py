"""A provider read that StopProvider cannot end: the real local provider reading a local_file whose
file was replaced by a FIFO blocks until someone writes to it, whatever Stop says. For the tests of
cancellation (tests/refresh, tests/fleet)."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from kit.kl import kl_cmd, kl_env
from kit.paths import PLUGIN_CACHE
from kit.providers import BY_TYPE, require

LOCAL = 'provider["registry.terraform.io/hashicorp/local"]'


def local_file_state(name: str, files: list[str]) -> bytes:
    """A state of local_files as Terraform 1.0.3 writes them (relative paths: out/<file>.conf)."""
    return json.dumps({
        "version": 4, "terraform_version": "1.0.3", "serial": 1, "lineage": f"lineage-{name}", "outputs": {},
        "resources": [{"mode": "managed", "type": "local_file", "name": f, "provider": LOCAL, "instances": [{
            "schema_version": 0, "sensitive_attributes": [],
            "attributes": {"content": f"{f} = 1\n", "content_base64": None, "directory_permission": "0777",
                           "file_permission": "0777", "filename": f"out/{f}.conf", "id": "0" * 40,
                           "sensitive_content": None, "source": None}}]} for f in files],
    }).encode()


def add_fifo_state(db_url: str, name: str, workdir: Path, files: list[str]) -> list[Path]:
    """State NAME with WORKDIR as its workdir, where every out/<file>.conf is a FIFO: each read of
    them blocks. Returns the FIFOs."""
    require(BY_TYPE["local"])
    (workdir / "out").mkdir(parents=True)
    fifos = [workdir / "out" / f"{f}.conf" for f in files]
    for fifo in fifos:
        os.mkfifo(fifo)
    env = kl_env(KL_DATABASE_URL=db_url)
    for args, given in ((("state", "import", name, "-"), local_file_state(name, files)),
                        (("state", "set", name, "--workdir", str(workdir), "--provider-search-path", str(PLUGIN_CACHE)), None)):
        r = subprocess.run(kl_cmd(*args), input=given, env=env, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()
    return fifos


@contextlib.contextmanager
def reads_stuck(fifos: list[Path], timeout: float = 60.0) -> Iterator[None]:
    """Waits until a provider is reading each FIFO, and holds a writer open on each until the end
    of the block: the read then blocks in read(2) rather than open(2), still where no Stop reaches
    it. (Opening a FIFO for writing without blocking succeeds only once it has a reader.)"""
    fds: list[int] = []
    try:
        for fifo in fifos:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fds.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                    break
                except OSError as exc:
                    if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                        raise AssertionError(f"no provider started reading {fifo}: {exc}") from None
                time.sleep(0.05)
        yield
    finally:
        for fd in fds:
            os.close(fd)
