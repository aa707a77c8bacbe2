"""Starting a provider binary as a go-plugin server, reading its handshake, and reaping it.

A provider must never outlive kl. Three mechanisms, each covering what the others cannot:
- its own process group (setsid), so kl can kill it and anything it spawned in one signal, and a
  Ctrl-C at the terminal reaches kl only (kl then shuts providers down in order);
- PR_SET_PDEATHSIG=SIGKILL (Linux), so even a SIGKILLed kl takes its providers with it. The signal
  fires when the *thread* that forked exits, so every plugin is forked from one long-lived spawner
  thread rather than from whichever worker thread asked;
- a registry of live plugins killed at interpreter exit (atexit) and by ``kill_all()``, which a
  second signal to ``kl refresh`` calls (and a worker that leaves threads behind).
"""
from __future__ import annotations

import atexit
import collections
import concurrent.futures
import ctypes
import logging
import os
import queue
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kilolock.provider.errors import PluginStartError
from kilolock.provider.handshake import Handshake, parse_handshake
from kilolock.provider.logbridge import StderrLogBridge, provider_logger, quiet_plugin_log_env
from kilolock.redact import Redactor

MAGIC_COOKIE_KEY = "TF_PLUGIN_MAGIC_COOKIE"
MAGIC_COOKIE_VALUE = "d602bf8f470bc67ca7faa0386276bbdd4330efaf76d1a219cb4d6991ca9872b2"
_NOT_FOR_DIRECT_USE = "This binary is a plugin"
_STDERR_TAIL_LINES = 40
_MAX_HANDSHAKE_LINE = 64 * 1024
# kl's own credentials: a provider gets the rest of kl's environment (its cloud credentials come
# from there, as under Terraform) but has no business with kl's database or server tokens.
_KL_CREDENTIALS = ("KL_DATABASE_URL", "KL_SERVE_TOKEN", "KL_SERVE_ADMIN_TOKEN")

T = TypeVar("T")


# --- the spawner thread ---------------------------------------------------------------------------


class _Spawner:
    """One daemon thread that performs every fork, so PDEATHSIG tracks the life of kl itself."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], concurrent.futures.Future[object]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="kl-plugin-spawner", daemon=True)
                self._thread.start()
        fut: concurrent.futures.Future[object] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        return fut.result()  # type: ignore[return-value]

    def _loop(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
                fut.set_exception(exc)


_spawner = _Spawner()

if sys.platform.startswith("linux"):
    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl
else:  # pragma: no cover - kl's supported platform is Linux; elsewhere the registry still reaps
    _prctl = None
_PR_SET_PDEATHSIG = 1


def _preexec(parent_pid: int) -> Callable[[], None]:
    def child() -> None:
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent_pid:  # kl died between fork and prctl
                os._exit(1)

    return child


# --- the registry of live plugins -----------------------------------------------------------------

_live: set[PluginProcess] = set()
_live_lock = threading.Lock()


def kill_all() -> None:
    """SIGKILL every plugin still running; safe from signal handlers' follow-up code and atexit."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        proc.kill()


atexit.register(kill_all)


# --- one plugin process ---------------------------------------------------------------------------


SOCKET_DIR_PREFIX = "kl-plugin-"


def sweep_orphaned_socket_dirs(base: str | None = None) -> int:
    """Remove the plugin socket directories (in BASE, the temporary directory by default) of kl
    processes that are gone: a kl killed outright (SIGKILL, the OOM killer) cannot remove its own.
    Only this user's, named by a process id no process has any more, and with no plugin answering
    on its socket (a kl in another PID namespace sharing the directory, a container's, has an id
    this one cannot see); returns how many went."""
    base = base or tempfile.gettempdir()
    try:
        entries = os.scandir(base)
    except OSError:
        return 0
    swept = 0
    with entries:
        for entry in entries:
            pid_text = entry.name[len(SOCKET_DIR_PREFIX):].partition("-")[0]
            if not entry.name.startswith(SOCKET_DIR_PREFIX) or not pid_text.isdigit():
                continue
            try:
                if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                    continue
                os.kill(int(pid_text), 0)
                continue  # its process is alive (or the id was reused: left for that one)
            except ProcessLookupError:
                pass
            except OSError:
                continue  # another user's process, or the entry went meanwhile
            if _serving(entry.path):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            swept += not os.path.exists(entry.path)
    return swept


