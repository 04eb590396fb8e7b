"""The second factor of password accounts: TOTP (an authenticator app) and recovery codes,
on django-otp's devices. The only writer of those devices.

- ``totp_begin`` makes an unconfirmed TOTP device (its QR code is on the account page);
  ``totp_confirm`` confirms it with a first code and returns ten recovery codes, shown once.
- ``second_factor_check`` verifies a code at login: a 6-digit code against the TOTP device,
  anything else against the recovery codes (each works once). Wrong codes are throttled by
  django-otp: after each failure the device refuses every code, right or wrong, for
  ``OTP_*_THROTTLE_FACTOR`` * 2^(n-1) seconds.
- ``required_for`` says whether the operator requires a second factor of this user
  (``KUMO_REQUIRE_TOTP``). Federated logins rely on their IdP; API tokens are unchanged.
"""

from dataclasses import dataclass

import segno
from django.conf import settings
from django.db import transaction
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from controlplane import audit
from controlplane.choices import AuditOutcome
from controlplane.errors import Conflict, InvalidInput
from tenants.models import User

RECOVERY_CODES = 10


@dataclass(frozen=True)
class Enrolment:
    device: TOTPDevice
    otpauth_url: str
    qr_svg: str  # inline SVG of the otpauth URL
    secret_base32: str


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    device: object | None = None
    throttled_for_s: int = 0
    used_recovery_code: bool = False


def has_totp(user: User) -> bool:
    return TOTPDevice.objects.filter(user=user, confirmed=True).exists()


def required_for(user: User) -> bool:
    """Whether the operator requires a second factor of ``user``'s password logins."""
    if not user.has_usable_password():
        return False
    return settings.REQUIRE_TOTP == "password" or (
        settings.REQUIRE_TOTP == "staff" and user.is_staff
    )


def _enrolment(device: TOTPDevice) -> Enrolment:
    import base64

    url = device.config_url
    qr = segno.make(url, error="m").svg_inline(scale=4, dark="#1d2733")
    return Enrolment(device, url, qr, base64.b32encode(device.bin_key).decode().rstrip("="))


@transaction.atomic
def totp_begin(*, user: User) -> Enrolment:
    """An unconfirmed TOTP device for ``user`` (a fresh secret each time), to scan."""
    if has_totp(user):
        raise Conflict("a second factor is already set up", code="totp_enabled")
    TOTPDevice.objects.filter(user=user, confirmed=False).delete()
    device = TOTPDevice.objects.create(user=user, name="authenticator", confirmed=False)
    return _enrolment(device)


def totp_pending(*, user: User) -> Enrolment | None:
    device = TOTPDevice.objects.filter(user=user, confirmed=False).first()
    return _enrolment(device) if device else None


@transaction.atomic
def totp_confirm(*, user: User, code: str) -> list[str]:
    """Confirm the pending device with a first code; returns the recovery codes (once)."""
    device = TOTPDevice.objects.select_for_update().filter(user=user, confirmed=False).first()
    if device is None:
        raise Conflict("no second factor is being set up", code="totp_not_pending")
    if not device.verify_token(_clean(code)):
        raise InvalidInput.field("code", "wrong code: check the clock of your device")
    device.confirmed = True
    device.save(update_fields=["confirmed"])
    codes = _new_recovery_codes(user)
    audit.record("user.totp_enable", user)
    return codes


def _new_recovery_codes(user: User) -> list[str]:
    StaticDevice.objects.filter(user=user).delete()
    static = StaticDevice.objects.create(user=user, name="recovery codes", confirmed=True)
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    StaticToken.objects.bulk_create(StaticToken(device=static, token=c) for c in codes)
    return codes


@transaction.atomic
def recovery_codes_regenerate(*, user: User) -> list[str]:
    """Ten new recovery codes; the old ones stop working."""
    if not has_totp(user):
        raise Conflict("set up a second factor first", code="totp_not_enabled")
    codes = _new_recovery_codes(user)
    audit.record("user.recovery_codes_regenerate", user)
    return codes


def recovery_codes_left(user: User) -> int:
    return StaticToken.objects.filter(device__user=user, device__confirmed=True).count()


@transaction.atomic
def totp_disable(*, user: User, code: str | None = None, by_operator: bool = False) -> None:
    """Remove the second factor: by its owner with a current code, or by an operator."""
    if not by_operator and not second_factor_check(user=user, code=code or "").ok:
        raise InvalidInput.field("code", "wrong code")
    TOTPDevice.objects.filter(user=user).delete()
    StaticDevice.objects.filter(user=user).delete()
    audit.record("user.totp_disable", user, detail={"by_operator": by_operator})


def _clean(code: str) -> str:
    return "".join((code or "").split())


def second_factor_check(*, user: User, code: str) -> CheckResult:
    """Verify ``code`` against the user's TOTP device or, for a recovery code, the
    recovery codes (each used once). A throttled device refuses until its wait is over;
    every failure is audited."""
    code = _clean(code)
    # A 6-digit code goes to the authenticator, anything else to the recovery codes, so a
    # recovery code never counts as a wrong TOTP code (and the reverse).
    kind = TOTPDevice if code.isdigit() and len(code) <= 8 else StaticDevice
    devices = list(kind.objects.filter(user=user, confirmed=True))
    wait = 0
    for device in devices:
        allowed, data = device.verify_is_allowed()
        if not allowed:
            locked_until = (data or {}).get("locked_until")
            if locked_until is not None:
                from django.utils import timezone

                wait = max(wait, int((locked_until - timezone.now()).total_seconds()) + 1)
            continue
        if code and device.verify_token(code):
            recovery = isinstance(device, StaticDevice)
            with transaction.atomic():
                audit.record("user.second_factor", user, detail={"recovery_code": recovery})
            return CheckResult(True, device, used_recovery_code=recovery)
    with transaction.atomic():
        audit.record(
            "user.second_factor",
            user,
            outcome=AuditOutcome.DENIED,
            detail={"throttled_for_s": wait},
        )
    return CheckResult(False, throttled_for_s=wait)
