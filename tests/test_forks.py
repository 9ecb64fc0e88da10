"""The fork servers behind warm kernels and forked notebook workers (helpers/pipeline/run/forks.py): a child
gets the client's stdio, cwd and environment in a session of its own; its exit code comes back; a client
that goes away, or the server's parent, takes the child with it; a bad request or a lost server does not
pass for an exit."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.pipeline.paths import repo_root
from helpers.pipeline.run import procs
from helpers.pipeline.run.forks import Forked

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(os, "pidfd_open"), reason="Linux only")

# The child: print what it was given, then sleep (request["sleep"]) and exit with request["code"].
SERVER = """
import json, os, signal, sys, time
from helpers.pipeline.run.forks import serve

def child(request):
    print(json.dumps({"cwd": os.getcwd(), "env": os.environ.get("FORK_TEST"), "sid": os.getsid(0) == os.getpid(),
                      "big": len(os.environ.get("BIG", ""))}),
          flush=True)
    time.sleep(request.get("sleep", 0))
    return request.get("code", 0)

serve(sys.argv[1], child)
"""


def _server(tmp_path: Path, via_shell: bool = False) -> tuple[subprocess.Popen, str]:
    path = str(tmp_path / "s.sock")
    cmd = [sys.executable, "-c", SERVER, path]
    if via_shell:  # the server's parent is a shell we can kill
        cmd = ["sh", "-c", " ".join(f"'{c}'" for c in cmd) + " & wait"]
    proc = subprocess.Popen(cmd, cwd=repo_root(), start_new_session=True)
    deadline = time.monotonic() + 20
    while not Path(path + ".ready").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert Path(path + ".ready").exists(), "the fork server did not start"
    return proc, path


@pytest.fixture()
def server(tmp_path):
    """A fork server of the child above: (its process, its socket path); stopped after the test."""
    proc, path = _server(tmp_path)
    yield proc, path
    procs.stop_processes([proc.pid, *procs.descendants(proc.pid)], grace=1.0)
    proc.wait()


def _request(path: str, tmp_path: Path, big: int = 0, **request) -> tuple[Forked, Path]:
    out = tmp_path / f"out{time.monotonic_ns()}.txt"
    env = {"FORK_TEST": "yes", "PATH": os.environ["PATH"], **({"BIG": "x" * big} if big else {})}
    with open(out, "wb") as log, open(os.devnull, "rb") as null:
        forked = Forked(path, {"cwd": str(tmp_path), "env": env, **request}, [null.fileno(), log.fileno(), log.fileno()])
    return forked, out


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while procs._alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not procs._alive(pid)


def test_child_gets_the_clients_stdio_cwd_and_environment_and_its_exit_code_returns(server, tmp_path):
    proc, path = server
    forked, out = _request(path, tmp_path, code=7)
    assert forked.wait(timeout=20) == 7 and forked.poll() == 7
    seen = json.loads(out.read_text())
    assert seen == {"cwd": str(tmp_path), "env": "yes", "sid": True, "big": 0}
    again, out = _request(path, tmp_path, code=0, big=3_000_000)  # more than one, and one in many pieces
    assert again.wait(timeout=20) == 0 and again.pid != forked.pid
    assert json.loads(out.read_text())["big"] == 3_000_000


def test_poll_does_not_block_and_wait_times_out_while_the_child_runs(server, tmp_path):
    proc, path = server
    forked, _ = _request(path, tmp_path, sleep=30)
    start = time.monotonic()
    assert forked.poll() is None and time.monotonic() - start < 0.5
    with pytest.raises(TimeoutError):
        forked.wait(timeout=0.2)
    os.kill(forked.pid, signal.SIGTERM)
    assert forked.wait(timeout=10) == -signal.SIGTERM


def test_a_client_that_goes_away_takes_its_child_with_it(server, tmp_path):
    proc, path = server
    forked, _ = _request(path, tmp_path, sleep=30)
    forked.close()
    assert _gone_within(forked.pid, 5), "the child outlived its client"
    assert proc.poll() is None, "the server stopped with it"


def test_a_bad_request_is_dropped_and_the_server_goes_on(server, tmp_path):
    import socket

    proc, path = server
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.connect(path)
    bad.sendall(b"not json")
    assert bad.recv(64) == b""  # closed without a pid
    forked, _ = _request(path, tmp_path, code=3)
    assert forked.wait(timeout=20) == 3


def test_a_lost_server_is_not_taken_for_the_childs_exit(server, tmp_path):
    proc, path = server
    forked, _ = _request(path, tmp_path, sleep=30)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.2)
    assert forked.poll() is None and procs._alive(forked.pid), "a child still running was reported as exited"
    os.kill(forked.pid, signal.SIGKILL)
    assert forked.wait(timeout=10) == 1  # its exit code went with the server


def test_the_servers_parent_going_away_ends_the_children(tmp_path):
    shell, path = _server(tmp_path, via_shell=True)
    server = procs.descendants(shell.pid)
    forked, _ = _request(path, tmp_path, sleep=30)
    os.kill(shell.pid, signal.SIGKILL)
    shell.wait()
    assert _gone_within(forked.pid, 5), "a child outlived the run that started its server"
    assert all(_gone_within(pid, 5) for pid in server), "the server outlived its parent"

