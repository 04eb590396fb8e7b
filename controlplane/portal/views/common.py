"""What every page shares: the layout's context and the answer to a write."""

from django.contrib import messages
from django.db import models
from django.shortcuts import redirect, render

from controlplane.errors import KumoError
from controlplane.portal.access import form_error, form_invalid, may_write, record_refusal
from tenants import selectors
from tenants.choices import Role


def page(request, template: str, context: dict | None = None, *, project=None, status=200):
    """Render ``template`` in the layout: the project switcher lists the caller's projects,
    and ``can_write``/``is_admin`` say which forms to offer (the server checks again)."""
    context = {
        "project": project,
        "membership": getattr(request, "membership", None),
        "can_write": may_write(request, Role.MEMBER),
        "is_admin": may_write(request, Role.ADMIN),
        "nav_projects": selectors.projects_for(request.user).order_by("slug"),
        **(context or {}),
    }
    return render(request, template, context, status=status)


def act(request, service, *, done: str, back: str, gone: str | None = None, **kwargs):
    """Run one service call for a button (no form): its success or its error (a
    ``KumoError``'s message, never a 500) is a message on the page ``back`` leads to (on
    success ``gone``, when given: the page ``back`` was is no more). A refusal is audited,
    on the object the service was given."""
    try:
        service(**kwargs)
    except KumoError as e:
        obj = next((v for v in kwargs.values() if isinstance(v, models.Model)), None)
        record_refusal(e.status, e.code, e.message, obj=obj, details=e.details)
        messages.error(request, e.message)
        return redirect(back)
    messages.success(request, done)
    return redirect(gone or back)


def submit(form, call) -> tuple[bool, int]:
    """Validate ``form`` and run ``call(cleaned_data)``; returns whether it succeeded and
    the HTTP status to answer with (400 for bad input, the service error's status). Either
    refusal is audited (``access.record_refusal``)."""
    if not form.is_valid():
        return False, form_invalid(form)
    try:
        call(form.cleaned_data)
    except KumoError as e:
        return False, form_error(form, e)
    return True, 200
