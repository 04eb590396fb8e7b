"""Federated login: Kumo as a SAML 2.0 service provider in an academic federation (GakuNin,
eduGAIN) and as an OpenID Connect client of any number of providers.

The glue lives here; what a login *does* to users and identities is ``tenants.identities``.
``demo_idp`` is a real SAML identity provider (pysaml2's server) for ``make run`` and the
tests: it has nothing to do with production logins.
"""
