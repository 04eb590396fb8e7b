"""Host-side and service-side storage drivers. No Django here: only frozen dataclasses cross
these boundaries."""
