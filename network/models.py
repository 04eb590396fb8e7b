"""Models of this app arrive with its own issue."""
