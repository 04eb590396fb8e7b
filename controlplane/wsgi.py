"""The web process's WSGI application (gunicorn ``controlplane.wsgi:application``).

Each worker loads the URL conf, and with it every view module, as it starts: its first
requests are answered as fast as the rest instead of paying for those imports (about
0.2 s), and a view that cannot be imported stops the worker at its start, not on a user's
request."""

import os
from importlib import import_module

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = get_wsgi_application()

import_module(settings.ROOT_URLCONF)  # the URL conf imports every view
