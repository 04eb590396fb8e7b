from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from tenants import selectors


@login_required
def home(request):
    projects = selectors.projects_for(request.user)
    return render(request, "portal/home.html", {"projects": projects})
