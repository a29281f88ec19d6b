from django.urls import path

from consumers import api, pull_api

_C = "channel/<str:channel_id>/consumer/<str:consumer_id>"

urlpatterns = [
    path("channel/<str:channel_id>/consumers", api.ConsumerListView.as_view()),
    path(_C, api.ConsumerView.as_view()),
    # flow control
    path(f"{_C}/pause", api.ConsumerPauseView.as_view()),
    path(f"{_C}/resume", api.ConsumerResumeView.as_view()),
    # pull consumers: the spec's endpoints
    path(f"{_C}/queued-jobs", pull_api.QueuedJobsView.as_view()),
    path(f"{_C}/job/<str:job_id>", pull_api.JobView.as_view()),
    path(f"{_C}/job/<str:job_id>/requeue-dead-job", pull_api.JobRequeueView.as_view()),
    # pull consumers: the fast path
    path(f"{_C}/pull", pull_api.PullView.as_view()),
    path(f"{_C}/ack", pull_api.AckView.as_view()),
    path(f"{_C}/job/<str:job_id>/progress", pull_api.JobProgressView.as_view()),
    # priority groups
    path(f"{_C}/unpin", pull_api.UnpinView.as_view()),
    path(f"{_C}/advisories", pull_api.AdvisoriesView.as_view()),
]
