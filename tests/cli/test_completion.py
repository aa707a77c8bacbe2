"""`kl completion bash|zsh|fish`: the scripts loaded into real shells and driven as the shells drive
them at a TAB (bash: COMP_WORDS and the function `complete` registered; fish: `complete -C`), with
state names from a real store. zsh's script is checked to parse (`zsh -n`)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.kl import NO_DATABASE, kl_env, run_kl
from kit.paths import REPO

ASKED_FOR = "kl-completion-test-asked-for"


def _shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: install it (Debian: apt-get install {name}; scripts/setup-dev.sh does)",
                    pytrace=False)
    return path


@pytest.fixture(scope="module")
def kl_on_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with `kl` in it (this checkout's, as a user's shell finds it): the scripts run
    the first word of the command line to list state names."""
    bin_dir = tmp_path_factory.mktemp("bin")
    kl = bin_dir / "kl"
    kl.write_text(f'#!/bin/sh\nPYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} -m kilolock "$@"\n')
    kl.chmod(0o755)
    return bin_dir


def script(shell: str) -> str:
    r = run_kl("completion", shell, env={"KL_DATABASE_URL": NO_DATABASE})
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    return r.stdout.decode()


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "kl.bash"
    path.write_text(script("bash"))
    return path


def bash_complete(bash_script: Path, kl_on_path: Path, line: list[str], **env: str) -> tuple[list[str], str]:
    """What bash offers at a TAB after LINE (its last word the one being completed), and what the
    completion printed on stderr."""
    driver = (f"source {bash_script}\n"
              # The function `complete` registered for kl, called as bash calls it.
              "fn=$(complete -p kl | sed -n 's/.* -F \\([^ ]*\\) kl$/\\1/p')\n"
              '[ -n "$fn" ] || { echo "no completion registered for kl" >&2; exit 3; }\n'
              'COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}\n'
              '"$fn" kl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    full_env = kl_env(PATH=f"{kl_on_path}{os.pathsep}{os.environ['PATH']}", **env)
    r = subprocess.run([_shell("bash"), "--norc", "--noprofile", "-c", driver, "bash", *line], capture_output=True,
                       text=True, env=full_env, timeout=120)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w], r.stderr


def test_bash_completes_commands_actions_options_and_choices(bash_script, kl_on_path):
    def offers(*line: str) -> list[str]:
        return bash_complete(bash_script, kl_on_path, ["kl", *line], KL_DATABASE_URL=NO_DATABASE)[0]

    assert offers("st") == ["state", "status"]
    assert offers("state", "") == ["import", "list", "versions", "pull", "diff", "set", "show", "unlock", "rm", "mv"]
    assert offers("refresh", "prod", "--dr") == ["--dry-run"]
    assert "--detailed-exitcode" in offers("refresh", "prod", "--")
    assert offers("refresh", "--format", "") == ["table", "json", "markdown"]
    assert offers("completion", "") == ["bash", "zsh", "fish"]
    # `kl drift ignore|accept` are routed before kl's parser; completion knows them.
    assert offers("drift", "ignore", "") == ["add", "list", "remove"]
    assert offers("drift", "accept", "prod", "--dr") == ["--dry-run"]


def test_bash_completes_state_names_from_a_real_store(bash_script, kl_on_path, db_url, make_state):
    for name in ("prod/eu", "prod/us", "staging"):
        r = run_kl("state", "import", name, "-", input=make_state(1, {"a": {"id": "1"}}))
        assert r.returncode == 0, r.stderr
    def offers(*line: str) -> tuple[list[str], str]:
        return bash_complete(bash_script, kl_on_path, ["kl", *line])

    assert offers("refresh", "pro") == (["prod/eu", "prod/us"], "")
    assert offers("state", "versions", "") == (["prod/eu", "prod/us", "staging"], "")
    assert offers("drift", "--states", "st") == (["staging"], "")
    assert offers("drift", "") == (["ignore", "accept", "prod/eu", "prod/us", "staging"], "")  # a state or an action


def test_state_names_fail_silently_without_a_database(bash_script, kl_on_path):
    assert bash_complete(bash_script, kl_on_path, ["kl", "status", ""], KL_DATABASE_URL=NO_DATABASE) == ([], "")
    # The options still complete.
    assert bash_complete(bash_script, kl_on_path, ["kl", "status", "--f"], KL_DATABASE_URL=NO_DATABASE)[0] == ["--format"]


def test_state_names_never_start_the_embedded_database(tmp_path):
    env = {k: v for k, v in kl_env().items() if k != "KL_DATABASE_URL"}
    env["KL_DATA_DIR"] = str(tmp_path / "kl")
    r = subprocess.run([sys.executable, "-m", "kilolock", "completion", "--state-names"], capture_output=True,
                       env=env, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")
    assert not (tmp_path / "kl").exists()  # no cluster was made, let alone started


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word (a database host that hangs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield listener.getsockname()[1]
    stop.set()
    t.join(5)
    for s in accepted:
        s.close()
    listener.close()


def test_state_names_give_up_on_a_database_that_never_answers(silent_server):
    # kl's own connect timeout is 10 s; the completion's is shorter, and it says nothing either way.
    r = run_kl("completion", "--state-names", env={"KL_DATABASE_URL": f"postgresql://kl@127.0.0.1:{silent_server}/kl"},
               timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")


def test_completion_without_a_shell_is_a_one_line_usage_error():
    r = run_kl("completion")
    err = r.stderr.decode()
    assert r.returncode == 2 and err.splitlines()[0] == "kl: completion: give a shell: bash, zsh, fish", err
    assert "Traceback" not in err


def test_fish_completes_commands_options_and_state_names(kl_on_path, tmp_path, db_url, make_state):
    r = run_kl("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}}))
    assert r.returncode == 0, r.stderr
    path = tmp_path / "kl.fish"
    path.write_text(script("fish"))
    fish = _shell("fish")
    env = kl_env(PATH=f"{kl_on_path}{os.pathsep}{os.environ['PATH']}", HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))
    assert subprocess.run([fish, "-n", str(path)], capture_output=True, text=True, timeout=60).returncode == 0

    def offers(line: str) -> list[str]:
        done = subprocess.run([fish, "--no-config", "-c", f"source {path}; complete -C {line!r}"], capture_output=True,
                              text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        return [c.split("\t")[0] for c in done.stdout.splitlines()]

    assert offers("kl sta") == ["state", "status"]
    assert offers("kl refresh prod --dry") == ["--dry-run"]
    assert offers("kl refresh pr") == ["prod"]


def test_zsh_script_parses():
    r = subprocess.run([_shell("zsh"), "-n"], input=script("zsh"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
