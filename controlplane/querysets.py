from django.db import models


class ProjectOwnedQuerySet(models.QuerySet):
    """The one way to read a tenant's objects: ``Model.objects.for_project(project)``."""

    def for_project(self, project):
        return self.filter(project=project)
