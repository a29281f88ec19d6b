from django.urls import path

from consumers import api

urlpatterns = [
    path("channel/<str:channel_id>/consumers", api.ConsumerListView.as_view()),
    path("channel/<str:channel_id>/consumer/<str:consumer_id>", api.ConsumerView.as_view()),
]