def _serving(directory: str) -> bool:
    """Whether a plugin may still use DIRECTORY: one of its sockets accepts a connection, or it is
    too new for its plugin to be listening yet."""
    import socket as sockets
    import time

    try:
        names = os.listdir(directory)
        if not names and time.time() - os.stat(directory).st_mtime < 60:
            return True
    except OSError:
        return False
    for name in names:
        path = os.path.join(directory, name)
        try:
            if not stat.S_ISSOCK(os.stat(path, follow_symlinks=False).st_mode):
                continue
            with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as probe:
                probe.settimeout(0.5)
                probe.connect(path)
            return True
        except OSError:
            continue  # refused: nothing listens there any more
    return False


@dataclass(frozen=True)
class LaunchSpec:
    """What to start and how: the binary, its certificate, timeout, secrets and directory."""

    binary: str
    name: str  # the provider type, used for logger names and messages
    client_cert_pem: bytes | None
    start_timeout: float
    # The launching run's secrets: masked in the plugin's log lines and in the stderr tail that
    # error messages quote. A plugin launched outside a refresh knows none.
    secrets: Redactor = field(default_factory=Redactor)
    # The plugin's working directory (relative paths in resources resolve against it); None: kl's own.
    cwd: str | None = None


# hclog's JSON lines below WARN: a provider at TRACE writes dozens per call, and they would push
# the lines that explain an exit (a panic, a warning, plain text) out of the error's stderr tail.
_HCLOG_CHATTER = tuple(b'{"@level":"%s"' % level for level in (b"trace", b"debug", b"info"))


