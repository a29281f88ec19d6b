"""WSGI entry point: ``gunicorn broker.wsgi:application`` (settings in gunicorn.conf.py)."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
application = get_wsgi_application()
