"""A built-in receiver for the seeded sample push consumer, so a first run delivers somewhere."""

from __future__ import annotations

import logging

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

logger = logging.getLogger("broker.api.sample")  # its name before the move: what operators filter on


class SampleReceiverView(APIView):
    parser_classes = []

    @extend_schema(summary="Sample webhook receiver (accepts any POST with 204)",
                   request={"*/*": bytes}, responses={204: OpenApiResponse(description="accepted")})
    def post(self, request):
        logger.info("sample receiver got message %s (%s bytes)",  # (its body is not read: anyone may post here)
                    request.headers.get("X-Broker-Message-ID", "?"), request.META.get("CONTENT_LENGTH") or 0)
        return Response(status=204)
