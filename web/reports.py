"""Staff-only page serving the latest delivery report (the admin dashboard links here)."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import FileResponse, HttpResponse

from pipeline.latest import pipeline_report_latest


@staff_member_required
def report_latest_view(request):
    latest = pipeline_report_latest()
    if latest is None:
        return HttpResponse(
            "<p>No delivery report yet. Run <code>python manage.py pipeline report --since 7d</code>.</p>",
            status=404,
        )
    response = FileResponse(open(latest["html"], "rb"), content_type="text/html; charset=utf-8")
    response["Cache-Control"] = "no-store"
    return response