class PluginProcess:
    """A running plugin binary after a successful handshake."""

    def __init__(self, spec: LaunchSpec, popen: subprocess.Popen[bytes], socket_dir: str) -> None:
        self.spec = spec
        self.popen = popen
        self.pid = popen.pid
        self.socket_dir = socket_dir
        self.logger = provider_logger(spec.name)
        self.handshake: Handshake | None = None
        self._first_line: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._reaped = threading.Event()
        self._kill_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._drain_stdout, name=f"kl-{spec.name}-stdout", daemon=True),
            threading.Thread(target=self._drain_stderr, name=f"kl-{spec.name}-stderr", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # -- start --

    @classmethod
    def start(cls, spec: LaunchSpec) -> PluginProcess:
        """Spawn the plugin and wait for its handshake line."""
        proc = cls.spawn(spec)
        proc.wait_for_handshake()
        return proc

    @classmethod
    def spawn(cls, spec: LaunchSpec) -> PluginProcess:
        """Start the plugin without waiting for it: a Go binary takes a while to print its handshake
        (longer with AutoMTLS, when it makes its own key), which the caller can spend on other work
        (importing grpc) before ``wait_for_handshake``."""
        if spec.cwd is not None and not os.path.isdir(spec.cwd):
            # Popen would say FileNotFoundError, which reads as a missing binary.
            raise PluginStartError(f"working directory {spec.cwd} does not exist on this host")
        # mode 0700: only kl's user can connect. Named by this process, which removes it when the
        # plugin ends; one a SIGKILLed kl left behind is swept by sweep_orphaned_socket_dirs.
        socket_dir = tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{os.getpid()}-")
        env = dict(os.environ)
        env.pop("PLUGIN_CLIENT_CERT", None)
        for var in _KL_CREDENTIALS:
            env.pop(var, None)
        env.update(quiet_plugin_log_env(os.environ))
        env.update(
            {
                MAGIC_COOKIE_KEY: MAGIC_COOKIE_VALUE,
                "PLUGIN_PROTOCOL_VERSIONS": "6,5",
                "PLUGIN_MIN_PORT": "10000",
                "PLUGIN_MAX_PORT": "25000",
                "PLUGIN_UNIX_SOCKET_DIR": socket_dir,
            }
        )
        if spec.client_cert_pem is not None:
            env["PLUGIN_CLIENT_CERT"] = spec.client_cert_pem.decode()
        parent = os.getpid()

        def spawn() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [spec.binary],
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_preexec(parent),  # noqa: PLW1509 - only prctl(PR_SET_PDEATHSIG), async-signal-safe
                close_fds=True,
            )

        try:
            popen = _spawner.run(spawn)
        except FileNotFoundError:
            shutil.rmtree(socket_dir, ignore_errors=True)
            raise PluginStartError(f"provider binary {spec.binary} does not exist") from None
        except PermissionError:
            shutil.rmtree(socket_dir, ignore_errors=True)
            raise PluginStartError(f"provider binary {spec.binary} is not executable (check its permissions)") from None
        except OSError as exc:
            shutil.rmtree(socket_dir, ignore_errors=True)
            raise PluginStartError(f"provider binary {spec.binary} cannot be executed: {exc.strerror or exc}") from None
        proc = cls(spec, popen, socket_dir)
        with _live_lock:
            _live.add(proc)
        return proc

    def wait_for_handshake(self) -> Handshake:
        """The plugin's handshake (waiting for it once); a plugin that fails it is killed."""
        if self.handshake is None:
            try:
                self.handshake = self._await_handshake()
            except BaseException:
                self.kill()
                raise
        return self.handshake

    def _await_handshake(self) -> Handshake:
        binary, timeout = self.spec.binary, self.spec.start_timeout
        try:
            line = self._first_line.get(timeout=timeout)
        except queue.Empty:
            raise PluginStartError(
                f"{binary} did not complete the plugin handshake within {timeout:g}s{self._tail_suffix()}"
            ) from None
        if line is None:  # stdout closed without a line: the process is exiting
            try:
                self.popen.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
            self._threads[1].join(timeout=1.0)
            tail = "\n".join(self._stderr_tail)
            if _NOT_FOR_DIRECT_USE in tail:
                raise PluginStartError(
                    f"{binary} is a go-plugin binary for another application: it rejected Terraform's magic cookie"
                )
            raise PluginStartError(f"{binary} exited before the plugin handshake ({self.exit_description()}){self._tail_suffix()}")
        return parse_handshake(line, binary)

    # -- draining --

    def _drain_stdout(self) -> None:
        stream = self.popen.stdout
        assert stream is not None
        first = True
        try:
            while True:
                raw = stream.readline(_MAX_HANDSHAKE_LINE)
                if not raw:
                    break
                text = raw.decode("utf-8", errors="replace")
                if first:
                    first = False
                    self._first_line.put(text)
                else:
                    self.logger.debug("stdout: %s", self.spec.secrets.redact(text.rstrip()))
        except (OSError, ValueError):
            pass
        finally:
            if first:
                self._first_line.put(None)

    def _drain_stderr(self) -> None:
        stream = self.popen.stderr
        assert stream is not None
        bridge = StderrLogBridge(self.logger, self.spec.secrets)
        try:
            for raw in iter(stream.readline, b""):
                text = raw.decode("utf-8", errors="replace")
                if not raw.startswith(_HCLOG_CHATTER):
                    self._stderr_tail.append(text.rstrip())
                bridge.line(text)
        except (OSError, ValueError):
            pass

    # -- state --

    def alive(self) -> bool:
        return self.popen.poll() is None

    def exit_description(self) -> str:
        code = self.popen.poll()
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def stderr_tail(self) -> list[str]:
        """The last stderr lines, known secrets masked: the tail goes into error messages."""
        return [self.spec.secrets.redact(line) for line in self._stderr_tail]

    def _tail_suffix(self) -> str:
        lines = [line for line in self.stderr_tail() if line][-8:]
        return "; stderr: " + " | ".join(lines) if lines else ""

    # -- ending --

    def wait(self, timeout: float) -> bool:
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        self._finish()
        return True

    def kill(self) -> None:
        """SIGKILL the whole process group and reap it; idempotent and thread-safe."""
        with self._kill_lock:
            if self.popen.poll() is None:
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                except PermissionError:  # pragma: no cover - group gone and pid reused
                    self.popen.kill()
            try:
                self.popen.wait(timeout=10.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - uninterruptible sleep in the kernel
                logging.getLogger(__name__).error("provider %s (pid %d) did not die after SIGKILL", self.spec.name, self.pid)
            self._finish()

    def _finish(self) -> None:
        if self._reaped.is_set():
            return
        self._reaped.set()
        with _live_lock:
            _live.discard(self)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=1.0)
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        self._remove_stray_socket()

    def _remove_stray_socket(self) -> None:
        # go-plugin < 1.5 ignores PLUGIN_UNIX_SOCKET_DIR and listens in $TMPDIR; it removes the
        # socket on a clean exit but not when killed. The process is gone, so the path is ours to drop.
        hs = self.handshake
        if hs is None or hs.network != "unix" or hs.address.startswith(self.socket_dir + os.sep):
            return
        try:
            if stat.S_ISSOCK(os.lstat(hs.address).st_mode):
                os.unlink(hs.address)
        except OSError:
            pass
