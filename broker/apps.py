from django.apps import AppConfig


class BrokerConfig(AppConfig):
    name = "broker"
    default_auto_field = "django.db.models.BigAutoField"
