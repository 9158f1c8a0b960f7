"""Engine hosts as Linux network namespaces on this machine (issue 26 item 6): a small LAN in
the root namespace (a bridge device on a private 10.231.<n>.0/24), a Redis bound to the LAN's
root-side address, and per host a namespace cabled to the LAN by a veth pair. A process run in a
host (`ip netns exec`) reaches Redis only across its cable, so cutting the cable
(`ip link set ... down`) is a host vanishing from the network, the way a machine does.

Names carry this process's pid (namespaces `colibri-nh<pid>-<host>`, links `cnb<pid>` for the
LAN and `cnv<pid><host>` for a cable), so concurrent test sessions never touch each other's;
`sweep_leftovers` removes those of sessions whose pid no longer runs. Needs root and `ip`
(Debian package iproute2); without `ip` the lab refuses with a message naming the package.

Invariant: after `close()` (called however the tests ended) no namespace, link, process or
Redis of this lab is left.
"""
import contextlib
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support import procs

NS_PREFIX = "colibri-nh"
LINK_PREFIXES = ("cnb", "cnv")
_OWNED = re.compile(rf"^(?:{NS_PREFIX}|{'|'.join(LINK_PREFIXES)})(\d+)")


def ip(*args: str, check: bool = True) -> str:
    """Runs `ip ARGS`; its stdout. Fails naming the command and its stderr."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def require_ip() -> None:
    """Refuses, naming the package, where `ip` is missing (the tests fail then, never skip)."""
    if shutil.which("ip") is None:
        raise RuntimeError("the network-namespace tests need the `ip` command: install the Debian package "
                           "iproute2 (apt-get install iproute2) and run them as root")


def _pid_runs(pid: int) -> bool:
    """Whether a process of that pid exists (a leftover's owner still running: not ours to sweep)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """SIGKILLs every process in `ns`, then deletes it."""
    for pid in ip("netns", "pids", ns, check=False).split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", ns, check=False)


def sweep_leftovers() -> None:
    """Removes the namespaces and links a crashed earlier session left (its pid no longer runs)."""
    for line in ip("netns", "list").splitlines():
        ns = line.split()[0] if line.strip() else ""
        owner = _OWNED.match(ns)
        if owner and not _pid_runs(int(owner.group(1))):
            _kill_namespace(ns)
    for line in ip("-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        owner = _OWNED.match(name)
        if owner and not _pid_runs(int(owner.group(1))):
            for address in re.findall(r"inet ([\d.]+)/", ip("-o", "-4", "addr", "show", "dev", name, check=False)):
                _kill_redis_on(address)
            ip("link", "del", name, check=False)


def _kill_redis_on(address: str) -> None:
    """SIGKILLs the redis-server listening on `address` (its process title: `redis-server ADDR:PORT`)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            title = cmdline.read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith(f"redis-server {address}:"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(cmdline.parent.name), signal.SIGKILL)


def _free_subnet() -> str:
    """A 10.231.<n> no address on this machine uses (starting from one this pid picks)."""
    used = set(re.findall(r"inet 10\.231\.(\d+)\.", ip("-o", "-4", "addr", "show")))
    start = os.getpid() % 200
    for n in (1 + (start + k) % 254 for k in range(254)):
        if str(n) not in used:
            return f"10.231.{n}"
    raise RuntimeError("no free 10.231.<n>.0/24 subnet for the namespace lab")


@dataclass
class Host:
    name: str     # short name, e.g. "h1" (the bridge id the tests give it)
    ns: str       # its network namespace
    cable: str    # the root-side end of its veth pair
    address: str  # its address on the LAN

    def exec_prefix(self) -> list[str]:
        """argv that runs a command inside this host (procs.start_bridge's argv_prefix)."""
        return ["ip", "netns", "exec", self.ns]


class Lab:
    """The LAN, its Redis and its hosts; `open()` builds the LAN and starts Redis."""

    def __init__(self, workdir: Path) -> None:
        self.tag = str(os.getpid())
        self.workdir = workdir
        self.lan = f"cnb{self.tag}"
        self.subnet = ""
        self.hosts: dict[str, Host] = {}
        self.cabled = 0  # hosts ever added: each gets the next address, never a removed one's
        self.redis: subprocess.Popen | None = None
        self.redis_url = ""

    def open(self) -> "Lab":
        require_ip()
        sweep_leftovers()
        self.subnet = _free_subnet()
        ip("link", "add", self.lan, "type", "bridge")
        ip("addr", "add", f"{self.subnet}.1/24", "dev", self.lan)
        ip("link", "set", self.lan, "up")
        port = procs.free_port()
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", f"{self.subnet}.1", "--protected-mode", "no",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir)], stdout=subprocess.DEVNULL)
        procs.wait_for_port(port, self.redis, host=f"{self.subnet}.1")
        self.redis_url = f"redis://{self.subnet}.1:{port}/0"
        return self

    def add_host(self, name: str) -> Host:
        """A new namespace with loopback up, cabled to the LAN at .(10 + its number)."""
        self.cabled += 1
        host = Host(name, f"{NS_PREFIX}{self.tag}-{name}", f"cnv{self.tag}{name}", f"{self.subnet}.{10 + self.cabled}")
        self.hosts[name] = host
        ip("netns", "add", host.ns)
        ip("link", "add", host.cable, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        ip("link", "set", host.cable, "master", self.lan, "up")
        inside = ["netns", "exec", host.ns, "ip"]
        ip(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip(*inside, "link", "set", "eth0", "up")
        ip(*inside, "link", "set", "lo", "up")
        return host

    def cut(self, name: str) -> None:
        """Pulls the host's cable: its processes run on, and reach nothing."""
        ip("link", "set", self.hosts[name].cable, "down")

    def power_off(self, name: str) -> None:
        """Kills every process in the host and removes it (namespace and cable)."""
        host = self.hosts.pop(name)
        _kill_namespace(host.ns)
        ip("link", "del", host.cable, check=False)

    def close(self) -> None:
        """Removes whatever open() and add_host() made (nothing when `ip` is missing: then they
        made nothing, and the refusal must stay the error the caller sees)."""
        procs.stop(self.redis)
        if shutil.which("ip") is None:
            return
        for name in list(self.hosts):
            self.power_off(name)
        ip("link", "del", self.lan, check=False)
