"""Helpers to run the real processes of the stack (engine fixture model, bridge worker, Daphne) in tests."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"port {port} did not open within {timeout}s")


def stop(proc, timeout=10.0):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def build_engine(binary_env="COLIBRI_ENGINE"):
    """Builds native/ once and returns the engine binary (or the one named by $COLIBRI_ENGINE)."""
    override = os.environ.get(binary_env)
    if override:
        return Path(override).resolve()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    return ROOT / "native" / "build" / "colibri-engine"


def make_tiny_model(out_path, *extra_args):
    subprocess.run(
        [PYTHON, str(ROOT / "native" / "tools" / "make_tiny_moe.py"), str(out_path), *extra_args],
        check=True,
    )
    return Path(out_path)
