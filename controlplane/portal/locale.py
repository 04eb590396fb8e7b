"""The portal's language: Django's LocaleMiddleware everywhere but the API.

The portal follows the ``django_language`` cookie (set by its language switch through
``set_language``), else the browser's Accept-Language, else ``LANGUAGE_CODE``. The API, its
schema and its error messages stay English whatever the client asks for: scripts match on
them, and DRF ships catalogues of its own that would otherwise translate its errors.
"""

import os
import subprocess
import tempfile
from pathlib import Path

from django.conf import settings
from django.middleware.locale import LocaleMiddleware
from django.utils import translation

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
