"""Calling a consumer's endpoint: the asyncio HTTP client (``http``), where a callback goes
(``target``) and how it is signed (``signing``); shared by push delivery and the pull doorbell; and
the delivery portal's test event (``probe``)."""
