"""People: a project's members and roles (admins change them, invite people by e-mail and
revoke pending invitations), and the caller's own SSH keys and API tokens (a new token's
secret is shown once, on the answer that made it)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from controlplane.errors import KumoError
from controlplane.portal.access import form_error, form_invalid, may_write, project_page
from controlplane.portal.forms import InviteForm, RoleForm, SSHKeyForm, TokenForm
from controlplane.portal.views.common import act, page, submit
from tenants import invitations, selectors, services
from tenants.choices import Role
from tenants.models import ApiToken, Invitation, Membership, SSHKey

# --- members ----------------------------------------------------------------------------------


@project_page(write_role=Role.ADMIN)
def members(request, project):
    """The members and, for admins, the invite form and the pending invitations. People
    come in only by invitation: the answer to one is the same whether or not the address
    has an account (``tenants.invitations``), so no admin learns who exists."""
    form = InviteForm(request.POST or None)
    status = 200
    if request.method == "POST":
        ok, status = submit(
            form,
            lambda v: invitations.invitation_create(project=project, actor=request.user, **v),
        )
        if ok:
            messages.success(
                request, _("Invitation sent to %(email)s.") % {"email": form.cleaned_data["email"]}
            )
            return redirect("portal:members", slug=project.slug)
    return page(
        request,
        "portal/members.html",
        {
            "members": Membership.objects.for_project(project)
            .select_related("user")
            .order_by("user__username"),
            "invitations": selectors.pending_invitations(project)
            if may_write(request, Role.ADMIN)
            else [],
            "form": form,
            "roles": Role.choices,
        },
        project=project,
        status=status,
    )


@require_POST
@project_page(write_role=Role.ADMIN)
def invitation_revoke(request, project, pk):
    invitation = get_object_or_404(Invitation.objects.for_project(project), pk=pk)
    return act(
        request,
        invitations.invitation_revoke,
        done=_("Invitation to %(email)s revoked.") % {"email": invitation.email},
        back=reverse("portal:members", kwargs={"slug": project.slug}),
        invitation=invitation,
    )


def _membership(project, username) -> Membership:
    return get_object_or_404(
        Membership.objects.for_project(project).select_related("user", "project"),
        user__username=username,
    )


@require_POST
@project_page(write_role=Role.ADMIN)
def member_role(request, project, username):
    membership = _membership(project, username)
    form = RoleForm(request.POST)
    if not form.is_valid():
        form_invalid(form)
        messages.error(request, _("Choose a role."))
        return redirect("portal:members", slug=project.slug)
    return act(
        request,
        services.membership_update,
        done=_("%(username)s is now %(role)s.")
        % {"username": username, "role": form.cleaned_data["role"]},
        back=reverse("portal:members", kwargs={"slug": project.slug}),
        membership=membership,
        role=form.cleaned_data["role"],
        actor=request.user,
    )


@require_POST
@project_page(write_role=Role.ADMIN)
def member_remove(request, project, username):
    return act(
        request,
        services.membership_remove,
        done=_("%(username)s removed.") % {"username": username},
        back=reverse("portal:members", kwargs={"slug": project.slug}),
        membership=_membership(project, username),
        actor=request.user,
    )


# --- the caller's SSH keys and API tokens -----------------------------------------------------


@login_required
def ssh_keys(request):
    form = SSHKeyForm(request.POST or None)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: services.sshkey_add(user=request.user, **v))
        if ok:
            messages.success(request, _("SSH key added."))
            return redirect("portal:ssh-keys")
    return page(
        request,
        "portal/ssh_keys.html",
        {"keys": SSHKey.objects.filter(user=request.user).order_by("name"), "form": form},
        status=status,
    )


@require_POST
@login_required
def ssh_key_delete(request, pk):
    key = get_object_or_404(SSHKey.objects.filter(user=request.user), pk=pk)
    return act(
        request,
        services.sshkey_delete,
        done=_("SSH key %(name)s deleted.") % {"name": key.name},
        back=reverse("portal:ssh-keys"),
        key=key,
    )


@login_required
def tokens(request):
    """The caller's tokens; a created token's secret is in this one answer only."""
    projects = selectors.projects_for(request.user).order_by("slug")
    form = TokenForm(request.POST or None, projects=projects)
    status, secret = 200, None
    if request.method == "POST":
        if form.is_valid():
            v = form.cleaned_data
            try:
                _token, secret = services.token_create(
                    user=request.user,
                    name=v["name"],
                    project=projects.filter(slug=v["project"]).first() if v["project"] else None,
                    expires_at=v["expires_at"],
                )
            except KumoError as e:
                status = form_error(form, e)
            else:
                form = TokenForm(projects=projects)
        else:
            status = 400
    return page(
        request,
        "portal/tokens.html",
        {
            "tokens": ApiToken.objects.filter(user=request.user)
            .select_related("project")
            .order_by("-created_at"),
            "form": form,
            "secret": secret,
        },
        status=status,
    )


@require_POST
@login_required
def token_revoke(request, pk):
    token = get_object_or_404(ApiToken.objects.filter(user=request.user), pk=pk)
    return act(
        request,
        services.token_revoke,
        done=_("Token %(name)s revoked.") % {"name": token.name},
        back=reverse("portal:tokens"),
        token=token,
    )
