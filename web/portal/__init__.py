"""The delivery portal: scoped links an operator hands to the team behind one consumer, opening
server-rendered pages of that consumer only (overview, deliveries, dead letters, replay and, for
push consumers, the endpoint), built on the admin's pieces and the same services.

``links`` (make, open, find, revoke; changes recorded as advisories), ``rules`` (pure), ``api``
(``POST``/``DELETE /channel/{c}/consumer/{k}/portal-links``), ``access`` (the link opening, the
check every page runs, the refusals), ``pages`` and ``endpoint`` (the pages), ``forms``, ``admin``.
"""
