from django.db import models


class HostState(models.TextChoices):
    ENROLLING = "enrolling", "Enrolling"  # known, agent not heard from yet
    UP = "up", "Up"
    DRAINING = "draining", "Draining"  # runs what it has, takes nothing new
    MAINTENANCE = "maintenance", "Maintenance"  # an operator took it out of service
    DOWN = "down", "Down"  # its agent missed heartbeats


# States an operator sets; the controller never leaves them by itself.
OPERATOR_STATES = (HostState.DRAINING, HostState.MAINTENANCE)
