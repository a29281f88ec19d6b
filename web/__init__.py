"""HTTP in and out: the API views and their routes, the one domain-error -> HTTP mapping, OpenAPI
hooks, middleware (HMAC signatures, sessions), the operator's admin site and pages, /metrics,
/_status and the sample receiver. The top layer: nothing below imports it (.importlinter).
"""
