from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("", include("broker.api.urls")),
    path("", include("consumers.urls")),
    path("", include("jobs.urls")),
    path("", include("pipeline.urls")),
]

handler400 = "broker.api.errors.bad_request_view"
handler403 = "broker.api.errors.forbidden_view"
handler404 = "broker.api.errors.not_found_view"
handler500 = "broker.api.errors.server_error_view"
