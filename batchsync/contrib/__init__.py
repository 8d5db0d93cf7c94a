"""Optional integrations, each with its extra, kept apart from the core as in ``urllib3.contrib``:
``dask`` (a batch across a Dask cluster), ``redis`` (limits shared by processes), ``prometheus``
(metrics) and ``otel`` (OpenTelemetry traces). The core imports one only when a run asks for it,
through what this package offers, never by a module's name. Each is a leaf: it imports only
the engine's and the limits' terms, and the runs (``run``) import it.

May import: core, limits.
"""

from __future__ import annotations

from ..limits.shared import SharedLimits


def shared_limits(url: str, namespace: str, lease_ttl: float) -> SharedLimits:
    """The backend of limits shared through the server at ``url`` (Redis), its module
    imported only now; ValueError when it cannot be reached."""
    from .redis import RedisLimits

    return RedisLimits(url, namespace, lease_ttl)
