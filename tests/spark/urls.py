"""URLs for the Spark tests: the pipeline's report page next to the admin (for its login)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("pipeline.urls")),
]
