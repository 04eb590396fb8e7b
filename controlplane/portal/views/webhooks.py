"""The project's webhooks (admins add and delete; the signing secret is shown once, in the
answer to the create) with each one's last delivery, and the project's recent events,
through ``controlplane.services``."""

from django.contrib import messages
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from controlplane import services
from controlplane.models import Event, Webhook
from controlplane.portal.access import project_page
from controlplane.portal.forms import WebhookForm
from controlplane.portal.views.common import act, page, submit
from tenants.choices import Role

RECENT_EVENTS = 20


@project_page(write_role=Role.ADMIN)
def webhooks(request, project):
    form = WebhookForm(request.POST or None)
    status, secret = 200, None
    if request.method == "POST":
        created = {}

        def create(v):
            created["hook"], created["secret"] = services.webhook_create(project=project, **v)

        ok, status = submit(form, create)
        if ok:
            secret = created["secret"]
            messages.success(
                request, _("Webhook to %(url)s created.") % {"url": created["hook"].url}
            )
            form = WebhookForm()
    return page(
        request,
        "portal/webhooks.html",
        {
            "webhooks": Webhook.objects.for_project(project).order_by("created_at"),
            "events": Event.objects.for_project(project).order_by("-created_at")[:RECENT_EVENTS],
            "form": form,
            "secret": secret,
        },
        project=project,
        status=status,
    )


@require_POST
@project_page(write_role=Role.ADMIN)
def webhook_delete(request, project, pk):
    hook = get_object_or_404(Webhook.objects.for_project(project), pk=pk)
    return act(
        request,
        services.webhook_delete,
        done=_("Webhook to %(url)s deleted.") % {"url": hook.url},
        back=reverse("portal:webhooks", kwargs={"slug": project.slug}),
        webhook=hook,
    )
