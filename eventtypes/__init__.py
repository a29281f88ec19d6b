"""Event types (issue 37): a channel's named message types with a JSON Schema each, in versions; the
validation of every publish against them (``validation.message_validate``), the import from an
OpenAPI document and the AsyncAPI document of a channel. A layer between ``consumers`` and ``broker``
(.importlinter): the seed and the export (consumers) include event types; jobs and web call in."""
