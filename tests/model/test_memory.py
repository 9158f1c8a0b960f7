"""What one engine process holds in memory while it serves the default model."""
from __future__ import annotations

from tests.model.oracle import _shutdown
from tests.native.engine import Engine, base_env, chatml


def _status_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in open(f"/proc/{pid}/status"):
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            out[key] = int(rest.split()[0])
    return out


def test_it_keeps_the_model_file_out_of_its_memory(default_model, engine_binary):
    """The forward pass reads owned copies only (packed matrices, norm vectors, the F32 router),
    so a conversation maps no part of the 118 MB file back in. When the norms and the router were
    read in place, one conversation brought 72 MB of the file into the process: the page cache
    holds the file in large folios, and a fault on a 2 KB vector maps the folio around it."""
    e = Engine(engine_binary, env=base_env(default_model, slots=1, ctx=512))
    try:
        e.generate(chatml("Tell me about the sea."), max_tokens=16)
        st = _status_kb(e.proc.pid)
    finally:
        _shutdown(e)
    # what stays: the engine's and the shared libraries' code, the GGUF header and a few pages
    assert st["RssFile"] < 16 * 1024, st
    assert st["VmHWM"] < 200 * 1024, st
