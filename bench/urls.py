"""Kumo's URLs plus ``/bench/bare``: a plain Django JSON view, the floor the API is measured
against (same gunicorn, settings and middleware; no DRF, no authentication, no query)."""

from django.http import JsonResponse
from django.urls import path

from controlplane.urls import handler404, handler500
from controlplane.urls import urlpatterns as kumo_urlpatterns

__all__ = ["handler404", "handler500", "urlpatterns"]


def bare(request):
    return JsonResponse({"ok": True, "service": "kumo"})


urlpatterns = [path("bench/bare", bare), *kumo_urlpatterns]
