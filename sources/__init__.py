"""Inbound sources (issue 36): a channel fed straight by a provider's webhooks.

A source is registered under a channel (``PUT /channel/{c}/source/{s}``) and gets an unguessable
address, ``/in/{id}``, to give the provider (GitHub, Stripe, Shopify, Slack, any Standard Webhooks
sender, or a plain HMAC, Basic or API-key sender). Each request is verified exactly as the source
says (``verify.py``: no fallback), deduplicated by the provider's delivery id within a window,
durably and across processes (the ``sources_message_check`` trigger, migration 0002: a unique
row written in the message's own statement), published as one message of the channel through the
group-commit publish (``receive.py``), and answered only after the commit. Everything downstream
(push, pull, retries, filters, replay, the portal) is the channel's as for any message.

The app sits above ``jobs`` (it calls the publish service) and beside ``pipeline``; ``web`` holds
its HTTP views and admin. Modules: ``models.py``, ``rules.py`` (pure: presets, fields, specs),
``verify.py`` (pure: the signatures), ``registry.py`` (create, update, delete, rotate),
``lookup.py`` (the per-process cache of sources by id), ``receive.py`` (one request),
``tallies.py`` (counts by outcome and the last refusals), ``prune.py`` (expired dedupe rows, a
housekeeping step), ``seed.py`` (the seed file's and ``broker_export``'s sections).
"""
