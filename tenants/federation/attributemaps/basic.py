"""Attributes named plainly (NameFormat basic): pysaml2's map."""

from saml2.attributemaps.basic import MAP  # noqa: F401
