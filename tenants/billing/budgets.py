"""Budgets: monthly amounts per project with alert thresholds, checked by beat; a budget
whose policy stops VMs has compute stop them (``compute.services.reclaim.budget_reclaim``)."""

from datetime import UTC, date, datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import audit, events
from controlplane.errors import Conflict, InvalidInput
from tenants.billing.periods import month_bounds
from tenants.billing.rating import spend
from tenants.billing.rounding import PRICE_QUANTUM, _quantize
from tenants.choices import BudgetPolicy
from tenants.models import Budget, BudgetAlert, Project

DEFAULT_THRESHOLDS = [50, 80, 100]


def _check_thresholds(thresholds) -> list[int]:
    if not isinstance(thresholds, list) or not thresholds:
        raise InvalidInput.field("thresholds", "must be a list of percentages, e.g. [50, 80, 100]")
    if any(not isinstance(t, int) or isinstance(t, bool) or not 1 <= t <= 1000 for t in thresholds):
        raise InvalidInput.field("thresholds", "each must be a whole percentage from 1 to 1000")
    if len(set(thresholds)) != len(thresholds):
        raise InvalidInput.field("thresholds", "must not repeat a percentage")
    return sorted(thresholds)


def _check_amount(amount) -> Decimal:
    amount = Decimal(amount)
    if not amount.is_finite() or amount <= 0 or amount >= Decimal(10) ** 13:
        raise InvalidInput.field("amount", "must be more than 0")
    return _quantize(amount, PRICE_QUANTUM)


@transaction.atomic
def budget_create(
    *,
    project: Project,
    name: str,
    amount: Decimal,
    thresholds: list[int] | None = None,
    policy: str = BudgetPolicy.NOTIFY,
    active: bool = True,
) -> Budget:
    """A monthly budget for ``project``; thresholds default to 50, 80 and 100 %."""
    thresholds = _check_thresholds(DEFAULT_THRESHOLDS if thresholds is None else thresholds)
    if policy not in BudgetPolicy.values:
        raise InvalidInput.field("policy", f"must be one of {', '.join(BudgetPolicy.values)}")
    if Budget.objects.for_project(project).filter(name=name).exists():
        raise Conflict(f"a budget named {name} exists", details={"name": ["taken"]})
    budget = Budget.objects.create(
        project=project,
        name=name,
        amount=_check_amount(amount),
        thresholds=thresholds,
        policy=policy,
        active=active,
    )
    audit.record(
        "budget.create",
        budget,
        project=project,
        detail={"amount": str(budget.amount), "thresholds": thresholds, "policy": policy},
    )
    return budget


@transaction.atomic
def budget_update(*, budget: Budget, **changes) -> Budget:
    """Change a budget's name, amount, thresholds, policy or active flag. Alerts already
    sent this month stay sent."""
    unknown = set(changes) - {"name", "amount", "thresholds", "policy", "active"}
    if unknown:
        raise InvalidInput.field(sorted(unknown)[0], "cannot be changed")
    budget = Budget.objects.select_for_update().get(pk=budget.pk)
    if "thresholds" in changes:
        changes["thresholds"] = _check_thresholds(changes["thresholds"])
    if "amount" in changes:
        changes["amount"] = _check_amount(changes["amount"])
    if "policy" in changes and changes["policy"] not in BudgetPolicy.values:
        raise InvalidInput.field("policy", f"must be one of {', '.join(BudgetPolicy.values)}")
    if (
        "name" in changes
        and Budget.objects.for_project(budget.project)
        .filter(name=changes["name"])
        .exclude(pk=budget.pk)
        .exists()
    ):
        raise Conflict(f"a budget named {changes['name']} exists", details={"name": ["taken"]})
    changed = {k: v for k, v in changes.items() if getattr(budget, k) != v}
    for k, v in changed.items():
        setattr(budget, k, v)
    if changed:
        budget.save()
        audit.record(
            "budget.update",
            budget,
            project=budget.project,
            detail={k: str(v) if isinstance(v, Decimal) else v for k, v in changed.items()},
        )
    return budget


@transaction.atomic
def budget_delete(*, budget: Budget) -> None:
    audit.record("budget.delete", budget, project=budget.project)
    budget.delete()


def budgets_check(*, now: datetime | None = None) -> dict:
    """Check every active budget against its project's month-to-date spend (beat).

    Each threshold crossed alerts exactly once per month: the ``BudgetAlert`` row's unique
    constraint decides which of several concurrent checks emits the ``budget.threshold``
    event (mailed to the project's admins and sent to its webhooks). A project at or over
    100 % of a budget whose policy stops VMs has its running spot VMs stopped first, then,
    with ``stop_all``, its other running VMs; each step is announced (``budget.reclaim``)
    before it happens, and audited. Compute does the stopping
    (``compute.services.reclaim.budget_reclaim``). Returns what it did."""
    now = now or timezone.now()
    start, end = month_bounds(now.astimezone(UTC).date())
    budgets = list(Budget.objects.filter(active=True).select_related("project"))
    spent = spend(sorted({b.project_id for b in budgets}), start, end, open_until=now)
    done = {"alerts": [], "stopped": []}
    for budget in budgets:
        amount_spent = spent.get(budget.project_id, Decimal(0))
        for threshold in budget.thresholds:
            crossed = amount_spent * 100 >= budget.amount * threshold
            if crossed and _alert_once(budget, start.date(), threshold, amount_spent):
                done["alerts"].append((budget.pk, threshold))
        if amount_spent >= budget.amount and budget.policy != BudgetPolicy.NOTIFY:
            # compute writes its VMs (and imports tenants, so only here, not at import time)
            from compute.services.reclaim import budget_reclaim

            done["stopped"] += budget_reclaim(budget=budget, spent=amount_spent)
    return done


def _alert_once(budget: Budget, period: date, threshold: int, spent: Decimal) -> bool:
    """Record and announce one threshold crossing; False when it was already recorded."""
    try:
        with transaction.atomic():
            alert = BudgetAlert.objects.create(
                budget=budget, period_start=period, threshold=threshold, spend=spent
            )
            message = (
                f"project {budget.project.slug} has spent {spent} of its "
                f"{budget.amount} budget {budget.name!r} this month: {threshold} % reached"
            )
            events.emit(
                "budget.threshold",
                project=budget.project,
                message=message,
                obj=budget,
                payload={
                    "budget": budget.name,
                    "threshold": threshold,
                    "amount": str(budget.amount),
                    "spent": str(spent),
                    "period": f"{period:%Y-%m}",
                },
                mail=True,
            )
            audit.record(
                "budget.threshold",
                alert,
                project=budget.project,
                detail={"budget": budget.name, "threshold": threshold, "spent": str(spent)},
            )
    except IntegrityError:
        return False
    return True
