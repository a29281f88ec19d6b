from django.urls import path

from jobs import api, partitions_api

_C = "channel/<str:channel_id>/consumer/<str:consumer_id>"

urlpatterns = [
    path(f"{_C}/dlq", api.DeadLetterQueueView.as_view()),
    path(f"{_C}/rotate-secret", api.RotateSecretView.as_view()),
    # partitions (documented with {key}; keys holding "/" once decoded, e.g. sent as %2F, reach the
    # same views through the <path:key> fallbacks after them)
    path(f"{_C}/partitions", partitions_api.PartitionListView.as_view()),
    *partitions_api.key_routes(_C),
    path("dlq-status", api.DlqStatusView.as_view()),
    path("job-status", api.JobStatusView.as_view()),
    path("channel/<str:channel_id>/scheduled-messages", api.ScheduledMessagesView.as_view()),
    path("channel/<str:channel_id>/scheduled-message/<str:message_id>", api.ScheduledMessageView.as_view()),
]
