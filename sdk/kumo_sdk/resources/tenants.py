"""Projects, members, quotas, your SSH keys and API tokens."""

from __future__ import annotations

from kumo_sdk.resource import CREATE, CRUD, DELETE, GET, READ, UPDATE, Resource, Singleton
from kumo_sdk.types import ApiToken, Member, Project, Quota, SSHKey


class Projects(Resource[Project]):
    """The projects you hold a role in. ``create(slug=..., name=..., valid_until=...)``
    makes one you own (where the server lets users make projects); ``update`` changes its
    name, description and validity (admins); ``delete`` ends it (owners)."""

    path, type, project_scoped, key, find_by = "projects/", Project, False, "slug", None
    verbs, create_args = CRUD, ()


class Members(Resource[Member]):
    """The project's members, by username: ``update(username, role=...)`` (admins; roles
    reader < member < admin < owner, and only owners grant owner), ``delete(username)``.
    There is no ``create``: people join by accepting an invitation
    (``kumo.invitations.create(email, role=...)``), which answers the same for every address."""

    path, type, key, find_by, create_args = "members/", Member, "username", None, ()
    verbs = READ | {UPDATE, DELETE}


class Quota(Singleton[Quota]):
    """The project's quota: per resource its limit, what is in use and what is left.
    Operators change limits with ``kumo.admin.projects.set_quota``."""

    path, type, verbs = "quota/", Quota, frozenset({GET})


class SSHKeys(Resource[SSHKey]):
    """Your SSH public keys: ``create(name, public_key)`` (the key is checked: type, size,
    encoding; InvalidInput says what is wrong). VMs install the keys named in ``ssh_keys``."""

    path, type, project_scoped, noun = "user/ssh-keys/", SSHKey, False, "SSH key"
    create_args = ("name", "public_key")
    verbs = READ | {CREATE, DELETE}


class Tokens(Resource[ApiToken]):
    """Your API tokens: ``create(name, project=slug, expires_at=...)`` makes one (its secret
    is in ``.token``, in that answer only; ``project`` scopes it to one project). Revoking
    keeps a token listed, with ``revoked_at`` set."""

    path, type, project_scoped, noun = "user/tokens/", ApiToken, False, "token"
    verbs = READ | {CREATE, DELETE}

    def revoke(self, token_id: int) -> None:
        self.delete(token_id)
