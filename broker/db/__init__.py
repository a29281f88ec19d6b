"""Database plumbing shared by the apps: the named-query registry (``queries``) and the one way to
run a query (``run``)."""
