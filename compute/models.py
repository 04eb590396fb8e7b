"""Hosts (hypervisors with their agents). Inventory, templates and VMs come with compute."""

from django.db import models

from compute.choices import HostState


class Host(models.Model):
    """A hypervisor host and its agent, which consumes queue ``host.<name>``.

    A host is created by its agent's first heartbeat (or by an operator ahead of it) and
    marked down when heartbeats stop; it comes back up by itself when they return, unless
    an operator put it in draining or maintenance.
    """

    name = models.SlugField(max_length=63, unique=True)
    state = models.CharField(max_length=16, choices=HostState.choices, default=HostState.ENROLLING)
    state_reason = models.CharField(max_length=200, blank=True)
    libvirt_uri = models.CharField(max_length=255, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    agent_started_at = models.DateTimeField(null=True, blank=True)
    capabilities = models.JSONField(default=list, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True, db_index=True)
    rack = models.CharField(max_length=64, blank=True)
    zone = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name
