"""Real connexd OS processes for the tests, started as harness/e2e/harness_test.go does."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[3]
T = TypeVar("T")

# The authority of each connexd's embedded, authenticated NATS server, by its URL (the ready line's auth=), kept in
# the environment so that child processes of a test (prefill_process.py) find it too.
_AUTH_ENV = "CONNEX_TEST_AUTHORITIES"


def _authorities() -> dict[str, str]:
    out: dict[str, str] = {}
    for item in os.environ.get(_AUTH_ENV, "").split(","):
        url, _, d = item.partition("=")
        if url and d:
            out[url] = d
    return out


def creds(nats_url: str, *identity: str) -> str:
    """Mints NATS credentials for an identity (``--role engine --member M --engine E``, ``--role admin``, ...) with
    ``connexd auth creds``, as an operator would, when nats_url is an authenticated embedded server; "" otherwise."""
    d = _authorities().get(nats_url)
    if not d:
        return ""
    fd, path = tempfile.mkstemp(prefix="connex-test-", suffix=".creds")
    os.close(fd)
    subprocess.run([connexd_binary(), "auth", "creds", "--dir", d, "-o", path, *identity], check=True)
    return path


def admin_creds(nats_url: str) -> str:
    """The admin credentials of an authenticated embedded server at nats_url, or ""."""
    d = _authorities().get(nats_url)
    return os.path.join(d, "admin.creds") if d else ""


def connexd_binary() -> str:
    """$CONNEXD, or bin/connexd at the repository root (run-tests.sh builds it)."""
    path = os.environ.get("CONNEXD") or str(ROOT / "bin" / "connexd")
    if not os.access(path, os.X_OK):
        raise RuntimeError(
            f"connexd binary {path} not found: run `go build -o bin/connexd ./cmd/connexd` or set CONNEXD"
        )
    return path


def wait_for(what: str, fn: Callable[[], T | None], timeout_s: float = 10.0, every_s: float = 0.005) -> T:
    """Polls fn until it returns a value that is not None (or True), failing after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            v = fn()
            if v is not None and v is not False:
                return v
        except Exception as e:  # keep polling; report the last error
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s (last error: {last!r})")
        time.sleep(every_s)


class Connexd:
    """One connexd process; ``nats_url`` is parsed from its ready line."""

    def __init__(self, member: str, role: str, nats_url: str | None, extra: list[str] | None = None) -> None:
        self.member = member
        self.data_dir = tempfile.mkdtemp(prefix=f"connexd-{member}-")
        args = [
            connexd_binary(),
            "--member-id", member,
            "--role", role,
            "--cluster-preset", "local",
            "--data-dir", self.data_dir,
            "--log-level", "warn",
            *(extra or []),
        ]  # fmt: skip
        if nats_url:
            args += ["--nats-url", nats_url]
            member_creds = creds(nats_url, "--role", "member", "--member", member)
            if member_creds:
                args += ["--nats-creds", member_creds]
        else:
            args += ["--nats-listen", "127.0.0.1:0"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        ready = threading.Event()
        self.nats_url = nats_url or ""

        def read_out() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith("connexd ready"):
                    auth_dir = ""
                    for f in line.split():
                        if f.startswith("nats="):
                            self.nats_url = f.removeprefix("nats=")
                        if f.startswith("auth="):
                            auth_dir = f.removeprefix("auth=")
                    if auth_dir:
                        known = _authorities()
                        known[self.nats_url] = auth_dir
                        os.environ[_AUTH_ENV] = ",".join(f"{u}={d}" for u, d in known.items())
                    ready.set()

        def read_err() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.stderr.append(line)

        threading.Thread(target=read_out, daemon=True).start()
        threading.Thread(target=read_err, daemon=True).start()
        deadline = time.monotonic() + 30
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"connexd {member} not ready: {''.join(self.stderr[-40:])}")

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
