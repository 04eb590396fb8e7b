"""Benchmarks: ``bench/api.py`` measures the API's request rates (``make bench-api``)."""
