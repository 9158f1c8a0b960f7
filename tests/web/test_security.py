"""Issue 10, item 6: login throttling, the Content-Security-Policy and production settings."""
import os
import secrets
import subprocess

import pytest

from tests.support import procs
from tests.web.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def _login(client, username, password):
    return client.post("/accounts/login/", {"username": username, "password": password},
                       REMOTE_ADDR="203.0.113.7")


def test_it_locks_out_a_guessed_account_even_for_the_right_password(client, alice, settings):
    for _ in range(20):
        r = _login(client, "alice", "wrong password")
        assert r.status_code in (200, 429)
    r = _login(client, "alice", PASSWORD)
    assert r.status_code == 429, "the right password worked after 20 wrong ones"
    assert "_auth_user_id" not in client.session


def test_a_few_typos_do_not_lock_anyone_out(client, alice, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _login(client, "alice", "typo").status_code == 200
    r = _login(client, "alice", PASSWORD)
    assert r.status_code == 302 and client.session["_auth_user_id"] == str(alice.pk)


def test_a_locked_username_does_not_lock_other_users(client, alice, bob, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT + 1):
        _login(client, "alice", "wrong")
    assert _login(client, "bob", PASSWORD).status_code == 302


def test_pages_carry_a_strict_content_security_policy(client, alice):
    client.force_login(alice)
    policy = client.get("/")["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
    assert directives["script-src"] == "'self'"  # no inline script, no eval
    assert directives["default-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
    assert directives["object-src"] == "'none'"


def test_check_deploy_is_clean_with_production_settings():
    env = {**os.environ, "COLIBRI_DEV": "0", "DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50),
           "ALLOWED_HOSTS": "chat.example.com", "CSRF_TRUSTED_ORIGINS": "https://chat.example.com"}
    out = subprocess.run([procs.PYTHON, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                         cwd=procs.ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues" in out.stdout


def test_production_settings_refuse_to_start_without_a_secret_key():
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    env.update(COLIBRI_DEV="0", DEBUG="0")
    out = subprocess.run([procs.PYTHON, "manage.py", "check"], cwd=procs.ROOT, env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "SECRET_KEY must be set" in out.stderr


def test_production_redirects_to_https_but_not_the_health_probe():
    env = {**os.environ, "COLIBRI_DEV": "0", "SECRET_KEY": secrets.token_urlsafe(50),
           "ALLOWED_HOSTS": "testserver", "DJANGO_SETTINGS_MODULE": "colibri_site.settings"}
    script = ("import django; django.setup()\n"
              "from django.test import Client\n"
              "c = Client()\n"
              "r = c.get('/accounts/login/'); print(r.status_code, r.get('Location'))\n"
              "r = c.get('/health'); print(r.status_code)\n")
    out = subprocess.run([procs.PYTHON, "-c", script], cwd=procs.ROOT, env=env, capture_output=True, text=True)
    lines = out.stdout.split("\n")
    assert lines[0] == "301 https://testserver/accounts/login/", out.stdout + out.stderr
    assert lines[1] in ("200", "503"), out.stdout + out.stderr
