"""pysaml2 attribute maps: the library's own, plus the GakuNin (jaDisplayName, jao, …) names.

Both Kumo's SP and the demo IdP load this folder, so names and OIDs agree."""
