"""The web portal: server-rendered pages over the same services and selectors as the API."""
