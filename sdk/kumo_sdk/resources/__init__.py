"""Every resource of the API, one module per area; see ``kumo_sdk.resource``."""
