"""The operators' users page (staff only): every user with their linked identities, a
search, and deactivate / reactivate through ``tenants.users`` (deactivating ends their
sessions and revokes their API tokens at once)."""

from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from controlplane.portal.access import staff_page
from controlplane.portal.views.common import act, page
from tenants import selectors, users
from tenants.models import User

PAGE_SIZE = 200


class DeactivateForm(forms.Form):
    reason = forms.CharField(max_length=500, required=False)


@staff_page
def user_list(request):
    q = request.GET.get("q", "")[:100]
    found = selectors.users_search(q)
    shown = list(found[: PAGE_SIZE + 1])
    return page(
        request,
        "portal/users.html",
        {"users": shown[:PAGE_SIZE], "more": len(shown) > PAGE_SIZE, "q": q},
    )


def _back(request) -> str:
    q = request.POST.get("q", "")[:100]
    url = reverse("portal:users")
    return f"{url}?{urlencode({'q': q})}" if q else url


@require_POST
@staff_page
def user_deactivate(request, username):
    user = get_object_or_404(User, username=username)
    if user == request.user:
        messages.error(request, _("You cannot lock yourself out; ask another operator."))
        return redirect(_back(request))
    form = DeactivateForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    return act(
        request,
        users.user_deactivate,
        done=_(
            "%(username)s is deactivated: their sessions ended and their API tokens are revoked."
        )
        % {"username": username},
        back=_back(request),
        user=user,
        reason=reason,
    )


@require_POST
@staff_page
def user_reactivate(request, username):
    return act(
        request,
        users.user_reactivate,
        done=_("%(username)s may log in again (with new API tokens).") % {"username": username},
        back=_back(request),
        user=get_object_or_404(User, username=username),
    )
