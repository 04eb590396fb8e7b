"""urn:oid names: pysaml2's map plus GakuNin's Japanese-language attributes."""

import copy

from saml2.attributemaps.saml_uri import MAP as _BASE

GAKUNIN_OID = "urn:oid:1.3.6.1.4.1.32264.1.1."
GAKUNIN = {
    "jasn": f"{GAKUNIN_OID}1",
    "jaGivenName": f"{GAKUNIN_OID}2",
    "jaDisplayName": f"{GAKUNIN_OID}3",
    "jao": f"{GAKUNIN_OID}4",
    "jaou": f"{GAKUNIN_OID}5",
}

MAP = copy.deepcopy(_BASE)
MAP["fro"].update({oid: name for name, oid in GAKUNIN.items()})
MAP["to"].update(GAKUNIN)
