from django.apps import AppConfig


class ConsumersConfig(AppConfig):
    name = "consumers"
    default_auto_field = "django.db.models.BigAutoField"
