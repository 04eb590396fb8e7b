"""The portal's language and time zone: Django's LocaleMiddleware everywhere but the API,
and the reader's time zone for the portal's times.

The portal follows the ``django_language`` cookie (set by its language switch through
``set_language``), else the browser's Accept-Language, else ``LANGUAGE_CODE``. The API, its
schema and its error messages stay English whatever the client asks for: scripts match on
them, and DRF ships catalogues of its own that would otherwise translate its errors.
"""

import os
import subprocess
import tempfile
import zoneinfo
from pathlib import Path
from urllib.parse import unquote

from django.conf import settings
from django.middleware.locale import LocaleMiddleware
from django.utils import timezone, translation

API_PREFIXES = ("/api/",)


class PortalLocaleMiddleware(LocaleMiddleware):
    """LocaleMiddleware for the portal; requests under ``/api/`` always get English."""

    def process_request(self, request):
        if request.path.startswith(API_PREFIXES):
            translation.activate(settings.LANGUAGE_CODE)
            request.LANGUAGE_CODE = translation.get_language()
            return
        super().process_request(request)

    def process_response(self, request, response):
        if request.path.startswith(API_PREFIXES):
            return response
        return super().process_response(request, response)


TZ_COOKIE = "kumo_tz"


def reader_zone(request) -> zoneinfo.ZoneInfo | None:
    """The IANA time zone the portal's script put in the ``kumo_tz`` cookie (the browser's
    own), or None when there is none or it names no zone."""
    name = unquote(request.COOKIES.get(TZ_COOKIE, ""))[:64]
    if not name:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return None


class PortalTimezoneMiddleware:
    """The portal shows times in the reader's time zone (its pages' ``date`` filters, and
    the datetimes its forms read); the API answers in UTC whatever the cookie says."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        zone = None if request.path.startswith(API_PREFIXES) else reader_zone(request)
        if zone is None:
            return self.get_response(request)
        timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


def compile_catalogues() -> list[Path]:
    """Compile every ``LOCALE_PATHS`` catalogue whose .mo is missing or older than its .po.

    GNU gettext's msgfmt (the tool ``compilemessages`` runs) writes a temporary file that
    then replaces the .mo, so concurrent test processes never read half a catalogue.
    Returns the .mo files written.
    """
    written = []
    for base in settings.LOCALE_PATHS:
        for po in sorted(Path(base).glob("*/LC_MESSAGES/*.po")):
            mo = po.with_suffix(".mo")
            if mo.exists() and mo.stat().st_mtime >= po.stat().st_mtime:
                continue
            fd, tmp = tempfile.mkstemp(dir=po.parent, suffix=".mo.tmp")
            os.close(fd)
            try:
                subprocess.run(
                    ["msgfmt", "--check-format", "-o", tmp, str(po)],
                    check=True,
                    capture_output=True,
                )
                os.replace(tmp, mo)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            written.append(mo)
    return written
