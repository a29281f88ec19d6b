"""WSGI entry point: ``gunicorn broker.wsgi:application`` (settings in gunicorn.conf.py).

Starts the embedded PostgreSQL first when DATABASE_URL is unset (gunicorn.conf.py has normally done
so in the master already; importing settings never does).
"""
import os

from django.core.wsgi import get_wsgi_application

from broker.embedded_db import database_url_ensure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
database_url_ensure()
application = get_wsgi_application()
