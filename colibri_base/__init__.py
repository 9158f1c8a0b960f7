"""The floor the apps stand on: the pieces that api/, chat/, experts/ and ops/ share.

Why a package of its own: `colibri_site/` is the project (settings, URLs, ASGI, Celery), and the
project imports every app; while it also held what the apps import (the lean path, the cache
backend, the metrics), each app sat on top of the project that sat on top of every app, a tower
in which any module could reach any other. Here the shared pieces stand below all of them:

  colibri_site                 the project: settings, urls, asgi, celery (+ the Daphne patches
                               and the static-file middleware they install: no app imports those)
  api | chat | experts | ops   peers: each may use engine_bridge and this package, never another
  engine_bridge                the engine's bridge and its client
  colibri_base                 this package

Modules: access (staff-only views), cache (the Redis cache backend), frames (websocket frame
declarations rendered as TypeScript and checked in tests), layers (the default channel layer), lean
(the API's short middleware chain and `database_call`), metrics (the /metrics and /v1/stats
registry), socket_access (whether an open websocket may still act).

Invariant: nothing here imports an app, engine_bridge or colibri_site; what it needs from above
is handed in by the caller (metrics.stats takes the bridge-state reader, metrics.declare_surfaces
the API's surface names, each socket app builds its own frames.FrameSet). pyproject.toml's
import-linter contracts hold every layer to this, run by tests/test_layers.py.
"""
