"""Reclamation as it concerns the project (``compute.services.reclamation_report``): its
guaranteed minimum of GPUs, the thresholds in force, and each step announced for its VMs
with the time it will happen."""

from datetime import timedelta

from compute import services
from controlplane.portal.access import project_page
from controlplane.portal.views.common import page


def _duration(seconds: int) -> str:
    return str(timedelta(seconds=int(seconds)))


@project_page()
def reclamation(request, project):
    report = services.reclamation_report(project)
    t = report["thresholds"]
    idle = (
        f"warned after {_duration(t['idle_after_s'])} under {t['idle_cpu_percent']}% CPU, "
        f"stopped {_duration(t['idle_warning_s'])} later unless busy again"
        if t["idle_after_s"]
        else "never stopped for being idle at this site"
    )
    rules = [
        ("Idle VMs", idle),
        (
            "When the project expires",
            f"its running VMs stop {_duration(t['expired_stop_notice_s'])} after the notice; "
            f"stopped VMs are deleted {_duration(t['expired_delete_grace_s'])} after they stopped",
        ),
        (
            "Spot VMs",
            f"when their eviction notice ends, {_duration(t['spot_stop_grace_s'])} to shut down "
            "before they are forced off",
        ),
    ]
    return page(
        request,
        "portal/reclamation.html",
        {"report": report, "rules": rules},
        project=project,
    )
