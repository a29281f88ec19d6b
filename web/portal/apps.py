from django.apps import AppConfig


class PortalConfig(AppConfig):
    """The delivery portal (``web.portal``): its own app label, so its tables and migrations never
    meet another app's."""

    name = "web.portal"
    label = "portal"
    verbose_name = "Delivery portal"
    default_auto_field = "django.db.models.BigAutoField"
