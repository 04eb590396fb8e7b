from django.apps import AppConfig


class ControlPlaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Control plane"

    def ready(self):
        # The Celery app, so shared tasks bind to it; the tasks module registers the
        # report handlers the agents' messages need.
        from controlplane import celery, tasks  # noqa: F401
        from controlplane.api import schema  # noqa: F401  (registers the token scheme)
