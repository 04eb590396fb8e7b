"""API token authentication: ``Authorization: Bearer kumo_<prefix>_<secret>``."""

import hmac

from django.utils import timezone
from rest_framework import authentication, exceptions

from tenants import services
from tenants.selectors import token_by_prefix


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """Finds the token by its public prefix, then compares SHA-256 digests in constant time.

    Sets ``request.auth`` to the ApiToken, whose ``project`` (if any) limits what the
    request can see: the scoped querysets read it. When the view has named the request's
    project (``request.project_slug``), the token's query also reads the caller's membership
    there (``tenants.selectors.token_by_prefix``).
    """

    keywords = (b"bearer", b"token")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: expected 'Bearer <token>'."
            )
        try:
            raw = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed(
                "The token has characters a token never has."
            ) from None
        if not raw.startswith(services.TOKEN_PREFIX) or raw.count("_") < 2:
            raise exceptions.AuthenticationFailed("Not a Kumo API token.")
        prefix = raw[len(services.TOKEN_PREFIX) :].split("_", 1)[0]
        token = token_by_prefix(prefix, project_slug=getattr(request, "project_slug", None))
        if token is None or not hmac.compare_digest(token.digest, services.token_digest(raw)):
            raise exceptions.AuthenticationFailed("Invalid token.")
        now = timezone.now()
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This token was revoked.")
        if token.expires_at is not None and token.expires_at <= now:
            raise exceptions.AuthenticationFailed("This token has expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("This user is deactivated.")
        services.token_touch(token=token, now=now)
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'
