"""Shibboleth 1.x names: pysaml2's map."""

from saml2.attributemaps.shibboleth_uri import MAP  # noqa: F401
