"""The operator's admin: importing this package (Django's admin autodiscovery imports
``web.admin``) registers every ModelAdmin on the broker's site (``web.admin.site``)."""

from web.admin import advisories, channels, consumers, event_types, history, jobs, partitions, sources  # noqa: F401  (registers the ModelAdmins)
