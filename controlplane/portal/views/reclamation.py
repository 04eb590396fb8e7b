"""Reclamation as it concerns the project (``compute.services.reclamation_report``): its
guaranteed minimum of GPUs, the thresholds in force, and each step announced for its VMs
with the time it will happen."""

from datetime import timedelta

from django.utils.translation import gettext as _

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
        _(
            "warned after %(after)s under %(percent)s%% CPU, "
            "stopped %(warning)s later unless busy again"
        )
        % {
            "after": _duration(t["idle_after_s"]),
            "percent": t["idle_cpu_percent"],
            "warning": _duration(t["idle_warning_s"]),
        }
        if t["idle_after_s"]
        else _("never stopped for being idle at this site")
    )
    rules = [
        (_("Idle VMs"), idle),
        (
            _("When the project expires"),
            _(
                "its running VMs stop %(notice)s after the notice; "
                "stopped VMs are deleted %(grace)s after they stopped"
            )
            % {
                "notice": _duration(t["expired_stop_notice_s"]),
                "grace": _duration(t["expired_delete_grace_s"]),
            },
        ),
        (
            _("Spot VMs"),
            _(
                "when their eviction notice ends, %(grace)s to shut down before they are "
                "forced off; the VMs evicted are those whose eviction wastes the fewest "
                "GPU-seconds: the work since their last checkpoint, plus %(cost)s per GPU"
            )
            % {
                "grace": _duration(t["spot_stop_grace_s"]),
                "cost": _duration(t["spot_eviction_cost_s"]),
            },
        ),
        (
            _("Spot notices"),
            _(
                "an eviction notice may run up to %(stretch)s longer than the template's, "
                "to end just after a save its guest is expected to make then (from the "
                "checkpoints it reported)"
            )
            % {"stretch": _duration(t["spot_notice_stretch_s"])},
        ),
    ]
    return page(
        request,
        "portal/reclamation.html",
        {"report": report, "rules": rules},
        project=project,
    )
