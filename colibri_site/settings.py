"""Settings: everything that varies between machines is read from the environment here, once."""
import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
DEV = env_bool("COLIBRI_DEV", True)  # a developer's machine: plain http, a dev key
SECRET_KEY = env("SECRET_KEY") or ("insecure-dev-key" if DEBUG or DEV else "")
if not SECRET_KEY:
    raise RuntimeError("SECRET_KEY must be set when COLIBRI_DEV=0")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "http://localhost:8000,http://127.0.0.1:8000")
# Websocket Origin check: hosts allowed as the Origin of a websocket handshake.
WEBSOCKET_ALLOWED_ORIGINS = env_list("WEBSOCKET_ALLOWED_ORIGINS", ",".join(ALLOWED_HOSTS))

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "channels",
    "axes",
    "csp",
    "engine_bridge",
    "chat",
    "experts",
    "api",
    "ops",
    "colibri_site",  # for its management command (frames_ts), which spans the apps
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "colibri_site.static.AsyncWhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "api.keyauth.ApiKeyUserMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes requires: it turns a locked-out login into its lockout answer.
    "axes.middleware.AxesMiddleware",
]

# The API routes served with API_MIDDLEWARE instead (colibri_base/lean.py): API-key auth in DRF, no
# session, cookie or CSRF state, so the page chain's thread hops would only delay the first token.
# All of /v1 (its unknown routes' 404 envelope too: an SDK pointed at a route we lack, such as
# /v1/embeddings, paid ~6 ms of page middleware per call) except the staff stats page, which may be
# served by session, and the OpenAPI document.
# /health too: a probe must answer within a second under load and under every fault (issue 24).
API_LEAN_PATHS = r"/v1/(?!stats$|openapi\.json$).+|/health"
API_MIDDLEWARE = ["colibri_base.lean.InlineSecurityMiddleware"]

# JSON routes outside /v1 that also take an API key (as its owner; the route's own rule decides).
API_KEY_PATHS = ["/experts"]

# --- Security: production defaults whenever COLIBRI_DEV=0; each can be set from the environment.
# `manage.py check --deploy` is clean with COLIBRI_DEV=0 and a strong SECRET_KEY (issue 10).
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEV)
SECURE_REDIRECT_EXEMPT = [r"^health$"]  # load balancers probe over plain http
SECURE_HSTS_SECONDS = int(env("SECURE_HSTS_SECONDS", "0" if DEV else "31536000"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEV)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEV)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEV)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEV)
if env_bool("SECURE_PROXY_SSL_HEADER", False):  # behind a TLS-terminating proxy that sets it
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# Content-Security-Policy (django-csp): only our own scripts, styles and connections (the chat
# and atlas websockets are same-origin); no inline script, no framing.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# Login throttling (django-axes): after AXES_FAILURE_LIMIT wrong passwords for one username from
# one address, that pair is locked out for AXES_COOLOFF_TIME hours, the right password included.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(env("AXES_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = float(env("AXES_COOLOFF_HOURS", "0.25"))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_IPWARE_PROXY_COUNT = int(env("AXES_PROXY_COUNT", "0"))

ROOT_URLCONF = "colibri_site.urls"
ASGI_APPLICATION = "colibri_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# One connection per request, closed at its end (CONN_MAX_AGE=0). Under ASGI each request's sync
# code runs in a thread of its own, so persistent connections are never reused; a pool would
# be, but a streaming answer holds its connection until the stream ends, and 50 concurrent
# streams exhausted a 16-connection pool (measured; issue 14 left it at this).
DATABASES = {"default": dj_database_url.parse(env("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env("REDIS_URL", "redis://127.0.0.1:6379/0")
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [REDIS_URL],
            # Token batches are small and numbered; a larger capacity keeps bursts from being dropped.
            "capacity": 1000,
            "expiry": 60,
        },
    }
}
CACHES = {
    "default": {
        "BACKEND": "colibri_base.cache.SharedPoolRedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env("CACHE_PREFIX", "colibri"),
    }
}

CELERY_BROKER_URL = env("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_IGNORE_RESULT = True

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "frontend" / "dist"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# Request bodies above this answer 413 (the /v1 surfaces render it in their envelope); colibri's
# gateway caps at 4 MiB, the engine's SUBMIT payload at 16 MiB.
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024

# /v1 admission defaults for keys and users without limits of their own in the admin (0 = none).
API_DEFAULT_REQUESTS_PER_MINUTE = int(env("API_DEFAULT_REQUESTS_PER_MINUTE", "0")) or None
API_DEFAULT_TOKENS_PER_MINUTE = int(env("API_DEFAULT_TOKENS_PER_MINUTE", "0")) or None

REST_FRAMEWORK: dict[str, object] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
}

# The engine the bridge owns. ENGINE_COMMAND overrides the whole command line (e.g. the real
# colibri binary); ENGINE_ENV adds KEY=VALUE pairs (comma separated) to its environment.
ENGINE_BINARY = env("ENGINE_BINARY", str(BASE_DIR / "native" / "build" / "colibri-engine"))
ENGINE_COMMAND = env("ENGINE_COMMAND", "")
ENGINE_ENV = env("ENGINE_ENV", "")
ENGINE_MODEL = env("ENGINE_MODEL", str(BASE_DIR / "models" / "smollm2-135m-moe16.gguf"))
ENGINE_CTX = int(env("CTX", "4096"))
KV_SLOTS = int(env("KV_SLOTS", "4"))
ENGINE_READY_TIMEOUT = float(env("ENGINE_READY_TIMEOUT", "120"))
# The engine's niceness: on a small host its threads take every core, and the web processes'
# short bursts (a request's admission, a text batch) wait behind them; a positive value lets
# those bursts go first (bench/webpath.py). 0 = as the bridge.
ENGINE_NICE = int(env("ENGINE_NICE", "0"))
BRIDGE_QUEUE_LIMIT = int(env("BRIDGE_QUEUE_LIMIT", "32"))
# Several bridges on one Redis (engine_bridge.registry): this bridge's id (its inbox, heartbeat,
# state and registration keys), the host name it reports, and the model a request naming none
# gets (a served model id; empty: the first model by bridge id).
BRIDGE_ID = env("BRIDGE_ID", "main")
BRIDGE_HOST = env("BRIDGE_HOST", "")
DEFAULT_MODEL = env("DEFAULT_MODEL", "")
# Text batches per second the bridge sends over all running requests together (the first token of
# each never waits): each costs the web path ~0.5 ms of CPU; a larger host can afford more.
BRIDGE_TEXT_BATCHES_PER_S = float(env("BRIDGE_TEXT_BATCHES_PER_S", "100"))
# Shortest interval between two text batches of one stream (the first token never waits): 25
# updates a second, fluid for reading; on 2 cores 0.1 s less web-path CPU per 1,000 tokens than
# 15 ms (bench/webpath.py). A larger host can afford 0.015.
BRIDGE_TEXT_FRAME_S = float(env("BRIDGE_TEXT_FRAME_S", "0.04"))
# Chat template for engines that send no MODEL line (jinja2, ChatML by default).
CHAT_TEMPLATE = env("CHAT_TEMPLATE", "")
DEFAULT_MAX_TOKENS = int(env("DEFAULT_MAX_TOKENS", "512"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
}
