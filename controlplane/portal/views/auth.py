"""The portal's front door and the caller's account.

- ``LoginView``: "Log in with your institution" (SAML discovery), the configured OIDC
  providers, and the local account. A password account with a second factor is not logged
  in by its password alone: the password step parks the user in the session and the code
  step (``login_verify``) finishes the login.
- ``account``: profile, linked identities, second factor (QR code, confirm, recovery codes,
  turn off).
- ``RequireSecondFactorMiddleware``: where the operator requires a second factor, a user
  who logged in by password without one can only reach the account page until they set it
  up.
"""

import time

from django import forms
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from controlplane.errors import KumoError
from controlplane.portal.views.common import page
from tenants import mfa
from tenants.federation import saml
from tenants.models import User

PENDING = "kumo_mfa_pending"
PENDING_TTL_S = 300
LOGIN_METHOD = "kumo_login_method"


class LoginView(auth_views.LoginView):
    template_name = "portal/login.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["saml_enabled"] = saml.enabled()
        context["oidc_providers"] = [
            {"name": p["name"], "label": p.get("label", p["name"])} for p in settings.OIDC_PROVIDERS
        ]
        return context

    def form_valid(self, form):
        user = form.get_user()
        if mfa.has_totp(user):
            self.request.session[PENDING] = {
                "user": user.pk,
                "backend": user.backend,
                "at": time.time(),
                "next": self.get_success_url(),
            }
            return redirect("portal:login-verify")
        response = super().form_valid(form)
        self.request.session[LOGIN_METHOD] = "password"
        return response


class CodeForm(forms.Form):
    code = forms.CharField(
        max_length=20,
        label=gettext_lazy("Code from your authenticator app, or a recovery code"),
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "autofocus": True}),
    )


def login_verify(request):
    """The second step of a password login: a TOTP or recovery code."""
    pending = request.session.get(PENDING)
    if not pending or time.time() - pending["at"] > PENDING_TTL_S:
        request.session.pop(PENDING, None)
        return redirect("portal:login")
    user = User.objects.filter(pk=pending["user"], is_active=True).first()
    if user is None:
        return redirect("portal:login")
    form = CodeForm(request.POST or None)
    status = 200
    if request.method == "POST" and form.is_valid():
        result = mfa.second_factor_check(user=user, code=form.cleaned_data["code"])
        if result.ok:
            request.session.pop(PENDING, None)
            auth.login(request, user, backend=pending["backend"])
            from django_otp import login as otp_login

            otp_login(request, result.device)
            request.session[LOGIN_METHOD] = "password"
            if result.used_recovery_code:
                left = mfa.recovery_codes_left(user)
                messages.warning(request, _("Recovery code used: %(left)s left.") % {"left": left})
            target = pending.get("next") or ""
            if not url_has_allowed_host_and_scheme(target, {request.get_host()}):
                target = reverse("portal:home")
            return redirect(target)
        status = 429 if result.throttled_for_s else 400
        form.add_error(
            "code",
            _("Too many wrong codes: wait %(seconds)s s and try again.")
            % {"seconds": result.throttled_for_s}
            if result.throttled_for_s
            else _("Wrong code."),
        )
    return render(request, "portal/login_verify.html", {"form": form}, status=status)


@login_required
def account(request):
    """Your profile, identities and second factor."""
    user = request.user
    context = {
        "identities": user.external_identities.order_by("created_at"),
        "has_totp": mfa.has_totp(user),
        "pending": mfa.totp_pending(user=user),
        "recovery_left": mfa.recovery_codes_left(user),
        "recovery_codes": request.session.pop("kumo_recovery_codes", None),
        "required": mfa.required_for(user),
        "has_password": user.has_usable_password(),
        "form": CodeForm(),
    }
    return page(request, "portal/account.html", context)


@require_POST
@login_required
def totp_setup(request):
    step = request.POST.get("step", "begin")
    try:
        if step == "begin":
            mfa.totp_begin(user=request.user)
        elif step == "confirm":
            codes = mfa.totp_confirm(user=request.user, code=request.POST.get("code", ""))
            request.session["kumo_recovery_codes"] = codes
            from django_otp import login as otp_login

            otp_login(request, request.user.totpdevice_set.filter(confirmed=True).first())
            messages.success(request, _("Second factor on. Keep your recovery codes safe."))
        elif step == "recovery":
            request.session["kumo_recovery_codes"] = mfa.recovery_codes_regenerate(
                user=request.user
            )
            messages.success(request, _("New recovery codes; the old ones no longer work."))
        elif step == "disable":
            mfa.totp_disable(user=request.user, code=request.POST.get("code", ""))
            messages.success(request, _("Second factor off."))
    except KumoError as e:
        messages.error(request, e.message)
    return redirect("portal:account")


class RequireSecondFactorMiddleware:
    """Keeps a password login the operator requires a second factor of on the account page
    until one is set up (the API is not affected: it uses tokens or its own login)."""

    ALLOWED = ("/account/", "/logout/", "/static/", "/login/")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        user = getattr(request, "user", None)
        if (
            settings.REQUIRE_TOTP
            and user is not None
            and user.is_authenticated
            and not request.path.startswith(("/api/", *self.ALLOWED))
            and request.session.get(LOGIN_METHOD) == "password"
            and mfa.required_for(user)
            and not mfa.has_totp(user)
        ):
            messages.warning(request, _("This cloud requires a second factor: set it up first."))
            return redirect("portal:account")
        return self.get_response(request)


def invitation(request, secret: str):
    """An invitation's link: log in (any method), then accept."""
    from tenants import invitations

    if not request.user.is_authenticated:
        return redirect(f"{reverse('portal:login')}?next={request.path}")
    try:
        found = invitations.invitation_for(secret)
    except KumoError:
        return render(
            request,
            "portal/refused.html",
            {"title": _("No such invitation"), "message": _("The link is wrong or was revoked.")},
            status=404,
        )
    if request.method == "POST":
        try:
            membership = invitations.invitation_accept(secret=secret, user=request.user)
        except KumoError as e:
            return render(
                request,
                "portal/refused.html",
                {"title": _("Invitation not accepted"), "message": e.message},
                status=e.status,
            )
        messages.success(
            request,
            _("You joined %(slug)s as %(role)s.")
            % {"slug": membership.project.slug, "role": membership.role},
        )
        return redirect("portal:dashboard", slug=membership.project.slug)
    return page(
        request,
        "portal/invitation.html",
        {"invitation": found, "status": invitations.invitation_status(found)},
    )
