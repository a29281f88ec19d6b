from django.urls import path

from broker.api import metrics, sample, views

urlpatterns = [
    path("producers", views.ProducerListView.as_view()),
    path("producer/<str:producer_id>", views.ProducerView.as_view()),
    path("channels", views.ChannelListView.as_view()),
    path("channel/<str:channel_id>", views.ChannelView.as_view()),
    path("channel/<str:channel_id>/broadcast", views.BroadcastView.as_view()),
    path("channel/<str:channel_id>/messages", views.MessagesView.as_view()),
    path("channel/<str:channel_id>/message/<str:message_id>", views.MessageView.as_view()),
    path("channel/<str:channel_id>/messages-status", views.MessagesStatusView.as_view()),
    path("_status", views.StatusView.as_view()),
    path("metrics", metrics.MetricsView.as_view()),
    path("_sample-receiver", sample.SampleReceiverView.as_view()),
]
