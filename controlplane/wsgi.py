"""The web process's WSGI application (gunicorn ``controlplane.wsgi:application``).

Each worker loads the URL conf, and with it every view module, as it starts: its first
requests are answered as fast as the rest instead of paying for those imports (about
0.2 s), and a view that cannot be imported stops the worker at its start, not on a user's
request. So is the broker's transport (kombu's, with Redis' client library: about 0.15 s),
which a worker's first publish, the first request it accepts that sends work, would load.
It loads the code only: the broker is connected to when the first message is sent."""

import os
from importlib import import_module
from urllib.parse import urlsplit

from django.conf import settings
from django.core.wsgi import get_wsgi_application
from kombu.transport import resolve_transport

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = get_wsgi_application()

import_module(settings.ROOT_URLCONF)  # the URL conf imports every view
resolve_transport(urlsplit(settings.CELERY_BROKER_URL).scheme)
