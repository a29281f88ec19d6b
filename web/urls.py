"""Every route (ROOT_URLCONF): the admin, the OpenAPI schema and docs, the HTTP API, the pipeline's
report page. One list, in the order the routes are matched."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from web.api import consumers, dlq, event_types, messages, metrics, partitions, publishing, registry, sample, sources, status
from web.api.pull import views as pull
from web.portal import api as portal
from web.reports import report_latest_view

_C = "channel/<str:channel_id>/consumer/<str:consumer_id>"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    # registry, publishing, messages, health
    path("producers", registry.ProducerListView.as_view()),
    path("producer/<str:producer_id>", registry.ProducerView.as_view()),
    path("channels", registry.ChannelListView.as_view()),
    path("channel/<str:channel_id>", registry.ChannelView.as_view()),
    path("channel/<str:channel_id>/broadcast", publishing.BroadcastView.as_view()),
    path("channel/<str:channel_id>/messages", messages.MessagesView.as_view()),
    path("channel/<str:channel_id>/message/<str:message_id>", messages.MessageView.as_view()),
    path("channel/<str:channel_id>/messages-status", messages.MessagesStatusView.as_view()),
    # event types with schemas (issue 37): a type may hold "/", so its route takes a path
    path("channel/<str:channel_id>/event-types", event_types.EventTypeListView.as_view()),
    path("channel/<str:channel_id>/event-types/import", event_types.EventTypeImportView.as_view()),
    path("channel/<str:channel_id>/event-type/<path:event_type>", event_types.EventTypeView.as_view()),
    path("channel/<str:channel_id>/asyncapi.json", event_types.AsyncApiView.as_view()),
    path("_status", status.StatusView.as_view()),
    path("metrics", metrics.MetricsView.as_view()),
    path("_sample-receiver", sample.SampleReceiverView.as_view()),
    # consumers
    path("channel/<str:channel_id>/consumers", consumers.ConsumerListView.as_view()),
    path(_C, consumers.ConsumerView.as_view()),
    # flow control
    path(f"{_C}/pause", consumers.ConsumerPauseView.as_view()),
    path(f"{_C}/resume", consumers.ConsumerResumeView.as_view()),
    # replay and the circuit breaker
    path(f"{_C}/replay", consumers.ConsumerReplayView.as_view()),
    path(f"{_C}/circuit/close", consumers.ConsumerCircuitCloseView.as_view()),
    # pull consumers: the spec's endpoints
    path(f"{_C}/queued-jobs", pull.QueuedJobsView.as_view()),
    path(f"{_C}/job/<str:job_id>", pull.JobView.as_view()),
    path(f"{_C}/job/<str:job_id>/requeue-dead-job", pull.JobRequeueView.as_view()),
    # pull consumers: the fast path
    path(f"{_C}/pull", pull.PullView.as_view()),
    path(f"{_C}/ack", pull.AckView.as_view()),
    path(f"{_C}/job/<str:job_id>/progress", pull.JobProgressView.as_view()),
    # priority groups
    path(f"{_C}/unpin", pull.UnpinView.as_view()),
    path(f"{_C}/advisories", pull.AdvisoriesView.as_view()),
    # the delivery portal: links to one consumer's pages (web/portal), and the pages
    path(f"{_C}/portal-links", portal.PortalLinksView.as_view()),
    path("portal/", include("web.portal.urls")),
    # dead letters, secret rotation
    path(f"{_C}/dlq", dlq.DeadLetterQueueView.as_view()),
    path(f"{_C}/rotate-secret", dlq.RotateSecretView.as_view()),
    # partitions (documented with {key}; keys holding "/" once decoded, e.g. sent as %2F, reach the
    # same views through the <path:key> fallbacks after them)
    path(f"{_C}/partitions", partitions.PartitionListView.as_view()),
    *partitions.key_routes(_C),
    path("dlq-status", dlq.DlqStatusView.as_view()),
    path("job-status", dlq.JobStatusView.as_view()),
    path("channel/<str:channel_id>/scheduled-messages", dlq.ScheduledMessagesView.as_view()),
    path("channel/<str:channel_id>/scheduled-message/<str:message_id>", dlq.ScheduledMessageView.as_view()),
    # the Spark pipeline's latest report (staff only)
    path("pipeline/reports/latest/", report_latest_view, name="pipeline-report-latest"),
    # inbound sources (issue 36): the registry, and the address providers post to
    path("channel/<str:channel_id>/sources", sources.SourceListView.as_view()),
    path("channel/<str:channel_id>/source/<str:source_name>", sources.SourceView.as_view()),
    path("in/<str:source_id>", sources.SourceReceiveView.as_view()),
]

handler400 = "web.api.errors.bad_request_view"
handler403 = "web.api.errors.forbidden_view"
handler404 = "web.api.errors.not_found_view"
handler500 = "web.api.errors.server_error_view"
