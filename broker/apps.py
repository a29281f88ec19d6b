from pathlib import Path

from django.apps import AppConfig
from django.conf import settings


class BrokerConfig(AppConfig):
    name = "broker"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """STATIC_ROOT exists before WhiteNoise looks at it (it warns about a missing one); made
        here, not in settings, whose import only reads the environment."""
        Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
