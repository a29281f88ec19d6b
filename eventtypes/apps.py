from django.apps import AppConfig


class EventTypesConfig(AppConfig):
    name = "eventtypes"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Event types"
