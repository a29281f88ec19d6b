"""The broker's database backend (``ENGINE = "broker.db.backend"``): Django's PostgreSQL backend
whose connections bound every round trip (``base.BoundedConnection``)."""
