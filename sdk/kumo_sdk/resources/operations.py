"""Operations: the asynchronous work a 202 answer names."""

from __future__ import annotations

import time
from collections.abc import Callable

from kumo_sdk import errors
from kumo_sdk.resource import Resource
from kumo_sdk.types import Operation


class Operations(Resource[Operation]):
    path, type, find_by = "operations/", Operation, None

    def get(self, operation: Operation | str, *, project: str | None = None) -> Operation:
        """An operation by object, URL or id (an id is looked up in the project)."""
        if isinstance(operation, Operation):
            path = operation.url
        elif operation.startswith(("http://", "https://", "/")):
            path = operation
        else:
            path = self._item(operation, project)
        return self._decode(self._c.get(path))

    def wait(
        self,
        operation: Operation | str,
        *,
        project: str | None = None,
        timeout: float = 600.0,
        interval: float = 2.0,
        on_poll: Callable[[Operation], None] | None = None,
    ) -> Operation:
        """Poll until the operation finishes: return it when it succeeded, raise
        ``OperationFailed`` when it failed and ``OperationTimeout`` once ``timeout`` seconds
        have passed. Polls start at 0.2 s apart and slow to ``interval``; ``on_poll`` sees
        every state read."""
        deadline = time.monotonic() + timeout
        delay = 0.2
        while True:
            current = self.get(operation, project=project)
            if on_poll is not None:
                on_poll(current)
            if current.state == "succeeded":
                return current
            if current.state == "failed":
                raise errors.OperationFailed(current)
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.OperationTimeout(current, timeout)
            time.sleep(min(delay, left))
            delay = min(delay * 1.5, interval)
            operation = current
