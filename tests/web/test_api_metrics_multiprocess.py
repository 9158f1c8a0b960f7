"""/metrics across several web processes: with PROMETHEUS_MULTIPROC_DIR set, counters that two
processes incremented appear summed in a third process's exposition."""
import os
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from tests.support import procs

SETUP = ("import django; django.setup(); from colibri_base import metrics; "
         "from engine_bridge import telemetry; telemetry.get_state = lambda: {'updated': None}; ")


def run(code, env):
    return subprocess.run([sys.executable, "-c", SETUP + code], cwd=procs.ROOT, env=env, capture_output=True,
                          text=True, check=True, timeout=120).stdout


def test_counters_from_several_processes_are_summed(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "colibri_site.settings", "COLIBRI_DEV": "1",
           "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for n in (2, 3):
        run(f"metrics.REQUESTS.labels('openai_chat', '200').inc({n})", env)
    text = run("import sys; sys.stdout.write(metrics.exposition(telemetry.get_state).decode())", env)
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(text) for s in family.samples}
    assert values[("colibri_api_requests_total", (("status", "200"), ("surface", "openai_chat")))] == 5
    assert values[("colibri_engine_up", ())] == 0
