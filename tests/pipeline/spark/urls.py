"""URLs for the Spark tests: the pipeline's report page next to the admin (for its login)."""

from django.contrib import admin
from django.urls import path

from web.reports import report_latest_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("pipeline/reports/latest/", report_latest_view, name="pipeline-report-latest"),
]
