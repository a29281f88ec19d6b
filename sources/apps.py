from django.apps import AppConfig


class SourcesConfig(AppConfig):
    name = "sources"
    verbose_name = "Inbound sources"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Hooks into the layers below, which cannot import this app: the housekeeping step that
        prunes expired dedupe rows, and the seed file's and the export's ``[source:...]`` sections.
        Imported here because those modules import models (the allow-list of
        tests/system/architecture/test_no_function_imports.py names this method)."""
        from consumers.seed import seed_section_register
        from jobs.housekeeping import step_register
        from sources.prune import PRUNE_STEP
        from sources.seed import SEED_SECTION

        step_register(PRUNE_STEP)
        seed_section_register(SEED_SECTION)
