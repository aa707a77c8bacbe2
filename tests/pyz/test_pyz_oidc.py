"""OIDC tokens through a kl serve run from kl.pyz: PyJWT and cryptography (natives under native/,
cffi's backend among them) verify RS256 and ES256 signatures with a bare python3."""
from __future__ import annotations

import subprocess
from pathlib import Path

from kit.httpclient import Client
from kit.klserve import free_port
from kit.oidc import AUDIENCE, Issuer
from kit.procs import stderr_line
from kit.pyz import clean_env

SUB = "repo:acme/infra:ref:refs/heads/main"


def test_kl_serve_from_the_pyz_verifies_a_token(run_pyz, pyz: Path, host_python: Path, home: Path, db_url, make_state):
    issuer = Issuer()
    try:
        r = run_pyz("access", "trust", "oidc", "--issuer", issuer.url, "--audience", AUDIENCE, "--jwks", issuer.jwks_url,
                    "--name", "ci")
        assert r.returncode == 0, r.stderr
        r = run_pyz("access", "grant", f"oidc:ci:{SUB}", "--role", "write", "--states", "**")
        assert r.returncode == 0, r.stderr
        port = free_port()
        proc = subprocess.Popen([str(host_python), "-I", str(pyz), "serve", "--listen", f"127.0.0.1:{port}", "-q"],
                                env=clean_env(home), cwd=str(home), stderr=subprocess.PIPE, text=True)
        try:
            assert "kl serve:" in stderr_line(proc)
            banner = stderr_line(proc)
            assert "1 OIDC trust" in banner, banner
            client = Client(f"http://127.0.0.1:{port}")
            rsa_token, ec_token = issuer.token(SUB), issuer.token(SUB, kind="ec")
            assert client.with_auth(f"Bearer {rsa_token}").request("POST", "/states/p", make_state(1, {"a": {}})).status == 200
            assert client.basic("oidc", ec_token).request("GET", "/states/p").status == 200
            wrong = client.with_auth(f"Bearer {issuer.token(SUB, aud='other')}").request("GET", "/states/p")
            assert wrong.status == 401 and "audience 'other'" in wrong.text, wrong.text
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        issuer.close()
