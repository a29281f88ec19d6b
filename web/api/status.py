"""HTTP API for health: the database and the seed this process applied (``/_status``)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.health import database_ping
from broker.models import SeedState
from consumers.seed import seed_applied
from web.api.common import OBJ
from web.api.representations import rfc3339
from web.auth import is_admin


class StatusView(APIView):
    @extend_schema(
        summary="Health: database reachable, and the seed this process applied",
        description="SeedApplied / SeedHash / SeedAppliedAt: the seed configuration this broker process applied "
                    "(BROKER_SEED_CONFIG at start-up), so brokers sharing a database each show their own; "
                    "AppStatus 3 once any seed was applied to the database. SeedData (without tokens) "
                    "with the admin token.",
        responses={200: OBJ, 503: OBJ})
    def get(self, request):
        try:
            database_ping()
            database_seeded = SeedState.objects.filter(pk=1, applied_at__isnull=False).exists()
        except Exception:  # noqa: BLE001 - any database failure means unhealthy
            return Response({"Database": "unreachable", "AppStatus": 1}, status=503)
        applied = seed_applied()
        body = {
            "Database": "ok",
            "SeedApplied": applied is not None,
            "SeedHash": applied.digest if applied else "",
            "SeedAppliedAt": rfc3339(applied.applied_at) if applied else None,
            "AppStatus": 3 if database_seeded else 1,
        }
        if applied and is_admin(request):
            body["SeedData"] = applied.data
        return Response(body)
