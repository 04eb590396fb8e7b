"""Validators every app uses for what it names (kept here, below the apps, so that an app
validating a name imports no other app's models)."""

from django.core.validators import RegexValidator

hostname_validator = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
    "1 to 63 characters: lower-case letters, digits and hyphens, not starting or ending "
    "with a hyphen (it becomes the guest's host name).",
)
