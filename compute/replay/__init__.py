"""Replaying a month of demand through Kumo's own scheduler: ``trace`` reads and
generates job traces, ``sim`` runs one on a simulated fleet in virtual time, ``database``
gives it a throwaway database. Run it with ``manage.py replay TRACE.csv`` or
``bench/goodput.py``."""
