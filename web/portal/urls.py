"""The portal's routes, under ``/portal/`` (``web.urls``): the link opening (followed, then started
with a button), then one consumer's pages
under its channel and consumer ids; anything else under /portal/ is the portal's own 404."""

from django.urls import path, re_path

from web.portal import access, catalog, endpoint, pages

app_name = "portal"
_K = "channel/<str:channel_id>/consumer/<str:consumer_id>/"

urlpatterns = [
    path("open", access.link_start_view, name="start"),
    path("open/<str:token>", access.link_open_view, name="open"),
    path(_K, pages.overview_view, name="overview"),
    path(f"{_K}sign-out", access.sign_out_view, name="sign_out"),
    path(f"{_K}deliveries", pages.deliveries_view, name="deliveries"),
    path(f"{_K}deliveries/<str:job_id>", pages.job_view, name="job"),
    path(f"{_K}dead-letters", pages.dead_letters_view, name="dead_letters"),
    path(f"{_K}dead-letters/requeue", pages.requeue_view, name="requeue"),
    path(f"{_K}dead-letters/requeue-all", pages.requeue_all_view, name="requeue_all"),
    path(f"{_K}replay", pages.replay_view, name="replay"),
    path(f"{_K}event-catalog", catalog.event_catalog_view, name="event_catalog"),
    path(f"{_K}endpoint", endpoint.endpoint_view, name="endpoint"),
    path(f"{_K}endpoint/rotate-secret", endpoint.rotate_secret_view, name="rotate_secret"),
    path(f"{_K}endpoint/test-event", endpoint.test_event_view, name="test_event"),
    re_path(r"", access.not_found_page),
]
