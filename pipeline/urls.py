from django.urls import path

from pipeline.views import report_latest_view

urlpatterns = [
    path("pipeline/reports/latest/", report_latest_view, name="pipeline-report-latest"),
]
