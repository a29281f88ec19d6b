from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class WebConfig(AppConfig):
    name = "web"
    default = True  # the app's config (this module also holds the admin's)
    default_auto_field = "django.db.models.BigAutoField"


class BrokerAdminConfig(admin_apps.AdminConfig):
    """Installed in place of ``django.contrib.admin`` (settings), so ``admin.site`` and every
    ``@admin.register`` use the broker's site, whose index is the dashboard (``web.admin.site``).
    Here, not in ``web.admin.site``: INSTALLED_APPS loads this class before the models, and
    importing the ``web.admin`` package registers the ModelAdmins, which needs them."""

    default = False  # named explicitly in INSTALLED_APPS, never picked for "web"
    default_site = "web.site.BrokerAdminSite"
