"""Fixtures: a running stsd daemon on a private socket, with the test catalog and its own
audit log, and the paths the tests need."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Path(__file__).resolve().parent / "catalog.json"
SECRET = "supersecret-token-123"


def stsd_bin() -> str:
    # .cargo/config.toml names the target: the build is under target/<triple>/.
    b = os.environ.get("STSD_BIN", str(ROOT / "target" / "x86_64-unknown-linux-gnu" / "debug" / "stsd"))
    assert os.path.exists(b), f"{b} is missing: build first (scripts/test does)"
    return b


class Daemon:
    def __init__(self, tmp: Path, pool: int = 2, extra_config: str = "", catalog: Path = CATALOG,
                 args: list[str] | None = None):
        self.tmp = tmp
        self.catalog = catalog
        self.args = args or []
        self.socket = tmp / "stsd.sock"
        self.audit = tmp / "audit.jsonl"
        self.config = tmp / "stsd.toml"
        self.log = tmp / "stsd.log"
        baseline = '[baseline]\nenv_allow = ["STSD_TEST_*"]\n'
        if "[baseline]" in extra_config:
            extra_config = extra_config.replace("[baseline]\n", baseline, 1)
        else:
            extra_config = extra_config + "\n" + baseline
        self.config.write_text(
            f'[daemon]\naudit_log = "{self.audit}"\ncatalog_dir = "{tmp / "managed"}"\n'
            # Hand-written test catalogs; the Local Pass gate has its own test.
            f'require_local_pass = false\n{extra_config}'
        )
        self.pool = pool
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e["STSD_TEST_TOKEN"] = SECRET
        # Its own fingerprint ledger: tests that share tool names never see each other's.
        e["STSD_STATE_DIR"] = str(self.tmp / "state")
        e.pop("STSD_TEST_UNSET_VARIABLE", None)
        return e

    def start(self) -> "Daemon":
        self.proc = subprocess.Popen(
            [stsd_bin(), "--config", str(self.config), "--socket", str(self.socket),
             "--catalog", str(self.catalog), "--pool", str(self.pool), *self.args],
            # The daemon logs a line per call: a pipe nobody reads would fill and stall it.
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"), env=self.env(), text=True,
        )
        deadline = time.time() + 20
        while not self.socket.exists():
            assert self.proc.poll() is None, f"daemon exited: {self.log.read_text()}"
            assert time.time() < deadline, "daemon did not start"
            time.sleep(0.02)
        return self

    def mcp_command(self) -> list[str]:
        return [stsd_bin(), "mcp", "--socket", str(self.socket)]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        # Generous: exiting workers and the zygote are background work (SCHED_IDLE), which a
        # loaded machine runs late.
        return self.proc.wait(timeout=90)


@pytest.fixture
def daemon(tmp_path: Path):
    d = Daemon(tmp_path).start()
    yield d
    if d.proc and d.proc.poll() is None:
        d.stop()
